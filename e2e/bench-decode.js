// Decode speed of the demo page in headless Chromium, for docs/perf.md:
//   node e2e/bench-decode.js http://127.0.0.1:8000/ [tokens]
// Loads SmolLM2 through the page's worker, warms the kernels up with the same generation
// (SwiftShader compiles each pipeline on first use), then times it again from an empty cache.
const { chromium } = require('playwright-core');

async function main() {
  const [base = 'http://127.0.0.1:8000/', tokens = '32'] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.WEBSHARD_CHROMIUM || '/usr/lib/chromium/chromium-headless-shell',
    args: ['--enable-unsafe-webgpu'],
  });
  try {
    const page = await browser.newPage();
    await page.goto(base);
    const result = await page.evaluate(async (n) => {
      const engine = await window.__webshard.load('/models/SmolLM2-135M-Instruct.Q4_1.gguf');
      await engine.generate('The capital of France is', { n, temp: 0 });
      await engine.reset();
      const out = await engine.generate('The capital of France is', { n, temp: 0 });
      return { info: engine.info, out };
    }, Number(tokens));
    const { info, out } = result;
    console.log(JSON.stringify({
      adapter: info.adapter,
      variant: info.variant,
      load_seconds: info.loadSeconds,
      prefill_tokens: out.prefillTokens,
      prefill_tok_s: out.prefillTokens / out.prefillSeconds,
      decode_tokens: out.ids.length,
      decode_tok_s: out.decodeTokS,
    }));
  } finally {
    await browser.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
