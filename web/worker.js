// The engine's thread. The page talks to it only through messages (see engine-client.js):
//   page -> worker  { id, type: 'load' | 'generate' | 'chat' | 'embed' | 'abort' | 'cancel-load' |
//                      'reset' | 'clear-cache' | 'lose-device', ... }
// An encoder GGUF (bert, nomic-bert), or any model loaded with `settings.embeddings`, becomes
// an `EmbeddingModel` (embed only); the others an `Engine` (generate and chat).
//   worker -> page  { id, type: 'result' | 'error' | 'progress' | 'token' | 'prefill' } and, unasked,
//                   { type: 'device-lost' | 'reinitialised' | 'reinit-failed' }.
// The wasm package is found relative to this file (pkg/ beside it): `runner serve` puts web/ at
// / and pkg/ at /pkg/, and the npm package (.ci/build-npm.sh) has the same layout, so the page
// and the package share this file; wasm-bindgen finds its .wasm relative to webshard.js.
import init, { Engine, EmbeddingModel, wasmMemoryBytes, clearCache } from './pkg/webshard.js';

const ready = init();
let engine = null;
let lastLoad = null; // { url, settings } of the engine in use, to rebuild it after device loss
let loadController = null;

const post = (message) => self.postMessage(message);

function errorMessage(id, err) {
  return {
    id,
    type: 'error',
    message: err && err.message ? err.message : String(err),
    kind: (err && err.kind) || 'other',
  };
}

async function load(id, url, settings) {
  await ready;
  loadController?.abort();
  const controller = new AbortController();
  loadController = controller;
  const memoryBefore = wasmMemoryBytes();
  let peakMemory = memoryBefore;
  const { embeddings, ...engineSettings } = settings;
  const options = {
    ...engineSettings,
    signal: controller.signal,
    onProgress: (event) => {
      peakMemory = Math.max(peakMemory, wasmMemoryBytes());
      post({ id, type: 'progress', event });
    },
    onDeviceLost: (reason, message) => recover(reason, message),
  };
  const next = embeddings ? await EmbeddingModel.load(url, options) : await loadEngine(url, options);
  if (loadController === controller) loadController = null;
  engine?.free();
  engine = next;
  lastLoad = { url, settings };
  const info = engine.info();
  info.task = engine instanceof EmbeddingModel ? 'embeddings' : 'generation';
  info.adapter ||= await adapterName();
  info.wasmMemoryBefore = memoryBefore;
  info.wasmMemoryPeak = Math.max(peakMemory, wasmMemoryBytes());
  return info;
}

/** An `Engine`, or an `EmbeddingModel` where the file is an encoder (the engine says so
 * with the error kind `embedding-model`, before any weights are read). */
async function loadEngine(url, options) {
  try {
    return await Engine.load(url, options);
  } catch (err) {
    if (err?.kind !== 'embedding-model') throw err;
    return EmbeddingModel.load(url, options);
  }
}

/** The loaded model, which must be of `Class` for request `type`. */
function requireModel(Class, type) {
  const model = requireEngine();
  if (!(model instanceof Class)) {
    const err = new Error(Class === EmbeddingModel
      ? `${type}: this model is loaded for chat; load it with \`embeddings: true\` to embed`
      : `${type}: this is an embedding model; it only embeds`);
    err.kind = 'options';
    throw err;
  }
  return model;
}

// wgpu leaves the adapter's name empty in browsers; ask WebGPU itself.
async function adapterName() {
  const adapter = await navigator.gpu?.requestAdapter();
  const info = adapter?.info;
  return (info && [info.vendor, info.architecture, info.description].filter(Boolean).join(' ')) || 'unknown';
}

// A lost device (driver reset, GPU process crash) takes the engine with it: build a new one
// from the same URL, which the OPFS cache makes quick, without reloading the page.
async function recover(reason, message) {
  post({ type: 'device-lost', reason, message });
  engine = null;
  if (!lastLoad) return;
  try {
    const info = await load(undefined, lastLoad.url, lastLoad.settings);
    post({ type: 'reinitialised', info });
  } catch (err) {
    post({ ...errorMessage(undefined, err), type: 'reinit-failed' });
  }
}

/** `onPrefill(done, total)` for request `id`: the prompt tokens processed so far. */
const prefillPoster = (id) => (done, total) => post({ id, type: 'prefill', done, total });

function requireEngine() {
  if (!engine) {
    const err = new Error('no model is loaded');
    err.kind = 'not-loaded';
    throw err;
  }
  return engine;
}

const handlers = {
  load: ({ id, url, settings }) => load(id, url, settings),
  generate: ({ id, prompt, options }) =>
    requireModel(Engine, 'generate').generate(prompt, options, (text) => post({ id, type: 'token', text }), prefillPoster(id)),
  chat: ({ id, messages, options }) =>
    requireModel(Engine, 'chat').chat(messages, options, (text) => post({ id, type: 'token', text }), prefillPoster(id)),
  embed: ({ inputs }) => requireModel(EmbeddingModel, 'embed').embed(inputs),
  tokenize: ({ text }) => Array.from(requireEngine().tokenize(text)),
  abort: () => engine?.abort(),
  'cancel-load': () => loadController?.abort(),
  reset: () => engine?.reset?.(),
  'clear-cache': async () => {
    await ready;
    await clearCache();
  },
  'lose-device': () => requireEngine().loseDevice(),
  memory: async () => {
    await ready;
    return wasmMemoryBytes();
  },
};

self.onmessage = async ({ data }) => {
  const handler = handlers[data.type];
  if (!handler) {
    post(errorMessage(data.id, new Error(`unknown request ${data.type}`)));
    return;
  }
  try {
    post({ id: data.id, type: 'result', value: await handler(data) });
  } catch (err) {
    post(errorMessage(data.id, err));
  }
};
