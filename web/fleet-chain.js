// The Fleet panel's picture of the chain: this page, then one box per stage (its donor, the
// layers it holds, width by layer count), arrows in chain order labelled with the bytes each
// hop sends, and under each box the stage's compute time of the last step.

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 720;
const PAGE_BOX = 110;
const GAP = 34;
const BOX_Y = 20;
const BOX_H = 48;

function node(name, attributes, text) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

function box(x, width, lines, className) {
  const group = node('g', { class: className });
  group.append(node('rect', { x, y: BOX_Y, width, height: BOX_H, rx: 6 }));
  lines.forEach((line, index) => {
    group.append(node('text', { x: x + width / 2, y: BOX_Y + 19 + index * 16, 'text-anchor': 'middle' }, line));
  });
  return group;
}

function arrow(x1, x2, label) {
  const group = node('g', { class: 'hop' });
  const y = BOX_Y + BOX_H / 2;
  group.append(node('line', { x1, y1: y, x2: x2 - 4, y2: y, 'marker-end': 'url(#chain-arrow)' }));
  if (label) group.append(node('text', { x: (x1 + x2) / 2, y: y - 6, 'text-anchor': 'middle' }, label));
  return group;
}

const kb = (bytes) => (bytes >= 1024 ? `${(bytes / 1024).toFixed(0)} KB` : `${bytes} B`);

/** Draws `plan` (a `plan` FleetEvent) with `hops` (the last `step` event's, or []) into `svg`. */
export function drawChain(svg, plan, hops = []) {
  svg.textContent = '';
  const stages = plan.stages;
  const layers = stages.reduce((sum, s) => sum + (s.layers[1] - s.layers[0]), 0) || 1;
  const room = WIDTH - PAGE_BOX - GAP * stages.length - 4;
  const defs = node('defs', {});
  const marker = node('marker', { id: 'chain-arrow', markerWidth: 8, markerHeight: 8, refX: 6, refY: 4, orient: 'auto' });
  marker.append(node('path', { d: 'M0,0 L8,4 L0,8 z' }));
  defs.append(marker);
  svg.append(defs, box(2, PAGE_BOX, ['this page', 'tokens, sampling'], 'page'));
  let x = 2 + PAGE_BOX;
  stages.forEach((stage, index) => {
    const width = Math.max(70, (room * (stage.layers[1] - stage.layers[0])) / layers);
    const previous = index === 0 ? null : hops[index - 1];
    svg.append(arrow(x, x + GAP, previous ? kb(previous.bytesOut) : ''));
    x += GAP;
    const span = `layers ${stage.layers[0]}–${stage.layers[1] - 1}`;
    const group = box(x, width, [`stage ${stage.stageId} · ${stage.peer.slice(0, 8)}`, span], 'stage');
    const hop = hops[index];
    const time = hop ? `${hop.computeMs.toFixed(1)} ms` : '–';
    group.append(node('text', { x: x + width / 2, y: BOX_Y + BOX_H + 16, 'text-anchor': 'middle', class: 'time' }, time));
    svg.append(group);
    x += width;
  });
  svg.setAttribute('viewBox', `0 0 ${Math.max(WIDTH, x + 4)} ${BOX_Y + BOX_H + 24}`);
  svg.removeAttribute('hidden');
}
