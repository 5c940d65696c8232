//! Element-wise operators against their CPU references on every device and variant.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::elementwise::{self, Activation};

/// Extra elements after each output, which must keep their poison.
const GUARD: usize = 7;

fn each_variant() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("gpu devices")
}

fn label(gpu: &Gpu, variant: Variant) -> String {
    format!("{} ({}) {variant}", gpu.caps.adapter, gpu.caps.backend)
}

fn scaled(count: usize, seed: u64, scale: f32) -> Vec<f32> {
    testing::random_f32(count, seed)
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

fn poisoned_output(gpu: &Gpu, n: usize) -> wgpu::Buffer {
    let out = gpu::storage_buffer(gpu, "out", ((n + GUARD) * 4) as u64);
    gpu::poison_f32(gpu, &out);
    out
}

/// Reads `n` results and checks the guard elements after them were not written.
fn read_checked(gpu: &Gpu, buffer: &wgpu::Buffer, n: usize, what: &str) -> Vec<f32> {
    let all = pollster::block_on(gpu::read_f32(gpu, buffer, 0, (n + GUARD) as u64)).unwrap();
    for (i, v) in all[n..].iter().enumerate() {
        assert_eq!(
            v.to_bits(),
            gpu::POISON,
            "{what}: wrote past the end at {}",
            n + i
        );
    }
    all[..n].to_vec()
}

const SIZES: [usize; 7] = [1, 3, 576, 1000, 896 * 5, 640 * 33 + 1, 70_001];

#[test]
fn add_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for n in SIZES {
            let a = scaled(n, seed + n as u64, 4.0);
            let b = scaled(n, seed + 2 * n as u64 + 1, 4.0);
            let out = poisoned_output(&gpu, n);
            let mut rec = Recorder::with_variant(&gpu, variant);
            let (a_buf, b_buf) = (
                gpu::upload_f32(&gpu, "a", &a),
                gpu::upload_f32(&gpu, "b", &b),
            );
            elementwise::add(&mut rec, &a_buf, &b_buf, &out, n as u32);
            rec.submit();
            let what = format!("add n={n} {} seed={seed}", label(&gpu, variant));
            let got = read_checked(&gpu, &out, n, &what);
            let want = elementwise::add_reference(&a, &b);
            eprintln!(
                "{what}: relative error {:e}",
                testing::relative_error(&got, &want)
            );
            testing::assert_close(&got, &want, 1e-6, &what);
        }
    }
}

#[test]
fn add_in_place_matches_reference_and_stops_at_n() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for n in SIZES {
            let acc = scaled(n + GUARD, seed + n as u64, 4.0);
            let b = scaled(n, seed + 3 * n as u64 + 2, 4.0);
            let acc_buf = gpu::upload_f32(&gpu, "acc", &acc);
            let mut rec = Recorder::with_variant(&gpu, variant);
            elementwise::add_in_place(
                &mut rec,
                &acc_buf,
                &gpu::upload_f32(&gpu, "b", &b),
                n as u32,
            );
            rec.submit();
            let what = format!("add_in_place n={n} {} seed={seed}", label(&gpu, variant));
            let got =
                pollster::block_on(gpu::read_f32(&gpu, &acc_buf, 0, (n + GUARD) as u64)).unwrap();
            assert_eq!(&got[n..], &acc[n..], "{what}: changed elements past n");
            let want = elementwise::add_reference(&acc[..n], &b);
            eprintln!(
                "{what}: relative error {:e}",
                testing::relative_error(&got[..n], &want)
            );
            testing::assert_close(&got[..n], &want, 1e-6, &what);
        }
    }
}

#[test]
fn add_bias_broadcasts_over_rows() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for rows in [1usize, 5, 33] {
            for cols in [3usize, 576, 640, 896, 1000] {
                let x = scaled(rows * cols, seed + (rows * cols) as u64, 2.0);
                let bias = scaled(cols, seed + cols as u64 + 5, 2.0);
                let x_buf = gpu::upload_f32(&gpu, "x", &x);
                let mut rec = Recorder::with_variant(&gpu, variant);
                let bias_buf = gpu::upload_f32(&gpu, "bias", &bias);
                elementwise::add_bias(&mut rec, &x_buf, &bias_buf, rows as u32, cols as u32);
                rec.submit();
                let what = format!(
                    "add_bias {rows}x{cols} {} seed={seed}",
                    label(&gpu, variant)
                );
                let got = pollster::block_on(gpu::read_f32(&gpu, &x_buf, 0, (rows * cols) as u64))
                    .unwrap();
                let want = elementwise::add_bias_reference(&x, &bias);
                eprintln!(
                    "{what}: relative error {:e}",
                    testing::relative_error(&got, &want)
                );
                testing::assert_close(&got, &want, 1e-6, &what);
            }
        }
    }
}

#[test]
fn gated_activations_match_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for act in [Activation::Silu, Activation::GeluTanh] {
            for (n, scale) in [
                (3usize, 6.0f32),
                (1000, 12.0),
                (4864 * 5, 6.0),
                (2048 * 33, 30.0),
            ] {
                // Wide ranges reach the saturated tails, where exp and tanh overflow.
                let gate = scaled(n, seed + n as u64, scale);
                let up = scaled(n, seed + n as u64 + 9, 3.0);
                let out = poisoned_output(&gpu, n);
                let mut rec = Recorder::with_variant(&gpu, variant);
                let gate_buf = gpu::upload_f32(&gpu, "gate", &gate);
                let up_buf = gpu::upload_f32(&gpu, "up", &up);
                elementwise::gated_activation(&mut rec, &gate_buf, &up_buf, &out, n as u32, act);
                rec.submit();
                let what = format!("{act:?} n={n} {} seed={seed}", label(&gpu, variant));
                let got = read_checked(&gpu, &out, n, &what);
                let want = elementwise::gated_activation_reference(&gate, &up, act);
                let products: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| g * u).collect();
                assert_within_input_scale(&got, &want, &products, &what);
            }
        }
    }
}

#[test]
fn activate_in_place_matches_reference_and_stops_at_n() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for act in [Activation::Silu, Activation::GeluTanh] {
            for (n, scale) in [(3usize, 6.0f32), (1536 * 7, 12.0), (1536 * 33 + 5, 30.0)] {
                let x = scaled(n, seed + n as u64, scale);
                let mut stored = x.clone();
                stored.extend([f32::from_bits(gpu::POISON); GUARD]);
                let buf = gpu::upload_f32(&gpu, "x", &stored);
                let mut rec = Recorder::with_variant(&gpu, variant);
                elementwise::activate(&mut rec, &buf, n as u32, act);
                rec.submit();
                let what = format!(
                    "activate {act:?} n={n} {} seed={seed}",
                    label(&gpu, variant)
                );
                let got = read_checked(&gpu, &buf, n, &what);
                let want: Vec<f32> = x
                    .iter()
                    .map(|&v| elementwise::activation_reference(v, act))
                    .collect();
                assert_within_input_scale(&got, &want, &x, &what);
            }
        }
    }
}

#[test]
fn activation_reference_matches_the_definitions_in_f64() {
    for x in testing::random_f32(10_000, testing::fresh_seed()) {
        let x = x * 12.0;
        let xd = f64::from(x);
        let silu = xd / (1.0 + (-xd).exp());
        let gelu = 0.5
            * xd
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
        for (act, want) in [(Activation::Silu, silu), (Activation::GeluTanh, gelu)] {
            let got = f64::from(elementwise::activation_reference(x, act));
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{act:?}({x}) = {got}, want {want}"
            );
        }
    }
}

#[test]
fn add_beyond_one_dispatch_dimension() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant().into_iter().take(1) {
        // More workgroups of 256 than one grid dimension allows.
        let n = gpu.caps.max_workgroups_per_dim as usize * 256 + 1000;
        let a = scaled(n, seed, 4.0);
        let b = scaled(n, seed + 1, 4.0);
        let out = poisoned_output(&gpu, n);
        let mut rec = Recorder::with_variant(&gpu, variant);
        let (a_buf, b_buf) = (
            gpu::upload_f32(&gpu, "a", &a),
            gpu::upload_f32(&gpu, "b", &b),
        );
        elementwise::add(&mut rec, &a_buf, &b_buf, &out, n as u32);
        rec.submit();
        let what = format!("add n={n} {} seed={seed}", label(&gpu, variant));
        let got = read_checked(&gpu, &out, n, &what);
        testing::assert_close(&got, &elementwise::add_reference(&a, &b), 1e-6, &what);
    }
}

/// `got` within 2e-5 of `want` relative to the inputs' scale (at least 1), not the outputs':
/// a few inputs far below zero give GELU outputs near 0 whose f32 rounding (1 + tanh
/// cancelling) is of the order of the input's ulp, not the output's. Unwritten (poisoned)
/// values fail.
fn assert_within_input_scale(got: &[f32], want: &[f32], inputs: &[f32], what: &str) {
    let scale = inputs.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).fold(0.0f32, |m, (g, w)| {
        m.max(if g.is_finite() {
            (g - w).abs()
        } else {
            f32::INFINITY
        })
    });
    eprintln!("{what}: error {:e} of the input scale", worst / scale);
    assert!(
        worst / scale <= 2e-5,
        "{what}: error {worst:e} against inputs up to {scale}"
    );
}

/// The slices of a product split along K, added in order of the slice: the same bits as the
/// reference, and nothing written past n.
#[test]
fn sum_slices_adds_each_element_over_the_slices_in_order() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for (n, count) in [(1, 2), (896 * 5 + 3, 3), (70_001, 8)] {
            let slices = scaled(n * count, seed + n as u64, 4.0);
            let slices_buf = gpu::upload_f32(&gpu, "slices", &slices);
            let out = poisoned_output(&gpu, n);
            let mut rec = Recorder::with_variant(&gpu, variant);
            elementwise::sum_slices(&mut rec, &slices_buf, count as u32, &out, n as u32);
            rec.submit();
            let what = format!("sum_slices n={n} count={count} {}", label(&gpu, variant));
            let got = read_checked(&gpu, &out, n, &what);
            let want = elementwise::sum_slices_reference(&slices, count);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what} seed={seed}: not the reference's sums");
        }
    }
}
