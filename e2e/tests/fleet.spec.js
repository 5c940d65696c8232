// The shard chain across browsers and this machine: two donor pages (each its own browser
// context, WebGPU on SwiftShader) and one native donor (lavapipe) join a fleet through
// `runner serve --fleet`'s /signal; `runner coordinate` splits SmolLM2 over the three and
// generates greedily. The ids must be the single-device `runner generate --temp 0` ids, also
// when a donor tab closes mid-generation and the coordinator re-plans and replays, and when
// a page and two native donors that each offer under half the model run it together.
const { test, expect } = require('@playwright/test');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { SMOLLM2 } = require('./shared.js');
const { FLEET_LAUNCH, Child, startFleetServer, openDonorPage: openDonor, donorStatus } = require('./fleet-support.js');
const { openHostilePeer } = require('./hostile-peer.js');

const TOKEN = 'e2e-fleet-token';
const PROMPT = 'The capital of France is';
const TOKENS = 12;
// The whole model needs about 144 MB here (98 MB of weights, the tied embedding on two stages,
// 1.5 MiB of KV per layer at this context), more than any one donor offers, and the native donor
// offers little: the slow SwiftShader pages hold most layers, so splitting them over both pages
// is the fastest plan (three stages), and after one page leaves the other page and the native
// donor still hold the model.
const CTX = 256;
const PAGE_MIB = 128;
const NATIVE_MIB = 48;
// Generous for SwiftShader, but every wait ends: no test can hang.
const COORDINATE_MS = 8 * 60 * 1000;

test.use({ launchOptions: FLEET_LAUNCH });
test.describe.configure({ mode: 'serial', timeout: 12 * 60 * 1000 });

function runnerJson(args, limitMs) {
  return new Promise((resolve, reject) => {
    execFile(process.env.WEBSHARD_RUNNER, args, { timeout: limitMs, maxBuffer: 1 << 24 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`runner ${args[0]}: ${err.message}\n${stderr}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

let server;
let base;
let signal;
let expected;
let models;
const children = [];
const contexts = [];

test.beforeAll(async () => {
  ({ server, base, signal, models } = await startFleetServer(TOKEN, 30 * 60 * 1000));
  expected = await runnerJson(
    ['generate', '-m', path.join(models, SMOLLM2), '-p', PROMPT, '-n', String(TOKENS), '--temp', '0', '--json', '--quiet'],
    10 * 60 * 1000,
  );
  expect(expected.ids).toHaveLength(TOKENS);
});

test.afterAll(() => server?.kill());

test.afterEach(async () => {
  for (const child of children.splice(0)) child.kill();
  for (const context of contexts.splice(0)) await context.close().catch(() => {});
});

/** A donor page in a context of its own, joining the fleet at once. */
const openDonorPage = (browser) => openDonor(browser, contexts, { base, signal, token: TOKEN, gpuMib: PAGE_MIB });

/**
 * A native donor offering `mib`. `fast` reports a pinned speed well above the pages' instead of
 * a probe: the planner minimises the slowest stage, so were this donor's few layers and head the
 * slowest (its probe taken while the pages compile, say), every plan would tie and the one with
 * fewest stages, a single page beside it, would win; fast, the pages are the slowest and share
 * the layers, the three-stage plan these tests look for.
 */
function startNativeDonor(mib = NATIVE_MIB, { fast = false } = {}) {
  const child = new Child(
    'runner donor',
    [
      'donor', '--once', '--signal', signal, '--fleet', TOKEN, '--gpu-mem-mib', String(mib), '--backend', 'vulkan',
      ...(fast ? ['--ms-per-layer', '0.5'] : []),
    ],
    COORDINATE_MS + 60 * 1000,
  );
  children.push(child);
  return child;
}

/** `runner coordinate` over three donors; `extra` is appended (`--kv-slots`...). */
function startCoordinator({ ctx = CTX, extra = [] } = {}) {
  const child = new Child(
    'runner coordinate',
    [
      'coordinate', '-m', `${base}/models/${SMOLLM2}`, '--signal', signal, '--fleet', TOKEN,
      '--donors', '3', '-p', PROMPT, '-n', String(TOKENS), '--temp', '0', '--ctx', String(ctx), '--json',
      ...extra,
      // A SwiftShader stage takes seconds per prefill chunk, answering no heartbeat meanwhile.
      '--heartbeat-timeout', '120',
    ],
    COORDINATE_MS,
  );
  children.push(child);
  return child;
}

test('two browser donors and a native donor generate the single-device ids, a hostile peer in the room', async ({ browser }) => {
  // One hostile peer before the donors (it offers to them), one after (it answers their offers).
  const early = await openHostilePeer(browser, contexts, { base, signal, token: TOKEN });
  const donors = [await openDonorPage(browser), await openDonorPage(browser)];
  const late = await openHostilePeer(browser, contexts, { base, signal, token: TOKEN });
  const native = startNativeDonor(NATIVE_MIB, { fast: true });
  const report = JSON.parse(await startCoordinator().success());
  expect((await early.attacks()).offers).toBeGreaterThanOrEqual(2 * 3);
  expect((await late.attacks()).answers).toBeGreaterThanOrEqual(2 * 2);

  expect(report.ids).toEqual(expected.ids);
  expect(report.text).toBe(expected.text);
  expect(report.plan).toHaveLength(3);
  expect(report.recoveries).toBe(0);

  const planned = new Set(report.plan.map((stage) => `${stage.layers[0]}-${stage.layers[1]}`));
  for (const { page, errors, dropped } of donors) {
    const status = await donorStatus(page);
    expect(errors).toEqual([]);
    // Each hostile signal dropped with a warning, none handed to matchbox (which would panic).
    expect(dropped.length, dropped.join('\n')).toBeGreaterThanOrEqual(6);
    expect(status.refused_frames).toBe(0);
    const { start, end } = status.layers;
    expect(end).toBeGreaterThan(start);
    expect(planned.has(`${start}-${end}`)).toBe(true);
    expect(status.bytes_downloaded).toBeGreaterThan(1e6);
    expect(status.steps).toBeGreaterThan(TOKENS - 2);
    expect(status.bytes_in).toBeGreaterThan(0);
    expect(status.bytes_out).toBeGreaterThan(0);
    await expect(page.locator('#layers')).toContainText(`${start}–${end - 1}`);
    await expect(page.locator('#downloaded')).toContainText(`${(status.bytes_downloaded / 1e6).toFixed(1)} MB`);
    await expect(page.locator('#step-ms')).toContainText(' ms');
    // The coordinator streams each token to every donor: the page shows the whole text.
    await expect(page.locator('#text')).toHaveText(expected.text);
    // Dismissed when the coordinator finished.
    await expect(page.locator('body')).toHaveAttribute('data-phase', 'Left');
  }
  await native.success();
});

test('a donor tab closing mid-generation changes nothing in the output', async ({ browser }) => {
  const donors = [await openDonorPage(browser), await openDonorPage(browser)];
  startNativeDonor(NATIVE_MIB, { fast: true });
  const coordinator = startCoordinator();
  const [leaving, staying] = donors;
  // Close a tab once tokens flow through both pages: generation is under way on three stages.
  for (const { page } of donors) {
    await expect
      .poll(async () => (await donorStatus(page))?.text?.length ?? 0, { timeout: COORDINATE_MS })
      .toBeGreaterThan(0);
  }
  const closedAfter = (await donorStatus(leaving.page)).text;
  await leaving.context.close();

  const report = JSON.parse(await coordinator.success());
  expect(closedAfter.length).toBeLessThan(expected.text.length);
  expect(report.ids).toEqual(expected.ids);
  expect(report.recoveries).toBeGreaterThanOrEqual(1);
  // The re-plan runs on the two donors left.
  expect(report.plan.length).toBeLessThanOrEqual(2);
  const status = await donorStatus(staying.page);
  expect(status.epoch).toBeGreaterThan(1);
  await expect(staying.page.locator('#text')).toHaveText(expected.text);
});

// A model no donor can hold: a page offering `gpu_mem` and two native donors, each under half of
// SmolLM2's 96.6 MB of weights (46 MiB), run it together. Context 64 and one KV slot keep the
// caches small, so the three together hold it (the tied embedding sits on both edge stages).
const UNDER_HALF_MIB = 45;

test('a page donor and two native donors, each under half the model, give the single-device ids', async ({ browser }) => {
  expect(UNDER_HALF_MIB * 2 ** 20).toBeLessThan(fs.statSync(path.join(models, SMOLLM2)).size / 2);
  const { page, errors } = await openDonor(browser, contexts, { base, signal, token: TOKEN, gpuMib: UNDER_HALF_MIB });
  const natives = [startNativeDonor(UNDER_HALF_MIB), startNativeDonor(UNDER_HALF_MIB)];
  const report = JSON.parse(await startCoordinator({ ctx: 64, extra: ['--kv-slots', '1'] }).success());

  expect(report.ids).toEqual(expected.ids);
  expect(report.plan).toHaveLength(3);
  expect(report.recoveries).toBe(0);
  const status = await donorStatus(page);
  expect(errors).toEqual([]);
  expect(status.layers.end).toBeGreaterThan(status.layers.start);
  expect(report.plan.map((stage) => `${stage.layers[0]}-${stage.layers[1]}`)).toContain(`${status.layers.start}-${status.layers.end}`);
  for (const native of natives) await native.success();
});
