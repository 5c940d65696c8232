// Tool calls through the in-page API (web/openai.js): on tiny-qwen3 (Qwen3's layout with
// seeded random weights and the Qwen2.5 chat template, which shows tools in Hermes'
// <tool_call> tags; real Qwen2.5 makes the same round trip natively in
// native-runner/tests/api_tools.rs, at a tenth of SwiftShader's cost) one round trip: `tool_choice: required` gives a call whose
// arguments validate against the function's schema (ajv), streamed as OpenAI's tool-call
// deltas; the tool's result sent back with `tool_choice: auto` gives a text answer. On SmolLM2
// (a template without tools) `tools` are refused naming the field. SwiftShader is slow: the
// call ends where its grammar does, the answer is a few tokens, and the answer turn reuses
// the cached conversation, so only the tool's result is prefilled again.
const { test, expect } = require('@playwright/test');
const Ajv = require('ajv');
const { MODEL_URL } = require('./shared.js');

test.describe.configure({ mode: 'serial' });

const QWEN_URL = '/models/tiny-qwen3.F16.gguf';
const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 20 } },
      required: ['city'],
      additionalProperties: false,
    },
  },
};
const QUESTION = [{ role: 'user', content: 'What is the weather in Paris?' }];

/** A page with `url` loaded through the demo (openai.js's createEngine). */
async function loadedPage(browser, url) {
  const page = await browser.newPage();
  page.on('console', (message) => console.log(`[page ${message.type()}] ${message.text()}`));
  await page.goto('/');
  await page.waitForFunction(() => window.__webshard);
  const started = Date.now();
  await page.evaluate((model) => window.__webshard.load(model).then(() => true), url);
  console.log(`load of ${url} on SwiftShader took ${((Date.now() - started) / 1000).toFixed(0)} s`);
  return page;
}

/** `chat.completions.create(body)` in the page; a stream is collected. */
function create(page, body) {
  return page.evaluate(async (body) => {
    try {
      const out = await window.__webshard.api().chat.completions.create(body);
      if (!body.stream) return { out };
      const chunks = [];
      for await (const chunk of out) chunks.push(chunk);
      return { chunks };
    } catch (err) {
      return { error: { name: err.name, message: err.message, param: err.param } };
    }
  }, body);
}

test('tool-calls.js reads a call the same whole and in streamed pieces of any size', async ({ page }) => {
  await page.goto('/');
  const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris\\"", "days": [1, {"a": 2}]}}\n</tool_call>';
  const out = await page.evaluate(async (CALL) => {
    const { CallReader, readCall } = await import('/tool-calls.js');
    const streamed = [1, 2, 3, 7, 500].map((size) => {
      const reader = new CallReader();
      const pieces = [];
      for (let at = 0; at < CALL.length; at += size) pieces.push(...reader.push(CALL.slice(at, at + size)));
      return { pieces, call: reader.call() };
    });
    const text = new CallReader();
    const textPieces = [...text.push(''), ...text.push('Hi'), ...text.push(' <b>')];
    return { whole: readCall(CALL), prose: readCall('Sunny, 18 degrees.'), cut: readCall(CALL.slice(0, 40)), streamed, textPieces, textCall: text.call() };
  }, CALL);
  expect(out.whole).toEqual({ name: 'get_weather', arguments: '{"city": "Pa}ris\\"", "days": [1, {"a": 2}]}' });
  expect(out.prose).toBeNull();
  expect(out.cut).toBeNull();
  for (const { pieces, call } of out.streamed) {
    expect(pieces[0]).toEqual({ name: 'get_weather' });
    expect(pieces.slice(1).map((piece) => piece.arguments).join('')).toBe(out.whole.arguments);
    expect(call).toEqual(out.whole);
  }
  expect(out.textPieces).toEqual([{ content: 'Hi' }, { content: ' <b>' }]);
  expect(out.textCall).toBeNull();
});

test('tools on a template without tools are refused naming `tools`; tool_choice none passes', async ({ browser }) => {
  const page = await loadedPage(browser, MODEL_URL);
  const refused = await create(page, { messages: QUESTION, tools: [WEATHER], max_tokens: 2 });
  expect(refused.error).toMatchObject({ name: 'BadRequestError', param: 'tools' });
  expect(refused.error.message).toMatch(/has no tools/);
  const unknown = await create(page, { messages: QUESTION, tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } });
  expect(unknown.error).toMatchObject({ name: 'BadRequestError', param: 'tool_choice.function.name' });
  // `none` drops the tools before the engine sees them: a plain chat (checked on the plan, as
  // a generation would only repeat openai-page.spec.js at SwiftShader's cost).
  const none = await page.evaluate(async (body) => {
    const { chatPlan } = await import('/openai-request.js');
    const { maxContext, toolSupport } = window.__webshard.api().info;
    const plan = chatPlan(body, { maxContext, toolSupport });
    return { toolSupport, toolCalls: plan.toolCalls, tools: plan.options.tools ?? null };
  }, { messages: QUESTION, tools: [WEATHER], tool_choice: 'none', max_tokens: 1 });
  expect(none).toEqual({ toolSupport: 'none', toolCalls: false, tools: null });
  await page.close();
});

test('tiny-qwen3: a required call streams, validates against its schema, and the result comes back as an answer', async ({ browser }) => {
  test.setTimeout(12 * 60 * 1000);
  const page = await loadedPage(browser, QWEN_URL);
  const started = Date.now();
  const body = { messages: QUESTION, tools: [WEATHER], tool_choice: 'required', temperature: 0, max_tokens: 40, stream: true };
  const { chunks, error } = await create(page, body);
  expect(error).toBeUndefined();
  const deltas = chunks.flatMap((chunk) => chunk.choices.map((choice) => choice.delta));
  expect(deltas[0]).toEqual({ role: 'assistant' });
  const calls = deltas.flatMap((delta) => delta.tool_calls ?? []);
  expect(calls[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'get_weather', arguments: '' } });
  expect(calls[0].id).toMatch(/^call_/);
  expect(calls.slice(1).every((call) => call.id === undefined && call.function.name === undefined)).toBe(true);
  expect(deltas.some((delta) => delta.content)).toBe(false);
  expect(chunks.at(-1).choices[0].finish_reason).toBe('tool_calls');
  const args = calls.map((call) => call.function.arguments).join('');
  const validate = new Ajv({ allErrors: true }).compile(WEATHER.function.parameters);
  expect(validate(JSON.parse(args)), `${args}: ${new Ajv().errorsText(validate.errors)}`).toBe(true);
  console.log(`call: get_weather(${args}) in ${((Date.now() - started) / 1000).toFixed(0)} s`);

  const call = { id: calls[0].id, type: 'function', function: { name: 'get_weather', arguments: args } };
  const answer = await create(page, {
    messages: [
      ...QUESTION,
      { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"city": "Paris", "sky": "sunny", "celsius": 18}' },
    ],
    tools: [WEATHER],
    tool_choice: 'auto',
    temperature: 0,
    max_tokens: 4,
  });
  expect(answer.error).toBeUndefined();
  const [choice] = answer.out.choices;
  console.log(`answer: ${JSON.stringify(choice.message.content)} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  // Free to call again (`auto`), the model answers in text with the result in its context.
  expect(choice.finish_reason).toBe('length');
  expect(typeof choice.message.content).toBe('string');
  expect(choice.message.content.trim().length).toBeGreaterThan(0);
  expect(choice.message.tool_calls).toBeUndefined();
  expect(answer.out.usage.completion_tokens).toBe(4);
  await page.close();
});
