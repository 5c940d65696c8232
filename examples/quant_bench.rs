//! Throughput of the quantized products on the local adapter, per variant.
//!
//! `cargo run --release --example quant_bench -- [TYPE] [ROWS] [COLS] [TOKENS]`
//! (default: Q4_K 896 4864 1). Prints GB/s of weight bytes and GFLOP/s.

use std::time::Instant;

use webshard::gpu::{self, testing, Gpu, GpuOptions, Recorder, WeightTensor};
use webshard::ops::quant::{matmul, QuantMatrix, QuantType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quant = args.first().map_or(QuantType::Q4_K, |name| {
        QuantType::from_ggml_name(name).expect("type name")
    });
    let number =
        |i: usize, default: u32| args.get(i).map_or(default, |a| a.parse().expect("number"));
    let (rows, cols, tokens) = (number(1, 896), number(2, 4864), number(3, 1));
    let gpu = pollster::block_on(Gpu::new(&GpuOptions::default())).expect("gpu");
    println!(
        "{} ({}), {quant:?} {rows}x{cols}, tokens {tokens}",
        gpu.caps.adapter, gpu.caps.backend
    );
    let row_bytes = quant.row_bytes(u64::from(cols));
    let tensor = WeightTensor::allocate(&gpu, "w", u64::from(rows), row_bytes).expect("allocate");
    let bytes = testing::random_bytes((row_bytes * u64::from(rows)) as usize, 1);
    for piece in tensor.upload_pieces(1 << 24) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(&gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    let w = QuantMatrix::new(&tensor, quant, cols, rows).expect("shape");
    let x = gpu::upload_f32(&gpu, "x", &testing::random_f32((cols * tokens) as usize, 2));
    let out = gpu::storage_buffer(&gpu, "out", u64::from(rows * tokens) * 4);
    for variant in gpu.caps.all_variants() {
        let started = Instant::now();
        let run = |repeats: u32| {
            let mut rec = Recorder::with_variant(&gpu, variant);
            for _ in 0..repeats {
                matmul(&mut rec, &w, &x, &out, tokens);
            }
            pollster::block_on(rec.submit_and_read(&out, 0, 4)).expect("read");
        };
        run(1);
        let compile = started.elapsed();
        let repeats = 20;
        let mut times = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            run(repeats);
            times.push(started.elapsed().as_secs_f64() / f64::from(repeats));
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let weight_bytes = tensor.total_bytes() as f64;
        let flops = 2.0 * f64::from(rows) * f64::from(cols) * f64::from(tokens);
        println!(
            "{variant}: {:.3} ms per product, {:.2} GB/s weights, {:.2} GFLOP/s (first run incl. compile {:.2} s)",
            median * 1e3,
            weight_bytes / median / 1e9,
            flops / median / 1e9,
            compile.as_secs_f64()
        );
    }
}
