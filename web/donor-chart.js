// A sparkline chart of the donor's steps on a canvas: stage time (left scale) and the kB it
// received and sent per step (right scale). No chart library: three polylines do.

const COLORS = { ms: '#2a6adf', in: '#2a9a4a', out: '#d07a10' };
const MAX_POINTS = 120;

/** A scale's top: the first step is the prompt (its prefill and, on a fresh page, the kernels'
 * compilation: often a hundred times a token's step), so with later steps to show it is clipped
 * at the top rather than flattening them all to the axis. */
function scaleOf(points, value, floor) {
  const shown = points.length > 2 && points[0].step === 1 ? points.slice(1) : points;
  return Math.max(floor, ...shown.map(value));
}

/** Points `{ step, ms, kbIn, kbOut }`, newest last; keeps the latest MAX_POINTS. */
export class StepChart {
  constructor(canvas) {
    this.canvas = canvas;
    this.points = [];
  }

  add(point) {
    this.points.push(point);
    if (this.points.length > MAX_POINTS) this.points.shift();
    this.canvas.dataset.points = String(this.points.length);
    this.draw();
  }

  clear() {
    this.points = [];
    this.canvas.dataset.points = '0';
    this.draw();
  }

  draw() {
    const { canvas } = this;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = getComputedStyle(canvas).color;
    if (!this.points.length) {
      ctx.fillText('No steps yet: the chart starts with the first token through this GPU.', 8, height / 2);
      return;
    }
    const box = { left: 58, right: width - 62, top: 8, bottom: height - 18 };
    const maxMs = scaleOf(this.points, (p) => p.ms, 1);
    const maxKb = scaleOf(this.points, (p) => Math.max(p.kbIn, p.kbOut), 0.1);
    this.axes(ctx, box, maxMs, maxKb);
    const first = this.points[0];
    if (first.ms > maxMs && first.step === 1) ctx.fillText(`(step 1, the prompt: ${first.ms.toFixed(0)} ms, off the scale)`, box.left + 50, box.bottom + 13);
    this.line(ctx, box, (p) => p.ms / maxMs, COLORS.ms);
    this.line(ctx, box, (p) => p.kbIn / maxKb, COLORS.in);
    this.line(ctx, box, (p) => p.kbOut / maxKb, COLORS.out);
  }

  axes(ctx, box, maxMs, maxKb) {
    ctx.strokeStyle = '#8886';
    ctx.beginPath();
    ctx.moveTo(box.left, box.top);
    ctx.lineTo(box.left, box.bottom);
    ctx.lineTo(box.right, box.bottom);
    ctx.stroke();
    ctx.fillText(`${maxMs.toFixed(0)} ms`, 2, box.top + 8);
    ctx.fillText('0', box.left - 10, box.bottom);
    ctx.fillText(`${maxKb.toFixed(1)} kB`, box.right + 4, box.top + 8);
    const first = this.points[0].step;
    const last = this.points[this.points.length - 1].step;
    ctx.fillText(`step ${first}`, box.left, box.bottom + 13);
    ctx.fillText(`step ${last}`, box.right - 40, box.bottom + 13);
  }

  line(ctx, box, value, color) {
    const n = this.points.length;
    const x = (i) => (n === 1 ? (box.left + box.right) / 2 : box.left + ((box.right - box.left) * i) / (n - 1));
    const y = (p) => box.bottom - (box.bottom - box.top) * Math.min(1, value(p));
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    this.points.forEach((p, i) => (i ? ctx.lineTo(x(i), y(p)) : ctx.moveTo(x(i), y(p))));
    ctx.stroke();
    const lastIndex = n - 1;
    ctx.beginPath();
    ctx.arc(x(lastIndex), y(this.points[lastIndex]), 3, 0, 2 * Math.PI);
    ctx.fill();
    ctx.lineWidth = 1;
  }
}
