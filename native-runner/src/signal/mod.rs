//! `/signal`: WebRTC signaling for the shard fleet, as routes of `runner serve`.
//!
//! The server is matchbox_signaling's, with our full mesh (`mesh`: a newcomer is reachable
//! before it is announced): a WebSocket at `/signal/<room>` (or `/signal`, room "world") puts
//! the peer in that room, and every pair of peers in a room exchanges its offers, answers and
//! ICE candidates through it. matchbox_signaling builds an axum 0.8 router
//! (the same axum as ours) and normally serves it itself; `build_with` hands us that router,
//! routes and state included, and we nest it under `/signal` so that one server and one port
//! serve the models, the pages and signaling.
//!
//! With a fleet token, only the fleet's room (`fleet_room(token)`) is admitted: any other
//! room gets 403 before the WebSocket upgrade.

use std::net::{Ipv4Addr, SocketAddr};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use matchbox_signaling::SignalingServerBuilder;
use webshard::shard::fleet_room;

mod mesh;

use mesh::{OrderedMesh, Rooms};

/// Where the signaling routes are nested.
pub const SIGNAL_PATH: &str = "/signal";

/// The signaling routes: `/signal` and `/signal/{room}`, every room open, or with
/// `fleet_token` only that fleet's room. The server they are merged into must be served with
/// `into_make_service_with_connect_info::<SocketAddr>()`: matchbox reads the peer address.
// The callback's `Result<bool, Response>` is matchbox's signature, large `Err` and all.
#[allow(clippy::result_large_err)]
pub fn signal_routes(fleet_token: Option<&str>) -> Router {
    let fleet = fleet_token.map(fleet_room);
    // The address is never bound: the routes are served by the server they are merged into.
    let unbound = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut routes = Router::new();
    // Dropping the `SignalingServer` drops only its shutdown switch; the handlers run on.
    let _server = SignalingServerBuilder::new(unbound, OrderedMesh, Rooms::default())
        .on_connection_request(move |request| {
            if admit(fleet.as_deref(), request.path.as_deref()) {
                Ok(true)
            } else {
                Err(refusal())
            }
        })
        .build_with(|router| {
            routes = router.clone();
            router
        });
    Router::new().nest(SIGNAL_PATH, routes)
}

/// Whether a peer asking for `room` may join, under `fleet` (a room name) when given.
fn admit(fleet: Option<&str>, room: Option<&str>) -> bool {
    fleet.is_none() || room == fleet
}

/// The answer to a peer asking for another room than the fleet's.
fn refusal() -> Response {
    (
        StatusCode::FORBIDDEN,
        "this signaling server admits only its fleet's room: check the fleet token\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fleet_room_is_admitted_when_a_token_is_set() {
        let room = fleet_room("t");
        assert!(admit(None, Some("anything")));
        assert!(admit(None, None));
        assert!(admit(Some(&room), Some(&room)));
        assert!(!admit(Some(&room), Some("other")));
        assert!(!admit(Some(&room), None));
    }
}
