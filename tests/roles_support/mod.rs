//! A fleet in one process for the role tests: donors on their own threads (GPU waits block),
//! the in-process transport between them, and transports that misbehave on purpose.
#![allow(dead_code)]

pub mod run;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use futures::channel::oneshot;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt, TextFront};
use webshard::gguf::open_source;
use webshard::gpu::{Gpu, GpuOptions};
use webshard::model::OpenModel;
use webshard::sample::SamplerConfig;
use webshard::shard::roles::timer::sleep;
use webshard::shard::roles::{Donor, DonorConfig, DonorExit, DonorStatus};
use webshard::shard::transport::TransportStats;
use webshard::shard::{
    FrameLimits, InProcessNetwork, PeerId, Transport, TransportError, TransportEvent,
};

use crate::support;

pub const TOKEN: &str = "fleet-secret";
pub const DONOR_BYTES: u64 = 1 << 30;

/// One GPU for the whole test binary, donors and single-device references alike: its pipeline
/// cache then compiles each kernel once per binary instead of once per test (on a CPU adapter a
/// stage's first step spends 10-20 s compiling, more than a short test computes).
pub fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    let gpu =
        GPU.get_or_init(|| pollster::block_on(Gpu::new(&GpuOptions::default())).expect("gpu"));
    Arc::clone(gpu)
}

pub fn model_url(file: &str) -> String {
    support::model_path(file)
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

/// `prompt`'s ids as the coordinator's tokenizer gives them (a chat prompt, as `runner` sends),
/// from the file's header alone.
pub fn prompt_ids(file: &str, prompt: &str) -> Vec<u32> {
    let model = pollster::block_on(async {
        let source = open_source(&model_url(file)).await.expect("open model");
        OpenModel::read(source.as_ref()).await.expect("read header")
    });
    let text = TextFront::from_header(&model.header).expect("tokenizer");
    text.tokenize_prompt(prompt)
}

/// Greedy ids of one device (the `Engine`) for each prompt.
pub fn single_device_ids(
    file: &str,
    prompts: &[&str],
    max_tokens: u32,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    pollster::block_on(async {
        let mut engine = support::load_engine_on(gpu(), file).await;
        let mut out = Vec::new();
        for prompt in prompts {
            let ids = engine.tokenize_prompt(prompt);
            let options = GenerateOptions {
                max_tokens,
                sampler: SamplerConfig::greedy(),
                stop: Vec::new(),
                constraint: None,
                ..GenerateOptions::default()
            };
            engine.reset();
            let request = GenerateRequest::new(Prompt::Ids(ids.clone()), options);
            let generated = engine
                .generate_one(&request, &mut |_| std::ops::ControlFlow::Continue(()))
                .await
                .expect("generate");
            out.push((ids, generated.ids));
        }
        out
    })
}

/// What one device (the `Engine`) generates for each request, each from an empty cache.
pub fn single_device(file: &str, requests: &[GenerateRequest]) -> Vec<Generated> {
    pollster::block_on(async {
        let mut engine = support::load_engine_on(gpu(), file).await;
        let mut out = Vec::new();
        for request in requests {
            engine.reset();
            let generated = engine
                .generate_one(request, &mut |_| std::ops::ControlFlow::Continue(()))
                .await
                .expect("generate");
            out.push(generated);
        }
        out
    })
}

/// A donor thread; `kill` drops it (and so its transport) wherever it is.
pub struct DonorHandle {
    pub id: PeerId,
    pub status: Arc<Mutex<DonorStatus>>,
    kill: Option<oneshot::Sender<()>>,
    exit: mpsc::Receiver<Result<DonorExit, String>>,
}

impl DonorHandle {
    /// Sending on it kills the donor.
    pub fn take_kill(&mut self) -> oneshot::Sender<()> {
        self.kill.take().expect("kill switch taken once")
    }

    pub fn status(&self) -> DonorStatus {
        self.status.lock().unwrap().clone()
    }

    pub fn exit(&self, limit: Duration) -> Result<DonorExit, String> {
        self.exit
            .recv_timeout(limit)
            .map_err(|e| format!("donor did not finish: {e}"))?
    }
}

pub fn spawn_donor<T, W>(
    network: &InProcessNetwork,
    gpu: &Arc<Gpu>,
    token: &str,
    wrap: W,
) -> DonorHandle
where
    T: Transport + Send + 'static,
    W: FnOnce(webshard::shard::InProcessTransport) -> T,
{
    spawn_donor_offering(network, gpu, token, DONOR_BYTES, wrap)
}

/// The speed every in-process donor reports (a plausible lavapipe figure for SmolLM2).
pub const PINNED_MS_PER_LAYER: f32 = 2.5;

/// A donor offering `usable_gpu_bytes` of memory.
pub fn spawn_donor_offering<T, W>(
    network: &InProcessNetwork,
    gpu: &Arc<Gpu>,
    token: &str,
    usable_gpu_bytes: u64,
    wrap: W,
) -> DonorHandle
where
    T: Transport + Send + 'static,
    W: FnOnce(webshard::shard::InProcessTransport) -> T,
{
    let transport = wrap(network.join());
    let id = transport.local_id();
    let (kill, killed) = oneshot::channel::<()>();
    let (done, exit) = mpsc::channel();
    let status = Arc::new(Mutex::new(DonorStatus::default()));
    let shared = Arc::clone(&status);
    let config = DonorConfig {
        fleet_token: token.to_string(),
        gpu: Arc::clone(gpu),
        usable_gpu_bytes,
        limits: FrameLimits::default(),
        // Every donor shares this machine's GPU: a measured probe follows the machine's load
        // (one cold CI run planned 2 stages for 3 donors when one probe ran during a build),
        // and these tests check plan shapes, so the donors report one pinned speed.
        pinned_ms_per_layer: Some(PINNED_MS_PER_LAYER),
    };
    thread::spawn(move || {
        let outcome = pollster::block_on(async move {
            let mut donor = Donor::new(transport, config);
            donor.on_status(move |now| *shared.lock().unwrap() = now.clone());
            let run = Box::pin(donor.run());
            match futures::future::select(run, killed).await {
                futures::future::Either::Left((exit, _)) => exit.map_err(|e| e.to_string()),
                futures::future::Either::Right(_) => Err("killed".to_string()),
            }
        });
        let _ = done.send(outcome);
    });
    DonorHandle {
        id,
        status,
        kill: Some(kill),
        exit,
    }
}

/// Runs `work` on its own thread and fails the test if it takes longer than `limit`.
pub fn with_deadline<R: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (done, result) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(work());
    });
    result
        .recv_timeout(limit)
        .unwrap_or_else(|e| panic!("test did not finish within {limit:?}: {e}"))
}

/// The perturbation `runner donor --fault-perturb` uses too.
pub use webshard::shard::fault::Perturbing;

/// A peer that hangs when `frozen` is set: it stays connected but drops everything it
/// would send or receive, as a crashed tab whose connection has not timed out yet.
pub struct Freezable<T> {
    pub inner: T,
    pub frozen: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl<T: Transport + Send + Sync> Transport for Freezable<T> {
    fn local_id(&self) -> PeerId {
        self.inner.local_id()
    }
    fn peers(&self) -> Vec<PeerId> {
        self.inner.peers()
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        if self.frozen.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.send(to, frame).await
    }
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        if self.frozen.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.flush(to).await
    }
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        loop {
            let event = self.inner.recv().await?;
            if !self.frozen.load(Ordering::SeqCst) {
                return Ok(event);
            }
        }
    }
}

/// A peer whose process is suspended while `paused` is set (a throttled background tab): it
/// neither takes what arrives nor sends, and what arrives waits for it.
pub struct Pausable<T> {
    pub inner: T,
    pub paused: Arc<AtomicBool>,
}

impl<T> Pausable<T> {
    async fn wait_while_paused(&self) {
        while self.paused.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(10)).await;
        }
    }
}

#[async_trait::async_trait]
impl<T: Transport + Send + Sync> Transport for Pausable<T> {
    fn local_id(&self) -> PeerId {
        self.inner.local_id()
    }
    fn peers(&self) -> Vec<PeerId> {
        self.inner.peers()
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        self.wait_while_paused().await;
        self.inner.send(to, frame).await
    }
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.inner.flush(to).await
    }
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        self.wait_while_paused().await;
        self.inner.recv().await
    }
}

/// A peer that reports each peer it has sent a frame to; an in-process frame is in the
/// receiver's inbox once `send` returns.
pub struct SendNotice<T> {
    pub inner: T,
    pub sent: mpsc::Sender<PeerId>,
}

#[async_trait::async_trait]
impl<T: Transport + Send + Sync> Transport for SendNotice<T> {
    fn local_id(&self) -> PeerId {
        self.inner.local_id()
    }
    fn peers(&self) -> Vec<PeerId> {
        self.inner.peers()
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        self.inner.send(to, frame).await?;
        let _ = self.sent.send(to);
        Ok(())
    }
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.inner.flush(to).await
    }
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        self.inner.recv().await
    }
}

/// Starts a donor and returns once it has greeted `coordinator` (its Hello is queued there).
pub fn join_donor(network: &InProcessNetwork, gpu: &Arc<Gpu>, coordinator: PeerId) -> DonorHandle {
    let (sent, greeted) = mpsc::channel();
    let handle = spawn_donor(network, gpu, TOKEN, move |inner| SendNotice { inner, sent });
    loop {
        let to = greeted
            .recv_timeout(Duration::from_secs(120))
            .expect("the new donor greets the coordinator");
        if to == coordinator {
            return handle;
        }
    }
}

/// A donor whose links to the other donors open late, as WebRTC handshakes still under way on
/// a loaded machine: once the coordinator (always linked) has sent it something, a link to
/// any other peer opens `delay` after its first use; until then that peer is not among
/// `peers()`, and sends and flushes to it fail as they do for a peer not connected yet.
pub struct SlowLinks<T> {
    pub inner: T,
    coordinator: PeerId,
    delay: Duration,
    assigned: AtomicBool,
    first_use: Mutex<std::collections::HashMap<PeerId, std::time::Instant>>,
}

impl<T> SlowLinks<T> {
    pub fn new(inner: T, coordinator: PeerId, delay: Duration) -> SlowLinks<T> {
        SlowLinks {
            inner,
            coordinator,
            delay,
            assigned: AtomicBool::new(false),
            first_use: Mutex::new(Default::default()),
        }
    }

    fn linked(&self, peer: PeerId) -> bool {
        if peer == self.coordinator {
            return true;
        }
        if !self.assigned.load(Ordering::SeqCst) {
            return false;
        }
        let now = std::time::Instant::now();
        let mut first_use = self.first_use.lock().unwrap();
        let since = *first_use.entry(peer).or_insert(now);
        now >= since + self.delay
    }

    fn check(&self, peer: PeerId) -> Result<(), TransportError> {
        match self.linked(peer) {
            true => Ok(()),
            false => Err(TransportError::UnknownPeer(peer)),
        }
    }
}

#[async_trait::async_trait]
impl<T: Transport + Send + Sync> Transport for SlowLinks<T> {
    fn local_id(&self) -> PeerId {
        self.inner.local_id()
    }
    fn peers(&self) -> Vec<PeerId> {
        let peers = self.inner.peers();
        peers.into_iter().filter(|&p| self.linked(p)).collect()
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        self.check(to)?;
        self.inner.send(to, frame).await
    }
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.check(to)?;
        self.inner.flush(to).await
    }
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        let event = self.inner.recv().await?;
        if matches!(&event, TransportEvent::Frame { from, .. } if *from == self.coordinator) {
            self.assigned.store(true, Ordering::SeqCst);
        }
        Ok(event)
    }
}
