// The package from a plain <script type="module">: load the model named by ?model=URL, then
// stream greedy replies to the form's message.
import { createEngine } from 'webshard';

const $ = (selector) => document.querySelector(selector);

async function main() {
  const model = new URLSearchParams(location.search).get('model');
  const engine = await createEngine({
    model,
    onProgress: ({ bytesDone, bytesTotal }) => {
      $('#status').textContent = `loading ${Math.round((100 * bytesDone) / bytesTotal)} %`;
    },
  });
  window.engine = engine;
  $('#status').textContent = `ready: ${engine.model} (${engine.info.arch}) on ${engine.info.adapter}`;
  $('#send').disabled = false;
  $('#chat').addEventListener('submit', async (event) => {
    event.preventDefault();
    $('#send').disabled = true;
    $('#reply').textContent = '';
    const stream = await engine.chat.completions.create({
      messages: [{ role: 'user', content: $('#prompt').value }],
      max_tokens: Number($('#max-tokens').value),
      temperature: 0,
      stream: true,
    });
    for await (const chunk of stream) $('#reply').textContent += chunk.choices[0]?.delta.content ?? '';
    $('#send').disabled = false;
  });
}

main().catch((err) => {
  $('#status').textContent = `error: ${err.message}`;
});
