// Playwright drives Debian's headless Chromium (never a downloaded browser) with WebGPU on
// (SwiftShader without a GPU) against `runner serve`, which this config starts on a free port
// of 127.0.0.1 with a request log the tests read to count Range requests.
const { defineConfig } = require('@playwright/test');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const root = path.resolve(__dirname, '..');

/** The runner binary to test: $WEBSHARD_RUNNER, else the newest of test.sh's (ci), release and debug. */
function runnerBinary() {
  if (process.env.WEBSHARD_RUNNER) return process.env.WEBSHARD_RUNNER;
  const target = process.env.CARGO_TARGET_DIR || path.join(root, 'target');
  const built = ['ci', 'release', 'debug']
    .map((profile) => path.join(target, profile, 'runner'))
    .filter((file) => fs.existsSync(file))
    .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
  if (!built.length) throw new Error(`no runner binary under ${target}: build it with cargo build -p native-runner`);
  return built[0];
}

/** A free port, chosen once: workers inherit it through the environment. */
function freePort() {
  const script =
    "const s=require('net').createServer();s.listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})";
  return execFileSync(process.execPath, ['-e', script]).toString().trim();
}

process.env.WEBSHARD_RUNNER ||= runnerBinary();
process.env.WEBSHARD_E2E_PORT ||= freePort();
process.env.WEBSHARD_E2E_REQUEST_LOG ||= path.join(os.tmpdir(), `webshard-e2e-${process.env.WEBSHARD_E2E_PORT}.jsonl`);
process.env.WEBSHARD_MODELS ||= path.join(root, 'models');
const port = process.env.WEBSHARD_E2E_PORT;

module.exports = defineConfig({
  testDir: './tests',
  globalSetup: require.resolve('./global-setup.js'),
  // SwiftShader compiles and runs kernels on the CPU: minutes, not seconds.
  timeout: 15 * 60 * 1000,
  expect: { timeout: 60 * 1000 },
  workers: 1,
  fullyParallel: false,
  reporter: [['list']],
  // Failure screenshots land in test-results/ (CI keeps it as an artefact); specs that open
  // pages in contexts of their own take theirs in afterEach.
  outputDir: 'test-results',
  use: {
    baseURL: `http://127.0.0.1:${port}/`,
    screenshot: 'only-on-failure',
    browserName: 'chromium',
    launchOptions: {
      executablePath: process.env.WEBSHARD_CHROMIUM || '/usr/lib/chromium/chromium-headless-shell',
      args: ['--enable-unsafe-webgpu'],
    },
  },
  webServer: {
    command: [
      process.env.WEBSHARD_RUNNER,
      'serve',
      '--root', root,
      '--models', process.env.WEBSHARD_MODELS,
      '--host', '127.0.0.1',
      '--port', port,
      '--request-log', process.env.WEBSHARD_E2E_REQUEST_LOG,
    ].map((arg) => JSON.stringify(arg)).join(' '),
    url: `http://127.0.0.1:${port}/`,
    reuseExistingServer: false,
    timeout: 60 * 1000,
  },
});
