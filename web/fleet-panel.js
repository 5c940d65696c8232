// The chat page's Fleet panel: renders what the coordinator reports (`FleetEvent`s: donors,
// plan, stages ready, steps, donors lost) and keeps it in window.__fleet for tests:
// { events, plan, steps, tokens }. The chain is drawn as a picture too (fleet-chain.js).
import { drawChain } from './fleet-chain.js';

const $ = (id) => document.getElementById(id);
const short = (peer) => peer.slice(0, 8);

export class FleetPanel {
  constructor() {
    this.reset();
  }

  reset() {
    this.plan = null;
    this.lastHops = [];
    window.__fleet = { events: [], plan: null, steps: 0, tokens: 0 };
    $('fleet-log').textContent = '';
    $('fleet-progress').textContent = '';
    $('fleet-plan').hidden = true;
    $('fleet-chain').setAttribute('hidden', '');
  }

  status(text, state) {
    $('fleet-status').textContent = text;
    document.body.dataset.fleet = state;
  }

  log(text) {
    const item = document.createElement('li');
    item.textContent = text;
    $('fleet-log').append(item);
  }

  /** One `FleetEvent` from the coordinator. */
  onEvent(event) {
    window.__fleet.events.push(event);
    const describe = {
      joined: () => `peer ${short(event.peer)} entered the room`,
      donor: () =>
        event.accepted
          ? `donor ${short(event.peer)}: ${event.adapter || 'unknown adapter'}, ${event.gpuMib} MiB, ` +
            `${event.msPerLayer.toFixed(2)} ms per layer`
          : `refused ${short(event.peer)}: another fleet token`,
      plan: () => `plan (epoch ${event.epoch}): ${event.stages.length} stage(s)`,
      ready: () => `stage ${event.stageId} loaded on ${short(event.peer)} in ${(event.loadMs / 1000).toFixed(1)} s`,
      'donor-error': () => `donor ${short(event.peer)} reported ${event.code}: ${event.message}`,
      left: () => `donor ${short(event.peer)} left${event.inPlan ? ': re-planning without it' : ''}`,
    }[event.type];
    if (describe) this.log(describe());
    if (event.type === 'plan') this.showPlan(event);
    if (event.type === 'step') this.showStep(event);
    if (event.type === 'left' && event.inPlan) this.status('a donor left: re-planning and replaying', 'recovering');
  }

  showPlan(event) {
    this.plan = event;
    window.__fleet.plan = event;
    const body = $('fleet-plan').querySelector('tbody');
    body.textContent = '';
    for (const stage of event.stages) {
      const row = document.createElement('tr');
      const cells = [
        String(stage.stageId),
        short(stage.peer),
        stage.adapter || 'unknown',
        `${stage.layers[0]}–${stage.layers[1] - 1}${stage.embedding ? ' + embedding' : ''}${stage.head ? ' + head' : ''}`,
        '–',
      ];
      for (const text of cells) {
        const cell = document.createElement('td');
        cell.textContent = text;
        row.append(cell);
      }
      body.append(row);
    }
    $('fleet-plan').hidden = false;
    drawChain($('fleet-chain'), event);
  }

  /** Each stage's compute time of the step, in the plan table and the progress line. */
  showStep(event) {
    window.__fleet.steps += 1;
    const rows = $('fleet-plan').querySelectorAll('tbody tr');
    event.hops.forEach((hop, index) => {
      const cell = rows[index]?.lastElementChild;
      if (cell) cell.textContent = `${hop.computeMs.toFixed(1)} ms`;
    });
    this.lastHops = event.hops;
    if (this.plan) drawChain($('fleet-chain'), this.plan, event.hops);
  }

  /** Per-token progress: token count of `max` and the last step's hops. */
  onToken(count, max) {
    window.__fleet.tokens = count;
    const hops = this.lastHops.map((hop) => `stage ${hop.stageId} ${hop.computeMs.toFixed(1)} ms`).join(' → ');
    $('fleet-progress').textContent = `token ${count} of at most ${max}${hops ? ` · last step: ${hops}` : ''}`;
  }
}
