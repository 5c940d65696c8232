//! A chain that serves: requests taken in while it runs, and each result handed over as its
//! request ends (`Coordinator::generate_fed`). `Generator::generate` runs a fixed slice and
//! returns when all of it is done, which suits a command line; a server (the HTTP API's
//! `fleet_worker`) would otherwise hold a short request until the longest one beside it ends,
//! and hold a new one until the whole run ends.

use super::super::transport::Transport;
use super::coordinator::Coordinator;
use super::session::Session;
use super::RoleError;
use crate::front::{GenerateRequest, Generated, OnEvent};

/// Where a fed chain's requests come from and its results go.
pub trait Feed {
    /// The next request, if one is waiting; asked whenever the chain has a free slot.
    fn next(&mut self) -> Option<GenerateRequest>;

    /// Request `index` (counting `next`'s requests from 0) ended with this result, or could
    /// not start (its prompt does not fit, its constraint does not compile).
    fn done(&mut self, index: usize, result: Result<Generated, RoleError>);
}

impl<T: Transport> Coordinator<T> {
    /// Runs the feed's requests, up to `kv_slots` at a time through the chain, taking new
    /// ones as slots free up; returns once none runs and none waits. `on_event` gets each
    /// token, tagged with its request's index.
    pub async fn generate_fed(
        &mut self,
        feed: &mut dyn Feed,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        let session = Session::new(self.config.runtime.kv_slots);
        self.run_session(session, Some(feed), on_event).await?;
        Ok(())
    }

    /// Queues as many of the feed's requests as there are open slots.
    pub(super) fn take_fed(&mut self, session: &mut Session, feed: &mut dyn Feed) {
        while session.open_slots() > 0 {
            let Some(request) = feed.next() else {
                return;
            };
            let checked = self.check_request(&request).and_then(|ids| {
                let constrained = self.compile_constraint(&request)?;
                Ok((ids, constrained))
            });
            match checked {
                Ok(prompt) => {
                    session.push(request.options, prompt);
                }
                Err(error) => {
                    let index = session.push_refused();
                    feed.done(index, Err(error));
                }
            }
        }
    }
}

/// Hands the feed every result that came in since it last heard.
pub(super) fn report_finished(session: &mut Session, feed: &mut dyn Feed) {
    for index in std::mem::take(&mut session.finished) {
        feed.done(index, Ok(session.take_output(index)));
    }
}
