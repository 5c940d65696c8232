// What the donor page says: each state and error as plain sentences for a volunteer.

const seconds = (ms) => {
  const s = Math.round(ms / 1000);
  return s < 120 ? `${s} s` : `${Math.floor(s / 60)} min ${s % 60} s`;
};

const layerRange = ({ start, end }) => `${start}–${end - 1}`;

/** `{ title, detail }` for a `DonorStatus`, `sinceMs` being how long its phase has lasted. */
export function describeStatus(status, sinceMs) {
  switch (status.phase) {
    case 'Joining':
      return {
        title: 'Waiting for a coordinator',
        detail:
          `Connected to the signaling server; waited ${seconds(sinceMs)} so far. Nobody has asked for this GPU yet: ` +
          'it is lent once someone starts a job with this fleet token (for example `runner coordinate`). ' +
          'Keep the tab open; nothing is downloaded until then.',
      };
    case 'Loading':
      return {
        title: status.layers ? `Loading layers ${layerRange(status.layers)}` : 'Loading the layers the coordinator assigned',
        detail:
          `The coordinator picked this GPU for part of the model. It is downloading those layers' weights ` +
          `(only their byte ranges) and uploading them to the GPU: ${seconds(sinceMs)} so far.`,
      };
    case 'Serving':
      return {
        title: status.layers ? `Serving layers ${layerRange(status.layers)}` : 'Serving',
        detail:
          `For every token, the previous stage sends this tab its activations; this GPU runs its layers and passes the ` +
          `result on. ${status.steps} step${status.steps === 1 ? '' : 's'} so far` +
          (status.steps ? `, the last in ${status.last_step_ms.toFixed(1)} ms.` : '; waiting for the first token.'),
      };
    default:
      return { title: 'Leaving the fleet', detail: 'Saying goodbye to the coordinator.' };
  }
}

/** `{ title, detail }` for how `Donor.start` ended (`exit` as the wasm returns it). */
export function describeExit(exit, steps) {
  const served = `This GPU served ${steps} step${steps === 1 ? '' : 's'}.`;
  switch (exit.exit) {
    case 'dismissed':
      return {
        title: 'Finished: the coordinator released this GPU',
        detail: `${served} The coordinator said: "${exit.reason}". Thank you! Press Start lending to wait for the next job.`,
      };
    case 'coordinator-left':
      return { title: 'Finished: the coordinator went away', detail: `${served} Its connection ended without a goodbye.` };
    case 'stopped':
      return { title: 'Stopped', detail: `${served} You stopped lending on this page.` };
    default:
      return { title: 'Disconnected', detail: `${served} The connection to the fleet closed.` };
  }
}

/** Strips the `fleet: ` prefix and starts with a capital: the title says it is about the fleet. */
function sentence(message) {
  const text = message.replace(/^fleet: /, '').trim();
  const capital = text.charAt(0).toUpperCase() + text.slice(1);
  return /[.)!?]$/.test(capital) ? capital : `${capital}.`;
}

/** `{ title, detail }` for an error thrown by the wasm (`kind` as `WebError::kind`). */
export function describeError(message, kind) {
  const detail = sentence(message);
  if (kind === 'fleet' && /signaling/.test(message)) {
    return {
      title: 'Could not reach the signaling server',
      detail: `${detail} Check the address and that \`runner serve\` is running there.`,
    };
  }
  const titles = {
    options: 'Check the settings',
    'no-webgpu': 'This browser cannot lend its GPU',
    gpu: 'The GPU reported an error',
    'device-lost': 'The GPU stopped responding',
    fleet: 'The fleet reported a problem',
  };
  return { title: titles[kind] || 'Something went wrong', detail };
}
