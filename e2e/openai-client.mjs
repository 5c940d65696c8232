// The official `openai` npm client against `runner serve -m` (run by
// native-runner/tests/api_clients.rs): a greedy chat, whole and streamed, must equal
// `runner generate --chat --temp 0`.
// Usage: node openai-client.mjs BASE_URL API_KEY MODEL REFERENCE_JSON
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const PROMPT = 'What is the capital of France?';
const MAX_TOKENS = 8;

const [base, apiKey, model, referenceJson] = process.argv.slice(2);
const reference = JSON.parse(referenceJson);
const client = new OpenAI({ baseURL: `${base}v1`, apiKey, maxRetries: 0 });
const messages = [{ role: 'user', content: PROMPT }];
const finish = reference.ids.length === MAX_TOKENS ? 'length' : 'stop';

const whole = await client.chat.completions.create({
  model, messages, temperature: 0, max_tokens: MAX_TOKENS,
});
assert.equal(whole.choices[0].message.content, reference.text);
assert.equal(whole.choices[0].finish_reason, finish);
assert.equal(whole.usage.completion_tokens, reference.ids.length);

const stream = await client.chat.completions.create({
  model, messages, temperature: 0, max_tokens: MAX_TOKENS, stream: true,
});
let text = '';
let streamedFinish = null;
for await (const chunk of stream) {
  for (const choice of chunk.choices) {
    text += choice.delta.content ?? '';
    streamedFinish = choice.finish_reason ?? streamedFinish;
  }
}
assert.equal(text, reference.text);
assert.equal(streamedFinish, finish);
console.log('openai node client: all checks passed');
