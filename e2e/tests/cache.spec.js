// The OPFS cache through the page: an interrupted download resumed after a reload fetches only
// the missing ranges (counted on the server), a finished model loads with no Range request and
// with the server unreachable, and corrupt or short cached ranges are fetched again.
const { test, expect } = require('@playwright/test');
const { MODEL_URL, requestLog, requestsSince, parseRange } = require('./shared.js');

test.describe.configure({ mode: 'serial' });

let page;

/** Cached ranges of the model, from the file names in OPFS: [offset, length, name]. Only the
 * cache's own names (`offset-length-hash`): a write cut short by the reload can leave Chromium's
 * swap file `offset-length-hash.crswap` beside its range, which is not a range (and once made the
 * test count one range too many). */
function cachedRanges() {
  return page.evaluate(async () => {
    const root = await navigator.storage.getDirectory();
    const cache = await root.getDirectoryHandle('webshard-cache');
    const ranges = [];
    for await (const dir of cache.values()) {
      for await (const name of dir.keys()) {
        const parts = /^(\d+)-(\d+)-[0-9a-f]{16}$/.exec(name);
        if (parts) ranges.push([Number(parts[1]), Number(parts[2]), name]);
      }
    }
    return ranges.sort((a, b) => a[0] - b[0]);
  });
}

/** Loads the model in the page and returns the engine's info (network and cache counts). */
const load = () => page.evaluate((url) => window.__webshard.load(url).then((e) => e.info), MODEL_URL);

const overlaps = ([a, alen], [b, blen]) => a < b + blen && b < a + alen;

test.beforeAll(async ({ browser }) => {
  page = await browser.newPage();
  await page.goto('/');
  await page.evaluate(() => navigator.storage.getDirectory().then((d) => d.removeEntry('webshard-cache', { recursive: true }).catch(() => {})));
});

test.afterAll(async () => page?.close());

test('an interrupted download resumes with only the missing ranges', async () => {
  page.evaluate((url) => window.__webshard.load(url).catch(() => {}), MODEL_URL).catch(() => {});
  await page.waitForFunction(() => {
    const p = window.__webshard_progress.at(-1);
    return p && p.bytesDone > 0.3 * p.bytesTotal;
  });
  await page.reload(); // kills the worker mid-download
  const before = await cachedRanges();
  expect(before.length).toBeGreaterThan(10);

  const mark = requestLog().length;
  const info = await load();
  const fetched = requestsSince(mark, MODEL_URL).filter((r) => r.method === 'GET').map((r) => parseRange(r.range));
  console.log(`resume: ${before.length} ranges cached before, ${fetched.length} fetched after the reload`);
  expect(fetched.length).toBeGreaterThan(0);
  expect(fetched.length).toBe(info.cache.fetchedRanges);
  // A range being written when the worker died is short or fails its hash: the cache must
  // fetch it again (at most one per read in flight). Every other cached range is a hit.
  const refetched = fetched.filter((range) => before.some((cached) => overlaps(cached, range)));
  expect(refetched.length).toBeLessThanOrEqual(4);
  expect(info.cache.hitRanges + refetched.length).toBe(before.length);
  const after = await cachedRanges();
  expect(after.length).toBe(before.length + fetched.length - refetched.length);
  const bytes = (ranges) => ranges.reduce((sum, [, len]) => sum + len, 0);
  expect(info.cache.hitBytes + info.cache.fetchedBytes).toBe(bytes(after));
});

test('a finished model loads from the cache with no Range request', async () => {
  await page.reload();
  const mark = requestLog().length;
  const info = await load();
  const requests = requestsSince(mark, MODEL_URL);
  expect(requests.map((r) => r.method)).toEqual(['HEAD']);
  expect(info.cache.fetchedRanges).toBe(0);
  expect(info.networkRequests).toBe(0);
  expect(info.offline).toBe(false);
});

test('a finished model loads with the server unreachable', async () => {
  await page.reload();
  await page.route('**/models/**', (route) => route.abort('connectionrefused'));
  try {
    const info = await load();
    expect(info.offline).toBe(true);
    expect(info.cache.fetchedRanges).toBe(0);
    expect(info.cache.hitBytes).toBeGreaterThan(90e6);
  } finally {
    await page.unroute('**/models/**');
  }
});

test('corrupt and short cached ranges are detected and fetched again', async () => {
  const ranges = await cachedRanges();
  const [flipped, short] = [ranges[ranges.length - 1], ranges[Math.floor(ranges.length / 2)]];
  await page.reload();
  await page.evaluate(async ([flippedName, shortName]) => {
    const root = await navigator.storage.getDirectory();
    const cache = await root.getDirectoryHandle('webshard-cache');
    for await (const dir of cache.values()) {
      const rewrite = async (name, change) => {
        const handle = await dir.getFileHandle(name);
        const bytes = new Uint8Array(await (await handle.getFile()).arrayBuffer());
        const writable = await handle.createWritable();
        await writable.write(change(bytes));
        await writable.close();
      };
      await rewrite(flippedName, (b) => { b[b.length >> 1] ^= 0x40; return b; });
      await rewrite(shortName, (b) => b.subarray(0, b.length - 1));
    }
  }, [flipped[2], short[2]]);
  const mark = requestLog().length;
  const info = await load();
  const fetched = requestsSince(mark, MODEL_URL).filter((r) => r.method === 'GET').map((r) => parseRange(r.range));
  expect(info.cache.corruptRanges).toBe(2);
  expect(fetched.sort((a, b) => a[0] - b[0])).toEqual([short, flipped].map(([o, l]) => [o, l]).sort((a, b) => a[0] - b[0]));
});
