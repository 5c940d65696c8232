//! The signaling rooms: a full mesh, as matchbox_signaling's `FullMesh`, with a newcomer made
//! reachable before anyone is told of it.
//!
//! matchbox_signaling 0.15 announces a newcomer (`NewPeer`) to the room and only then adds it,
//! so a peer that answers the announcement at once (its offer) may reach the server while the
//! newcomer is still unknown there, and the offer is dropped: that pair never connects, and a
//! fleet waits out a rejoin (seen on CI as a coordinator short of a stage, and as a test's
//! instant hostile peer whose offers never arrived). Here joining, announcing and leaving
//! happen under one lock, in that order. Its `remove_peer` also unwraps a peer it may not hold.
//! The topology trait is matchbox's extension point, so only this state machine is ours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use axum::extract::ws::Message;
use futures_util::StreamExt;
use matchbox_protocol::{JsonPeerEvent, PeerId, PeerRequest};
use matchbox_signaling::common_logic::{parse_request, try_send, SignalingChannel};
use matchbox_signaling::{
    ClientRequestError, NoCallbacks, SignalingState, SignalingTopology, WsStateMeta,
};

/// Peers one room admits at once: a fleet is at most `shard::plan::MAX_DONORS` donors and
/// their coordinators, not a crowd; beyond this a newcomer is closed.
pub const MAX_ROOM_PEERS: usize = 1024;

/// The full mesh whose rooms are `Rooms`.
#[derive(Debug, Default)]
pub struct OrderedMesh;

/// Every room's peers and the channel that reaches each.
#[derive(Clone, Debug, Default)]
pub struct Rooms(Arc<Mutex<HashMap<String, HashMap<PeerId, SignalingChannel>>>>);

impl SignalingState for Rooms {}

impl Rooms {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<PeerId, SignalingChannel>>> {
        // A panic elsewhere cannot leave a room half-changed: every change is one map call.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `peer` to `room`, then tells the room's other peers; false when the room is full.
    fn join(&self, room: &str, peer: PeerId, channel: SignalingChannel) -> bool {
        let mut rooms = self.lock();
        let members = rooms.entry(room.to_string()).or_default();
        if members.len() >= MAX_ROOM_PEERS {
            return false;
        }
        members.insert(peer, channel);
        announce(members, peer, &JsonPeerEvent::NewPeer(peer));
        true
    }

    /// Removes `peer` from `room` and tells the peers left; an emptied room goes.
    fn leave(&self, room: &str, peer: PeerId) {
        let mut rooms = self.lock();
        let Some(members) = rooms.get_mut(room) else {
            return;
        };
        if members.remove(&peer).is_none() {
            return;
        }
        announce(members, peer, &JsonPeerEvent::PeerLeft(peer));
        if members.is_empty() {
            rooms.remove(room);
        }
    }

    /// Hands `event` to `receiver` in `room`; a peer unknown there (gone) gets nothing.
    fn send_to(&self, room: &str, receiver: PeerId, event: &JsonPeerEvent) {
        let rooms = self.lock();
        if let Some(channel) = rooms.get(room).and_then(|members| members.get(&receiver)) {
            // A closed channel is a peer on its way out; its leave follows.
            let _ = try_send(channel, Message::Text(event.to_string().into()));
        }
    }
}

/// Sends `event` to every member but `about`.
fn announce(members: &HashMap<PeerId, SignalingChannel>, about: PeerId, event: &JsonPeerEvent) {
    let text = event.to_string();
    for (_, channel) in members.iter().filter(|(id, _)| **id != about) {
        let _ = try_send(channel, Message::Text(text.clone().into()));
    }
}

#[async_trait]
impl SignalingTopology<NoCallbacks, Rooms> for OrderedMesh {
    /// One peer's socket, from joining its room to leaving it.
    async fn state_machine(upgrade: WsStateMeta<NoCallbacks, Rooms>) {
        let WsStateMeta {
            room,
            peer_id,
            sender,
            mut receiver,
            state,
            ..
        } = upgrade;
        if !state.join(&room, peer_id, sender.clone()) {
            tracing::warn!(
                "signaling room {room:?} is full ({MAX_ROOM_PEERS} peers): closed a newcomer"
            );
            let _ = try_send(&sender, Message::Close(None));
            return;
        }
        while let Some(request) = receiver.next().await {
            match parse_request(request) {
                Ok(PeerRequest::Signal { receiver, data }) => {
                    let event = JsonPeerEvent::Signal {
                        sender: peer_id,
                        data,
                    };
                    state.send_to(&room, receiver, &event);
                }
                Ok(PeerRequest::KeepAlive) => {}
                // Not a request: skipped, as matchbox's own mesh does.
                Err(ClientRequestError::Json(_) | ClientRequestError::UnsupportedType(_)) => {}
                Err(ClientRequestError::Close | ClientRequestError::Axum(_)) => break,
            }
        }
        state.leave(&room, peer_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    type Inbox = UnboundedReceiver<Result<Message, axum::Error>>;

    fn peer(n: u128) -> PeerId {
        PeerId(uuid::Uuid::from_u128(n))
    }

    fn joined(rooms: &Rooms, room: &str, n: u128) -> Inbox {
        let (channel, inbox) = unbounded_channel();
        assert!(rooms.join(room, peer(n), channel), "peer {n} joins {room}");
        inbox
    }

    /// Every event waiting in `inbox`, as text.
    fn events(inbox: &mut Inbox) -> Vec<String> {
        std::iter::from_fn(|| inbox.try_recv().ok())
            .map(|message| match message {
                Ok(Message::Text(text)) => text.to_string(),
                other => panic!("not a text event: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_newcomer_is_reachable_when_the_room_hears_of_it_and_gone_when_it_hears_it_left() {
        let rooms = Rooms::default();
        let mut first = joined(&rooms, "fleet", 1);
        let mut second = joined(&rooms, "fleet", 2);
        assert_eq!(
            events(&mut first),
            [JsonPeerEvent::NewPeer(peer(2)).to_string()]
        );
        assert!(
            events(&mut second).is_empty(),
            "no one announces a peer to itself"
        );
        let offer = JsonPeerEvent::Signal {
            sender: peer(1),
            data: serde_json::json!({ "Offer": "sdp" }),
        };
        rooms.send_to("fleet", peer(2), &offer);
        assert_eq!(events(&mut second), [offer.to_string()]);
        rooms.leave("fleet", peer(2));
        assert_eq!(
            events(&mut first),
            [JsonPeerEvent::PeerLeft(peer(2)).to_string()]
        );
        rooms.send_to("fleet", peer(2), &offer);
        assert!(events(&mut second).is_empty(), "a peer gone gets nothing");
    }

    #[test]
    fn rooms_are_apart_and_bad_leaves_and_receivers_are_ignored() {
        let rooms = Rooms::default();
        let mut a = joined(&rooms, "a", 1);
        let mut b = joined(&rooms, "b", 2);
        rooms.send_to("a", peer(2), &JsonPeerEvent::NewPeer(peer(9)));
        rooms.leave("a", peer(2));
        rooms.leave("nowhere", peer(1));
        assert!(events(&mut a).is_empty() && events(&mut b).is_empty());
        rooms.leave("b", peer(2));
        assert!(!rooms.lock().contains_key("b"), "an emptied room goes");
    }

    #[test]
    fn a_full_room_closes_the_newcomer_and_keeps_its_peers() {
        let rooms = Rooms::default();
        let inboxes: Vec<Inbox> = (0..MAX_ROOM_PEERS as u128)
            .map(|n| joined(&rooms, "fleet", n))
            .collect();
        let (channel, _inbox) = unbounded_channel();
        assert!(!rooms.join("fleet", peer(u128::MAX), channel));
        assert_eq!(rooms.lock()["fleet"].len(), MAX_ROOM_PEERS);
        drop(inboxes);
    }
}
