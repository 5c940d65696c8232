// The model catalogue: what `runner serve` lists at /models/index.json (read from each GGUF
// header), shown in the model picker with whether it fits this GPU before any download.
// A model fits when its largest tensor fits one storage buffer binding (the adapter's
// maxStorageBufferBindingSize and maxBufferSize) and, if the user set a memory budget, its
// estimated memory (weights plus KV cache) is within it.

const MB = 1e6;
const mb = (bytes) => `${Math.round(bytes / MB)} MB`;

/** The index's models, or [] when this server has no index (a plain static server). */
export async function fetchCatalog(url = '/models/index.json') {
  try {
    const response = await fetch(url);
    if (!response.ok) return [];
    const index = await response.json();
    return Array.isArray(index.models) ? index.models.filter((m) => !m.error) : [];
  } catch {
    return [];
  }
}

/** The adapter's buffer limits, or null without WebGPU. */
export async function adapterLimits() {
  const adapter = await navigator.gpu?.requestAdapter().catch(() => null);
  if (!adapter) return null;
  const { maxBufferSize, maxStorageBufferBindingSize } = adapter.limits;
  return { maxBufferSize, maxStorageBufferBindingSize };
}

/** `{ fits, reason }` for `entry` under `limits` and an optional `budgetBytes`. */
export function fitVerdict(entry, limits, budgetBytes) {
  if (!entry) return { fits: null, reason: 'a URL: its size is known only once its header is read' };
  const needs = `needs about ${mb(entry.memory_bytes)} (weights and a ${entry.estimate_context}-token KV cache)`;
  if (budgetBytes && entry.memory_bytes > budgetBytes) {
    return { fits: false, reason: `does not fit: ${needs}, over the budget of ${mb(budgetBytes)}` };
  }
  if (!limits) return { fits: null, reason: needs };
  const binding = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  if (entry.largest_tensor_bytes > binding) {
    return {
      fits: false,
      reason: `does not fit this GPU: its largest tensor (${mb(entry.largest_tensor_bytes)}) exceeds one buffer binding (${mb(binding)})`,
    };
  }
  return { fits: true, reason: `fits this GPU: ${needs}; largest tensor ${mb(entry.largest_tensor_bytes)} of ${mb(binding)} per buffer` };
}

/** A picker option's label: name, architecture, parameters, quant, size, context. */
export function entryLabel(entry) {
  const params = entry.parameters >= 1e9 ? `${(entry.parameters / 1e9).toFixed(1)}B` : `${Math.round(entry.parameters / 1e6)}M`;
  // The file name: general.name is often a training-run label.
  const name = entry.file.replace(/\.gguf$/, '');
  return `${name} · ${entry.architecture} ${params} ${entry.quant} · ${mb(entry.size_bytes)} · ctx ${entry.context_length}`;
}

/** Fills `select` with the catalogue's models, then "Other URL…". */
export function fillPicker(select, entries) {
  select.textContent = '';
  for (const entry of entries) {
    const option = document.createElement('option');
    option.value = entry.url;
    option.textContent = entryLabel(entry);
    select.append(option);
  }
  const other = document.createElement('option');
  other.value = 'other';
  other.textContent = 'Other URL…';
  select.append(other);
}
