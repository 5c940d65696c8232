// Checks an OpenAI-shaped request body and maps it onto the engine's generate options, with
// the rules of the HTTP API (native-runner/src/api/validate.rs and types.rs): unknown or
// wrongly typed fields, values out of range and features the engine lacks (tools on a
// template without them) are refused with
// an error naming the field, before anything is sent to the worker.

/** A request the engine cannot run; `param` names the field, as OpenAI's 400s do. */
export class BadRequestError extends Error {
  constructor(param, message) {
    super(`${param}: ${message}`);
    this.name = 'BadRequestError';
    this.param = param;
    this.type = 'invalid_request_error';
    this.kind = 'options';
  }
}

// OpenAI's limit on stop sequences; the wasm engine's on one generation (options.rs).
const MAX_STOPS = 4;
const MAX_TOKENS = 1 << 16;
const COMPLETION_DEFAULT_MAX_TOKENS = 16;
const ROLES = { system: 'system', developer: 'system', user: 'user', assistant: 'assistant', tool: 'tool' };
// The HTTP API's limits on tools (native-runner/src/api/structured.rs).
const MAX_TOOLS = 64;
const FUNCTION_NAME = /^[A-Za-z0-9_-]{1,64}$/;

const SAMPLING_FIELDS = [
  'model', 'stream', 'stream_options', 'max_tokens', 'temperature', 'top_p', 'seed', 'stop',
  'frequency_penalty', 'presence_penalty', 'top_k', 'min_p', 'repeat_penalty', 'n', 'logit_bias', 'user',
  // webshard's extension (not OpenAI's): speculative decoding with prompt-lookup drafts.
  'webshard_spec',
];
const MAX_DRAFT = 15;
const CHAT_FIELDS = new Set([
  ...SAMPLING_FIELDS, 'messages', 'max_completion_tokens', 'logprobs', 'top_logprobs', 'response_format',
  'tools', 'tool_choice', 'parallel_tool_calls',
]);
const COMPLETION_FIELDS = new Set([...SAMPLING_FIELDS, 'prompt', 'logprobs', 'echo', 'suffix', 'best_of']);

const isObject = (value) => typeof value === 'object' && value !== null && !Array.isArray(value);
const present = (value) => value !== undefined && value !== null;

function onlyKnown(object, known, where) {
  for (const key of Object.keys(object)) {
    if (!known.has(key)) throw new BadRequestError(where ? `${where}.${key}` : key, 'unknown field');
  }
}

/** `body[param]` if present, checked to be of `type`; errors name it as `where.param`. */
function typed(body, param, type, where) {
  const value = body[param];
  if (!present(value)) return undefined;
  const ok = type === 'integer' ? Number.isSafeInteger(value) : typeof value === type && (type !== 'number' || Number.isFinite(value));
  const name = where ? `${where}.${param}` : param;
  if (!ok) throw new BadRequestError(name, `must be ${type === 'integer' ? 'an integer' : `a ${type}`}, got ${JSON.stringify(value)}`);
  return value;
}

function inRange(body, param, low, high) {
  const value = typed(body, param, 'number');
  if (value !== undefined && !(value >= low && value <= high)) {
    throw new BadRequestError(param, `must be between ${low} and ${high}, got ${value}`);
  }
  return value;
}

function positive(body, param) {
  const value = typed(body, param, 'integer');
  if (value !== undefined && (value < 1 || value > MAX_TOKENS)) {
    throw new BadRequestError(param, `must be between 1 and ${MAX_TOKENS}, got ${value}`);
  }
  return value;
}

function stopStrings(body) {
  const stop = body.stop;
  if (!present(stop)) return [];
  const list = typeof stop === 'string' ? [stop] : stop;
  if (!Array.isArray(list) || list.some((s) => typeof s !== 'string')) {
    throw new BadRequestError('stop', 'must be a string or a list of strings');
  }
  if (list.length > MAX_STOPS) throw new BadRequestError('stop', `at most ${MAX_STOPS} stop sequences`);
  return list;
}

/** The sampler and stop options both endpoints share; OpenAI's defaults where absent. */
function sampling(body) {
  const n = typed(body, 'n', 'integer');
  if (n !== undefined && n !== 1) throw new BadRequestError('n', 'only `n: 1` is supported (one choice per request)');
  for (const param of ['frequency_penalty', 'presence_penalty']) {
    const value = inRange(body, param, -2, 2);
    if (value) throw new BadRequestError(param, 'values other than 0 are not supported; use `repeat_penalty`');
  }
  if (present(body.logit_bias) && (!isObject(body.logit_bias) || Object.keys(body.logit_bias).length)) {
    throw new BadRequestError('logit_bias', '`logit_bias` is not supported');
  }
  typed(body, 'user', 'string');
  typed(body, 'model', 'string');
  const repeatPenalty = inRange(body, 'repeat_penalty', 0, 10);
  if (repeatPenalty === 0) throw new BadRequestError('repeat_penalty', 'must be above 0');
  const topK = typed(body, 'top_k', 'integer');
  if (topK !== undefined && topK < 0) throw new BadRequestError('top_k', `must be at least 0, got ${topK}`);
  const seed = typed(body, 'seed', 'integer');
  if (seed !== undefined && seed < 0) throw new BadRequestError('seed', `must be at least 0 in the page, got ${seed}`);
  return {
    temp: inRange(body, 'temperature', 0, 2) ?? 1,
    top_p: inRange(body, 'top_p', 0, 1) ?? 1,
    top_k: topK ?? 0,
    min_p: inRange(body, 'min_p', 0, 1) ?? 0,
    repeat_penalty: repeatPenalty ?? 1,
    repeat_last_n: 64,
    // Without a seed every request draws differently, as OpenAI's do.
    seed: seed ?? Math.floor(Math.random() * Number.MAX_SAFE_INTEGER),
    stop: stopStrings(body),
    ...speculation(body),
  };
}

/** `webshard_spec: { type: 'lookup', draft_max }` as the engine's `spec` and `draft_max`. */
function speculation(body) {
  const spec = body.webshard_spec;
  if (!present(spec)) return {};
  if (!isObject(spec)) throw new BadRequestError('webshard_spec', 'must be an object like { type: "lookup", draft_max: 8 }');
  onlyKnown(spec, new Set(['type', 'draft_max']), 'webshard_spec');
  if (spec.type !== 'lookup') throw new BadRequestError('webshard_spec.type', `must be "lookup", got ${JSON.stringify(spec.type)}`);
  const draftMax = typed(spec, 'draft_max', 'integer', 'webshard_spec');
  if (draftMax !== undefined && (draftMax < 1 || draftMax > MAX_DRAFT)) {
    throw new BadRequestError('webshard_spec.draft_max', `must be between 1 and ${MAX_DRAFT}, got ${draftMax}`);
  }
  return draftMax === undefined ? { spec: 'lookup' } : { spec: 'lookup', draft_max: draftMax };
}

function streaming(body) {
  const stream = typed(body, 'stream', 'boolean') ?? false;
  const options = body.stream_options;
  if (!present(options)) return { stream, includeUsage: false };
  if (!stream) throw new BadRequestError('stream_options', 'only allowed with `stream: true`');
  if (!isObject(options)) throw new BadRequestError('stream_options', 'must be an object');
  onlyKnown(options, new Set(['include_usage', 'include_obfuscation']), 'stream_options');
  return { stream, includeUsage: typed(options, 'include_usage', 'boolean', 'stream_options') ?? false };
}

/** `n` for the engine: the asked maximum, or (OpenAI's default) the rest of the context. */
function length(maxTokens, maxContext) {
  if (maxTokens !== undefined) return { n: maxTokens, fit_context: false };
  return { n: Math.min(maxContext, MAX_TOKENS), fit_context: true };
}

function messageText(content, index) {
  if (!present(content)) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw new BadRequestError(`messages[${index}].content`, 'must be a string or a list of parts');
  return content
    .map((part, partIndex) => {
      const where = `messages[${index}].content[${partIndex}]`;
      if (!isObject(part)) throw new BadRequestError(where, 'must be an object');
      onlyKnown(part, new Set(['type', 'text']), where);
      if (part.type !== 'text') {
        throw new BadRequestError(`${where}.type`, `content parts of type \`${part.type}\` are not supported (text only)`);
      }
      return typed(part, 'text', 'string', where) ?? '';
    })
    .join('');
}

/** An assistant turn's calls as templates print them: `arguments` parsed to JSON. */
function messageToolCalls(calls, where) {
  if (!Array.isArray(calls)) throw new BadRequestError(`${where}.tool_calls`, 'must be a list of tool calls');
  return calls.map((call, index) => {
    const at = `${where}.tool_calls[${index}]`;
    if (!isObject(call) || !isObject(call.function)) throw new BadRequestError(at, 'must be `{ id, type, function: { name, arguments } }`');
    const name = typed(call.function, 'name', 'string', `${at}.function`);
    const text = typed(call.function, 'arguments', 'string', `${at}.function`) ?? '{}';
    let args;
    try {
      args = JSON.parse(text);
    } catch {
      args = text;
    }
    return { id: typed(call, 'id', 'string', at) ?? '', type: 'function', function: { name, arguments: args } };
  });
}

function chatMessages(messages) {
  if (!Array.isArray(messages)) throw new BadRequestError('messages', 'must be a list of messages');
  if (!messages.length) throw new BadRequestError('messages', 'must not be empty');
  return messages.map((message, index) => {
    const where = `messages[${index}]`;
    if (!isObject(message)) throw new BadRequestError(where, 'must be an object');
    onlyKnown(message, new Set(['role', 'content', 'name', 'tool_calls', 'tool_call_id']), where);
    const role = ROLES[message.role];
    if (!role) {
      throw new BadRequestError(`${where}.role`, `must be one of ${Object.keys(ROLES).join(', ')}, got ${JSON.stringify(message.role)}`);
    }
    const out = { role, content: messageText(message.content, index) };
    if (present(message.tool_calls)) {
      if (role !== 'assistant') throw new BadRequestError(`${where}.tool_calls`, 'only assistant messages carry `tool_calls`');
      out.tool_calls = messageToolCalls(message.tool_calls, where);
    }
    const callId = typed(message, 'tool_call_id', 'string', where);
    if (role === 'tool' && callId === undefined) {
      throw new BadRequestError(`${where}.tool_call_id`, 'a `tool` message needs the `tool_call_id` of the call it answers');
    }
    if (role !== 'tool' && callId !== undefined) throw new BadRequestError(`${where}.tool_call_id`, 'only `tool` messages carry `tool_call_id`');
    if (callId !== undefined) out.tool_call_id = callId;
    return out;
  });
}

function checkTools(tools) {
  if (!Array.isArray(tools)) throw new BadRequestError('tools', 'must be a list of tools');
  if (tools.length > MAX_TOOLS) throw new BadRequestError('tools', `at most ${MAX_TOOLS} tools per request, got ${tools.length}`);
  const names = new Set();
  tools.forEach((tool, index) => {
    const where = `tools[${index}]`;
    if (!isObject(tool)) throw new BadRequestError(where, 'must be an object');
    onlyKnown(tool, new Set(['type', 'function']), where);
    if (tool.type !== 'function') throw new BadRequestError(`${where}.type`, `tool type ${JSON.stringify(tool.type)} is not supported (function only)`);
    if (!isObject(tool.function)) throw new BadRequestError(`${where}.function`, 'must be an object');
    onlyKnown(tool.function, new Set(['name', 'description', 'parameters', 'strict']), `${where}.function`);
    const name = tool.function.name;
    if (typeof name !== 'string' || !FUNCTION_NAME.test(name)) {
      throw new BadRequestError(`${where}.function.name`, `function names are 1 to 64 of a-z, A-Z, 0-9, _ and -; got ${JSON.stringify(name)}`);
    }
    if (names.has(name)) throw new BadRequestError(`${where}.function.name`, `the function \`${name}\` is defined twice`);
    names.add(name);
    typed(tool.function, 'description', 'string', `${where}.function`);
    const parameters = tool.function.parameters;
    if (present(parameters) && !isObject(parameters)) throw new BadRequestError(`${where}.function.parameters`, 'must be a JSON Schema (an object)');
  });
}

/** `tool_choice` read against `tools`: 'none', 'auto', 'required' or `{ function }`. */
function readChoice(choice, tools) {
  let read;
  if (!present(choice)) read = 'auto';
  else if (typeof choice === 'string') {
    if (!['none', 'auto', 'required'].includes(choice)) {
      throw new BadRequestError('tool_choice', `\`tool_choice\` ${JSON.stringify(choice)} is not one of none, auto, required or a function`);
    }
    read = choice;
  } else {
    if (!isObject(choice)) throw new BadRequestError('tool_choice', 'must be none, auto, required or `{ type: "function", function: { name } }`');
    if (choice.type !== 'function') throw new BadRequestError('tool_choice.type', `\`tool_choice.type\` ${JSON.stringify(choice.type)} is not \`function\``);
    const name = isObject(choice.function) ? choice.function.name : undefined;
    if (!tools.some((tool) => tool.function.name === name)) {
      throw new BadRequestError('tool_choice.function.name', `\`tool_choice\` names the function ${JSON.stringify(name)}, which is not in \`tools\``);
    }
    read = { function: name };
  }
  if (!tools.length && read !== 'none' && read !== 'auto') {
    throw new BadRequestError('tool_choice', '`tool_choice` asks for a call but `tools` is empty');
  }
  return read;
}

/** `options.tools` and `options.tool_call` for the engine, or null when no call can be made. */
function toolOptions(body, toolSupport) {
  const tools = body.tools ?? [];
  checkTools(tools);
  const choice = readChoice(body.tool_choice, tools);
  typed(body, 'parallel_tool_calls', 'boolean');
  if (!tools.length || choice === 'none') return null;
  if (toolSupport !== 'hermes') {
    const why = toolSupport === 'other'
      ? 'the chat template of this model writes tool calls in a format the page cannot constrain (only Hermes\' <tool_call> tags)'
      : 'the chat template of this model has no tools (it never shows them to the model); send no `tools` or `tool_choice: "none"`';
    throw new BadRequestError('tools', why);
  }
  return { tools, tool_call: { function: choice.function ?? null, or_text: choice === 'auto' } };
}

/** `response_format` as the engine's constraint: json_object is any object, json_schema its schema. */
function constraint(format) {
  if (!present(format)) return undefined;
  if (!isObject(format)) throw new BadRequestError('response_format', 'must be an object');
  if (format.type === 'text') {
    onlyKnown(format, new Set(['type']), 'response_format');
    return undefined;
  }
  if (format.type === 'json_object') {
    onlyKnown(format, new Set(['type']), 'response_format');
    return { type: 'json_schema', schema: { type: 'object' } };
  }
  if (format.type !== 'json_schema') {
    throw new BadRequestError('response_format.type', `must be text, json_object or json_schema, got ${JSON.stringify(format.type)}`);
  }
  onlyKnown(format, new Set(['type', 'json_schema']), 'response_format');
  const spec = format.json_schema;
  if (!isObject(spec)) throw new BadRequestError('response_format.json_schema', 'must be an object with a `schema`');
  onlyKnown(spec, new Set(['name', 'description', 'schema', 'strict']), 'response_format.json_schema');
  if (!isObject(spec.schema) && typeof spec.schema !== 'boolean') {
    throw new BadRequestError('response_format.json_schema.schema', 'must be a JSON Schema (an object)');
  }
  return { type: 'json_schema', schema: spec.schema };
}

function refuse(body, param, why) {
  if (present(body[param]) && body[param] !== false) throw new BadRequestError(param, why);
}

/** A checked chat request: `{ messages, options, toolCalls, stream, includeUsage }` for the
 * engine; `toolSupport` is the engine's `info.toolSupport` (`hermes`, `none` or `other`). */
export function chatPlan(body, { maxContext, toolSupport }) {
  if (!isObject(body)) throw new BadRequestError('body', 'the request must be an object');
  onlyKnown(body, CHAT_FIELDS);
  refuse(body, 'logprobs', '`logprobs` is not supported in the page');
  refuse(body, 'top_logprobs', '`top_logprobs` is not supported in the page');
  const messages = chatMessages(body.messages);
  const maxTokens = positive(body, 'max_completion_tokens') ?? positive(body, 'max_tokens');
  const options = { ...sampling(body), ...length(maxTokens, maxContext) };
  const spec = constraint(body.response_format);
  const tools = toolOptions(body, toolSupport);
  if (spec && tools) {
    throw new BadRequestError('response_format', '`response_format` and a possible tool call cannot be combined; send `tool_choice: "none"` or no `response_format`');
  }
  if (spec) options.constraint = spec;
  if (tools) Object.assign(options, tools);
  return { messages, options, toolCalls: Boolean(tools), ...streaming(body) };
}

/** A checked legacy completion request: `{ prompt, options, stream, includeUsage }`. */
export function completionPlan(body) {
  if (!isObject(body)) throw new BadRequestError('body', 'the request must be an object');
  onlyKnown(body, COMPLETION_FIELDS);
  refuse(body, 'echo', '`echo` is not supported');
  refuse(body, 'logprobs', '`logprobs` is not supported in the page');
  if (typeof body.suffix === 'string' && body.suffix) throw new BadRequestError('suffix', '`suffix` is not supported');
  const bestOf = typed(body, 'best_of', 'integer');
  if (bestOf !== undefined && bestOf !== 1) throw new BadRequestError('best_of', 'only `best_of: 1` is supported');
  let prompt = body.prompt;
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string') [prompt] = prompt;
  if (typeof prompt !== 'string') throw new BadRequestError('prompt', 'must be a string (token ids are not supported in the page)');
  if (!prompt) throw new BadRequestError('prompt', 'must not be empty');
  const maxTokens = positive(body, 'max_tokens') ?? COMPLETION_DEFAULT_MAX_TOKENS;
  return { prompt, options: { ...sampling(body), n: maxTokens }, ...streaming(body) };
}
