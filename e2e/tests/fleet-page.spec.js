// The chat page as coordinator: it joins a fleet through `runner serve --fleet`'s /signal,
// plans SmolLM2 over donor pages (WebGPU on SwiftShader, each in its own browser context) and
// a native donor, and generates greedily. The ids must be the single-device
// `runner generate --temp 0` ids (global-setup.js), also when a donor tab closes
// mid-generation; bad settings end in a clear error on the page, never a hang.
const { test, expect } = require('@playwright/test');
const { PROMPT, TOKENS, SMOLLM2, nativeResult, autorunResult } = require('./shared.js');
const { FLEET_LAUNCH, Child, startFleetServer, newFleetContext, openDonorPage, donorStatus } = require('./fleet-support.js');

const TOKEN = 'e2e-page-fleet-token';
// As in fleet.spec.js: the model (about 144 MB at this context) fits on no one donor, so two
// pages split it, and after one of three donors leaves the other two still hold it.
const CTX = 256;
const PAGE_MIB = 128;
const NATIVE_MIB = 48;
// Generous for SwiftShader, but every wait ends.
const COORDINATE_MS = 8 * 60 * 1000;

test.use({ launchOptions: FLEET_LAUNCH });
test.describe.configure({ mode: 'serial', timeout: 12 * 60 * 1000 });

let fleet;
const children = [];
const contexts = [];

test.beforeAll(async () => {
  fleet = await startFleetServer(TOKEN, 30 * 60 * 1000);
});

test.afterAll(() => fleet?.server.kill());

test.afterEach(async () => {
  for (const child of children.splice(0)) child.kill();
  for (const context of contexts.splice(0)) await context.close().catch(() => {});
});

const openDonor = (browser) =>
  openDonorPage(browser, contexts, { base: fleet.base, signal: fleet.signal, token: TOKEN, gpuMib: PAGE_MIB });

function startNativeDonor() {
  const child = new Child(
    'runner donor',
    ['donor', '--signal', fleet.signal, '--fleet', TOKEN, '--gpu-mem-mib', String(NATIVE_MIB), '--backend', 'vulkan'],
    COORDINATE_MS + 60 * 1000,
  );
  children.push(child);
  return child;
}

/** The chat page, coordinating a fleet of `donors` and generating once (autorun). */
async function openChatPage(browser, { donors, token = TOKEN, extra = {} }) {
  const context = await newFleetContext(browser, contexts);
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (err) => errors.push(err.message));
  const query = new URLSearchParams({
    model: `/models/${SMOLLM2}`,
    prompt: PROMPT,
    n: String(TOKENS),
    temp: '0',
    autorun: '1',
    fleet: token,
    signal: fleet.signal,
    donors: String(donors),
    ctx: String(CTX),
    // A SwiftShader stage takes seconds per prefill chunk, answering no heartbeat meanwhile.
    heartbeat_timeout: '120',
    ...extra,
  });
  await page.goto(`${fleet.base}/?${query}`);
  return { context, page, errors };
}

const fleetState = (page) => page.evaluate(() => window.__fleet);

/** The error the page shows once its autorun ends: `{ last, shown, kind }`. */
async function pageError(page) {
  const last = await autorunResult(page);
  expect(last.ids).toBeUndefined();
  await expect(page.locator('#error')).toBeVisible();
  return { last, shown: await page.textContent('#error'), kind: await page.getAttribute('#error', 'data-kind') };
}

test('a fleet token the signaling server does not admit is a clear error', async ({ browser }) => {
  const { page, errors } = await openChatPage(browser, { donors: 1, token: 'not-the-fleet-token' });
  const { last, shown, kind } = await pageError(page);
  expect(last.kind).toBe('fleet');
  expect(kind).toBe('fleet');
  expect(shown).toContain('cannot join signaling room');
  expect(shown).toContain('fleet token');
  await expect(page.locator('body')).toHaveAttribute('data-fleet', 'failed');
  expect(errors).toEqual([]);
});

test('no donor joining is a clear error after the join timeout', async ({ browser }) => {
  const started = Date.now();
  const { page } = await openChatPage(browser, { donors: 2, extra: { join_timeout: '3' } });
  const { last, shown } = await pageError(page);
  expect(Date.now() - started).toBeLessThan(60 * 1000);
  expect(last.kind).toBe('fleet');
  expect(shown).toContain('0 of 2 donors joined within 3 s');
  expect(shown).toContain('fleet token');
});

test('the chat page coordinates two donor pages and gives the single-device ids', async ({ browser }) => {
  const expected = nativeResult();
  const donors = [await openDonor(browser), await openDonor(browser)];
  const { page, errors } = await openChatPage(browser, { donors: 2 });
  const last = await autorunResult(page);

  expect(last.error).toBeUndefined();
  expect(last.ids).toEqual(expected.ids);
  expect(last.text).toBe(expected.text);
  expect(last.aborted).toBe(false);
  expect(last.report.recoveries).toBe(0);
  expect(last.report.plan).toHaveLength(2);
  expect(errors).toEqual([]);

  // The page showed the plan, every stage loading, and each step's hops.
  const state = await fleetState(page);
  const accepted = state.events.filter((e) => e.type === 'donor' && e.accepted);
  expect(accepted).toHaveLength(2);
  expect(state.plan.stages).toHaveLength(2);
  expect(state.events.filter((e) => e.type === 'ready')).toHaveLength(2);
  expect(state.steps).toBeGreaterThanOrEqual(expected.ids.length);
  expect(state.tokens).toBe(expected.ids.length);
  await expect(page.locator('#fleet-plan tbody tr')).toHaveCount(2);
  await expect(page.locator('#fleet-plan tbody')).toContainText(' ms');
  // The chain picture: one box per stage with its layers and last compute time.
  await expect(page.locator('#fleet-chain g.stage')).toHaveCount(2);
  await expect(page.locator('#fleet-chain g.stage').first()).toContainText(`layers ${state.plan.stages[0].layers[0]}`);
  await expect(page.locator('#fleet-chain .time').last()).toContainText(' ms');
  await expect(page.locator('#fleet-progress')).toContainText(`token ${expected.ids.length} of at most ${TOKENS}`);
  await expect(page.locator('body')).toHaveAttribute('data-fleet', 'connected');
  await expect(page.locator('#transcript .assistant')).toHaveText(expected.text);

  // Each page holds the layers the plan gave it, and saw the whole text go by.
  const planned = new Set(state.plan.stages.map((stage) => `${stage.layers[0]}-${stage.layers[1]}`));
  for (const { page: donorPage, errors: donorErrors } of donors) {
    const status = await donorStatus(donorPage);
    expect(donorErrors).toEqual([]);
    expect(status.refused_frames).toBe(0);
    expect(planned.has(`${status.layers.start}-${status.layers.end}`)).toBe(true);
    await expect(donorPage.locator('#text')).toHaveText(expected.text);
  }

  // The next turn goes through the same fleet (each turn replays its whole prompt).
  const again = await page.evaluate(
    ({ prompt, n }) => window.__webshard.generate(prompt, { n, temp: 0 }),
    { prompt: PROMPT, n: TOKENS },
  );
  expect(again.ids).toEqual(expected.ids);
  expect(again.report.recoveries).toBe(0);

  // A request longer than the chain caches is refused before anything is sent; the fleet stays.
  const tooLong = await page.evaluate(
    (prompt) => window.__webshard.generate(prompt, { n: 1000 }).then(
      () => null,
      (err) => ({ message: err.message, kind: err.kind }),
    ),
    PROMPT,
  );
  expect(tooLong.kind).toBe('options');
  expect(tooLong.message).toContain(`more than the fleet's context of ${CTX}`);
  await expect(page.locator('body')).toHaveAttribute('data-fleet', 'connected');

  // Stop cannot take a request out of the chain midway: it dismisses the fleet, clearly.
  await page.click('#settings summary');
  await page.fill('#n', '64');
  await page.fill('#prompt', PROMPT);
  await page.click('#send');
  await expect(page.locator('#transcript .assistant').last()).not.toBeEmpty({ timeout: 3 * 60 * 1000 });
  await page.click('#stop');
  await expect(page.locator('body')).toHaveAttribute('data-fleet', 'closed');
  await expect(page.locator('#fleet-status')).toContainText('connect again');
  await expect(page.locator('#speed')).toContainText('stopped');
  await expect(page.locator('#send')).toBeDisabled();
  for (const { page: donorPage } of donors) {
    await expect(donorPage.locator('body')).toHaveAttribute('data-phase', 'Left');
    expect((await donorPage.evaluate(() => window.__donor.exit)).exit).toBe('dismissed');
  }
});

test('a donor tab closing mid-generation changes nothing in the page output', async ({ browser }) => {
  const expected = nativeResult();
  const donors = [await openDonor(browser), await openDonor(browser)];
  startNativeDonor();
  const { page } = await openChatPage(browser, { donors: 3 });
  // Close a tab once tokens flow through both pages: generation is under way on three stages.
  for (const { page: donorPage } of donors) {
    await expect
      .poll(async () => (await donorStatus(donorPage))?.text?.length ?? 0, { timeout: COORDINATE_MS })
      .toBeGreaterThan(0);
  }
  const [leaving, staying] = donors;
  const closedAfter = (await donorStatus(leaving.page)).text;
  await leaving.context.close();

  const last = await autorunResult(page);
  expect(last.error).toBeUndefined();
  expect(closedAfter.length).toBeLessThan(expected.text.length);
  expect(last.ids).toEqual(expected.ids);
  expect(last.report.recoveries).toBeGreaterThanOrEqual(1);
  expect(last.report.plan.length).toBeLessThanOrEqual(2);
  // The page saw the donor leave and showed the new plan.
  const state = await fleetState(page);
  expect(state.events.some((e) => e.type === 'left' && e.inPlan)).toBe(true);
  expect(state.events.filter((e) => e.type === 'plan').length).toBeGreaterThanOrEqual(2);
  expect(state.plan.stages.length).toBe(last.report.plan.length);
  await expect(staying.page.locator('#text')).toHaveText(expected.text);
});

test('a lost donor whose layers the others cannot hold is a clear error', async ({ browser }) => {
  const donors = [await openDonor(browser), await openDonor(browser)];
  // The coordinator waits up to its join timeout for a donor to take the lost layers (the
  // default, 300 s, is for real fleets): both donors are up before it starts, so 30 s is ample.
  const { page, errors } = await openChatPage(browser, { donors: 2, extra: { join_timeout: '30' } });
  const [leaving, staying] = donors;
  await expect
    .poll(async () => (await donorStatus(staying.page))?.text?.length ?? 0, { timeout: COORDINATE_MS })
    .toBeGreaterThan(0);
  await leaving.context.close();

  const { last, shown } = await pageError(page);
  expect(last.kind).toBe('fleet');
  expect(shown).toContain('cannot hold the model');
  expect(shown).toContain('connect again');
  await expect(page.locator('body')).toHaveAttribute('data-fleet', 'closed');
  await expect(page.locator('#fleet-log')).toContainText('left: re-planning without it');
  // The donor still there is dismissed, not left waiting.
  await expect(staying.page.locator('body')).toHaveAttribute('data-phase', 'Left');
  expect(errors).toEqual([]);
});
