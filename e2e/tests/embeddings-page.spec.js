// Embeddings in the page: `engine.embeddings.create` (web/openai.js over the wasm
// `EmbeddingModel`, which runs the same `embed::Embedder` as `runner embed`) against
// llama.cpp's goldens (tests/goldens/embed/README.md), as tests/embed_fidelity.rs holds the
// native runs: token ids identical and cosine >= 0.999 for every input, for MiniLM (bert) and
// nomic-bert-tiny, on SwiftShader (no shader-f16: the f32 kernels). Then the demo page
// (web/embeddings.html) draws the similarity matrix of its sentences.
const { test, expect } = require('@playwright/test');
const fs = require('node:fs');
const path = require('node:path');

test.describe.configure({ mode: 'serial' });

const GOLDENS = path.join(__dirname, '..', '..', 'tests', 'goldens', 'embed');
const MIN_COSINE = 0.999;
const MODELS = [
  { golden: 'all-minilm-l6-v2-f16', file: 'all-MiniLM-L6-v2.f16.gguf', arch: 'bert' },
  { golden: 'nomic-bert-tiny-f16', file: 'nomic-bert-tiny.f16.gguf', arch: 'nomic-bert' },
];

function cosine(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  a.forEach((x, i) => {
    dot += x * b[i];
    na += x * x;
    nb += b[i] * b[i];
  });
  return dot / Math.sqrt(na * nb);
}

/** Loads `file` through createEngine in the page, embeds `texts` and tokenizes them there. */
async function embedInPage(page, file, texts) {
  return page.evaluate(async ({ url, texts }) => {
    const { createEngine } = await import('/openai.js');
    const engine = await createEngine({ model: url, cache: false });
    const reply = await engine.embeddings.create({ input: texts });
    const ids = [];
    for (const text of texts) ids.push(await engine.engine.tokenize(text));
    const tooLong = await engine.embeddings
      .create({ input: ['ok', 'word '.repeat(engine.info.maxContext + 8)] })
      .then(() => null, (err) => ({ name: err.name, param: err.param, message: err.message }));
    return { info: engine.info, reply, ids, tooLong };
  }, { url: `/models/${file}`, texts });
}

for (const model of MODELS) {
  test(`${model.arch}: embeddings.create equals llama.cpp's goldens`, async ({ page }) => {
    const golden = JSON.parse(fs.readFileSync(path.join(GOLDENS, `${model.golden}.json`), 'utf8'));
    expect(golden.model_file).toBe(model.file);
    const texts = golden.inputs.map((record) => record.text);
    await page.goto('/embeddings.html');
    const started = Date.now();
    const { info, reply, ids, tooLong } = await embedInPage(page, model.file, texts);
    expect(info.task).toBe('embeddings');
    expect(info.arch).toBe(model.arch);
    expect(info.pooling).toBe(golden.pooling);
    expect(reply.object).toBe('list');
    expect(reply.data).toHaveLength(texts.length);
    golden.inputs.forEach((record, i) => {
      expect(ids[i], `ids of ${JSON.stringify(record.text)}`).toEqual(record.ids);
      const { embedding, index, object } = reply.data[i];
      expect([index, object, embedding.length]).toEqual([i, 'embedding', info.dimensions]);
      const similarity = cosine(embedding, record.embedding);
      expect(similarity, `cosine for ${JSON.stringify(record.text)}`).toBeGreaterThanOrEqual(MIN_COSINE);
      expect(Math.abs(Math.hypot(...embedding) - 1)).toBeLessThan(1e-4);
    });
    const tokens = golden.inputs.reduce((sum, record) => sum + record.ids.length, 0);
    expect(reply.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });
    expect(tooLong).toMatchObject({ name: 'BadRequestError', param: 'input[1]' });
    const worst = Math.min(...golden.inputs.map((record, i) => cosine(reply.data[i].embedding, record.embedding)));
    console.log(`${model.arch} (${info.variant}): worst cosine ${worst.toFixed(7)} over ${texts.length} inputs, ${((Date.now() - started) / 1000).toFixed(1)} s`);
  });
}

test('the demo page draws the cosine-similarity matrix of its sentences', async ({ page }) => {
  await page.goto('/embeddings.html');
  await page.locator('#compare').click();
  await expect(page.locator('#status')).toHaveText(/^(drawn|error)/);
  await expect(page.locator('#status')).toHaveText(/^drawn: 4x4, \d+ tokens/);
  const matrix = await page.evaluate(() => window.similarity);
  expect(matrix).toHaveLength(4);
  matrix.forEach((row, i) => {
    expect(row[i]).toBeCloseTo(1, 4);
    row.forEach((value, j) => expect(value).toBeCloseTo(matrix[j][i], 6));
  });
  // The paraphrases (cat/kitten, markets/shares) are nearer each other than the other topic.
  expect(matrix[0][1]).toBeGreaterThan(matrix[0][2]);
  expect(matrix[2][3]).toBeGreaterThan(matrix[1][3]);
  const painted = await page.evaluate(() => {
    const canvas = document.getElementById('heatmap');
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let coloured = 0;
    for (let i = 0; i < pixels.length; i += 4) if (pixels[i + 3] > 0) coloured += 1;
    return coloured / (pixels.length / 4);
  });
  expect(painted).toBeGreaterThan(0.9);
});
