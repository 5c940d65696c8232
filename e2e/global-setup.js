// Before the tests: the native runner's greedy ids for the prompt the browser tests use, so
// the page can be compared with `runner generate --temp 0 --json` on this machine.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { SMOLLM2, PROMPT, TOKENS, expectedFile } = require('./tests/shared.js');

module.exports = async () => {
  fs.writeFileSync(process.env.WEBSHARD_E2E_REQUEST_LOG, '');
  const model = path.join(process.env.WEBSHARD_MODELS, SMOLLM2);
  if (!fs.existsSync(model)) throw new Error(`model missing: ${model} (run .ci/fetch_models.py)`);
  const out = execFileSync(
    process.env.WEBSHARD_RUNNER,
    ['generate', '-m', model, '-p', PROMPT, '-n', String(TOKENS), '--temp', '0', '--json', '--quiet'],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 10 * 60 * 1000 },
  );
  const native = JSON.parse(out.trim().split('\n').pop());
  fs.writeFileSync(expectedFile(), JSON.stringify(native));
};
