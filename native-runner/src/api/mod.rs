//! An OpenAI-compatible HTTP API next to `runner serve`'s pages, models and signaling:
//! `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /v1/embeddings`, `GET /health`, `GET /metrics`.
//!
//! - `types`: strict request and response bodies;
//! - `validate`: a request's fields checked and its prompt rendered into a job;
//! - `worker`: the thread per model that owns its engine and drives its scheduler;
//! - `fleet_worker`: the same for a model served by a fleet of donors (`--donors`);
//! - `batch` and `pool`: continuous batching over the KV pool, and its prefix cache;
//! - `embeddings`: `/v1/embeddings` and the thread per embedding model (an encoder such as
//!   `bert` is served for embeddings only; a chat model too under `--embeddings`);
//! - `reply` and `sse`: the answer, whole or streamed;
//! - `errors`, `metrics`, `routes`: OpenAI-shaped errors, `/metrics`, the axum routes.

pub mod batch;
pub mod embeddings;
pub mod errors;
pub mod fleet_worker;
pub mod metrics;
pub mod pages;
pub mod pool;
pub mod reply;
pub mod routes;
pub mod row_constraint;
pub mod sse;
pub mod structured;
pub mod tool_calls;
pub mod types;
pub mod validate;
pub mod worker;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::model_args::ModelArgs;
use crate::serve::{banner, ServeOptions, Server};
use crate::signal::SIGNAL_PATH;
use crate::spec_args::SpecArgs;
use embeddings::EmbedHandle;
use fleet_worker::FleetTarget;
use metrics::Responses;
use routes::ApiState;
use worker::{ModelHandle, Serving};

/// Largest request body accepted (413 beyond): far more than any prompt a context holds.
pub const MAX_BODY_BYTES: usize = 4 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct ApiArgs {
    /// Serve this GGUF model (path or http(s) URL) through the OpenAI-compatible API at /v1/;
    /// repeatable. A model is named by its file stem unless `--alias` names it.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Vec<String>,
    /// The API name of the `-m` model in the same position (repeatable).
    #[arg(long, value_name = "NAME")]
    pub alias: Vec<String>,
    /// Require `Authorization: Bearer KEY` on /v1/.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Requests that may wait per model while one runs (more get 503).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue: u32,
    /// Sequences each model decodes together in one GPU step (slots of its KV pool); by
    /// default as many --ctx slots as 2 GiB holds, up to 16, on a GPU, and 1 on a CPU
    /// adapter, where a lone request decodes fastest alone.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=512))]
    pub parallel: Option<u32>,
    /// Longest context (prompt plus completion) of each sequence; the KV pool holds
    /// --parallel of them.
    #[arg(long, default_value_t = 4096)]
    pub ctx: u32,
    /// GPU backend for the models: auto, vulkan, gl, metal, dx12.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Use the f32 kernels even where the device has shader-f16.
    #[arg(long)]
    pub no_f16: bool,
    /// Do not use subgroup operations.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Also answer /v1/embeddings with each chat model (pooled hidden states; the model is
    /// loaded a second time, without its head). Encoder models (bert) always embed.
    #[arg(long)]
    pub embeddings: bool,
    /// Run the -m model on a fleet of N donors (`runner donor`, donor pages) that join this
    /// server's signaling room, instead of on this machine's GPU; needs `--fleet TOKEN`.
    /// `--parallel` is then the requests in the chain at once (default 4). /health answers
    /// 503 until the donors have joined and loaded their layers.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=webshard::shard::plan::MAX_DONORS as u64))]
    pub donors: Option<u64>,
    /// Chains the `--donors` form, each holding the whole model and taking requests as its
    /// slots free: a number, or `auto` (whatever the planner finds fastest for `--parallel`
    /// requests a chain), as `runner coordinate --replicas`; default 1.
    #[arg(long, value_name = "N|auto", value_parser = crate::fleet::parse_replicas)]
    pub replicas: Option<crate::fleet::Replicas>,
    /// STUN/TURN server URL the fleet's links may use beyond the LAN (repeatable; none: host
    /// addresses only), as `runner coordinate --ice`.
    #[arg(long, value_name = "URL")]
    pub ice: Vec<String>,
    /// Matvec work split of batched steps `LANES,LANES_PER_ROW,ROWS_PER_LANE,TOKENS` (for
    /// measuring it; see `runner bench --matvec-batch-split`).
    #[arg(long, value_parser = crate::model_args::parse_matvec_batch_split, hide = true)]
    pub matvec_batch_split: Option<[u32; 4]>,
    /// `TOKENS,MIB`: where batched steps' products read the weights once (for measuring it;
    /// see `runner bench --streamed-products`).
    #[arg(long, value_parser = crate::model_args::parse_streamed_products, hide = true)]
    pub streamed_products: Option<[u64; 2]>,
    /// Most tokens multiplied one product per token (for measuring it; see `runner bench
    /// --per-token-products`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), hide = true)]
    pub per_token_products: Option<u32>,
    /// Decode products on 8-bit integers, `off`, `batched` or `decode` (for measuring it; see
    /// `runner bench --int8-products`).
    #[arg(long, value_parser = crate::model_args::parse_int8_products, hide = true)]
    pub int8_products: Option<webshard::gpu::Int8Products>,
    /// Speculative decoding for the requests that do not ask themselves (`webshard_spec`):
    /// a request running alone drafts from its prompt and verifies each draft in one step.
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl ApiArgs {
    fn model_args(&self, source: &str) -> ModelArgs {
        ModelArgs {
            model: source.to_string(),
            backend: self.backend.clone(),
            no_f16: self.no_f16,
            no_subgroups: self.no_subgroups,
            ctx: self.ctx,
            max_binding: None,
            matvec_split: None,
            matvec_batch_split: self.matvec_batch_split,
            matmul_tile: None,
            streamed_products: self.streamed_products,
            coop_k_splits: None,
            per_token_products: self.per_token_products,
            int8_products: self.int8_products,
            int8_split: None,
            per_token_prefill_below: None,
            decode_depth: None,
            quiet: true,
            gpu_mem_mib: None,
        }
    }

    /// Whether the API is asked for: some `-m`; API flags without one are an error.
    pub fn wanted(&self) -> anyhow::Result<bool> {
        let api_only = self.api_key.is_some()
            || !self.alias.is_empty()
            || self.donors.is_some()
            || self.spec.spec.is_some();
        if self.model.is_empty() && api_only {
            bail!(
                "--api-key, --alias, --donors and --spec apply to the API, which needs at least one -m MODEL"
            );
        }
        Ok(!self.model.is_empty())
    }

    /// The fleet that runs the model under `--donors`, on the server at `base` (`http://HOST:
    /// PORT/`); `None` without `--donors`.
    fn fleet_target(&self, opts: &ServeOptions, base: &str) -> anyhow::Result<Option<FleetTarget>> {
        let Some(donors) = self.donors else {
            if !self.ice.is_empty() || self.replicas.is_some() {
                bail!("--ice and --replicas apply to the fleet: give --donors N too");
            }
            return Ok(None);
        };
        let Some(token) = opts.fleet_token.clone() else {
            bail!("--donors needs --fleet TOKEN: the donors join that fleet's room here");
        };
        if self.model.len() != 1 || self.embeddings {
            bail!("--donors serves one -m model, for generation only (no --embeddings)");
        }
        if self.spec.spec.is_some() {
            bail!(
                "--spec applies to a model on this machine's GPU: a fleet decodes one token a step"
            );
        }
        let signal = base.replacen("http://", "ws://", 1) + SIGNAL_PATH.trim_start_matches('/');
        Ok(Some(FleetTarget {
            model_url: model_url(&self.model[0], &opts.models_path(), base)?,
            signal,
            token,
            donors: donors as usize,
            ctx: self.ctx,
            kv_slots: self.parallel.unwrap_or(fleet_worker::DEFAULT_KV_SLOTS),
            replicas: self.replicas.unwrap_or(crate::fleet::Replicas::Count(1)),
            ice_urls: self.ice.clone(),
        }))
    }

    /// Each model's API name: its alias, else its file stem; names must be unique.
    pub fn names(&self) -> anyhow::Result<Vec<String>> {
        if self.alias.len() > self.model.len() {
            bail!(
                "{} --alias for {} -m models: each alias names the -m in its position",
                self.alias.len(),
                self.model.len()
            );
        }
        let names: Vec<String> = self
            .model
            .iter()
            .enumerate()
            .map(|(index, source)| {
                self.alias
                    .get(index)
                    .cloned()
                    .unwrap_or_else(|| file_stem(source))
            })
            .collect();
        for (index, name) in names.iter().enumerate() {
            if names[..index].contains(name) {
                bail!("two models are named `{name}`: give one an --alias");
            }
        }
        Ok(names)
    }
}

/// Where donors fetch `source`: an http(s) URL as given, a file inside the served models
/// folder at its `/models/` URL; any other file is an error (donors could not reach it).
fn model_url(source: &str, models: &Path, base: &str) -> anyhow::Result<String> {
    if source.starts_with("http://") || source.starts_with("https://") {
        return Ok(source.to_string());
    }
    let not_served = || {
        format!(
            "--donors: the donors fetch the model over HTTP, so {source} must be inside the \
             served models folder ({}) or an http(s) URL",
            models.display()
        )
    };
    let file = std::fs::canonicalize(source).with_context(|| format!("opening {source}"))?;
    let folder = std::fs::canonicalize(models).with_context(not_served)?;
    let relative = file
        .strip_prefix(&folder)
        .map_err(|_| anyhow::anyhow!(not_served()))?;
    let mut url = format!("{base}models");
    for part in relative.components() {
        url.push('/');
        url.push_str(&percent_encode(&part.as_os_str().to_string_lossy()));
    }
    Ok(url)
}

/// A path segment with every byte but RFC 3986's unreserved ones percent-encoded.
fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `path/to/Model.Q4.gguf` or `https://host/Model.Q4.gguf?x` → `Model.Q4`.
fn file_stem(source: &str) -> String {
    let path = source.split(['?', '#']).next().unwrap_or(source);
    let file = path.rsplit('/').next().unwrap_or(path);
    Path::new(file).file_stem().map_or_else(
        || file.to_string(),
        |stem| stem.to_string_lossy().into_owned(),
    )
}

/// `runner serve -m ...`: the files and signaling plus the API; the models load in the
/// background (`/health` answers 503 until they are ready). Ends with an error when a model
/// fails to load.
pub async fn serve(opts: &ServeOptions, args: &ApiArgs) -> anyhow::Result<()> {
    let names = args.names()?;
    // Bound first: a fleet's coordinator needs the server's address for its room and model.
    let server = Server::bind(opts).await?;
    let base = server.base_url();
    let fleet = args.fleet_target(opts, &base)?;
    let (failed, mut failures) = tokio::sync::mpsc::unbounded_channel();
    let (mut models, mut embedders) = (Vec::new(), Vec::new());
    for (name, source) in names.iter().zip(&args.model) {
        let (load, queue) = (args.model_args(source), args.queue as usize);
        if let Some(target) = &fleet {
            let handle = fleet_worker::start(name.clone(), target.clone(), queue, failed.clone());
            models.push(handle.context("starting the fleet's worker")?);
            continue;
        }
        let encoder = is_encoder(source).await?;
        if encoder || args.embeddings {
            let handle = EmbedHandle::start(name.clone(), load.clone(), queue, failed.clone());
            embedders.push(handle.context("starting an embedding worker")?);
        }
        if !encoder {
            let serving = Serving {
                queue,
                parallel: args.parallel,
                speculation: args.spec.config(),
            };
            let handle = ModelHandle::start(name.clone(), load, serving, failed.clone());
            models.push(handle.context("starting the model workers")?);
        }
    }
    drop(failed);
    let state = Arc::new(ApiState {
        models,
        embedders,
        api_key: args.api_key.clone(),
        responses: Responses::default(),
        started: unix_seconds(),
    });
    let server = server.merge(routes::router(state));
    let mut text = banner(&base, opts);
    for name in &names {
        text.push_str(&format!("  api     {base}v1/  model `{name}`\n"));
    }
    if let Some(target) = &fleet {
        let donors = target.donors;
        text.push_str(&format!(
            "  fleet   {donors} donor(s) run it: runner donor --signal {} --fleet TOKEN\n",
            target.signal
        ));
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    drop(stdout);
    tokio::select! {
        served = server.run() => Ok(served?),
        Some(why) = failures.recv() => bail!("{why}"),
    }
}

/// Whether the model at `source` is an encoder (embeddings only), from its header.
async fn is_encoder(source: &str) -> anyhow::Result<bool> {
    Ok(webshard::embed::is_encoder(
        &read_model_header(source).await?,
    ))
}

/// The GGUF header of the model at `source` (a path or URL), read alone.
async fn read_model_header(source: &str) -> anyhow::Result<webshard::gguf::Header> {
    let file = webshard::gguf::open_source(source)
        .await
        .with_context(|| format!("opening {source}"))?;
    webshard::gguf::read_header(file.as_ref())
        .await
        .with_context(|| format!("reading the header of {source}"))
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_named_by_stem_or_alias() {
        assert_eq!(file_stem("/m/SmolLM2.Q4_1.gguf"), "SmolLM2.Q4_1");
        assert_eq!(file_stem("https://h/x/Qwen.gguf?dl=1"), "Qwen");
        let mut args = ApiArgs {
            model: vec!["/a/one.gguf".into(), "/b/one.gguf".into()],
            alias: vec![],
            api_key: None,
            queue: 1,
            parallel: None,
            ctx: 64,
            backend: "auto".into(),
            no_f16: false,
            no_subgroups: false,
            embeddings: false,
            donors: None,
            replicas: None,
            ice: vec![],
            matvec_batch_split: None,
            streamed_products: None,
            per_token_products: None,
            int8_products: None,
            spec: SpecArgs::default(),
        };
        assert!(args.names().unwrap_err().to_string().contains("`one`"));
        args.alias = vec!["first".into()];
        assert_eq!(args.names().unwrap(), ["first", "one"]);
        args.alias = vec!["a".into(), "b".into(), "c".into()];
        assert!(args.names().is_err());
        assert!(args.wanted().unwrap());
        args.model.clear();
        assert!(args.wanted().is_err(), "an alias without a model");
        args.alias.clear();
        assert!(!args.wanted().unwrap());
        args.spec.spec = Some(crate::spec_args::SpecKind::Lookup);
        assert!(args.wanted().is_err(), "--spec without a model");
    }

    #[test]
    fn donors_fetch_the_model_at_its_served_url() {
        let base = "http://127.0.0.1:9/";
        let url = "https://host/x/Model.gguf";
        let models = tempfile::tempdir().unwrap();
        assert_eq!(model_url(url, models.path(), base).unwrap(), url);
        let nested = models.path().join("sub dir");
        std::fs::create_dir(&nested).unwrap();
        let file = nested.join("m+1.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        let served = model_url(file.to_str().unwrap(), models.path(), base).unwrap();
        assert_eq!(served, "http://127.0.0.1:9/models/sub%20dir/m%2B1.gguf");
        let outside = tempfile::NamedTempFile::new().unwrap();
        let err = model_url(outside.path().to_str().unwrap(), models.path(), base).unwrap_err();
        assert!(
            err.to_string().contains("inside the served models folder"),
            "{err}"
        );
        assert!(model_url("/no/such.gguf", models.path(), base).is_err());
    }
}
