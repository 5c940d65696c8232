// The donor page as a volunteer sees it: while no coordinator is there it says it is waiting
// for one (and for how long); once `runner coordinate` splits SmolLM2 over it and a native
// donor, it shows the layers it holds, a chart with a point per step, the text and a finished
// state; a signaling server that is not there gives a sentence, never Rust's Debug text.
const fs = require('node:fs');
const { test, expect } = require('@playwright/test');
const { FLEET_LAUNCH, Child, freePort, startFleetServer, openDonorPage, donorStatus } = require('./fleet-support.js');
const { SMOLLM2 } = require('./shared.js');

const TOKEN = 'e2e-donor-page-token';
const PROMPT = 'The capital of France is';
const TOKENS = 4;
const CTX = 128;
// Neither donor can hold the whole model (about 140 MB here), so the page gets some layers;
// the native donor (lavapipe, faster than SwiftShader) takes most of them.
const PAGE_MIB = 64;
const NATIVE_MIB = 112;
const COORDINATE_MS = 6 * 60 * 1000;

test.use({ launchOptions: FLEET_LAUNCH });
test.describe.configure({ mode: 'serial', timeout: 10 * 60 * 1000 });

const children = [];
const contexts = [];

/** On failure: screenshots of every page (the fixture's `page` is not used) and each process's output. */
test.afterEach(async ({}, testInfo) => {
  const failed = testInfo.status !== testInfo.expectedStatus;
  let index = 0;
  for (const context of contexts.splice(0)) {
    for (const page of context.pages()) {
      if (failed) await page.screenshot({ path: testInfo.outputPath(`page-${index++}.png`), fullPage: true }).catch(() => {});
    }
    await context.close().catch(() => {});
  }
  for (const child of children.splice(0)) {
    child.kill();
    if (failed) fs.writeFileSync(testInfo.outputPath(`${child.name.replace(/ /g, '-')}.log`), child.output);
  }
});

function start(name, args, limitMs) {
  const child = new Child(name, args, limitMs);
  children.push(child);
  return child;
}

test('the page waits for a coordinator, then shows its layers, a chart of its steps and a finished state', async ({ browser }, testInfo) => {
  const { server, base, signal } = await startFleetServer(TOKEN, COORDINATE_MS + 4 * 60 * 1000);
  children.push(server);
  const { page, errors } = await openDonorPage(browser, contexts, { base, signal, token: TOKEN, gpuMib: PAGE_MIB });

  await expect(page.locator('#phase')).toHaveText('Waiting for a coordinator');
  // The wait is counted, so a volunteer sees the page is alive.
  await expect(page.locator('#phase-detail')).toContainText(/waited [2-9] s/, { timeout: 15 * 1000 });
  await expect(page.locator('#steps-line li.current')).toHaveText('Wait for a coordinator');
  await expect(page.locator('#layers')).toHaveText('none yet');

  start('runner donor', ['donor', '--signal', signal, '--fleet', TOKEN, '--gpu-mem-mib', String(NATIVE_MIB), '--backend', 'vulkan'], COORDINATE_MS);
  const coordinator = start(
    'runner coordinate',
    [
      'coordinate', '-m', `${base}/models/${SMOLLM2}`, '--signal', signal, '--fleet', TOKEN, '--donors', '2',
      '-p', PROMPT, '-n', String(TOKENS), '--temp', '0', '--ctx', String(CTX), '--json', '--heartbeat-timeout', '120',
    ],
    COORDINATE_MS,
  );
  const report = JSON.parse(await coordinator.success());

  await expect(page.locator('body')).toHaveAttribute('data-phase', 'Left');
  const status = await donorStatus(page);
  expect(errors).toEqual([]);
  const { start: first, end } = status.layers;
  expect(end).toBeGreaterThan(first);
  await expect(page.locator('#layers')).toContainText(`${first}–${end - 1}`);
  // While loading, the page already knew (and said) which layers it was loading.
  const loadingTitle = await page.evaluate(async () => {
    const loading = window.__donor.statuses.find((seen) => seen.phase === 'Loading');
    const { describeStatus } = await import('/donor-words.js');
    return { layers: loading.layers, title: describeStatus(loading, 0).title };
  });
  expect(loadingTitle).toEqual({ layers: status.layers, title: `Loading layers ${first}–${end - 1}` });
  const points = await page.evaluate(() => window.__donor.chart);
  expect(points.length).toBeGreaterThanOrEqual(1);
  for (const point of points) {
    expect(point.ms).toBeGreaterThan(0);
    expect(point.kbIn + point.kbOut).toBeGreaterThan(0);
  }
  await expect(page.locator('#chart')).toHaveAttribute('data-points', String(points.length));
  await expect(page.locator('#phase')).toHaveText(/^Finished/);
  await expect(page.locator('#steps-line li.current')).toHaveText('Finished');
  await expect(page.locator('#text')).toHaveText(report.text);
  await expect(page.locator('#error')).toBeHidden();
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.screenshot({ path: testInfo.outputPath('finished.png') });
});

test('a signaling server that is not there reads as a sentence, not Debug text', async ({ browser }) => {
  const { page, errors } = await (async () => {
    const context = await browser.newContext();
    contexts.push(context);
    const opened = await context.newPage();
    const seen = [];
    opened.on('pageerror', (err) => seen.push(err.message));
    return { page: opened, errors: seen };
  })();
  // A port nothing listens on: the browser's WebSocket closes with 1006.
  const signal = `ws://127.0.0.1:${await freePort()}/signal`;
  await page.goto(`/donor.html?${new URLSearchParams({ signal, fleet: TOKEN, gpu_mem: '64' })}`);

  await expect(page.locator('body')).toHaveAttribute('data-phase', 'failed', { timeout: 2 * 60 * 1000 });
  await expect(page.locator('#error-title')).toHaveText('Could not reach the signaling server');
  const detail = await page.textContent('#error-detail');
  expect(detail).toContain('code 1006: no reason given');
  expect(detail).toContain('runner serve');
  const shown = await page.textContent('body');
  for (const debug of ['{', '}', 'CloseEvent', 'Some(', 'ConnectionFailed']) expect(shown).not.toContain(debug);
  expect(errors).toEqual([]);

  // A mistyped scheme is caught before connecting, in words too.
  await page.fill('#signal', 'http://127.0.0.1/signal');
  await page.click('#start');
  await expect(page.locator('#error-title')).toHaveText('Check the settings');
  await expect(page.locator('#error-detail')).toContainText('must start with ws:// or wss://');
  expect(await page.textContent('#error-detail')).not.toContain('{');
});
