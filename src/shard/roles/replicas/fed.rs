//! `Replicas::generate_fed`: the chains serve one feed (the HTTP API's queue) together. Each
//! chain runs the lone coordinator's fed loop (`Coordinator::generate_fed`) over its own view
//! of the feed, so a request goes to whichever chain has a free slot first, and each result is
//! handed over as its request ends. A chain with nothing to run looks for work again while
//! another still runs; the call returns once no chain runs and nothing waits (the first chain
//! to find that closes the run for all: none takes a request after another has returned).
//!
//! A chain whose donors can no longer hold the model is retired, as in `generate`: its
//! unfinished requests run again from the start on the chains left, their tokens already
//! passed to the caller held back (`Relay`). A chain that fails otherwise answers its own
//! unfinished requests with the error and keeps serving, as a lone chain's server does.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::super::super::transport::{MaybeSync, Transport};
use super::super::feed::Feed;
use super::super::timer::sleep;
use super::super::RoleError;
use super::{Chain, Relay, Replicas};
use crate::front::{GenerateRequest, Generated, OnEvent, TokenEvent};

/// How often a chain with nothing to run looks for work while another chain runs.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// What the chains of one fed run share.
struct Shared<'f> {
    feed: &'f mut dyn Feed,
    /// Requests of a retired chain, by the caller's index, to run again before new ones.
    again: VecDeque<(usize, GenerateRequest)>,
    /// Requests taken and not yet ended, by the caller's index.
    open: HashMap<usize, GenerateRequest>,
    /// The caller's index of the feed's next request.
    next_index: usize,
    /// Chains running requests now.
    busy: usize,
    /// A chain found nothing to run while none ran: the run is ending, and no chain takes a
    /// request any more (one that did, after another had already returned, would leave the
    /// requests after it to its slots alone).
    closed: bool,
    /// Requests moved off retired chains.
    moved: u32,
}

impl Shared<'_> {
    fn take(&mut self) -> Option<(usize, GenerateRequest)> {
        let (index, request) = match self.again.pop_front() {
            Some(moved) => moved,
            None => {
                let request = self.feed.next()?;
                self.next_index += 1;
                (self.next_index - 1, request)
            }
        };
        self.open.insert(index, request.clone());
        Some((index, request))
    }

    fn done(&mut self, index: usize, result: Result<Generated, RoleError>) {
        if self.open.remove(&index).is_some() {
            self.feed.done(index, result);
        }
    }
}

/// One chain's run as its coordinator sees the feed: indices from 0, mapped to the caller's.
struct ChainFeed<'a, 'f> {
    shared: &'a RefCell<Shared<'f>>,
    /// The caller's index of each request this run took, by the run's own index.
    taken: &'a RefCell<Vec<usize>>,
    /// The request that started the run.
    first: Option<(usize, GenerateRequest)>,
}

impl Feed for ChainFeed<'_, '_> {
    fn next(&mut self) -> Option<GenerateRequest> {
        let taken = self.first.take();
        let (index, request) = taken.or_else(|| self.shared.borrow_mut().take())?;
        self.taken.borrow_mut().push(index);
        Some(request)
    }

    fn done(&mut self, local: usize, result: Result<Generated, RoleError>) {
        let index = self.taken.borrow()[local];
        self.shared.borrow_mut().done(index, result);
    }
}

impl<T: Transport + MaybeSync> Replicas<T> {
    /// Runs the feed's requests on every chain at once, each taking new ones as its slots
    /// free; returns once none runs and none waits, or with the shortage error when every
    /// chain had to be retired (requests then left unanswered are the caller's to fail).
    pub async fn generate_fed(
        &mut self,
        feed: &mut dyn Feed,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        let shared = RefCell::new(Shared {
            feed,
            again: VecDeque::new(),
            open: HashMap::new(),
            next_index: 0,
            busy: 0,
            closed: false,
            moved: 0,
        });
        let relay = RefCell::new(Relay::new(on_event, 0));
        loop {
            let runs = (self.chains.iter_mut()).map(|chain| serve(chain, &shared, &relay));
            let results = futures::future::join_all(runs).await;
            let failed: Vec<usize> = (results.iter().enumerate())
                .filter_map(|(at, result)| result.is_err().then_some(at))
                .collect();
            self.report.moved += std::mem::take(&mut shared.borrow_mut().moved);
            if failed.len() == self.chains.len() {
                let error = results.into_iter().find_map(Result::err);
                return Err(error.expect("every chain failed"));
            }
            self.retire(&failed).await;
            let mut state = shared.borrow_mut();
            if state.again.is_empty() {
                return Ok(());
            }
            state.closed = false;
        }
    }
}

/// One chain's share of a fed run: runs of the chain's fed loop while there is work, a short
/// wait while only other chains have some. `Err` only with the shortage that retires it, its
/// unfinished requests handed back to the others.
async fn serve<T: Transport + MaybeSync>(
    chain: &mut Chain<T>,
    shared: &RefCell<Shared<'_>>,
    relay: &RefCell<Relay<'_, '_>>,
) -> Result<(), RoleError> {
    loop {
        let first = {
            let mut state = shared.borrow_mut();
            if state.closed {
                None
            } else {
                state.take()
            }
        };
        let Some(first) = first else {
            let ending = {
                let mut state = shared.borrow_mut();
                state.closed |= state.busy == 0;
                state.closed
            };
            if ending {
                return Ok(());
            }
            sleep(IDLE_POLL).await;
            continue;
        };
        shared.borrow_mut().busy += 1;
        let taken = RefCell::new(Vec::new());
        let mut feed = ChainFeed {
            shared,
            taken: &taken,
            first: Some(first),
        };
        let mut forward = |event: TokenEvent<'_>| {
            let index = taken.borrow()[event.request];
            relay.borrow_mut().pass(index, event)
        };
        let outcome = chain
            .coordinator
            .generate_fed(&mut feed, &mut forward)
            .await;
        let mut shared = shared.borrow_mut();
        shared.busy -= 1;
        let unfinished: Vec<usize> = (taken.take().into_iter())
            .filter(|index| shared.open.contains_key(index))
            .collect();
        match outcome {
            Ok(()) => {}
            Err(RoleError::Plan(error)) if error.is_shortage() => {
                for index in unfinished {
                    let request = shared.open.remove(&index).expect("an open request");
                    shared.again.push_back((index, request));
                    shared.moved += 1;
                }
                return Err(error.into());
            }
            Err(error) => {
                tracing::warn!(chain = chain.id, %error, "a chain failed its requests");
                for index in unfinished {
                    let failed = RoleError::Invalid(format!("chain {} failed: {error}", chain.id));
                    shared.done(index, Err(failed));
                }
            }
        }
    }
}
