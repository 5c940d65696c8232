// What the specs share: the model and prompt, the goldens' fidelity rule, the server's
// request log, and a few page helpers.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const root = path.resolve(__dirname, '..', '..');
const SMOLLM2 = 'SmolLM2-135M-Instruct.Q4_1.gguf';
// Issue 13's Qwen3 twin (.ci/build_tiny_model.sh): ~10x SmolLM2's tokens per second on
// SwiftShader, for the specs whose claim is the API, not the model's text.
const TINY_QWEN3 = 'tiny-qwen3.F16.gguf';
const MODEL_URL = `/models/${SMOLLM2}`;
const PROMPT = 'The capital of France is';
// Short: SwiftShader decodes a few tokens per second at best.
const TOKENS = 8;
// The loader's default chunk (model/loader.rs): the memory budget is 64 MiB plus one chunk.
const CHUNK_BYTES = 4 << 20;

const expectedFile = () => path.join(os.tmpdir(), `webshard-e2e-${process.env.WEBSHARD_E2E_PORT}-native.json`);

/** runner generate --temp 0 --json, as global-setup.js recorded it. */
const nativeResult = () => JSON.parse(fs.readFileSync(expectedFile(), 'utf8'));

/** Where `model`'s goldens are: llama.cpp's for SmolLM2 (../shared/goldens beside the checkout,
 * or $WEBSHARD_GOLDENS), the repository's for the tiny twin (tests/goldens, made the same way). */
const GOLDEN_FILES = {
  [SMOLLM2]: () =>
    path.join(process.env.WEBSHARD_GOLDENS || path.join(root, '..', 'shared', 'goldens'), 'smollm2-135m-instruct-q4_1.generate.json'),
  [TINY_QWEN3]: () => path.join(root, 'tests', 'goldens', 'tiny-qwen3-f16.generate.json'),
};

/** `model`'s golden records. */
function goldenRecords(model) {
  const file = GOLDEN_FILES[model]();
  return { file, records: JSON.parse(fs.readFileSync(file, 'utf8')).records };
}

/** The goldens' record for PROMPT. */
function goldenRecord(model = SMOLLM2) {
  const { file, records } = goldenRecords(model);
  const record = records.find((r) => r.prompt === PROMPT);
  if (!record) throw new Error(`no golden record for ${JSON.stringify(PROMPT)} in ${file}`);
  return record;
}

/** The goldens' chat record: its single user message is what the native runner's --chat sends. */
function chatGolden(model = SMOLLM2) {
  const { file, records } = goldenRecords(model);
  const record = records.find((r) => r.kind === 'chat');
  if (!record || record.messages.length !== 1) throw new Error(`no one-message chat record in ${file}`);
  return record;
}

/** `runner generate [--chat] --temp 0 --json` on `file` (SmolLM2 unless named). */
function nativeGenerate(prompt, n, chat, file = SMOLLM2) {
  const model = path.join(process.env.WEBSHARD_MODELS, file);
  const out = execFileSync(
    process.env.WEBSHARD_RUNNER,
    ['generate', '-m', model, '-p', prompt, ...(chat ? ['--chat'] : []), '-n', String(n), '--temp', '0', '--json', '--quiet'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 10 * 60 * 1000 },
  );
  return JSON.parse(out.trim().split('\n').pop());
}

/** Steps before the first whose golden margin (top-1 minus top-2 logit) is 0.5 or less: free-running
 * greedy output must be identical up to there (../shared/goldens/README.md). */
function stepsBeforeNearTie(record) {
  const index = record.steps.findIndex((s) => s.top5[0][1] - s.top5[1][1] <= 0.5);
  return index === -1 ? record.steps.length : index;
}

/** Parsed lines of the server's request log. */
function requestLog() {
  return fs
    .readFileSync(process.env.WEBSHARD_E2E_REQUEST_LOG, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line));
}

/** Requests for `urlPath` logged after `mark` (a previous `requestLog().length`). */
function requestsSince(mark, urlPath) {
  return requestLog()
    .slice(mark)
    .filter((r) => r.path === urlPath);
}

/** `bytes=FIRST-LAST` as [offset, length]. */
function parseRange(header) {
  const [first, last] = header.replace('bytes=', '').split('-').map(Number);
  return [first, last - first + 1];
}

/** Waits for an autorun to finish and returns window.__webshard_last. */
async function autorunResult(page) {
  await page.waitForFunction(() => document.body.dataset.done === '1', null, { timeout: 14 * 60 * 1000 });
  return page.evaluate(() => window.__webshard_last);
}

module.exports = {
  SMOLLM2,
  TINY_QWEN3,
  MODEL_URL,
  PROMPT,
  TOKENS,
  CHUNK_BYTES,
  expectedFile,
  nativeResult,
  goldenRecord,
  chatGolden,
  nativeGenerate,
  stepsBeforeNearTie,
  requestLog,
  requestsSince,
  parseRange,
  autorunResult,
};
