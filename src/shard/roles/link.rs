//! A donor's link to its next stage, proven before it says Ready.
//!
//! The coordinator knows its own links to the donors work (their Hellos came over them), but
//! not the links between donors, which the plan relies on: on a loaded machine a WebRTC
//! handshake between two donors can still be under way when the first `Forward` is due, or
//! can have failed with no error at all (matchbox never retries one). A `Forward` sent then
//! finds no peer and is lost, and the chain waits for a reply that never comes. So a donor
//! waits until its downstream peer is connected and has answered a ping (`Transport::flush`)
//! before it sends Ready; a ping sent as the link opens can be lost like any frame, so it is
//! sent again until one is answered. A link that does not work within `LINK_WAIT` is made
//! anew the only way there is: the donor joins the room again under a new id (every link
//! new), the coordinator plans the old id out, and the new one joins at its next re-plan.

use std::time::Duration;

use web_time::Instant;

use super::super::frame::ErrorCode;
use super::super::transport::{PeerId, Transport, TransportEvent};
use super::donor::{error_report, Donor};
use super::timer::with_timeout;

/// Longest a donor waits for a working link to its next stage.
const LINK_WAIT: Duration = Duration::from_secs(15);
/// How long one ping may go unanswered before another is sent.
const PING_RETRY: Duration = Duration::from_millis(500);
/// Longest the donor waits for its report to reach the coordinator before joining again.
const REPORT_FLUSH: Duration = Duration::from_secs(1);

impl<T: Transport> Donor<T> {
    /// Waits until `peer` is connected and answers a ping; false after `LINK_WAIT` or when
    /// the transport closes. Events that arrive meanwhile are kept for after, in order.
    pub(super) async fn reach(&mut self, peer: PeerId) -> bool {
        let started = Instant::now();
        while !self.closed && started.elapsed() < LINK_WAIT {
            if self.transport.peers().contains(&peer) {
                if let Ok(Ok(())) = with_timeout(PING_RETRY, self.transport.flush(peer)).await {
                    let waited = started.elapsed();
                    if waited > PING_RETRY {
                        tracing::info!(%peer, ?waited, "the link to the next stage works now");
                    }
                    return true;
                }
            }
            // Not connected yet (or the ping was lost): read on, so that `PeerJoined` lands.
            if !self.transport.peers().contains(&peer) {
                self.defer_for(PING_RETRY).await;
            }
        }
        false
    }

    /// Receives for at most `limit`, keeping what arrives for after.
    async fn defer_for(&mut self, limit: Duration) {
        match with_timeout(limit, self.transport.recv()).await {
            Ok(Ok(event)) => self.keep_for_later(event),
            Ok(Err(_)) => self.closed = true,
            Err(_) => {}
        }
    }

    pub(super) fn keep_for_later(&mut self, event: TransportEvent) {
        self.deferred_bytes += super::step::deferred_size(&event);
        self.deferred.push_back(event);
    }

    /// The link to `downstream` never worked: tells the coordinator, then joins the room
    /// again under a new id, keeping the loaded stage for a later plan.
    pub(super) async fn rejoin_for_link(&mut self, downstream: PeerId) {
        let reason = format!(
            "no working link to the next stage's donor {downstream} within {} s; \
             joining the room again",
            LINK_WAIT.as_secs()
        );
        tracing::warn!("{reason}");
        if let Some(coordinator) = self.coordinator {
            let report = error_report(ErrorCode::LoadFailed, None, &reason);
            self.send_or_log(coordinator, &report).await;
            let _ = with_timeout(REPORT_FLUSH, self.transport.flush(coordinator)).await;
        }
        self.deferred.clear();
        self.deferred_bytes = 0;
        if let Err(error) = self.transport.rejoin().await {
            tracing::warn!(%error, "could not join the room again");
            self.closed = true;
            return;
        }
        // The new id in the words `runner donor` prints its first in: logs and tests follow a
        // donor by every id it had.
        tracing::warn!(
            "joined the fleet as {} (again, so that every link is made anew)",
            self.transport.local_id()
        );
        self.return_to_room().await;
    }
}
