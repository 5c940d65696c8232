//! The fleet token: who may join a fleet, and which signaling room it meets in.
//!
//! A fleet is one signaling room. Its name is derived from the token by a hash, so the token
//! itself never travels through the signaling server (URLs end up in logs), fleets sharing a
//! server are kept apart, and a server started with `runner serve --fleet TOKEN` can admit
//! only that room. The coordinator still checks the token in each donor's `Hello`
//! (`token_matches`): knowing the room name is not enough to be given work.

use sha2::{Digest, Sha256};

/// Domain separation: the same secret used elsewhere must not give the same room name.
const ROOM_CONTEXT: &[u8] = b"webshard fleet room v1\0";
/// Hex digits of the digest kept in the room name (128 bits).
const ROOM_HEX_LEN: usize = 32;
/// Longest room name `room_url` accepts: room names are path segments, not data.
pub const MAX_ROOM_LEN: usize = 64;

/// The signaling room of the fleet with this token: `fleet-` and 32 hex digits.
pub fn fleet_room(token: &str) -> String {
    let digest = Sha256::new()
        .chain_update(ROOM_CONTEXT)
        .chain_update(token.as_bytes())
        .finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("fleet-{}", &hex[..ROOM_HEX_LEN])
}

/// Whether a presented token is the fleet's. Compares digests, so the time taken says nothing
/// about how much of the token was right.
pub fn token_matches(expected: &str, presented: &str) -> bool {
    Sha256::digest(expected.as_bytes()) == Sha256::digest(presented.as_bytes())
}

/// Whether `room` can be a room name: 1 to 64 of `A-Z a-z 0-9 - _`, so it is one path
/// segment with nothing to escape.
pub fn is_valid_room(room: &str) -> bool {
    (1..=MAX_ROOM_LEN).contains(&room.len())
        && room
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `ws://HOST:PORT/signal` and a room give `ws://HOST:PORT/signal/ROOM`; `None` when the room
/// name is not valid or the URL is not a WebSocket URL.
pub fn room_url(signal_url: &str, room: &str) -> Option<String> {
    let is_websocket = signal_url.starts_with("ws://") || signal_url.starts_with("wss://");
    if !is_websocket || !is_valid_room(room) {
        return None;
    }
    Some(format!("{}/{room}", signal_url.trim_end_matches('/')))
}

/// The signaling server's URL from what a user gave: `ws://HOST:PORT/signal`, or the room's
/// own URL `ws://HOST:PORT/signal/ROOM` as `runner serve --fleet` prints it.
pub fn signal_base<'a>(signal_url: &'a str, room: &str) -> &'a str {
    let trimmed = signal_url.trim_end_matches('/');
    trimmed
        .strip_suffix(room)
        .and_then(|base| base.strip_suffix('/'))
        .unwrap_or(signal_url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_stable_distinct_and_valid() {
        let room = fleet_room("s3cret");
        assert_eq!(room, fleet_room("s3cret"));
        assert_ne!(room, fleet_room("s3cret "));
        assert!(room.starts_with("fleet-") && room.len() == 6 + ROOM_HEX_LEN);
        assert!(is_valid_room(&room));
        assert!(!room.contains("s3cret"));
    }

    #[test]
    fn tokens_match_only_exactly() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abc", "abd"));
        assert!(!token_matches("abc", ""));
    }

    #[test]
    fn room_urls() {
        assert_eq!(
            room_url("ws://127.0.0.1:8000/signal/", "r1").as_deref(),
            Some("ws://127.0.0.1:8000/signal/r1")
        );
        assert_eq!(room_url("http://h/signal", "r1"), None);
        assert_eq!(room_url("ws://h/signal", "a/b"), None);
        assert_eq!(room_url("ws://h/signal", ""), None);
        assert_eq!(room_url("ws://h/signal", &"x".repeat(65)), None);
    }

    #[test]
    fn the_room_url_printed_by_serve_is_taken_as_the_signal_url() {
        let room = fleet_room("t");
        let base = "ws://127.0.0.1:8000/signal";
        assert_eq!(signal_base(base, &room), base);
        assert_eq!(signal_base(&format!("{base}/{room}"), &room), base);
        assert_eq!(signal_base(&format!("{base}/{room}/"), &room), base);
        assert_eq!(
            signal_base("ws://h/signal/other", &room),
            "ws://h/signal/other"
        );
    }
}
