// The page's handle on the engine, which lives in a Web Worker (worker.js). The API mirrors
// the wasm package's `Engine`:
//   const engine = await WorkerEngine.load(url, { onProgress, signal, onDeviceLost,
//                                                 onReinitialised, ...settings });
//   const out = await engine.generate(prompt, { n, temp, top_k, top_p, min_p,
//                                               repeat_penalty, seed, stop, constraint,
//                                               fit_context, spec, draft_max }, onToken);
//   // out: { text, ids, promptIds, finishReason, usage, aborted, prefillTokens, prefillSeconds,
//   //        decodeSeconds, decodeTokS, drafted, accepted }
//   const out = await engine.chat([{ role, content }], options, onToken, onPrefill);
//   // onPrefill(done, total): prompt tokens processed so far, while the prompt is prefilled
//   engine.abort();
//   const { embeddings, promptTokens } = await engine.embed(['text', [101, 2023, 102]]);
//   // an embedding model (encoder, or `embeddings: true` at load): L2-normalised vectors
// openai.js puts the OpenAI-shaped API (chat.completions.create...) over this.

/** An Error carrying the engine's error class (`not-found`, `not-gguf`, `no-webgpu`...). */
export class EngineError extends Error {
  constructor(message, kind) {
    super(message);
    this.name = 'EngineError';
    this.kind = kind || 'other';
  }
}

/** The engine's worker. Written as this one expression because bundlers (Vite, webpack) and
 * plain ESM all understand it: bundlers build worker.js as a worker entry, a page without one
 * loads it beside this file. */
function startWorker() {
  return new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
}

class WorkerChannel {
  constructor(worker) {
    this.worker = worker;
    this.pending = new Map();
    this.nextId = 1;
    this.listeners = { 'device-lost': [], reinitialised: [], 'reinit-failed': [] };
    this.worker.onmessage = ({ data }) => this.receive(data);
    this.worker.onerror = (event) => this.failAll(event.message || 'the engine worker failed to start');
  }

  receive(data) {
    if (data.id === undefined) {
      for (const listener of this.listeners[data.type] || []) listener(data);
      return;
    }
    const call = this.pending.get(data.id);
    if (!call) return;
    if (data.type === 'progress') call.onProgress?.(data.event);
    else if (data.type === 'token') call.onToken?.(data.text);
    else if (data.type === 'prefill') call.onPrefill?.(data.done, data.total);
    else {
      this.pending.delete(data.id);
      if (data.type === 'result') call.resolve(data.value);
      else call.reject(new EngineError(data.message, data.kind));
    }
  }

  failAll(message) {
    for (const call of this.pending.values()) call.reject(new EngineError(message, 'worker'));
    this.pending.clear();
  }

  request(message, hooks = {}) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, ...hooks });
      this.worker.postMessage({ ...message, id });
    });
  }

  send(message) {
    this.worker.postMessage({ ...message, id: this.nextId++ });
  }
}

export class WorkerEngine {
  constructor(channel, info) {
    this.channel = channel;
    this.info = info;
  }

  /** Loads `url` in a new worker (or `options.channel`'s). Resolves once the model is on the GPU. */
  static async load(url, options = {}) {
    const { onProgress, signal, onDeviceLost, onReinitialised, onReinitFailed, channel, ...settings } = options;
    const worker = channel || new WorkerChannel(startWorker());
    if (signal?.aborted) throw new EngineError('stopped: the load was aborted', 'aborted');
    const cancel = () => worker.send({ type: 'cancel-load' });
    signal?.addEventListener('abort', cancel);
    try {
      const info = await worker.request({ type: 'load', url, settings }, { onProgress });
      const engine = new WorkerEngine(worker, info);
      worker.listeners['device-lost'] = [(event) => onDeviceLost?.(event)];
      worker.listeners.reinitialised = [
        (event) => {
          engine.info = event.info;
          onReinitialised?.(event.info);
        },
      ];
      worker.listeners['reinit-failed'] = [(event) => onReinitFailed?.(new EngineError(event.message, event.kind))];
      return engine;
    } finally {
      signal?.removeEventListener('abort', cancel);
    }
  }

  /** A worker to load into; lets a page reuse one worker across models. */
  static channel() {
    return new WorkerChannel(startWorker());
  }

  generate(prompt, options = {}, onToken, onPrefill) {
    return this.channel.request({ type: 'generate', prompt, options }, { onToken, onPrefill });
  }

  chat(messages, options = {}, onToken, onPrefill) {
    return this.channel.request({ type: 'chat', messages, options }, { onToken, onPrefill });
  }

  /** Embeds strings or token-id lists: `{ embeddings: number[][], promptTokens }`. */
  embed(inputs) {
    return this.channel.request({ type: 'embed', inputs });
  }

  tokenize(text) {
    return this.channel.request({ type: 'tokenize', text });
  }

  /** Stops the running generation after the current token. */
  abort() {
    this.channel.send({ type: 'abort' });
  }

  reset() {
    return this.channel.request({ type: 'reset' });
  }

  /** Destroys the GPU device (tests of device-loss recovery). */
  loseDevice() {
    return this.channel.request({ type: 'lose-device' });
  }

  clearCache() {
    return this.channel.request({ type: 'clear-cache' });
  }
}
