// The goldens' fidelity rules (../shared/goldens/README.md) in the browser for issue 13's small
// models (tests/goldens, built by .ci/build_tiny_model.sh and .ci/build_requant_tiny.sh),
// teacher-forced through the wasm build's Engine.score on SwiftShader (f32: it has no f16). Few
// steps of one record per model: the native tests (tests/fidelity*.rs) check every record.
const fs = require('node:fs');
const path = require('node:path');
const { test, expect } = require('@playwright/test');

const root = path.resolve(__dirname, '..', '..');
const MODELS = [
  ['tiny-qwen3-f16', 'tiny-qwen3.F16.gguf'],
  ['tiny-lfm2-f16', 'tiny-lfm2.F16.gguf'],
  ['tiny-llama3-f16', 'tiny-llama3.F16.gguf'],
  ['tiny-phi3-f16', 'tiny-phi3.F16.gguf'],
  ['tiny-llama3-mixq', 'tiny-llama3.mixq.gguf'],
];
const STEPS = 6;
const MARGIN = 0.5;
const MEAN_LIMIT = 0.35;
const MAX_LIMIT = 2.0;

test.describe.configure({ mode: 'serial' });

let page;

test.beforeAll(async ({ browser }) => {
  page = await browser.newPage();
  page.on('console', (message) => console.log(`[page ${message.type()}] ${message.text()}`));
  await page.goto('/');
});

test.afterAll(async () => page?.close());

/** In the page: loads `url`, scores `ids` and returns, for each row from `from` on, its argmax
 * and its logits at the golden top-5 ids (`top`), never the whole vocabulary's. */
async function scoreInPage({ url, ids, from, top }) {
  const wasm = await import('/pkg/webshard.js');
  await wasm.default();
  const engine = await wasm.Engine.load(url, {});
  try {
    const flat = await engine.score(ids, from);
    const vocab = flat.length / top.length;
    return top.map((want, i) => {
      const row = flat.subarray(i * vocab, (i + 1) * vocab);
      let best = 0;
      for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
      return { argmax: best, logits: want.map((id) => row[id]) };
    });
  } finally {
    engine.free();
  }
}

for (const [name, file] of MODELS) {
  test(`${name}: teacher-forced logits within llama.cpp's fidelity limits in the browser`, async () => {
    const goldens = path.join(root, 'tests', 'goldens', `${name}.generate.json`);
    const record = JSON.parse(fs.readFileSync(goldens, 'utf8')).records[0];
    const steps = record.steps.slice(0, STEPS);
    const ids = [...record.prompt_ids, ...steps.slice(0, -1).map((s) => s.id)];
    const top = steps.map((s) => s.top5.map(([id]) => id));
    const started = Date.now();
    const rows = await page.evaluate(scoreInPage, {
      url: `/models/${file}`, ids, from: record.prompt_ids.length - 1, top,
    });
    const errors = [];
    steps.forEach((step, i) => {
      const margin = step.top5[0][1] - step.top5[1][1];
      if (margin > MARGIN) expect(rows[i].argmax, `${name} step ${i} (margin ${margin.toFixed(3)})`).toBe(step.top5[0][0]);
      step.top5.forEach(([, logit], k) => errors.push(Math.abs(rows[i].logits[k] - logit)));
    });
    const mean = errors.reduce((a, b) => a + b, 0) / errors.length;
    const max = Math.max(...errors);
    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    console.log(`fidelity ${name} in the browser: top-5 logit error mean ${mean.toFixed(4)} max ${max.toFixed(4)} over ${errors.length} values (${seconds} s)`);
    expect(mean).toBeLessThanOrEqual(MEAN_LIMIT);
    expect(max).toBeLessThanOrEqual(MAX_LIMIT);
  });
}
