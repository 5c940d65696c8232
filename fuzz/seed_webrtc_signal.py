#!/usr/bin/env python3
"""Seeds for the webrtc_signal fuzz target in its input format (records split by 0xFF, each a
kind byte then a body): a browser-like offer and answer, their candidates, a webrtc-rs
candidate, end-of-candidates and a peer leaving. Writes fuzz/corpus/webrtc_signal/."""

import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "webrtc_signal")
FINGERPRINT = ":".join(f"{b:02X}" for b in range(32))


def sdp(setup, ufrag):
    return "\r\n".join([
        "v=0", "o=- 4611731400430051336 2 IN IP4 127.0.0.1", "s=-", "t=0 0",
        "a=group:BUNDLE 0", "a=msid-semantic: WMS",
        "m=application 54321 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 127.0.0.1",
        "a=candidate:842163049 1 udp 1677729535 127.0.0.1 54321 typ host generation 0",
        f"a=ice-ufrag:{ufrag}", "a=ice-pwd:abcdefghijklmnopqrstuvwx", "a=ice-options:trickle",
        f"a=fingerprint:sha-256 {FINGERPRINT}", f"a=setup:{setup}", "a=mid:0",
        "a=sctp-port:5000", "a=max-message-size:262144", ""])


def candidate(ufrag, mid="0"):
    return json.dumps({"candidate": "candidate:842163049 1 udp 1677729535 127.0.0.1 54321 "
                       "typ host generation 0", "sdpMid": mid, "sdpMLineIndex": 0,
                       "usernameFragment": ufrag})


def record(kind, sender, body):
    return bytes([kind % 4 | (sender << 4)]) + body.encode()


SEEDS = {
    "offer_then_candidates": [record(0, 1, sdp("actpass", "abcd")), record(2, 1, candidate("abcd")),
                              record(2, 1, "null"), record(3, 1, "")],
    "answer_then_candidates": [record(1, 2, sdp("active", "wxyz")), record(2, 2, candidate("wxyz")),
                               record(2, 2, json.dumps({"candidate": "", "sdpMid": "0"}))],
    "webrtc_rs_candidate": [record(0, 3, sdp("actpass", "Rs0Ufrag1234abcd")),
                            record(2, 3, json.dumps({"candidate": "candidate:1 1 UDP 2130706431 "
                                                     "10.0.0.1 5000 typ host", "sdpMid": "",
                                                     "sdpMLineIndex": 0, "usernameFragment": None,
                                                     "url": None}))],
}

os.makedirs(OUT, exist_ok=True)
for name, records in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(b"\xff".join(records))
print(f"wrote {len(SEEDS)} seeds to {OUT}")
