// Types of the package's main entry (web/openai.js): the OpenAI-shaped in-page API over a
// model running in a Web Worker. Written by hand: wasm-bindgen types the low-level `Engine` with
// `any` where it takes JavaScript objects; this file says what those objects hold.

/** A JSON value, as `JSON.parse` returns it. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** A JSON Schema: an object of schema keywords, or `true` / `false`. */
export type JsonSchema = boolean | { [keyword: string]: JsonValue };

/** Why an engine error happened, to pick a message: `not-found` (404), `network` (CORS or an
 * unreachable server), `not-gguf`, `bad-gguf`, `unsupported` (architecture or tensor type),
 * `no-webgpu`, `does-not-fit` (GPU memory), `options`, `aborted`... */
export type EngineErrorKind =
  | 'not-found'
  | 'http'
  | 'network'
  | 'changed'
  | 'not-gguf'
  | 'bad-gguf'
  | 'unsupported'
  | 'no-webgpu'
  | 'gpu'
  | 'device-lost'
  | 'does-not-fit'
  | 'options'
  | 'aborted'
  | 'busy'
  | 'cache'
  | 'not-loaded'
  | 'worker'
  | 'fleet'
  | 'other';

/** A failure of the engine (load, GPU, network); `kind` classifies it. */
export class EngineError extends Error {
  constructor(message: string, kind?: EngineErrorKind);
  readonly name: 'EngineError';
  readonly kind: EngineErrorKind;
}

/** A request the engine cannot run; `param` names the field (`messages[0].role`, `temperature`). */
export class BadRequestError extends Error {
  constructor(param: string, message: string);
  readonly name: 'BadRequestError';
  readonly param: string;
  readonly type: 'invalid_request_error';
  readonly kind: 'options';
}

/** One step of a model load, for `onProgress`. */
export interface LoadProgress {
  bytesDone: number;
  bytesTotal: number;
  mbPerSec: number;
  /** The tensor being read. */
  tensor: string;
}

/** What the OPFS cache did during the load. */
export interface CacheStats {
  hitRanges: number;
  hitBytes: number;
  fetchedRanges: number;
  fetchedBytes: number;
  corruptRanges: number;
  writeErrors: number;
  invalidated: boolean;
}

/** The loaded model and the device it runs on. */
export interface EngineInfo {
  /** A model that generates (chat, completions). */
  task: 'generation';
  url: string;
  adapter: string;
  backend: string;
  /** Kernel variant in use, e.g. `f16+subgroups`. */
  variant: string;
  f16: boolean;
  subgroups: boolean;
  /** Model architecture: `llama`, `qwen2`, `gemma3`... */
  arch: string;
  nLayers: number;
  vocab: number;
  /** Tokens of context the engine holds (prompt and reply together). */
  maxContext: number;
  bytesTotal: number;
  loadSeconds: number;
  networkRequests: number;
  networkBytes: number;
  cache: CacheStats | null;
  /** Loaded from the cache with the server unreachable. */
  offline: boolean;
  wasmMemoryBytes: number;
  wasmMemoryBefore: number;
  wasmMemoryPeak: number;
  /** How the chat template shows tools: `hermes` (`<tool_call>` tags: `tools` work), `none` or `other` (refused). */
  toolSupport: 'hermes' | 'none' | 'other';
  /** Seconds the load spent compiling the generation's kernels (`warmUp`), or null. */
  warmUpSeconds: number | null;
}

/** A loaded embedding model (an encoder such as `bert`, or a decoder loaded with `embeddings: true`). */
export interface EmbeddingModelInfo {
  task: 'embeddings';
  url: string;
  adapter: string;
  backend: string;
  variant: string;
  f16: boolean;
  subgroups: boolean;
  /** `bert`, `nomic-bert`, `llama`... */
  arch: string;
  /** Length of every embedding. */
  dimensions: number;
  vocab: number;
  /** Most tokens one input may have, special tokens included. */
  maxContext: number;
  /** How token states become one vector (the GGUF's `pooling_type`). */
  pooling: 'mean' | 'cls' | 'last';
  loadSeconds: number;
  networkRequests: number;
  networkBytes: number;
  wasmMemoryBefore: number;
  wasmMemoryPeak: number;
}

/** `createEngine`'s options: the model's URL, the load settings, and callbacks. */
export interface CreateEngineOptions {
  /** URL of a GGUF file, read with HTTP Range requests (another origin needs CORS). */
  model: string;
  /** Keep downloaded ranges in the origin's private file system (OPFS); default true. */
  cache?: boolean;
  /** Tokens of context to allocate; default 2048. */
  maxContext?: number;
  /** Bytes per Range request; default 4 MiB, at most 64 MiB. */
  chunkBytes?: number;
  /** Range requests in flight; default 4, 1 to 16. */
  inFlight?: number;
  /** Load the model to embed only (`embeddings.create`); encoder GGUFs (bert, nomic-bert)
   * always load so. A causal decoder's final hidden states are then pooled. */
  embeddings?: boolean;
  /** Use the f32 kernels even where the adapter has shader-f16. */
  disableF16?: boolean;
  disableSubgroups?: boolean;
  /** GPU memory the model may use, MiB; checked before any weights are downloaded. */
  gpuMemMib?: number;
  /** Compile the generation's kernels at load with a throwaway two-token generation, so the
   * first reply does not pay for them. Default: on a GPU, off on a CPU adapter (SwiftShader),
   * where running it takes seconds. */
  warmUp?: boolean;
  /** Greedy decoding steps kept in flight, 1 to 8; default 4 (a browser's GPU read-back
   * comes later than a step's time: with 2 the GPU waits on it). */
  decodeDepth?: number;
  onProgress?: (event: LoadProgress) => void;
  /** Aborts the load; `createEngine` then rejects with an `EngineError` of kind `aborted`. */
  signal?: AbortSignal;
  /** The GPU device was lost; the engine is rebuilt from the same URL. */
  onDeviceLost?: (event: { reason: string; message: string }) => void;
  onReinitialised?: (info: EngineInfo) => void;
  onReinitFailed?: (error: EngineError) => void;
}

export type ChatRole = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

export interface TextContentPart {
  type: 'text';
  text: string;
}

export interface ChatMessage {
  role: ChatRole;
  content: string | TextContentPart[] | null;
  name?: string;
  /** An assistant turn's calls, sent back for the round trip. */
  tool_calls?: ToolCall[];
  /** A `tool` turn: the id of the call it answers. */
  tool_call_id?: string;
}

/** A function the model may call; `parameters` (a JSON Schema) holds its arguments. */
export interface Tool {
  type: 'function';
  function: { name: string; description?: string; parameters?: JsonSchema; strict?: boolean };
}

/** `auto` (text or a call), `none` (text, tools not shown), `required` (a call), or one function. */
export type ToolChoice = 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };

/** A call the model made; `arguments` is JSON text valid under the function's `parameters`. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A streamed piece of a call: the first carries `id`, `type` and `function.name`, the next ones `function.arguments` text. */
export interface ToolCallDelta {
  index: 0;
  id?: string;
  type?: 'function';
  function: { name?: string; arguments: string };
}

export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name?: string; description?: string; schema: JsonSchema; strict?: boolean } };

export type FinishReason = 'stop' | 'length' | 'cancelled' | 'tool_calls';

/** Sampling fields both endpoints take; OpenAI's defaults where absent (temperature 1, top_p 1). */
interface SamplingParams {
  /** The loaded model's name (its file's stem) or URL; any other is refused. */
  model?: string;
  max_tokens?: number;
  /** 0 is greedy. */
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  repeat_penalty?: number;
  /** Without one, every request draws differently. */
  seed?: number;
  stop?: string | string[];
  n?: 1;
  frequency_penalty?: 0;
  presence_penalty?: 0;
  user?: string;
  /** webshard's extension: speculative decoding with prompt-lookup drafts (same output). */
  webshard_spec?: { type: 'lookup'; draft_max?: number };
}

export interface StreamOptions {
  /** A last chunk with `usage` and no choices. */
  include_usage?: boolean;
}

export interface ChatCompletionCreateParamsBase extends SamplingParams {
  messages: ChatMessage[];
  max_completion_tokens?: number;
  /** Constrains the reply to JSON (any object, or one a JSON Schema allows). */
  response_format?: ResponseFormat;
  /** Functions the model may call (models whose template shows tools: `info.toolSupport === 'hermes'`). */
  tools?: Tool[];
  tool_choice?: ToolChoice;
  /** Accepted; at most one call is made. */
  parallel_tool_calls?: boolean;
}

export interface ChatCompletionCreateParamsNonStreaming extends ChatCompletionCreateParamsBase {
  stream?: false;
}

export interface ChatCompletionCreateParamsStreaming extends ChatCompletionCreateParamsBase {
  stream: true;
  stream_options?: StreamOptions;
}

export type ChatCompletionCreateParams = ChatCompletionCreateParamsNonStreaming | ChatCompletionCreateParamsStreaming;

export interface CompletionCreateParamsBase extends SamplingParams {
  prompt: string | [string];
  /** Default 16, as OpenAI's. */
  max_tokens?: number;
}

export interface CompletionCreateParamsNonStreaming extends CompletionCreateParamsBase {
  stream?: false;
}

export interface CompletionCreateParamsStreaming extends CompletionCreateParamsBase {
  stream: true;
  stream_options?: StreamOptions;
}

export type CompletionCreateParams = CompletionCreateParamsNonStreaming | CompletionCreateParamsStreaming;

export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** Prompt tokens whose state was reused from the previous request. */
  prompt_tokens_details: { cached_tokens: number };
  /** With `webshard_spec`: draft tokens kept and rejected. */
  completion_tokens_details?: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  /** Seconds since the epoch. */
  created: number;
  model: string;
  choices: [{ index: 0; message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] }; finish_reason: FinishReason; logprobs: null }];
  usage: CompletionUsage;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  /** One choice; none in the usage chunk. */
  choices: { index: 0; delta: { role?: 'assistant'; content?: string; tool_calls?: ToolCallDelta[] }; finish_reason: FinishReason | null; logprobs: null }[];
  usage?: CompletionUsage;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: { index: 0; text: string; finish_reason: FinishReason | null; logprobs: null }[];
  usage?: CompletionUsage;
}

export interface RequestOptions {
  /** Stops the request after its current token; it then rejects with an `AbortError`. */
  signal?: AbortSignal;
  /** While the prompt is processed: prompt tokens done so far of those to do (tokens the
   * cache already held are not counted). Not part of OpenAI's client. */
  onPrefill?: (done: number, total: number) => void;
}

export interface ChatCompletions {
  create(body: ChatCompletionCreateParamsNonStreaming, options?: RequestOptions): Promise<ChatCompletion>;
  create(body: ChatCompletionCreateParamsStreaming, options?: RequestOptions): Promise<AsyncIterable<ChatCompletionChunk>>;
  create(body: ChatCompletionCreateParams, options?: RequestOptions): Promise<ChatCompletion | AsyncIterable<ChatCompletionChunk>>;
}

export interface Completions {
  create(body: CompletionCreateParamsNonStreaming, options?: RequestOptions): Promise<Completion>;
  create(body: CompletionCreateParamsStreaming, options?: RequestOptions): Promise<AsyncIterable<Completion>>;
  create(body: CompletionCreateParams, options?: RequestOptions): Promise<Completion | AsyncIterable<Completion>>;
}

export interface EmbeddingCreateParams {
  /** A text, texts, token ids, or lists of token ids; at most 2048 inputs. */
  input: string | string[] | number[] | number[][];
  /** The loaded model's name (its file's stem) or URL; any other is refused. */
  model?: string;
  /** `float` (default): number lists; `base64`: the little-endian f32 bytes. */
  encoding_format?: 'float' | 'base64';
  /** Only the model's own length is possible. */
  dimensions?: number;
  user?: string;
}

/** One input's vector, pooled as the model says and L2-normalised. */
export interface Embedding<E extends number[] | string = number[]> {
  object: 'embedding';
  index: number;
  embedding: E;
}

export interface CreateEmbeddingResponse<E extends number[] | string = number[]> {
  object: 'list';
  data: Embedding<E>[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

export interface Embeddings {
  create(body: EmbeddingCreateParams & { encoding_format?: 'float' }, options?: { signal?: AbortSignal }): Promise<CreateEmbeddingResponse<number[]>>;
  create(body: EmbeddingCreateParams & { encoding_format: 'base64' }, options?: { signal?: AbortSignal }): Promise<CreateEmbeddingResponse<string>>;
}

/** A loaded model behind the OpenAI-shaped API. Requests run one at a time, in call order.
 * A generation model answers `chat` and `completions`, an embedding model `embeddings`
 * (`info.task` says which); the others reject with an `EngineError` of kind `options`. */
export interface OpenAIEngine {
  /** The model's name: its file's stem. */
  readonly model: string;
  readonly url: string;
  readonly info: EngineInfo | EmbeddingModelInfo;
  readonly chat: { completions: ChatCompletions };
  readonly completions: Completions;
  readonly embeddings: Embeddings;
  /** Stops the running request after its current token. */
  abort(): void;
}

/** What `wrapEngine` needs: the worker engine's methods (or a fleet's). */
export interface LoadedEngine {
  info: { maxContext: number; url?: string; model?: string; toolSupport?: EngineInfo['toolSupport'] };
  generate(prompt: string, options: object, onToken?: (text: string) => void): Promise<object>;
  chat(messages: { role: string; content: string; tool_calls?: object[]; tool_call_id?: string }[], options: object, onToken?: (text: string) => void): Promise<object>;
  abort(): void;
  /** Embedding models only: `{ embeddings, promptTokens }` for `embeddings.create`. */
  embed?(inputs: string[] | number[][]): Promise<{ embeddings: number[][]; promptTokens: number }>;
}

/** Loads `options.model` in a new Web Worker on WebGPU; resolves once it is on the GPU. */
export function createEngine(options: CreateEngineOptions): Promise<OpenAIEngine>;

/** The OpenAI-shaped API over an engine already loaded. */
export function wrapEngine(engine: LoadedEngine, url?: string): OpenAIEngine;
