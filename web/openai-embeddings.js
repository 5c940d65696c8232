// `engine.embeddings.create({ input, encoding_format, dimensions })` in OpenAI's shape, as
// `POST /v1/embeddings` answers (native-runner/src/api/embeddings.rs): `input` a string, a list
// of strings, a list of token ids or a list of such lists; `encoding_format` `float` (default)
// or `base64` (little-endian f32). The vectors are the model's pooling, L2-normalised, made by
// the wasm `EmbeddingModel` (src/web/embedder.rs) from the same `embed::Embedder` the native
// runner uses.
import { BadRequestError } from './openai-request.js';

const MAX_INPUTS = 2048;

const isIds = (value) => Array.isArray(value) && value.every((id) => Number.isInteger(id) && id >= 0);

/** The inputs as a list of strings or token-id lists, checked as the HTTP API checks them. */
function embeddingInputs(input) {
  if (typeof input === 'string') return [input];
  if (!Array.isArray(input)) {
    throw new BadRequestError('input', 'must be a string, a list of strings, a list of token ids or a list of token-id lists');
  }
  if (!input.length) throw new BadRequestError('input', 'is an empty list');
  if (input.length > MAX_INPUTS) throw new BadRequestError('input', `has ${input.length} items, more than ${MAX_INPUTS}`);
  if (typeof input[0] === 'number') {
    if (!isIds(input)) throw new BadRequestError('input', 'a token-id list holds non-negative integers only');
    return [input];
  }
  const texts = typeof input[0] === 'string';
  input.forEach((item, index) => {
    const fits = texts ? typeof item === 'string' : isIds(item);
    if (!fits) throw new BadRequestError(`input[${index}]`, texts ? 'must be a string, as input[0] is' : 'must be a list of token ids, as input[0] is');
  });
  return input;
}

/** What `create` will run: the inputs and how to encode the vectors. */
export function embeddingPlan(body, info) {
  if (!body || typeof body !== 'object') throw new BadRequestError('body', 'must be an object');
  const known = new Set(['model', 'input', 'encoding_format', 'dimensions', 'user']);
  const unknown = Object.keys(body).find((key) => !known.has(key));
  if (unknown) throw new BadRequestError(unknown, 'is not a field of an embeddings request');
  const format = body.encoding_format ?? 'float';
  if (format !== 'float' && format !== 'base64') {
    throw new BadRequestError('encoding_format', `is \`${format}\`; it must be \`float\` or \`base64\``);
  }
  if (body.dimensions !== undefined && body.dimensions !== info.dimensions) {
    throw new BadRequestError('dimensions', `is ${body.dimensions}, but this model makes vectors of ${info.dimensions} only`);
  }
  return { inputs: embeddingInputs(body.input), format };
}

/** A vector as base64 of its little-endian f32 bytes. */
function base64Floats(vector) {
  const bytes = new Uint8Array(vector.length * 4);
  const view = new DataView(bytes.buffer);
  vector.forEach((value, i) => view.setFloat32(i * 4, value, true));
  let binary = '';
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary);
}

/** The engine's `{ embeddings, promptTokens }` as OpenAI's `CreateEmbeddingResponse`. */
export function embeddingResponse(result, plan, model) {
  return {
    object: 'list',
    data: result.embeddings.map((vector, index) => ({
      object: 'embedding',
      index,
      embedding: plan.format === 'base64' ? base64Floats(vector) : Array.from(vector),
    })),
    model,
    usage: { prompt_tokens: result.promptTokens, total_tokens: result.promptTokens },
  };
}

/** An engine error about one input (`input 2 has 600 tokens...`), named as `input[2]`. */
export function embeddingError(err, plan) {
  if (err?.kind !== 'options') return err;
  const match = /^(?:bad options: )?input (\d+) (.*)$/.exec(err.message);
  if (!match) return new BadRequestError('input', err.message.replace(/^bad options: (input: )?/, ''));
  const param = plan.inputs.length === 1 && !Array.isArray(plan.inputs[0]) ? 'input' : `input[${match[1]}]`;
  return new BadRequestError(param, match[2]);
}
