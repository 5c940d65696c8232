//! The signaling rooms of `runner serve`, spoken to directly: peers that answer a newcomer's
//! announcement at once must all reach it. matchbox_signaling's own mesh announced a newcomer
//! before adding it, so such an answer was dropped whenever the server's thread lost the core
//! between the two (`src/signal/mesh.rs`); on CI a fleet lost a link and a hostile test peer's
//! offers vanished that way. Busy threads here take the cores from the server as CI's load did.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::fleet_support::{serial, Server};
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

/// Peers already in the room, each answering every newcomer at once.
const ELDERS: usize = 8;
/// Newcomers per run.
const ROUNDS: usize = 500;
/// Threads that only spin, so the server is preempted often.
const SPINNERS: usize = 4;
/// How long a newcomer waits for its answers (they take a millisecond or so).
const WAIT: Duration = Duration::from_secs(2);

/// A peer in the room; `quiet`, when given, ends its reads (a newcomer's).
fn join(room_url: &str, quiet: Option<Duration>) -> Socket {
    let (socket, _) = tungstenite::connect(room_url).expect("a peer joins the room");
    if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
        stream.set_read_timeout(quiet).expect("read timeout");
    }
    socket
}

/// The next text event the server sends `socket`; `None` once it is closed (or quiet).
fn next_event(socket: &mut Socket) -> Option<Value> {
    loop {
        match socket.read() {
            Ok(Message::Text(text)) => return serde_json::from_str(&text).ok(),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// An elder: signals its own id to every newcomer as soon as it is announced.
fn elder(room_url: &str) -> thread::JoinHandle<()> {
    let mut socket = join(room_url, None);
    let id = next_event(&mut socket).expect("IdAssigned")["IdAssigned"].clone();
    thread::spawn(move || {
        while let Some(event) = next_event(&mut socket) {
            if let Some(newcomer) = event["NewPeer"].as_str() {
                let data = json!({ "IceCandidate": id });
                let request = json!({ "Signal": { "receiver": newcomer, "data": data } });
                if socket
                    .send(Message::Text(request.to_string().into()))
                    .is_err()
                {
                    return;
                }
            }
        }
    })
}

#[test]
fn peers_answering_each_newcomer_at_once_always_reach_it() {
    let _turn = serial();
    let server = Server::start();
    let _elders: Vec<_> = (0..ELDERS).map(|_| elder(&server.room_url)).collect();
    let spinning = Arc::new(AtomicBool::new(true));
    let spinners: Vec<_> = (0..SPINNERS)
        .map(|_| {
            let spinning = Arc::clone(&spinning);
            thread::spawn(move || {
                while spinning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let mut newcomer = join(&server.room_url, Some(WAIT));
        let assigned = next_event(&mut newcomer).expect("IdAssigned");
        assert!(assigned["IdAssigned"].is_string(), "{assigned}");
        let deadline = Instant::now() + WAIT;
        let mut heard = 0;
        while heard < ELDERS && Instant::now() < deadline {
            match next_event(&mut newcomer) {
                Some(event) if event["Signal"].is_object() => heard += 1,
                Some(_) => {}
                None => break,
            }
        }
        if heard < ELDERS {
            lost.push((round, ELDERS - heard));
        }
        newcomer.close(None).expect("the newcomer leaves");
    }
    spinning.store(false, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().expect("spinner");
    }
    assert!(
        lost.is_empty(),
        "(round, answers lost) of {ROUNDS} newcomers, {ELDERS} elders: {lost:?}"
    );
}
