// The chat page as the coordinator of a fleet of donors (wasm `Coordinator`), behind the
// interface app.js uses for the worker engine:
//   const engine = await FleetEngine.connect({ signal, fleet, donors, model, maxContext,
//                                              joinTimeoutS, heartbeatTimeoutS },
//                                            { onEvent, signal: abortSignal });
//   const out = await engine.generate(prompt, options, onToken);   // onToken(text, { index, id })
//   const out = await engine.chat([{ role, content }], options, onToken);
//   engine.abort();  // stops the generation, which dismisses the fleet
//
// It runs on the page, not in the engine's worker: Chromium has no RTCPeerConnection in
// workers. The coordinator only tokenizes, samples and routes; the donors' GPUs compute.
import init, { Coordinator } from '/pkg/webshard.js';

export class FleetEngine {
  constructor(coordinator) {
    this.coordinator = coordinator;
    this.info = coordinator.info();
    this.closed = false;
  }

  /** Joins the fleet; resolves once the plan's stages have all loaded their layers. */
  static async connect(settings, { onEvent, signal } = {}) {
    await init();
    const coordinator = await Coordinator.connect({ ...settings, onEvent, abortSignal: signal });
    return new FleetEngine(coordinator);
  }

  generate(prompt, options = {}, onToken) {
    return this.track(this.coordinator.generate(prompt, options, (token) => onToken?.(token.text, token)));
  }

  chat(messages, options = {}, onToken) {
    return this.track(this.coordinator.chat(messages, options, (token) => onToken?.(token.text, token)));
  }

  /** A stopped or failed generation dismisses the fleet: note it for the page. */
  async track(running) {
    try {
      const out = await running;
      if (out.aborted) this.closed = true;
      return out;
    } catch (err) {
      if (err.kind === 'fleet') this.closed = true;
      throw err;
    }
  }

  abort() {
    this.coordinator.stop();
  }

  /** Nothing to forget: every turn sends the whole conversation through the chain. */
  reset() {}

  async close() {
    this.closed = true;
    await this.coordinator.close();
  }
}
