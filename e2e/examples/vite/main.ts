// The package through a bundler, typed by its index.d.ts (`tsc --noEmit` runs before
// `vite build`): load the model named by ?model=URL, then stream greedy replies to the form.
import { createEngine, EngineError, type ChatCompletionChunk, type OpenAIEngine } from 'webshard';

declare global {
  interface Window {
    engine?: OpenAIEngine;
  }
}

function element<T extends HTMLElement>(selector: string): T {
  const found = document.querySelector<T>(selector);
  if (!found) throw new Error(`${selector} is missing from index.html`);
  return found;
}

const status = element<HTMLParagraphElement>('#status');
const send = element<HTMLButtonElement>('#send');
const reply = element<HTMLPreElement>('#reply');

async function streamReply(engine: OpenAIEngine, content: string, maxTokens: number): Promise<void> {
  const stream: AsyncIterable<ChatCompletionChunk> = await engine.chat.completions.create({
    messages: [{ role: 'user', content }],
    max_tokens: maxTokens,
    temperature: 0,
    stream: true,
  });
  for await (const chunk of stream) reply.textContent += chunk.choices[0]?.delta.content ?? '';
}

async function main(): Promise<void> {
  const model = new URLSearchParams(location.search).get('model') ?? '';
  const engine = await createEngine({
    model,
    onProgress: ({ bytesDone, bytesTotal }) => {
      status.textContent = `loading ${Math.round((100 * bytesDone) / bytesTotal)} %`;
    },
  });
  window.engine = engine;
  status.textContent = `ready: ${engine.model} (${engine.info.arch}) on ${engine.info.adapter}`;
  send.disabled = false;
  element<HTMLFormElement>('#chat').addEventListener('submit', (event) => {
    event.preventDefault();
    send.disabled = true;
    reply.textContent = '';
    const prompt = element<HTMLInputElement>('#prompt').value;
    const maxTokens = Number(element<HTMLInputElement>('#max-tokens').value);
    streamReply(engine, prompt, maxTokens).finally(() => {
      send.disabled = false;
    });
  });
}

main().catch((err: unknown) => {
  const kind = err instanceof EngineError ? ` (${err.kind})` : '';
  status.textContent = `error${kind}: ${err instanceof Error ? err.message : String(err)}`;
});
