//! Signaling-server messages as a hostile room member can shape them, through the gate every
//! WebRTC socket puts before matchbox (`shard::webrtc::SignalGate`): records separated by
//! 0xFF, each a kind byte (offer, answer, candidate or a peer leaving, from one of four
//! senders) and a body sent as that signal's text, then the body alone as a whole message.
//! The gate must return, never panic (its per-peer state is bounded by `MAX_PEERS`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use webshard::shard::webrtc::SignalGate;

fuzz_target!(|data: &[u8]| {
    let mut gate = SignalGate::default();
    for record in data.split(|&b| b == 0xff) {
        let Some((&kind, body)) = record.split_first() else {
            continue;
        };
        let body = String::from_utf8_lossy(body);
        let sender = format!("00000000-0000-0000-0000-00000000000{}", (kind >> 4) % 4);
        let message = match kind % 4 {
            0 => json!({ "Signal": { "sender": sender, "data": { "Offer": body } } }),
            1 => json!({ "Signal": { "sender": sender, "data": { "Answer": body } } }),
            2 => json!({ "Signal": { "sender": sender, "data": { "IceCandidate": body } } }),
            _ => json!({ "PeerLeft": sender }),
        };
        let _ = gate.admit(&message.to_string());
        let _ = gate.admit(&body);
    }
});
