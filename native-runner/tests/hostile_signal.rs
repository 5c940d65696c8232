//! A hostile peer in the fleet's signaling room: it answers every offer with a malformed SDP
//! answer, offers malformed SDP to every newcomer, and sends garbage ICE candidates. Matchbox
//! unwraps what it parses from a peer's SDP, so before `shard::webrtc` checked signals such a
//! peer ended the socket of every runner in the room. Now the donor and the coordinator drop
//! those signals with one warning each and serve a generation as if the peer were not there.

use crate::common;
#[allow(dead_code)]
use crate::fleet_support;

use std::net::TcpStream;
use std::thread;

use common::SMOLLM2;
use fleet_support::*;
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// Not SDP at all, and far from it.
const GARBAGE_SDP: &str = "this is not a session description \u{0}\u{1}";
const GARBAGE_CANDIDATES: [&str; 3] = ["{not json", "[1,2,3]", "{\"candidate\": 42}"];

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

fn send(socket: &mut Socket, receiver: &str, data: Value) {
    let request = json!({ "Signal": { "receiver": receiver, "data": data } });
    // The room may close under a dying test; nothing to do then.
    let _ = socket.send(Message::Text(request.to_string().into()));
}

/// Malformed signals to `peer`: `kind` ("Offer" or "Answer") and every garbage candidate.
fn attack(socket: &mut Socket, peer: &str, kind: &str) {
    send(socket, peer, json!({ kind: GARBAGE_SDP }));
    for candidate in GARBAGE_CANDIDATES {
        send(socket, peer, json!({ "IceCandidate": candidate }));
    }
}

/// Joins `room_url` and attacks every peer it hears of, until the room closes.
fn hostile_peer(room_url: &str) -> thread::JoinHandle<()> {
    let (mut socket, _) = tungstenite::connect(room_url).expect("the hostile peer joins");
    thread::spawn(move || {
        while let Ok(message) = socket.read() {
            let Message::Text(text) = message else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if let Some(peer) = event["NewPeer"].as_str() {
                attack(&mut socket, peer, "Offer");
            } else if let Some(peer) = event["Signal"]["sender"].as_str() {
                if event["Signal"]["data"].get("Offer").is_some() {
                    attack(&mut socket, peer, "Answer");
                }
            }
        }
    })
}

#[test]
fn a_hostile_peer_sending_malformed_sdp_and_candidates_does_not_stop_a_fleet() {
    let _turn = serial();
    let expected = reference(SMOLLM2, PROMPT, 4);
    let server = Server::start();
    // One before the donor (it offers to the donor), one after (it answers the donor's offer).
    let _early = hostile_peer(&server.room_url);
    let mut donor = server.donor("donor", &[]);
    donor.peer_id();
    let _late = hostile_peer(&server.room_url);
    let mut coordinator = server.coordinate(SMOLLM2, 1, &[PROMPT], 4, &[]);
    let json = coordinator.json_with(RUN_LIMIT, &[&donor.0]);
    assert_eq!(ids_of(&json["ids"]), expected, "{json}");
    donor.wait_back_in_room(1);
    for (name, stderr) in [
        ("donor", donor.0.stderr()),
        ("coordinator", coordinator.stderr()),
    ] {
        assert!(!stderr.contains("panicked"), "{name}:\n{stderr}");
        let dropped = stderr
            .lines()
            .filter(|l| l.contains("dropped a malformed WebRTC signal"))
            .count();
        assert!(
            dropped >= 2,
            "{name} reported no malformed signal:\n{stderr}"
        );
    }
}
