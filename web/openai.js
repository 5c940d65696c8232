// The OpenAI-shaped in-page API, as WebLLM users write it:
//   const engine = await createEngine({ model: '/models/x.gguf', onProgress, ...loadSettings });
//   const reply = await engine.chat.completions.create({ messages, max_tokens, temperature,
//     top_p, seed, stop, response_format, tools, tool_choice });  // a ChatCompletion
//   webshard_spec: { type: 'lookup', draft_max: 8 } is webshard's extension: speculative
//   decoding with prompt-lookup drafts (same output; usage.completion_tokens_details counts
//   the drafts kept and rejected).
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true,
//     stream_options: { include_usage: true } })) ...   // chat.completion.chunk objects
//   await engine.completions.create({ prompt, max_tokens });  // a text_completion
//   await engine.embeddings.create({ input: ['a', 'b'] });  // { data[].embedding, usage }
//   (an embedding model: an encoder GGUF such as bert, or `createEngine({ embeddings: true })`)
// The model runs in a Web Worker (engine-client.js, worker.js); `wrapEngine` puts the same
// API over an engine already loaded (the worker's, or a fleet's). Requests run one at a time
// in call order. `create(body, { signal })` stops on an AbortSignal and rejects with an
// AbortError; `{ onPrefill(done, total) }` there reports prompt processing (not OpenAI's). Bad requests reject with a `BadRequestError` whose message and `param` name the
// field (openai-request.js). This is the npm package's main entry; its types are in
// npm/index.d.ts, kept in step by hand.
import { WorkerEngine, EngineError } from './engine-client.js';
import { chatPlan, completionPlan, BadRequestError } from './openai-request.js';
import { CallReader, readCall } from './tool-calls.js';
import { embeddingError, embeddingPlan, embeddingResponse } from './openai-embeddings.js';

export { BadRequestError, EngineError };

/** Loads `model` (a GGUF URL) in a new worker; the other options are `WorkerEngine.load`'s. */
export async function createEngine({ model, ...options } = {}) {
  if (typeof model !== 'string' || !model) throw new BadRequestError('model', 'must be the URL of a GGUF file');
  return wrapEngine(await WorkerEngine.load(model, options), model);
}

/** The OpenAI-shaped API over a loaded engine with `generate`, `chat`, `abort` and `info`. */
export function wrapEngine(engine, url = engine.info?.url || engine.info?.model || 'model') {
  return new OpenAIEngine(engine, url);
}

/** A model's name: its file's stem, as `runner serve -m` names it. */
function modelName(url) {
  const file = String(url).split(/[?#]/)[0].split('/').pop() || String(url);
  return file.replace(/\.gguf$/i, '');
}

const newId = (prefix) => `${prefix}-${crypto.randomUUID().replaceAll('-', '')}`;
const now = () => Math.floor(Date.now() / 1000);

function abortError() {
  const err = new Error('the request was aborted');
  err.name = 'AbortError';
  err.kind = 'aborted';
  return err;
}

function usage(result) {
  const { prompt_tokens, completion_tokens, cached_tokens } = result.usage;
  const counted = {
    prompt_tokens,
    completion_tokens,
    total_tokens: prompt_tokens + completion_tokens,
    prompt_tokens_details: { cached_tokens },
  };
  // With `webshard_spec`: draft tokens kept and thrown away, in OpenAI's predicted-output terms.
  if (result.drafted) {
    counted.completion_tokens_details = {
      accepted_prediction_tokens: result.accepted,
      rejected_prediction_tokens: result.drafted - result.accepted,
    };
  }
  return counted;
}

/** An engine error about a field the request set: named as the request names it. */
function requestError(err, plan) {
  if (err.kind !== 'options') return err;
  if (/^bad options: tools: /.test(err.message)) return new BadRequestError('tools', err.message.replace(/^bad options: tools: /, ''));
  if (/^bad options: constraint: /.test(err.message)) {
    // A tool call's constraint holds the functions' `parameters`; otherwise it is the format.
    const param = plan.toolCalls ? 'tools' : 'response_format';
    return new BadRequestError(param, err.message.replace(/^bad options: constraint: /, ''));
  }
  if (/context/.test(err.message)) {
    return new BadRequestError(plan.options.fit_context ? 'messages' : 'max_tokens', err.message.replace(/^bad options: /, ''));
  }
  return err;
}

/** Tokens pushed by the engine, read by an async iterator; ends with the engine's result. */
class TokenQueue {
  constructor() {
    this.items = [];
    this.waiting = null;
    this.ended = false;
  }

  push(text) {
    this.items.push(text);
    this.wake();
  }

  end(result, error) {
    this.ended = true;
    this.result = result;
    this.error = error;
    this.wake();
  }

  wake() {
    this.waiting?.();
    this.waiting = null;
  }

  /** Resolves once a token is waiting or the run ended. */
  ready() {
    if (this.items.length || this.ended) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiting = resolve;
    });
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      await this.ready();
      if (this.items.length) yield this.items.shift();
      else return;
    }
  }
}

class OpenAIEngine {
  constructor(engine, url) {
    this.engine = engine;
    this.url = url;
    this.model = modelName(url);
    this.queue = Promise.resolve();
    this.chat = { completions: { create: (body, options) => this.createChat(body, options) } };
    this.completions = { create: (body, options) => this.createCompletion(body, options) };
    this.embeddings = { create: (body, options) => this.createEmbeddings(body, options) };
  }

  get info() {
    return this.engine.info;
  }

  /** Stops the running request after its current token. */
  abort() {
    this.engine.abort();
  }

  checkModel(body) {
    if (typeof body?.model === 'string' && body.model !== this.model && body.model !== this.url) {
      throw new BadRequestError('model', `\`${body.model}\` is not loaded here (this engine runs \`${this.model}\`)`);
    }
  }

  async createChat(body, { signal, onPrefill } = {}) {
    this.checkModel(body);
    const plan = chatPlan(body, { maxContext: this.info.maxContext, toolSupport: this.info.toolSupport });
    const run = (onToken) => this.engine.chat(plan.messages, plan.options, onToken, onPrefill);
    const shape = (plan.toolCalls ? toolChatShape : chatShape)(newId('chatcmpl'), this.model);
    return plan.stream ? this.stream(plan, run, shape, signal) : shape.whole(await this.whole(plan, run, signal));
  }

  async createCompletion(body, { signal, onPrefill } = {}) {
    this.checkModel(body);
    const plan = completionPlan(body);
    const run = (onToken) => this.engine.generate(plan.prompt, plan.options, onToken, onPrefill);
    const shape = completionShape(newId('cmpl'), this.model);
    return plan.stream ? this.stream(plan, run, shape, signal) : shape.whole(await this.whole(plan, run, signal));
  }

  async createEmbeddings(body, { signal } = {}) {
    this.checkModel(body);
    if (typeof this.engine.embed !== 'function') throw new EngineError('embeddings: this engine does not embed', 'options');
    const plan = embeddingPlan(body, this.info);
    const turn = this.queue.then(async () => {
      if (signal?.aborted) throw abortError();
      return this.engine.embed(plan.inputs).catch((err) => Promise.reject(embeddingError(err, plan)));
    });
    this.queue = turn.catch(() => {});
    return embeddingResponse(await turn, plan, this.model);
  }

  /** Runs `run(onToken)` after the requests before it; `signal` stops it. */
  start(plan, run, onToken, signal) {
    const turn = this.queue.then(async () => {
      if (signal?.aborted) throw abortError();
      const stop = () => this.engine.abort();
      signal?.addEventListener('abort', stop);
      try {
        const result = await run(onToken).catch((err) => Promise.reject(requestError(err, plan)));
        if (signal?.aborted || result.aborted) throw abortError();
        return result;
      } finally {
        signal?.removeEventListener('abort', stop);
      }
    });
    this.queue = turn.catch(() => {});
    return turn;
  }

  whole(plan, run, signal) {
    return this.start(plan, run, undefined, signal);
  }

  /** The chunks of a streamed request; resolves once the first token came (or the run failed),
   * so a request the engine refuses rejects here rather than in the loop. */
  async stream(plan, run, shape, signal) {
    const tokens = new TokenQueue();
    const done = this.start(plan, run, (text) => tokens.push(text), signal);
    done.then((result) => tokens.end(result), (err) => tokens.end(undefined, err));
    await tokens.ready();
    if (tokens.error) throw tokens.error;
    const engine = this;
    return {
      async *[Symbol.asyncIterator]() {
        let finished = false;
        try {
          if (shape.first) yield shape.first();
          for await (const text of tokens) if (text) yield* shape.pieces(text);
          finished = true;
          if (tokens.error) throw tokens.error;
          yield shape.last(tokens.result);
          if (plan.includeUsage) yield shape.usage(tokens.result);
        } finally {
          // The consumer broke off the loop: stop the engine rather than finish unread.
          if (!finished && !tokens.ended) {
            engine.abort();
            await done.catch(() => {});
          }
        }
      },
    };
  }
}

/** Chat completions and their chunks. */
function chatShape(id, model) {
  const created = now();
  const chunk = (delta, finish_reason = null) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index: 0, delta, finish_reason, logprobs: null }],
  });
  return {
    whole: (result) => ({
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: result.text }, finish_reason: result.finishReason, logprobs: null }],
      usage: usage(result),
    }),
    first: () => chunk({ role: 'assistant', content: '' }),
    pieces: (text) => [chunk({ content: text })],
    last: (result) => chunk({}, result.finishReason),
    usage: (result) => ({ id, object: 'chat.completion.chunk', created, model, choices: [], usage: usage(result) }),
    chunk,
  };
}

/** Chat completions whose answer may be a tool call (as the HTTP API's `reply.rs` shapes them):
 * whole, `message.tool_calls` with `content: null` and `finish_reason: 'tool_calls'`;
 * streamed, the call's first delta carries its id, type and name, the next ones pieces of
 * the arguments. A call cut short (max_tokens) stays text, with `finish_reason: 'length'`. */
function toolChatShape(id, model) {
  const plain = chatShape(id, model);
  const callId = `call_${id.replace(/^chatcmpl-/, '')}`;
  const reader = new CallReader();
  const callDelta = (piece) => {
    if (piece.content !== undefined) return { content: piece.content };
    const call = piece.name !== undefined
      ? { index: 0, id: callId, type: 'function', function: { name: piece.name, arguments: '' } }
      : { index: 0, function: { arguments: piece.arguments } };
    return { tool_calls: [call] };
  };
  return {
    ...plain,
    whole: (result) => {
      const reply = plain.whole(result);
      const call = readCall(result.text);
      if (call) {
        reply.choices[0].message = { role: 'assistant', content: null, tool_calls: [{ id: callId, type: 'function', function: call }] };
        reply.choices[0].finish_reason = 'tool_calls';
      }
      return reply;
    },
    first: () => plain.chunk({ role: 'assistant' }),
    pieces: (text) => reader.push(text).map((piece) => plain.chunk(callDelta(piece))),
    last: (result) => plain.chunk({}, reader.call() ? 'tool_calls' : result.finishReason),
  };
}

/** Legacy text completions and their chunks. */
function completionShape(id, model) {
  const created = now();
  const chunk = (text, finish_reason = null) => ({
    id,
    object: 'text_completion',
    created,
    model,
    choices: [{ index: 0, text, finish_reason, logprobs: null }],
  });
  return {
    whole: (result) => ({ ...chunk(result.text, result.finishReason), usage: usage(result) }),
    pieces: (text) => [chunk(text)],
    last: (result) => chunk('', result.finishReason),
    usage: (result) => ({ id, object: 'text_completion', created, model, choices: [], usage: usage(result) }),
  };
}
