// The chat demo's page thread: it renders and forwards; the engine runs in the worker, or,
// in fleet mode, on donors' GPUs with this page as the coordinator (fleet-client.js).
// Chat turns go through the OpenAI-shaped API (openai.js), streamed, with the JSON schema box
// as `response_format`; turns without the chat template call the engine's `generate`.
// URL parameters for automation: model, prompt, n, temp, seed (and top_k, top_p, min_p,
// repeat_penalty, cache=0, warmup=0|1: compile the kernels at load, by default on a GPU only),
// autorun=1; for fleet mode fleet (the token), signal, donors, ctx,
// join_timeout and heartbeat_timeout (seconds). An autorun sets window.__webshard_last and
// document.body.dataset.done = "1" when it ends.
import { WorkerEngine, EngineError } from './engine-client.js';
import { createEngine, wrapEngine } from './openai.js';
import { FleetEngine } from './fleet-client.js';
import { FleetPanel } from './fleet-panel.js';
import { renderReply, replyElement } from './render.js';
import { loadConversation, saveConversation, withSystem } from './conversation.js';
import { adapterLimits, fetchCatalog, fillPicker, fitVerdict } from './catalog.js';
import { SAMPLER_FIELDS, chatRequest, responseFormat, samplerOptions } from './chat-settings.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = {
  engine: null,
  api: null, // the OpenAI-shaped API over `engine`
  turnController: null,
  loadController: null,
  fleetController: null,
  messages: [],
  catalog: [],
  limits: null,
  generating: false,
  noWebGpu: false,
};
const fleetPanel = new FleetPanel();
window.__webshard_progress = [];
// Every prefill report of the page's turns, `{ done, total }`, for the e2e tests.
window.__webshard_prefill = [];
window.__webshard_reinits = 0;
window.__webshard_live_speeds = [];
window.__webshard = {
  state,
  load: loadModel,
  generate: (p, o) => state.engine.generate(p, o),
  api: () => state.api,
  // Tests inject a reply through the same rendering as a generated one.
  renderReply: (markdown) => addReply(markdown),
};

const NO_WEBGPU_HELP =
  'This demo needs WebGPU. It works in Chrome or Edge 113+ (Windows, macOS, ChromeOS), Chrome 121+ on Android, ' +
  'Safari 26+ and Firefox 141+ on Windows. On Linux start Chromium with --enable-unsafe-webgpu ' +
  '(plus --enable-features=Vulkan with a GPU), or enable chrome://flags/#enable-unsafe-webgpu.';

const EXPLAIN = {
  'not-found': 'The model URL was not found (HTTP 404).',
  http: 'The server refused the request.',
  // The engine's message already explains (unreachable, or CORS headers missing).
  network: 'The model could not be fetched.',
  'not-gguf': 'That file is not a GGUF model.',
  'bad-gguf': 'The GGUF file is damaged or truncated.',
  unsupported: 'This model uses something the engine does not support yet.',
  'no-webgpu': NO_WEBGPU_HELP,
  aborted: 'Stopped.',
  changed: 'The file changed on the server during the download.',
  'device-lost': 'The GPU device was lost.',
  gpu: 'The GPU failed.',
  'does-not-fit': 'The model does not fit this GPU; a fleet of donors can run it.',
  fleet: 'The fleet failed.',
  busy: 'The engine is busy.',
  options: 'A setting is not valid.',
};

function showError(err) {
  const box = $('error');
  const kind = err.kind || 'other';
  box.hidden = false;
  box.dataset.kind = kind;
  box.textContent = `${EXPLAIN[kind] || 'Something went wrong.'} ${err.message || err}`;
}

function clearError() {
  $('error').hidden = true;
  $('error').textContent = '';
}

const mb = (bytes) => (bytes / 1e6).toFixed(1);

function renderProgress(event) {
  const { bytesDone, bytesTotal, mbPerSec, tensor } = event;
  $('progress').value = bytesTotal ? bytesDone / bytesTotal : 0;
  const left = mbPerSec > 0 ? (bytesTotal - bytesDone) / 1e6 / mbPerSec : NaN;
  const eta = left >= 1 ? ` · ETA ${left.toFixed(0)} s` : '';
  $('progress-text').textContent = `${mb(bytesDone)} / ${mb(bytesTotal)} MB · ${mbPerSec.toFixed(1)} MB/s${eta} · ${tensor}`;
}

/** Hides the bar and its text once a load ends: the info line then says what happened. */
function clearProgress() {
  $('progress-row').hidden = true;
  $('progress').value = 0;
  $('progress-text').textContent = '';
}

function renderInfo(info) {
  const cache = info.cache
    ? ` · from cache ${mb(info.cache.hitBytes)} MB, downloaded ${mb(info.cache.fetchedBytes)} MB`
    : '';
  $('model-info').textContent =
    `${info.arch}, ${info.nLayers} layers on ${info.adapter} (${info.backend}, ${info.variant} kernels) · ` +
    `loaded in ${info.loadSeconds.toFixed(1)} s${cache}${info.offline ? ' · offline' : ''}`;
}

async function checkWebGpu() {
  if (!('gpu' in navigator)) return 'navigator.gpu is missing';
  try {
    if (!(await navigator.gpu.requestAdapter())) return 'navigator.gpu.requestAdapter() found no adapter';
  } catch (err) {
    return err.message;
  }
  return null;
}

function modelUrl() {
  return $('model').value === 'other' ? $('model-url').value.trim() : $('model').value;
}

function setLoading(loading) {
  $('load').disabled = loading;
  $('cancel-load').hidden = !loading;
  if (loading) $('progress-row').hidden = false;
  else clearProgress();
  $('send').disabled = loading || !state.engine;
}

async function loadModel(url, settings = {}) {
  clearError();
  window.__webshard_progress = [];
  window.__webshard_reinits = 0;
  state.loadController = new AbortController();
  setLoading(true);
  try {
    const api = await createEngine({
      model: url,
      ...settings,
      signal: state.loadController.signal,
      onProgress: (event) => {
        window.__webshard_progress.push(event);
        renderProgress(event);
      },
      onDeviceLost: () => showError(new EngineError('Re-initialising the engine…', 'device-lost')),
      onReinitialised: (info) => {
        window.__webshard_reinits += 1;
        clearError();
        renderInfo(info);
        window.__webshard_info = info;
      },
      onReinitFailed: showError,
    });
    const { engine } = api;
    await dropEngine();
    state.engine = engine;
    state.api = api;
    window.__webshard_info = engine.info;
    renderInfo(engine.info);
    // A load by URL (a link's ?model=, the page's API) leaves the picker saying what runs.
    if (url !== modelUrl()) {
      pickModel(url);
      showFit();
    }
    return engine;
  } finally {
    state.loadController = null;
    setLoading(false);
  }
}

/** Ends the engine in use: its worker, or its fleet (the donors are dismissed). */
async function dropEngine() {
  const engine = state.engine;
  state.engine = null;
  state.api = null;
  if (!(engine instanceof FleetEngine)) {
    engine?.channel.worker.terminate();
    return;
  }
  await engine.close();
  fleetPanel.status('disconnected', 'closed');
  $('fleet-disconnect').disabled = true;
}

function fleetSettings() {
  return {
    signal: $('fleet-signal').value.trim(),
    fleet: $('fleet-token').value,
    donors: Number($('fleet-donors').value),
    // Donors fetch their layers from it: it must not be relative to this page.
    model: new URL(modelUrl(), location.href).href,
  };
}

function setFleetConnecting(connecting) {
  $('fleet-connect').disabled = connecting;
  $('fleet-disconnect').disabled = !connecting;
  $('load').disabled = connecting || state.noWebGpu;
  $('send').disabled = connecting || !state.engine;
}

/** Joins the fleet with the panel's settings (and `overrides`); this page then generates through it. */
async function connectFleet(overrides = {}) {
  clearError();
  fleetPanel.reset();
  const settings = { ...fleetSettings(), ...overrides };
  const controller = new AbortController();
  state.fleetController = controller;
  setFleetConnecting(true);
  fleetPanel.status(`waiting for ${settings.donors} donor(s) and their stages to load…`, 'connecting');
  try {
    const engine = await FleetEngine.connect(settings, {
      onEvent: (event) => fleetPanel.onEvent(event),
      signal: controller.signal,
    });
    await dropEngine();
    state.engine = engine;
    state.api = wrapEngine(engine);
    state.messages = [];
    const { arch, nLayers, stages } = engine.info;
    fleetPanel.status(`connected: ${arch}, ${nLayers} layers on ${stages} stage(s)`, 'connected');
    $('model-info').textContent = `${arch}, ${nLayers} layers through a fleet of ${stages} stage(s)`;
    return engine;
  } catch (err) {
    fleetPanel.status('not connected', 'failed');
    throw err;
  } finally {
    state.fleetController = null;
    setFleetConnecting(false);
    $('fleet-disconnect').disabled = !(state.engine instanceof FleetEngine);
  }
}

/** After a turn: a stopped or failed fleet generation has dismissed the donors. */
function noteFleetClosed() {
  if (!(state.engine instanceof FleetEngine) || !state.engine.closed) return;
  state.engine = null;
  state.api = null;
  fleetPanel.status('dismissed: connect again', 'closed');
  $('fleet-disconnect').disabled = true;
  $('send').disabled = true;
}

async function disconnectFleet() {
  if (state.fleetController) {
    state.fleetController.abort();
    return;
  }
  if (!(state.engine instanceof FleetEngine)) return;
  await dropEngine();
  $('send').disabled = true;
}

function addTurn(role, text) {
  const div = document.createElement('div');
  div.className = `turn ${role}`;
  div.textContent = text;
  $('transcript').append(div);
  return div;
}

/** A chat reply: Markdown, sanitised, with a copy button. Returns the element to render into. */
function addReply(markdown = '') {
  const { turn, body } = replyElement();
  $('transcript').append(turn);
  renderReply(body, markdown);
  return body;
}

/** The saved conversation back in the transcript and the system prompt field. */
function restoreConversation() {
  const { system, messages } = loadConversation();
  $('system-prompt').value = system;
  state.messages = messages;
  for (const message of messages) {
    if (message.role === 'user') addTurn('user', message.content);
    else addReply(message.content);
  }
}

function saveChat() {
  saveConversation($('system-prompt').value, state.messages);
}

function clearChat() {
  state.messages = [];
  $('transcript').textContent = '';
  $('speed').textContent = '';
  saveChat();
  state.engine?.reset();
}

function setGenerating(generating) {
  state.generating = generating;
  $('send').disabled = generating || !state.engine;
  $('stop').disabled = !generating;
}

/** Appends streamed text to `reply` (as Markdown when `markdown`) and shows the speed so far:
 * tokens after the first over the time since the first, so prefill is not counted. Until the
 * first token it shows how far the prompt is processed (`onPrefill`'s "n / N" tokens; a fleet
 * reports none) and for how long. */
function tokenCounter(reply, maxTokens, markdown) {
  const counter = { tokens: 0, firstAt: 0, text: '', prefilled: null };
  const fleet = state.engine instanceof FleetEngine;
  const started = performance.now();
  const prefill = () => {
    const seconds = ((performance.now() - started) / 1000).toFixed(0);
    const done = counter.prefilled;
    const tokens = done ? ` ${done.done} / ${done.total}` : '…';
    $('speed').textContent = `processing prompt${tokens} · ${seconds} s`;
  };
  prefill();
  counter.timer = setInterval(prefill, 500);
  counter.onPrefill = (done, total) => {
    window.__webshard_prefill.push({ done, total });
    counter.prefilled = { done, total };
    if (!counter.firstAt) prefill();
  };
  counter.onToken = (text) => {
    clearInterval(counter.timer);
    counter.tokens += 1;
    if (fleet) fleetPanel.onToken(counter.tokens, maxTokens ?? 128);
    counter.text += text;
    if (markdown) renderReply(reply, counter.text);
    else reply.textContent += text;
    if (!counter.firstAt) {
      counter.firstAt = performance.now();
      $('speed').textContent = 'first token';
      return;
    }
    const rate = (counter.tokens - 1) / ((performance.now() - counter.firstAt) / 1000);
    window.__webshard_live_speeds.push(rate);
    $('speed').textContent = `${rate.toFixed(1)} tokens/s`;
  };
  return counter;
}

/** Streams a reply into the transcript: a chat turn when `request` is given (through the
 * OpenAI-shaped API), else a plain continuation of the text. Resolves to what showSpeed shows. */
async function runTurn(promptText, options, request) {
  addTurn('user', promptText);
  const reply = request ? addReply() : addTurn('assistant', '');
  const counter = tokenCounter(reply, options.n, Boolean(request));
  setGenerating(true);
  try {
    if (!request) return await state.engine.generate(promptText, options, counter.onToken, counter.onPrefill);
    return await chatTurn(promptText, request, counter);
  } finally {
    clearInterval(counter.timer);
    setGenerating(false);
    noteFleetClosed();
  }
}

async function chatTurn(promptText, request, counter) {
  const messages = [...state.messages, { role: 'user', content: promptText }];
  const controller = new AbortController();
  state.turnController = controller;
  const started = performance.now();
  const turn = { chat: true, text: '', aborted: false };
  try {
    const sent = withSystem($('system-prompt').value, messages);
    const chunks = await state.api.chat.completions.create(
      { ...request, messages: sent },
      { signal: controller.signal, onPrefill: counter.onPrefill },
    );
    for await (const chunk of chunks) {
      const [choice] = chunk.choices;
      if (choice?.delta.content) {
        turn.text += choice.delta.content;
        counter.onToken(choice.delta.content);
      }
      if (choice?.finish_reason) turn.finishReason = choice.finish_reason;
      if (chunk.usage) turn.usage = chunk.usage;
    }
  } catch (err) {
    if (err.name !== 'AbortError') throw err;
    turn.aborted = true;
  } finally {
    state.turnController = null;
  }
  // A stopped reply stays in the conversation as far as it got, as the cache holds it.
  state.messages = [...messages, { role: 'assistant', content: turn.text }];
  saveChat();
  turn.tokens = turn.usage?.completion_tokens ?? counter.tokens;
  turn.seconds = (performance.now() - (counter.firstAt || started)) / 1000;
  return turn;
}

function showSpeed(out) {
  if (out.chat) {
    // Over decode steps only: the first token's time is the prompt's.
    const rate = out.seconds > 0 && out.tokens > 1 ? ` · ${((out.tokens - 1) / out.seconds).toFixed(2)} tokens/s` : '';
    const prompt = out.usage ? ` · prompt ${out.usage.prompt_tokens} tokens` : '';
    const end = out.aborted ? ' · stopped' : out.finishReason === 'length' ? ' · cut off at max tokens' : '';
    $('speed').textContent = `${out.tokens} tokens${rate}${prompt}${end}`;
    return;
  }
  if (out.report) {
    $('speed').textContent =
      `${out.ids.length} tokens · ${out.decodeTokS.toFixed(2)} tokens/s decode through the fleet · ` +
      `${out.stepMsMean.toFixed(0)} ms per step · ${out.recoveries} re-plan(s)${out.aborted ? ' · stopped' : ''}`;
    return;
  }
  $('speed').textContent =
    `${out.ids.length} tokens · ${out.decodeTokS.toFixed(2)} tokens/s decode · ` +
    `prefill ${out.prefillTokens} tokens in ${out.prefillSeconds.toFixed(2)} s${out.aborted ? ' · stopped' : ''}`;
}

async function onSend(event) {
  event.preventDefault();
  const text = $('prompt').value;
  if (!text.trim() || !state.engine || state.generating) return;
  clearError();
  try {
    const options = samplerOptions();
    const request = $('use-chat').checked ? chatRequest(options) : undefined;
    const format = request ? undefined : responseFormat();
    if (format) options.constraint = { type: 'json_schema', schema: format.json_schema.schema };
    $('prompt').value = '';
    showSpeed(await runTurn(text, options, request));
  } catch (err) {
    showError(err);
  }
}

/** The fleet settings the URL overrides (the panel holds signal, token and donors). */
function fleetParams() {
  const overrides = {};
  const numbers = { ctx: 'maxContext', join_timeout: 'joinTimeoutS', heartbeat_timeout: 'heartbeatTimeoutS' };
  for (const [param, key] of Object.entries(numbers)) {
    if (params.has(param)) overrides[key] = Number(params.get(param));
  }
  return overrides;
}

/** The engine's load settings the URL asks for (cache=0, warmup, subgroups=0, depth). */
function loadSettings() {
  const settings = {};
  if (params.get('cache') === '0') settings.cache = false;
  if (params.get('subgroups') === '0') settings.disableSubgroups = true;
  if (params.has('depth')) settings.decodeDepth = Number(params.get('depth'));
  if (params.has('warmup')) settings.warmUp = params.get('warmup') === '1';
  return settings;
}

/** Loads `model` (or connects the fleet) and generates once from the URL parameters, for tests and scripts. */
async function autorun() {
  const model = params.get('model') || $('model').value;
  const prompt = params.get('prompt') || 'The capital of France is';
  const options = { n: 16, temp: 0, seed: 0 };
  for (const field of SAMPLER_FIELDS) {
    if (params.has(field)) options[field] = Number(params.get(field));
  }
  try {
    if (params.has('fleet')) await connectFleet(fleetParams());
    else await loadModel(model, loadSettings());
    const info = state.engine.info;
    const out = await runTurn(prompt, options);
    showSpeed(out);
    window.__webshard_last = {
      prompt_ids: out.promptIds,
      ids: out.ids,
      text: out.text,
      decode_tok_s: out.decodeTokS,
      adapter: info.adapter,
      variant: info.variant,
      aborted: out.aborted,
      report: out.report,
    };
  } catch (err) {
    showError(err);
    window.__webshard_last = { error: err.message, kind: err.kind || 'other' };
  }
  document.body.dataset.done = '1';
}

function wireControls() {
  $('model').addEventListener('change', () => {
    $('model-url').hidden = $('model').value !== 'other';
    showFit();
  });
  $('memory-budget').addEventListener('input', showFit);
  $('system-prompt').addEventListener('change', saveChat);
  $('load').addEventListener('click', () => loadModel(modelUrl()).catch(showError));
  $('cancel-load').addEventListener('click', () => state.loadController?.abort());
  $('clear-cache').addEventListener('click', async () => {
    const channel = state.engine?.channel || WorkerEngine.channel();
    await channel.request({ type: 'clear-cache' }).catch(showError);
    if (channel !== state.engine?.channel) channel.worker.terminate();
  });
  $('fleet-connect').addEventListener('click', () => connectFleet().catch(showError));
  $('fleet-disconnect').addEventListener('click', () => disconnectFleet().catch(showError));
  $('prompt-form').addEventListener('submit', onSend);
  $('stop').addEventListener('click', () => (state.turnController ? state.turnController.abort() : state.engine?.abort()));
  $('new-chat').addEventListener('click', clearChat);
}

/** The Fleet panel's fields from the URL; the signaling server defaults to this server's. */
function fillFleetPanel() {
  $('fleet-signal').value =
    params.get('signal') || `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/signal`;
  if (params.has('fleet')) {
    $('fleet-token').value = params.get('fleet');
    $('fleet-panel').open = true;
  }
  if (params.has('donors')) $('fleet-donors').value = params.get('donors');
}

/** Whether the picked model fits, said before it is downloaded. */
function showFit() {
  const entry = state.catalog.find((m) => m.url === $('model').value);
  const budget = Number($('memory-budget').value) * 1e6;
  const { fits, reason } = fitVerdict(entry, state.limits, budget > 0 ? budget : 0);
  $('model-fit').textContent = reason;
  $('model-fit').dataset.fits = fits === null ? 'unknown' : String(fits);
}

/** Shows `url` in the picker: its catalogue entry, else "other" with the URL. */
function pickModel(url) {
  const known = [...$('model').options].some((o) => o.value === url);
  $('model').value = known ? url : 'other';
  $('model-url').hidden = known;
  if (!known) $('model-url').value = url;
}

async function loadCatalog() {
  [state.catalog, state.limits] = await Promise.all([fetchCatalog(), adapterLimits()]);
  fillPicker($('model'), state.catalog);
  $('model-url').hidden = $('model').value !== 'other';
  document.body.dataset.catalog = String(state.catalog.length);
}

async function main() {
  wireControls();
  fillFleetPanel();
  restoreConversation();
  await loadCatalog();
  if (params.has('model')) pickModel(params.get('model'));
  showFit();
  const missing = await checkWebGpu();
  if (missing) {
    $('caps').hidden = false;
    $('caps').textContent = `${NO_WEBGPU_HELP} (${missing})`;
    $('load').disabled = true;
    state.noWebGpu = true;
    // A fleet needs no GPU here: the donors compute.
    if (params.get('autorun') === '1' && params.has('fleet')) {
      await autorun();
      return;
    }
    if (params.get('autorun') === '1') {
      window.__webshard_last = { error: $('caps').textContent, kind: 'no-webgpu' };
      document.body.dataset.done = '1';
    }
    return;
  }
  if (params.get('autorun') === '1') await autorun();
}

main();
