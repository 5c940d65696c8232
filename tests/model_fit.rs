//! Fit before fetch: a model that cannot fit the budget or the device's bindings is refused
//! from its header, before any weights are read, with what does not fit and that a fleet can
//! run it.

use crate::support;

use webshard::engine::{Engine, EngineError, EngineOptions};
use webshard::gguf::{open_source, read_header, RangeSource};
use webshard::gpu::{Gpu, GpuOptions};
use webshard::model::fit::{self, FitError};
use webshard::model::{config_for, StageSpec};

async fn open_smollm2() -> Box<dyn RangeSource> {
    let path = support::model_path(support::SMOLLM2.1);
    open_source(path.to_str().unwrap()).await.unwrap()
}

/// Everything a refused load may have read: the header and the reader's overshoot.
fn header_budget(data_offset: u64) -> u64 {
    data_offset + data_offset / 4 + 256 * 1024
}

#[tokio::test]
async fn a_budget_too_small_is_refused_before_any_weights_are_read() {
    let gpu = Gpu::new(&GpuOptions::default()).await.unwrap();
    let source = open_smollm2().await;
    let options = EngineOptions {
        max_context: 1024,
        gpu_budget_bytes: Some(16 << 20),
        ..Default::default()
    };
    let err = match Engine::load(gpu.clone(), source.as_ref(), &options, &mut |_| {}).await {
        Err(err) => err,
        Ok(_) => panic!("loaded a model over its budget"),
    };
    let EngineError::DoesNotFit(FitError::OverBudget {
        footprint,
        ctx,
        budget,
    }) = &err
    else {
        panic!("expected an over-budget error, got {err}");
    };
    let header = read_header(open_smollm2().await.as_ref()).await.unwrap();
    let tensor_bytes: u64 = header.tensors.iter().map(|t| t.bytes).sum();
    assert_eq!(
        footprint.weights, tensor_bytes,
        "every tensor is loaded, once"
    );
    let cfg = config_for(&header).unwrap();
    let kv = 1024 * u64::from(cfg.kv_dim()) * 4 * 2 * u64::from(cfg.n_layers);
    assert_eq!((footprint.kv_cache, *ctx, *budget), (kv, 1024, 16 << 20));
    assert!(footprint.scratch > 0 && footprint.total() > *budget);
    let message = err.to_string();
    for words in [
        "does not fit",
        "budget of 16 MiB",
        "KV cache",
        "fleet",
        "nothing was downloaded",
    ] {
        assert!(message.contains(words), "`{words}` missing from: {message}");
    }
    let fetched = source.stats().bytes_fetched;
    assert!(
        fetched <= header_budget(header.data_offset),
        "read {fetched} bytes"
    );

    let spec = StageSpec::whole(&cfg, 1024, &gpu);
    let enough = Some(footprint.total());
    assert_eq!(
        fit::check(&header, &cfg, &spec, &gpu.caps, enough),
        Ok(*footprint)
    );
    assert!(fit::check(&header, &cfg, &spec, &gpu.caps, enough.map(|b| b - 1)).is_err());
}

#[tokio::test]
async fn a_layer_of_keys_over_one_binding_is_refused_before_loading() {
    let options = GpuOptions {
        max_binding_override: Some(64 << 10),
        ..Default::default()
    };
    let gpu = Gpu::new(&options).await.unwrap();
    let source = open_smollm2().await;
    let options = EngineOptions {
        max_context: 1024,
        ..Default::default()
    };
    let err = match Engine::load(gpu, source.as_ref(), &options, &mut |_| {}).await {
        Err(err) => err.to_string(),
        Ok(_) => panic!("loaded a model whose keys cannot be bound"),
    };
    assert!(
        err.contains("one layer's keys at context 1024") && err.contains("65536"),
        "{err}"
    );
    assert!(
        source.stats().bytes_fetched < 4 << 20,
        "{:?}",
        source.stats()
    );
}
