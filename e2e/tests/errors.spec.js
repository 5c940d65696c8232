// Clear errors for a missing URL, a file that is not a GGUF, a load option out of bounds, and
// a browser without WebGPU.
const { test, expect, chromium } = require('@playwright/test');
const { autorunResult } = require('./shared.js');

async function autorunError(page, model, extra = {}) {
  await page.goto(`/?${new URLSearchParams({ model, autorun: '1', n: '1', ...extra })}`);
  const last = await autorunResult(page);
  expect(last.ids).toBeUndefined();
  return { last, shown: await page.textContent('#error'), kind: await page.getAttribute('#error', 'data-kind') };
}

test('a 404 model URL says it was not found', async ({ page }) => {
  const { last, shown, kind } = await autorunError(page, '/models/no-such-model.gguf');
  expect(last.kind).toBe('not-found');
  expect(kind).toBe('not-found');
  expect(shown).toContain('not found (HTTP 404)');
  expect(shown).toContain('no-such-model.gguf');
});

test('a file that is not a GGUF says so', async ({ page }) => {
  const { last, shown } = await autorunError(page, '/style.css');
  expect(last.kind).toBe('not-gguf');
  expect(shown).toContain('not a GGUF');
  expect(shown).toContain('magic');
});

test('a decode depth out of bounds is refused before the model is read', async ({ page }) => {
  const { last, shown } = await autorunError(page, '/models/no-such-model.gguf', { depth: '9' });
  expect(last.kind).toBe('options');
  expect(shown).toContain('decodeDepth must be a whole number from 1 to 8, not 9');
});

test('without WebGPU the page names the browsers and flags that work', async () => {
  const browser = await chromium.launch({
    executablePath: process.env.WEBSHARD_CHROMIUM || '/usr/lib/chromium/chromium-headless-shell',
    args: [], // no --enable-unsafe-webgpu: no adapter
  });
  try {
    const page = await browser.newPage({ baseURL: `http://127.0.0.1:${process.env.WEBSHARD_E2E_PORT}/` });
    await page.goto('/?autorun=1');
    const last = await autorunResult(page);
    expect(last.kind).toBe('no-webgpu');
    const caps = page.locator('#caps');
    await expect(caps).toBeVisible();
    await expect(caps).toContainText('WebGPU');
    await expect(caps).toContainText('--enable-unsafe-webgpu');
    await expect(caps).toContainText('Chrome');
    await expect(page.locator('#load')).toBeDisabled();
  } finally {
    await browser.close();
  }
});
