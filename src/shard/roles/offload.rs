//! Where a donor's step computes: off the donor's message loop, so the loop keeps answering
//! heartbeats however long the step takes.
//!
//! Natively a GPU read-back blocks its thread (`device.poll(Wait)`), so the step runs on a
//! worker thread of the donor's own and the loop awaits its answer. In a browser the wait is a
//! map callback from the event loop, so the step runs in place and the loop is polled
//! alongside it.

use super::super::frame::Forward;
use super::host::{StageHost, StepOutput};
use crate::model::ModelError;

/// What a step gives back: the stage (to serve the next step) and its output. `None` when
/// the step panicked and took the stage with it.
pub(super) type StepDone = Option<(StageHost, Result<StepOutput, ModelError>)>;

/// `StepRunner::start`'s future: it owns what it needs, so the donor's loop stays free to
/// borrow the donor while it runs.
pub(super) type Step = futures::future::LocalBoxFuture<'static, StepDone>;

pub(super) use platform::StepRunner;

#[cfg(not(target_arch = "wasm32"))]
mod platform {
    use std::sync::mpsc;
    use std::thread;

    use futures::channel::oneshot;
    use futures::FutureExt;

    use super::{Forward, StageHost, Step};

    type Job = Box<dyn FnOnce() + Send>;

    /// One worker thread, started at the first step and ended when the runner is dropped.
    #[derive(Default)]
    pub struct StepRunner {
        jobs: Option<mpsc::Sender<Job>>,
    }

    impl StepRunner {
        /// Hands the step to the worker. A job that never runs (no thread to run it) drops
        /// its sender, and the step completes as `None`.
        pub fn start(&mut self, host: StageHost, forward: Forward) -> Step {
            let (done, finished) = oneshot::channel();
            let mut job: Job = Box::new(move || {
                let output = pollster::block_on(host.run(&forward));
                let _ = done.send((host, output));
            });
            // A worker that panicked is gone: the job comes back, and a new worker takes it.
            while let Some(jobs) = self.worker() {
                match jobs.send(job) {
                    Ok(()) => break,
                    Err(mpsc::SendError(returned)) => {
                        self.jobs = None;
                        job = returned;
                    }
                }
            }
            finished.map(Result::ok).boxed_local()
        }

        fn worker(&mut self) -> Option<&mpsc::Sender<Job>> {
            if self.jobs.is_none() {
                self.jobs = start_worker();
            }
            self.jobs.as_ref()
        }
    }

    /// `None` if the system has no thread to give (the step is then lost like a panicked one).
    fn start_worker() -> Option<mpsc::Sender<Job>> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = thread::Builder::new()
            .name("donor step".into())
            .spawn(move || queue.into_iter().for_each(|job| job()));
        match worker {
            Ok(_) => Some(jobs),
            Err(error) => {
                tracing::error!(%error, "cannot start the donor's step thread");
                None
            }
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod platform {
    use futures::FutureExt;

    use super::{Forward, StageHost, Step};

    #[derive(Default)]
    pub struct StepRunner;

    impl StepRunner {
        pub fn start(&mut self, host: StageHost, forward: Forward) -> Step {
            async move {
                let output = host.run(&forward).await;
                Some((host, output))
            }
            .boxed_local()
        }
    }
}
