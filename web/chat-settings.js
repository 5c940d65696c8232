// The chat form's settings as request fields: the sampler boxes, each checked so that a bad
// value gets a message naming the field, and the JSON schema box as a `response_format`.

import { EngineError } from './engine-client.js';

const $ = (id) => document.getElementById(id);

export const SAMPLER_FIELDS = ['n', 'temp', 'top_k', 'top_p', 'min_p', 'repeat_penalty', 'seed'];
// Each sampler field's label, whether it must be whole, and its range: checked here so a bad
// value gets a message naming the field, not the engine's deserialiser wording.
const SAMPLER_RULES = {
  n: { label: 'max tokens', integer: true, min: 1, max: 65536 },
  temp: { label: 'temperature', min: 0, max: 100 },
  top_k: { label: 'top-k', integer: true, min: 0, max: 1e6 },
  top_p: { label: 'top-p', min: 0, max: 1 },
  min_p: { label: 'min-p', min: 0, max: 1 },
  repeat_penalty: { label: 'repeat penalty', min: 0, max: 100, above: true },
  seed: { label: 'seed', integer: true, min: 0, max: 2 ** 32 - 1 },
};

/** The sampler settings; throws an `options` error naming the first field out of range. */
export function samplerOptions() {
  const options = {};
  for (const field of SAMPLER_FIELDS) {
    const text = $(field).value.trim();
    if (text === '') continue;
    options[field] = checkedSetting(field, Number(text), text);
  }
  return options;
}

function checkedSetting(field, value, text) {
  const rule = SAMPLER_RULES[field];
  const whole = rule.integer ? 'a whole number ' : 'a number ';
  const range = `${whole}from ${rule.min}${rule.above ? ' (exclusive)' : ''} to ${rule.max}`;
  const bad =
    !Number.isFinite(value) ||
    (rule.integer && !Number.isInteger(value)) ||
    value < rule.min ||
    (rule.above && value === rule.min) ||
    value > rule.max;
  if (bad) throw new EngineError(`"${rule.label}" must be ${range}, not ${text}.`, 'options');
  return value;
}

/** The JSON schema box as a `response_format`, or undefined when it is empty. */
export function responseFormat() {
  const text = $('json-schema').value.trim();
  if (!text) return undefined;
  try {
    return { type: 'json_schema', json_schema: { name: 'reply', schema: JSON.parse(text) } };
  } catch (err) {
    throw new EngineError(`JSON schema: the box does not hold JSON (${err.message})`, 'options');
  }
}

/** The sampler settings and the schema box as a streamed chat.completions request's fields. */
export function chatRequest(options) {
  const { n, temp, ...rest } = options;
  const request = { ...rest, stream: true, stream_options: { include_usage: true } };
  if (n !== undefined) request.max_tokens = n;
  if (temp !== undefined) request.temperature = temp;
  const format = responseFormat();
  if (format) request.response_format = format;
  return request;
}
