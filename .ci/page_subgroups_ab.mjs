// The page's decode with and without subgroup kernels in one run, alternating, three rounds
// each (docs/perf.md, session 23). Usage, with `runner serve --port 8765` running:
//   node .ci/page_subgroups_ab.mjs http://127.0.0.1:8765/ [MODEL_FILE]
// WEBSHARD_CHROMIUM names the browser (default: Debian's chromium-headless-shell); ROUNDS the
// rounds (default 3).
import { chromium } from '../e2e/node_modules/playwright-core/index.mjs';

const base = process.argv[2] ?? 'http://127.0.0.1:8765/';
const model = `${base}models/${process.argv[3] ?? 'SmolLM2-135M-Instruct.Q4_1.gguf'}`;
const browser = await chromium.launch({
  executablePath: process.env.WEBSHARD_CHROMIUM || '/usr/lib/chromium/chromium-headless-shell',
  args: ['--enable-unsafe-webgpu'],
});
const results = { on: [], off: [] };
for (let round = 0; round < Number(process.env.ROUNDS ?? 3); round++) {
  for (const mode of ['on', 'off']) {
    const page = await browser.newPage();
    await page.goto(base);
    const r = await page.evaluate(async ([url, off]) => {
      await window.__webshard.load(url, { disableSubgroups: off, cache: true });
      const out = await window.__webshard.generate('The capital of France is', { maxTokens: 32, temperature: 0 });
      return { variant: window.__webshard_info.variant, tokS: out.decodeTokS, ids: out.ids.join(',') };
    }, [model, mode === 'off']);
    results[mode].push(r);
    console.log(mode, r.variant, r.tokS.toFixed(2), r.ids.slice(0, 40));
    await page.close();
  }
}
const median = (xs) => {
  const sorted = xs.map((x) => x.tokS).sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)];
};
console.log(`median on ${median(results.on).toFixed(2)} off ${median(results.off).toFixed(2)} ratio ${(median(results.on) / median(results.off)).toFixed(2)}`);
await browser.close();
