// The embeddings demo (embeddings.html): the sentences in the box go through
// `engine.embeddings.create` (openai.js, an `EmbeddingModel` in the worker), and their cosine
// similarity matrix is drawn as a heat map. `window.similarity` holds the last matrix drawn,
// for the e2e spec.
import { createEngine } from './openai.js';

const $ = (id) => document.getElementById(id);
let engine = null;
let loadedUrl = null;

async function ensureEngine(url) {
  if (engine && loadedUrl === url) return engine;
  $('status').textContent = `loading ${url}`;
  engine = await createEngine({
    model: url,
    onProgress: (p) => {
      $('status').textContent = `loading ${Math.round((100 * p.bytesDone) / Math.max(p.bytesTotal, 1))}%`;
    },
  });
  loadedUrl = url;
  return engine;
}

/** Cosine similarity of every pair (the vectors are L2-normalised, so a dot product). */
function similarityMatrix(vectors) {
  return vectors.map((a) => vectors.map((b) => a.reduce((sum, x, i) => sum + x * b[i], 0)));
}

/** Blue (-1) through white (0) to red (1). */
function colour(value) {
  const v = Math.max(-1, Math.min(1, value));
  const fade = Math.round(255 * (1 - Math.abs(v)));
  return v >= 0 ? `rgb(255,${fade},${fade})` : `rgb(${fade},${fade},255)`;
}

function drawHeatmap(canvas, matrix) {
  const context = canvas.getContext('2d');
  const cell = canvas.width / matrix.length;
  context.clearRect(0, 0, canvas.width, canvas.height);
  context.font = `${Math.max(10, Math.floor(cell / 5))}px system-ui`;
  context.textAlign = 'center';
  context.textBaseline = 'middle';
  matrix.forEach((row, i) =>
    row.forEach((value, j) => {
      context.fillStyle = colour(value);
      context.fillRect(j * cell, i * cell, cell, cell);
      context.fillStyle = '#000';
      context.fillText(value.toFixed(2), (j + 0.5) * cell, (i + 0.5) * cell);
    }),
  );
}

async function compare() {
  const sentences = $('sentences').value.split('\n').map((s) => s.trim()).filter(Boolean);
  if (!sentences.length) {
    $('status').textContent = 'error: write at least one sentence';
    return;
  }
  $('compare').disabled = true;
  try {
    const model = await ensureEngine($('model-url').value);
    $('status').textContent = `embedding ${sentences.length} sentences`;
    const started = performance.now();
    const reply = await model.embeddings.create({ input: sentences });
    const matrix = similarityMatrix(reply.data.map((d) => d.embedding));
    drawHeatmap($('heatmap'), matrix);
    window.similarity = matrix;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    $('status').textContent = `drawn: ${matrix.length}x${matrix.length}, ${reply.usage.prompt_tokens} tokens in ${seconds} s`;
  } catch (err) {
    $('status').textContent = `error: ${err.message}`;
  } finally {
    $('compare').disabled = false;
  }
}

$('compare').addEventListener('click', compare);
