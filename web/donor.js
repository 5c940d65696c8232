// The donor page: lends this browser's GPU to a shard fleet (wasm `Donor.start`) and explains,
// as it goes, what the GPU is doing and why.
// URL parameters for automation: signal (ws://HOST:PORT/signal), fleet (the token), gpu_mem
// (MiB); with signal and fleet given the page starts at once. It sets
// window.__donor = { statuses, status, exit, error, chart } and document.body.dataset.phase
// (`idle`, `connecting`, a `DonorPhase`, `failed`).
//
// The donor runs on this page, not in a worker: Chromium has no RTCPeerConnection in
// workers. Its GPU and network work is asynchronous, so the page stays responsive.
import init, { Donor } from '/pkg/webshard.js';
import { StepChart } from './donor-chart.js';
import { describeError, describeExit, describeStatus } from './donor-words.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const chart = new StepChart($('chart'));
// `phaseSince`: when the current phase began, for "waited 12 s"; `last`: the status that the
// previous chart point was taken from, for per-step byte deltas.
const state = { controller: null, phase: 'idle', phaseSince: performance.now(), last: null };
window.__donor = { statuses: [], status: null, exit: null, error: null, chart: chart.points };

const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;
const kb = (bytes) => `${(bytes / 1e3).toFixed(1)} kB`;
const STEPS = ['connecting', 'Joining', 'Loading', 'Serving', 'Left'];

function showError(err) {
  const message = err && err.message ? err.message : String(err);
  const kind = (err && err.kind) || 'other';
  window.__donor.error = { message, kind };
  const { title, detail } = describeError(message, kind);
  $('error').hidden = false;
  $('error').dataset.kind = kind;
  $('error-title').textContent = title;
  $('error-detail').textContent = detail;
}

function clearError() {
  window.__donor.error = null;
  $('error').hidden = true;
  $('error-title').textContent = '';
  $('error-detail').textContent = '';
}

/** Sets the headline, its explanation and the step line; `phase` is for tests and styles. */
function setPhase(phase, { title, detail }) {
  if (phase !== state.phase) {
    state.phase = phase;
    state.phaseSince = performance.now();
  }
  document.body.dataset.phase = phase;
  $('phase').textContent = title;
  $('phase-detail').textContent = detail;
  const current = phase === 'failed' ? STEPS.indexOf(state.reached) : STEPS.indexOf(phase);
  for (const item of document.querySelectorAll('#steps-line li')) {
    const index = STEPS.indexOf(item.dataset.step);
    item.classList.toggle('current', index === current);
    item.classList.toggle('done', index < current || (phase === 'Left' && index === current));
  }
  if (phase !== 'failed') state.reached = phase;
}

/** One chart point per new step: its stage time and the bytes since the previous point. */
function recordStep(status) {
  const before = state.last;
  if (before && status.steps === before.steps) return;
  state.last = status;
  if (!before || !status.steps) return;
  chart.add({
    step: status.steps,
    ms: status.last_step_ms,
    kbIn: (status.bytes_in - before.bytes_in) / 1e3,
    kbOut: (status.bytes_out - before.bytes_out) / 1e3,
  });
}

/** Renders one `DonorStatus` (field names as in Rust). */
function render(status) {
  window.__donor.status = status;
  window.__donor.statuses.push(status);
  if (status.phase !== 'Left') setPhase(status.phase, describeStatus(status, performance.now() - state.phaseSince));
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
  recordStep(status);
  if (status.last_error) showError({ message: status.last_error, kind: 'fleet' });
}

/** Keeps "waited 12 s" counting while nothing else changes. */
function tick() {
  const status = window.__donor.status;
  if (state.controller && status && (state.phase === 'Joining' || state.phase === 'Loading')) {
    setPhase(state.phase, describeStatus(status, performance.now() - state.phaseSince));
  }
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
  chart.clear();
  window.__donor.chart = chart.points;
  window.__donor.exit = null;
  state.last = null;
  state.controller = new AbortController();
  setRunning(true);
  const signal = $('signal').value.trim();
  setPhase('connecting', {
    title: 'Connecting to the signaling server',
    detail: `Testing this GPU and joining the fleet's room at ${signal}, where coordinators find their donors.`,
  });
  try {
    await init();
    const adapter = await adapterName();
    $('adapter').textContent = adapter || 'unknown';
    const exit = await Donor.start({
      signal,
      fleet: $('fleet').value,
      gpuMemMib: Number($('gpu-mem').value),
      adapter,
      onStatus: render,
      abortSignal: state.controller.signal,
    });
    window.__donor.exit = exit;
    setPhase('Left', describeExit(exit, window.__donor.status?.steps ?? 0));
  } catch (err) {
    showError(err);
    setPhase('failed', { title: 'Not lending: an error stopped this donor', detail: 'See the message above; fix it and press Start lending again.' });
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
setInterval(tick, 1000);
window.addEventListener('resize', () => chart.draw());
chart.draw();

$('signal').value = params.get('signal') || `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/signal`;
$('fleet').value = params.get('fleet') || '';
if (params.has('gpu_mem')) $('gpu-mem').value = params.get('gpu_mem');
if (params.has('signal') && params.has('fleet')) start();
