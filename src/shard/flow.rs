//! Flow control for transports without backpressure of their own (matchbox's data channels
//! queue without bound): a credit window per direction of each peer pair, and the ping that
//! tells a sender what the peer's transport has received.
//!
//! A sender may have at most `WINDOW_BYTES` of wire messages to a peer not yet acknowledged.
//! The receiver acknowledges bytes once its application has taken them (`recv`), in credit
//! messages of at least `CREDIT_THRESHOLD` bytes, so a receiver that stops reading stops its
//! senders after one window. The window is a protocol constant, not negotiated: the receiver
//! also enforces it, and a peer that sends beyond it is in breach.
//!
//! Control messages, 8 bytes: `tag | flags (0) | reserved: u16 (0) | value: u32 LE`.
//! - credit (`0xC2`): the value is bytes acknowledged;
//! - ping (`0xC3`): the receiving transport answers with a pong of the same value as soon as
//!   the ping arrives, whatever its application does; the channel is ordered, so the pong
//!   says every message sent before the ping has arrived;
//! - pong (`0xC4`).
//!
//! Every other message, a malformed control message included, is a data message (a chunk,
//! `0xC1`, or garbage) and counts against the window by its length.

use super::chunk::{ChunkError, MAX_CHUNK_BYTES};

/// Unacknowledged bytes a sender may have in flight to one peer.
pub const WINDOW_BYTES: u32 = 1 << 20;
/// Consumed bytes a receiver gathers before it sends a credit: fewer, larger credits, and
/// still far below `WINDOW_BYTES - MAX_CHUNK_BYTES`, so a sender waiting for room always
/// gets it once the receiver has read what is in flight.
pub const CREDIT_THRESHOLD: u32 = 64 << 10;
/// First byte of a credit message.
pub const CREDIT_TAG: u8 = 0xC2;
/// First byte of a ping.
pub const PING_TAG: u8 = 0xC3;
/// First byte of a pong.
pub const PONG_TAG: u8 = 0xC4;
/// Length of every control message.
pub const CREDIT_LEN: usize = 8;

const _: () = assert!(CREDIT_THRESHOLD as usize + MAX_CHUNK_BYTES < WINDOW_BYTES as usize);

/// A credit acknowledging `bytes` consumed bytes.
pub fn encode_credit(bytes: u32) -> [u8; CREDIT_LEN] {
    encode_control(CREDIT_TAG, bytes)
}

/// A ping or a pong (`PING_TAG`, `PONG_TAG`) carrying `value`.
pub fn encode_control(tag: u8, value: u32) -> [u8; CREDIT_LEN] {
    let mut message = [0; CREDIT_LEN];
    message[0] = tag;
    message[4..].copy_from_slice(&value.to_le_bytes());
    message
}

/// A ping or a pong, as the transport's background task sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Echo {
    Ping(u32),
    Pong(u32),
}

/// `Some` for a well-formed ping or pong; anything else (malformed ones included) is a data
/// message or a credit.
pub fn parse_echo(message: &[u8]) -> Option<Echo> {
    let control: &[u8; CREDIT_LEN] = message.try_into().ok()?;
    if control[1..4] != [0, 0, 0] {
        return None;
    }
    let value = u32::from_le_bytes([control[4], control[5], control[6], control[7]]);
    match control[0] {
        PING_TAG => Some(Echo::Ping(value)),
        PONG_TAG => Some(Echo::Pong(value)),
        _ => None,
    }
}

/// `None` for a data message; for a credit message its byte count, or why it is malformed.
pub fn parse_credit(message: &[u8]) -> Option<Result<u32, ChunkError>> {
    if message.first() != Some(&CREDIT_TAG) {
        return None;
    }
    let Some(credit) = message.first_chunk::<CREDIT_LEN>() else {
        return Some(Err(ChunkError::CreditLength { len: message.len() }));
    };
    if message.len() != CREDIT_LEN {
        return Some(Err(ChunkError::CreditLength { len: message.len() }));
    }
    if credit[1] != 0 || credit[2] != 0 || credit[3] != 0 {
        return Some(Err(ChunkError::ReservedFlags {
            flags: credit[1] | credit[2] | credit[3],
        }));
    }
    let bytes = u32::from_le_bytes([credit[4], credit[5], credit[6], credit[7]]);
    if bytes > WINDOW_BYTES {
        return Some(Err(ChunkError::CreditTooLarge { bytes }));
    }
    Some(Ok(bytes))
}

/// The receiving side of one peer's window: bytes received and not yet acknowledged, split
/// into those the application has not read yet and those read but not yet credited.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveWindow {
    unacknowledged: u64,
    consumed: u32,
}

impl ReceiveWindow {
    /// A data message of `len` bytes arrived; refused when the sender went past the window.
    pub fn arrived(&mut self, len: usize) -> Result<(), ChunkError> {
        let unacknowledged = self.unacknowledged + len as u64;
        if unacknowledged > u64::from(WINDOW_BYTES) {
            return Err(ChunkError::WindowExceeded {
                unacknowledged,
                window: WINDOW_BYTES,
            });
        }
        self.unacknowledged = unacknowledged;
        Ok(())
    }

    /// The application took a data message of `len` bytes; returns the credit to send, if
    /// enough has been taken since the last.
    pub fn consumed(&mut self, len: usize) -> Option<u32> {
        let consumed = (self.consumed as usize + len).min(WINDOW_BYTES as usize) as u32;
        if consumed < CREDIT_THRESHOLD {
            self.consumed = consumed;
            return None;
        }
        self.consumed = 0;
        self.unacknowledged = self.unacknowledged.saturating_sub(u64::from(consumed));
        Some(consumed)
    }

    /// Bytes received and not yet acknowledged.
    pub fn unacknowledged(&self) -> u64 {
        self.unacknowledged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_round_trip_and_malformed_ones_are_refused() {
        assert_eq!(parse_credit(&encode_credit(70_000)), Some(Ok(70_000)));
        assert_eq!(parse_credit(&[0xC1, 0, 0, 0]), None);
        assert_eq!(parse_credit(&[]), None);
        assert_eq!(
            parse_credit(&[CREDIT_TAG, 0]),
            Some(Err(ChunkError::CreditLength { len: 2 }))
        );
        let mut long = encode_credit(1).to_vec();
        long.push(0);
        assert_eq!(
            parse_credit(&long),
            Some(Err(ChunkError::CreditLength { len: 9 }))
        );
        let mut flagged = encode_credit(1);
        flagged[2] = 4;
        assert_eq!(
            parse_credit(&flagged),
            Some(Err(ChunkError::ReservedFlags { flags: 4 }))
        );
        assert_eq!(
            parse_credit(&encode_credit(WINDOW_BYTES + 1)),
            Some(Err(ChunkError::CreditTooLarge {
                bytes: WINDOW_BYTES + 1
            }))
        );
    }

    #[test]
    fn pings_and_pongs_round_trip_and_malformed_ones_are_data() {
        assert_eq!(
            parse_echo(&encode_control(PING_TAG, 7)),
            Some(Echo::Ping(7))
        );
        assert_eq!(
            parse_echo(&encode_control(PONG_TAG, u32::MAX)),
            Some(Echo::Pong(u32::MAX))
        );
        assert_eq!(parse_echo(&encode_credit(7)), None);
        assert_eq!(parse_echo(&[PING_TAG, 0, 0, 0]), None);
        let mut flagged = encode_control(PING_TAG, 1);
        flagged[1] = 1;
        assert_eq!(parse_echo(&flagged), None);
        let mut long = encode_control(PONG_TAG, 1).to_vec();
        long.push(0);
        assert_eq!(parse_echo(&long), None);
    }

    #[test]
    fn receive_window_credits_what_was_read_and_refuses_overruns() {
        let mut window = ReceiveWindow::default();
        let chunk = MAX_CHUNK_BYTES;
        let per_window = WINDOW_BYTES as usize / chunk;
        for _ in 0..per_window {
            window.arrived(chunk).unwrap();
        }
        assert!(matches!(
            window.arrived(1),
            Err(ChunkError::WindowExceeded { .. })
        ));
        let credits: Vec<u32> = (0..per_window)
            .filter_map(|_| window.consumed(chunk))
            .collect();
        assert_eq!(credits.iter().sum::<u32>(), WINDOW_BYTES);
        assert_eq!(window.unacknowledged(), 0);
        window.arrived(chunk).unwrap();
    }
}
