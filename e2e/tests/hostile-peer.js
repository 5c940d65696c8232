// A hostile peer in a fleet's signaling room, run in a page of its own (browsers have the
// WebSocket): it offers malformed descriptions to every peer that joins after it, and answers
// every offer first with garbage, then with a well-formed answer, then with candidates a
// browser refuses. Matchbox unwraps what the WebRTC stack makes of them, so before the
// signaller checked signals (`shard::webrtc::signaller`) one such signal aborted a donor
// page's wasm. `attacks` counts what it sent.
const crypto = require('node:crypto');

/** The room of the fleet with `token`, as `shard::fleet::fleet_room` names it. */
function fleetRoom(token) {
  const digest = crypto.createHash('sha256').update('webshard fleet room v1\0').update(token).digest('hex');
  return `fleet-${digest.slice(0, 32)}`;
}

/** Runs in the hostile page. */
function attackRoom(roomUrl) {
  const GARBAGE = 'this is not a session description \u0000\u0001';
  const hex = () => Array.from({ length: 32 }, () => Math.floor(Math.random() * 256).toString(16).padStart(2, '0').toUpperCase()).join(':');
  const description = (mid, setup) => [
    'v=0', `o=- ${Date.now()} 2 IN IP4 127.0.0.1`, 's=-', 't=0 0', `a=group:BUNDLE ${mid}`,
    'm=application 9 UDP/DTLS/SCTP webrtc-datachannel', 'c=IN IP4 0.0.0.0',
    'a=ice-ufrag:hostile1', 'a=ice-pwd:hostilehostilehostile123', `a=fingerprint:sha-256 ${hex()}`,
    `a=setup:${setup}`, `a=mid:${mid}`, 'a=sctp-port:5000', 'a=max-message-size:262144', '',
  ].join('\r\n');
  // Parses as SDP, but a browser refuses a description without a DTLS fingerprint.
  const NO_FINGERPRINT = description('0', 'actpass').replace(/a=fingerprint:[^\r]*\r\n/, '');
  const candidates = (mid) => [
    '{not json',
    JSON.stringify({ candidate: 'garbage', sdpMid: mid, sdpMLineIndex: 0 }),
    JSON.stringify({ candidate: 'candidate:1 1 udp 2130706431 192.0.2.1 9 typ host', sdpMid: 'nope' }),
    JSON.stringify({ candidate: 'candidate:1 1 udp 2130706431 192.0.2.1 9 typ host', sdpMid: mid, usernameFragment: 'zzzz' }),
  ];
  window.attacks = { offers: 0, answers: 0, candidates: 0 };
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(roomUrl);
    const signal = (receiver, data) => socket.send(JSON.stringify({ Signal: { receiver, data } }));
    const attack = (peer, kind, bodies, mid) => {
      for (const body of bodies) signal(peer, { [kind]: body });
      for (const candidate of candidates(mid)) signal(peer, { IceCandidate: candidate });
      window.attacks[kind === 'Offer' ? 'offers' : 'answers'] += bodies.length;
      window.attacks.candidates += 4;
    };
    socket.onopen = () => resolve();
    socket.onerror = () => reject(new Error(`the hostile peer could not join ${roomUrl}`));
    socket.onmessage = ({ data }) => {
      let event;
      try {
        event = JSON.parse(data);
      } catch {
        return;
      }
      if (event.NewPeer) attack(event.NewPeer, 'Offer', [GARBAGE, NO_FINGERPRINT], '0');
      const offer = event.Signal?.data?.Offer;
      if (offer) {
        const mid = /a=mid:(\S+)/.exec(offer)?.[1] ?? '0';
        attack(event.Signal.sender, 'Answer', [GARBAGE, description(mid, 'active')], mid);
      }
    };
  });
}

/** A hostile peer joined to `signal`'s room for `token`; `attacks()` reads its counts. */
async function openHostilePeer(browser, contexts, { base, signal, token }) {
  const context = await browser.newContext();
  contexts.push(context);
  const page = await context.newPage();
  // A document of the server's origin: Chromium keeps about:blank from reaching loopback.
  await page.goto(`${base}/models/index.json`);
  await page.evaluate(attackRoom, `${signal}/${fleetRoom(token)}`);
  return { attacks: () => page.evaluate(() => window.attacks) };
}

module.exports = { openHostilePeer };
