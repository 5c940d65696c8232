// The npm package as a user installs it: .ci/build-npm.sh packs it (`npm pack`) and installs
// the tarball into two example apps, e2e/examples/plain-esm (an import map, no bundler) and
// e2e/examples/vite (TypeScript checked against the package's types, then `vite build`). Each
// app is served alone by a bare static server (no /pkg/, no COOP/COEP), loads the Qwen3 twin
// (the claim is the package, not the model's text) from `runner serve` on another origin (CORS),
// and gives the greedy chat reply of
// `runner generate --chat --temp 0`: streamed through the app's form, and whole through
// engine.chat.completions.create. One page and one model load per app. Vite's dev server, too,
// serves the app so that the engine loads (no generation: the build covers that).
const { test, expect } = require('@playwright/test');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { TINY_QWEN3, chatGolden, nativeGenerate, stepsBeforeNearTie } = require('./shared.js');
const { startStaticServer } = require('./static-server.js');

test.describe.configure({ mode: 'serial' });

const EXAMPLES = path.join(__dirname, '..', 'examples');
const WEB = path.join(__dirname, '..', '..', 'web');
const CHAT = chatGolden(TINY_QWEN3);
const MESSAGES = CHAT.messages;
// Greedy output is fixed only up to the reference's first near-tie (../shared/goldens/README.md).
const CHAT_TOKENS = stepsBeforeNearTie(CHAT);
const MODEL_URL = `http://127.0.0.1:${process.env.WEBSHARD_E2E_PORT}/models/${TINY_QWEN3}`;
const MODEL_NAME = TINY_QWEN3.replace(/\.gguf$/, '');
const READY = /^ready: tiny-qwen3\.F16 \(qwen3\)/;

const APPS = [
  { name: 'plain ESM page', dir: 'plain-esm', root: 'plain-esm', wasm: /^\/node_modules\/webshard\/pkg\/webshard_bg\.wasm$/ },
  { name: 'Vite build', dir: 'vite', root: 'vite/dist', built: true, wasm: /^\/assets\/webshard_bg-[\w-]+\.wasm$/ },
];

/** Fails unless build-npm.sh installed the package built from this checkout's web/. */
function expectFreshInstall(app) {
  const installed = path.join(EXAMPLES, app.dir, 'node_modules', 'webshard');
  const hint = 'run .ci/build-wasm.sh and .ci/build-npm.sh';
  for (const file of ['openai.js', 'openai-request.js', 'tool-calls.js', 'engine-client.js', 'worker.js']) {
    const copy = path.join(installed, file);
    if (!fs.existsSync(copy)) throw new Error(`${copy} is missing: ${hint}`);
    if (fs.readFileSync(copy, 'utf8') !== fs.readFileSync(path.join(WEB, file), 'utf8')) {
      throw new Error(`${copy} differs from web/${file}: ${hint}`);
    }
  }
  const index = path.join(EXAMPLES, app.root, 'index.html');
  const stale = () => fs.statSync(index).mtimeMs < fs.statSync(path.join(installed, 'package.json')).mtimeMs;
  if (!fs.existsSync(index) || (app.built && stale())) {
    throw new Error(`${index} is missing or older than the installed package: ${hint}`);
  }
}

let native;

test.beforeAll(() => {
  expect(CHAT_TOKENS).toBeGreaterThan(1);
  native = nativeGenerate(MESSAGES[0].content, CHAT_TOKENS, true, TINY_QWEN3);
});

for (const app of APPS) {
  test.describe(app.name, () => {
    let server;
    let page;

    test.beforeAll(async ({ browser }) => {
      expectFreshInstall(app);
      server = await startStaticServer(path.join(EXAMPLES, app.root));
      page = await browser.newPage();
      page.on('console', (message) => console.log(`[${app.dir} ${message.type()}] ${message.text()}`));
    });

    test.afterAll(async () => {
      await page?.close();
      await server?.close();
    });

    test('createEngine loads the model in the package worker, the wasm from the app', async () => {
      const started = Date.now();
      await page.goto(`${server.origin}/?model=${encodeURIComponent(MODEL_URL)}`);
      await expect(page.locator('#status')).toHaveText(/^(ready|error)/, { timeout: 10 * 60 * 1000 });
      console.log(`${app.name}: ${await page.locator('#status').textContent()} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
      await expect(page.locator('#status')).toHaveText(READY);
      const workers = page.workers().map((worker) => worker.url());
      expect(workers).toHaveLength(1);
      expect(workers[0].startsWith(`${server.origin}/`)).toBe(true);
      expect(server.served.filter((p) => app.wasm.test(p))).toHaveLength(1);
    });

    test('a streamed reply through the form equals runner generate --chat --temp 0', async () => {
      await page.fill('#prompt', MESSAGES[0].content);
      await page.fill('#max-tokens', String(CHAT_TOKENS));
      await page.click('#send');
      await expect(page.locator('#send')).toBeEnabled({ timeout: 5 * 60 * 1000 });
      const reply = await page.locator('#reply').textContent();
      console.log(`${app.name}: ${JSON.stringify(reply)}; native: ${JSON.stringify(native.text)}`);
      expect(reply).toBe(native.text);
    });

    test('chat.completions.create gives the same reply whole, with usage', async () => {
      const out = await page.evaluate(
        ({ messages, max_tokens }) => window.engine.chat.completions.create({ messages, max_tokens, temperature: 0 }),
        { messages: MESSAGES, max_tokens: CHAT_TOKENS },
      );
      expect(out.object).toBe('chat.completion');
      expect(out.model).toBe(MODEL_NAME);
      expect(out.choices[0].message).toEqual({ role: 'assistant', content: native.text });
      expect(out.choices[0].finish_reason).toBe(native.finish_reason);
      expect(out.usage.prompt_tokens).toBe(native.prompt_ids.length);
      expect(out.usage.completion_tokens).toBe(native.ids.length);
    });
  });
}

/** `vite` (the dev server) for the Vite example on a free port; resolves once it answers. */
async function startViteDev() {
  const dir = path.join(EXAMPLES, 'vite');
  const server = await startStaticServer(dir); // only to borrow a free port
  const port = new URL(server.origin).port;
  await server.close();
  const vite = spawn(process.execPath, [path.join(dir, 'node_modules', 'vite', 'bin', 'vite.js'), '--host', '127.0.0.1', '--port', port, '--strictPort'], {
    cwd: dir,
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const origin = `http://127.0.0.1:${port}`;
  let exited = null;
  vite.once('exit', (code) => {
    exited = code;
  });
  for (const deadline = Date.now() + 60 * 1000; ; await new Promise((resolve) => setTimeout(resolve, 200))) {
    if (exited !== null) throw new Error(`vite exited with ${exited} before serving ${origin}`);
    if (await fetch(origin).then((response) => response.ok, () => false)) break;
    if (Date.now() > deadline) {
      vite.kill();
      throw new Error(`vite did not serve ${origin} within 60 s`);
    }
  }
  return { origin, close: () => vite.kill() };
}

test.describe('Vite dev server', () => {
  let dev;
  let page;

  test.beforeAll(async ({ browser }) => {
    expectFreshInstall(APPS[1]);
    dev = await startViteDev();
    page = await browser.newPage();
  });

  test.afterAll(async () => {
    await page?.close();
    dev?.close();
  });

  test('createEngine loads the model from the dev server too', async () => {
    await page.goto(`${dev.origin}/?model=${encodeURIComponent(MODEL_URL)}`);
    await expect(page.locator('#status')).toHaveText(/^(ready|error)/, { timeout: 10 * 60 * 1000 });
    await expect(page.locator('#status')).toHaveText(READY);
    const workers = page.workers().map((worker) => worker.url());
    expect(workers).toHaveLength(1);
    expect(workers[0].startsWith(`${dev.origin}/`)).toBe(true);
  });
});
