// What the fleet specs share: runner processes kept with their output, a `runner serve
// --fleet` of their own, and donor pages. Every wait has a limit: no test can hang.
const { spawn } = require('node:child_process');
const path = require('node:path');
const { expect } = require('@playwright/test');

const root = path.resolve(__dirname, '..', '..');

// Loopback-only machines (CI) gather no ICE candidates without the flag and the
// camera/microphone permissions every fleet context is granted (`newFleetContext`).
const FLEET_LAUNCH = {
  executablePath: process.env.WEBSHARD_CHROMIUM || '/usr/lib/chromium/chromium-headless-shell',
  args: ['--enable-unsafe-webgpu', '--allow-loopback-in-peer-connection'],
};

/** A child process whose output is kept, ended with the test (or by its own time limit). */
class Child {
  constructor(name, args, limitMs) {
    this.name = name;
    this.output = '';
    this.stdout = '';
    this.proc = spawn(process.env.WEBSHARD_RUNNER, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.proc.stdout.on('data', (data) => {
      this.stdout += data;
      this.output += data;
    });
    this.proc.stderr.on('data', (data) => (this.output += data));
    this.exited = new Promise((resolve) => this.proc.on('exit', (code, signal) => resolve({ code, signal })));
    this.timer = setTimeout(() => this.kill(), limitMs);
  }

  kill() {
    clearTimeout(this.timer);
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
  }

  /** Resolves to stdout once the process exits 0; rejects with its output otherwise. */
  async success() {
    const { code, signal } = await this.exited;
    clearTimeout(this.timer);
    if (code !== 0) throw new Error(`${this.name} exited with ${code ?? signal}:\n${this.output.slice(-4000)}`);
    return this.stdout;
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = require('node:net').createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function waitForHttp(url, limitMs) {
  const deadline = Date.now() + limitMs;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {
      // Not listening yet.
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`${url} did not answer within ${limitMs} ms`);
}

/** `runner serve --fleet token` on a free port: `{ server, base, signal, models }`. */
async function startFleetServer(token, limitMs) {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const models = process.env.WEBSHARD_MODELS || path.join(root, 'models');
  const server = new Child(
    'runner serve',
    ['serve', '--root', root, '--models', models, '--host', '127.0.0.1', '--port', String(port), '--fleet', token],
    limitMs,
  );
  await waitForHttp(`${base}/donor.html`, 60 * 1000);
  return { server, base, signal: `ws://127.0.0.1:${port}/signal`, models };
}

/** A browser context of its own, allowed to gather loopback ICE candidates. */
async function newFleetContext(browser, contexts) {
  const context = await browser.newContext();
  contexts.push(context);
  await context.grantPermissions(['camera', 'microphone']);
  return context;
}

/** A donor page in a context of its own, joined and probed: waiting for the coordinator's Assign. */
async function openDonorPage(browser, contexts, { base, signal, token, gpuMib }) {
  const context = await newFleetContext(browser, contexts);
  const page = await context.newPage();
  const errors = [];
  const dropped = [];
  page.on('pageerror', (err) => errors.push(err.message));
  page.on('console', (message) => {
    if (message.text().includes('dropped a malformed WebRTC signal')) dropped.push(message.text());
  });
  const query = new URLSearchParams({ signal, fleet: token, gpu_mem: String(gpuMib) });
  await page.goto(`${base}/donor.html?${query}`);
  await expect(page.locator('body'), errors.join('\n')).toHaveAttribute('data-phase', 'Joining', { timeout: 3 * 60 * 1000 });
  await expect(page.locator('#adapter')).toContainText('ms per layer');
  return { context, page, errors, dropped };
}

const donorStatus = (page) => page.evaluate(() => window.__donor.status);

module.exports = {
  FLEET_LAUNCH,
  Child,
  freePort,
  waitForHttp,
  startFleetServer,
  newFleetContext,
  openDonorPage,
  donorStatus,
};
