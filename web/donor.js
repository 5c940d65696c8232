// The donor page: lends this browser's GPU to a shard fleet (wasm `Donor.start`).
// URL parameters for automation: signal (ws://HOST:PORT/signal), fleet (the token), gpu_mem
// (MiB); with signal and fleet given the page starts at once. It sets
// window.__donor = { statuses, status, exit, error } and document.body.dataset.phase.
//
// The donor runs on this page, not in a worker: Chromium has no RTCPeerConnection in
// workers. Its GPU and network work is asynchronous, so the page stays responsive.
import init, { Donor } from '/pkg/webshard.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = { controller: null };
window.__donor = { statuses: [], status: null, exit: null, error: null };

const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;
const kb = (bytes) => `${(bytes / 1e3).toFixed(1)} kB`;

function showError(err) {
  const message = err && err.message ? err.message : String(err);
  window.__donor.error = { message, kind: (err && err.kind) || 'other' };
  $('error').hidden = false;
  $('error').textContent = message;
}

function clearError() {
  window.__donor.error = null;
  $('error').hidden = true;
  $('error').textContent = '';
}

/** Shows `label`; `phase` (`connecting`, a `DonorPhase`, `failed`) is for tests and styles. */
function setPhase(label, phase = label) {
  document.body.dataset.phase = phase;
  $('phase').textContent = label;
}

/** Renders one `DonorStatus` (field names as in Rust). */
function render(status) {
  window.__donor.status = status;
  window.__donor.statuses.push(status);
  const coordinator = status.coordinator ? ` · coordinator ${status.coordinator.slice(0, 8)}` : '';
  setPhase(`${status.phase}${coordinator}`, status.phase);
  $('adapter').textContent = `${status.adapter || 'unknown'} · probe ${status.ms_per_layer.toFixed(2)} ms per layer`;
  if (status.layers) {
    const { start, end } = status.layers;
    $('layers').textContent = `${start}–${end - 1} (${end - start} layers, stage ${status.stage_id}, epoch ${status.epoch})`;
  }
  $('downloaded').textContent = `${mb(status.bytes_downloaded)}${status.load_ms ? ` in ${(status.load_ms / 1000).toFixed(1)} s` : ''}`;
  $('step-ms').textContent = status.steps ? `${status.last_step_ms.toFixed(1)} ms` : '–';
  $('traffic').textContent = `${kb(status.bytes_in)} in · ${kb(status.bytes_out)} out`;
  $('steps').textContent = String(status.steps);
  $('refused').textContent = String(status.refused_frames);
  $('text').textContent = status.text;
  if (status.last_error) showError(new Error(status.last_error));
}

/** The adapter's name as WebGPU reports it (wgpu leaves it empty in browsers). */
async function adapterName() {
  const adapter = await navigator.gpu?.requestAdapter();
  const info = adapter?.info;
  return (info && [info.vendor, info.architecture, info.description].filter(Boolean).join(' ')) || '';
}

function setRunning(running) {
  $('start').disabled = running;
  $('stop').disabled = !running;
  for (const id of ['signal', 'fleet', 'gpu-mem']) $(id).disabled = running;
}

async function start() {
  clearError();
  window.__donor.exit = null;
  state.controller = new AbortController();
  setRunning(true);
  setPhase('connecting');
  try {
    await init();
    const adapter = await adapterName();
    $('adapter').textContent = adapter || 'unknown';
    const exit = await Donor.start({
      signal: $('signal').value.trim(),
      fleet: $('fleet').value,
      gpuMemMib: Number($('gpu-mem').value),
      adapter,
      onStatus: render,
      abortSignal: state.controller.signal,
    });
    window.__donor.exit = exit;
    setPhase(`left: ${exit.reason}`, 'Left');
  } catch (err) {
    showError(err);
    setPhase('failed');
  } finally {
    state.controller = null;
    setRunning(false);
  }
}

$('join-form').addEventListener('submit', (event) => {
  event.preventDefault();
  if (!state.controller) start();
});
$('stop').addEventListener('click', () => state.controller?.abort());

$('signal').value = params.get('signal') || `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/signal`;
$('fleet').value = params.get('fleet') || '';
if (params.has('gpu_mem')) $('gpu-mem').value = params.get('gpu_mem');
if (params.has('signal') && params.has('fleet')) start();
