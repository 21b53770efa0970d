//! Every kernel against a plain CPU reference on fresh random data, several shapes including sizes
//! that are not multiples of the workgroup size, with named tolerances.

mod common;
#[path = "common/contraction.rs"]
mod contraction;
mod reference;

use common::{assert_close, assert_fits, gpu, gpu_unshared, gpus, rand_vec, read_f32, read_u32, rng, tiny};
use rand::rngs::SmallRng;
use wgspec::gpu::{
    AttentionShape, Gpu, GpuBuffer, HeadNormIo, Kernel, KernelShape, KvOut, MatmulOut, NormIn, Op,
    RopeLayout, RopeOut, SideOutput, WeightBuffer, REDUCE_SLICE,
};
use wgspec::loader::{quant, DType};

/// f32 dot products of length k: error bound relative to the magnitude of the terms.
const MATMUL_REL: f32 = 2e-6;
/// Normalisation, attention: a few ulps of f32 after exp/sqrt.
const ELEMENTWISE_ABS: f32 = 2e-6;
const ELEMENTWISE_REL: f32 = 2e-5;

fn run(gpu: &Gpu, step: &wgpu::Buffer, ops: &[Op], n: usize, start_pos: usize) {
    gpu.write_step(step, n, start_pos);
    let mut enc = gpu.encoder();
    gpu.encode(&mut enc, ops, n as u32);
    gpu.submit(enc);
}

/// Random weights `[cols, k]` stored as `dtype`: the stored bytes and the exact values they hold
/// (dequantised on the CPU by the loader, the reference for the kernels' own dequantisation).
fn random_weights(rng: &mut SmallRng, dtype: DType, cols: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let bytes = match dtype {
        DType::F32 => tiny::f32_bytes(&rand_vec(rng, cols * k, 0.5)),
        DType::F16 => tiny::f16_bytes(&rand_vec(rng, cols * k, 0.5)),
        DType::BF16 => tiny::bf16_bytes(&rand_vec(rng, cols * k, 0.5)),
        q => tiny::random_blocks(q, cols * k, rng),
    };
    let values = quant::dequantize(dtype, &bytes, cols * k).expect("dequantize");
    (bytes, values)
}

fn upload(gpu: &Gpu, dtype: DType, bytes: &[u8], cols: usize, k: usize) -> WeightBuffer {
    WeightBuffer::from_blocks(gpu, "w", dtype, bytes, cols, k).expect("weights")
}

/// Reference matmul with a bound on the rounding error of each output.
fn ref_matmul(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
    cols: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut y = Vec::new();
    let mut bound = Vec::new();
    for r in 0..n {
        let row = reference::matvec(w, &x[r * k..(r + 1) * k], cols, k);
        for c in 0..cols {
            let mag: f32 = (0..k).map(|i| (x[r * k + i] * w[c * k + i]).abs()).sum();
            y.push(row[c] + bias.map_or(0.0, |b| b[c]));
            bound.push(mag * MATMUL_REL * (k as f32).sqrt() + 1e-6);
        }
    }
    (y, bound)
}

#[allow(clippy::too_many_arguments)]
fn check_matmul(
    what: &str,
    y: &[f32],
    ldy: usize,
    off: usize,
    want: &[f32],
    bound: &[f32],
    n: usize,
    cols: usize,
) {
    for r in 0..n {
        assert_eq!(y[r * ldy], 0.0, "{what}: column before the chunk was written");
        for c in 0..cols {
            let (g, e) = (y[r * ldy + off + c], want[r * cols + c]);
            assert!((g - e).abs() <= bound[r * cols + c], "{what} [{r},{c}]: {g} vs {e}");
        }
    }
}

#[test]
fn every_kernel_builds_in_every_shape() {
    // Kernels compile on first use; this compiles the rest (each inside an error scope), so
    // that every kernel is checked on the adapter in each shape, the GPU shape's wide matmuls too.
    for gpu in gpus() {
        pollster::block_on(gpu.check_kernels()).unwrap_or_else(|e| panic!("{}: {e}", gpu.describe()));
        assert_eq!(gpu.compiled_kernels(), Kernel::all(), "{}", gpu.describe());
    }
}

#[test]
fn a_device_compiles_only_the_kernels_it_uses() {
    // (its own devices: the shared ones have compiled whatever other tests ran), in the
    // adapter's shape and in the GPU shape (whose matmuls share one bindings layout)
    let gpu_shape = KernelShape { matmul_lanes: Some(16), split_attention: Some(true), shuffle_loads: None };
    for shape in [KernelShape::default(), gpu_shape] {
        a_device_of_this_shape_compiles_only_the_kernels_it_uses(shape);
    }
}

fn a_device_of_this_shape_compiles_only_the_kernels_it_uses(shape: KernelShape) {
    let gpu = pollster::block_on(Gpu::with_shape(shape)).expect("gpu");
    assert_eq!(gpu.compiled_kernels(), [], "a new device compiles nothing");
    let (cols, k) = (8, 64);
    let mut r = rng(70);
    let (bytes, w) = random_weights(&mut r, DType::Q4_0, cols, k);
    let x = rand_vec(&mut r, k, 1.0);
    let step = gpu.step_buffer();
    let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
    let wb = upload(&gpu, DType::Q4_0, &bytes, cols, k);
    let yb = GpuBuffer::<f32>::zeros(&gpu, "y", cols);
    let op = gpu.matmul(&step, &xb, &wb, None, &yb, MatmulOut { ldy: cols as u32, ..Default::default() });
    assert_eq!(
        gpu.compiled_kernels(),
        [Kernel::Matmul(DType::Q4_0)],
        "building a Q4_0 matmul op compiles that kernel alone"
    );
    run(&gpu, &step, &[op], 1, 0);
    let y = read_f32(&gpu, &yb.raw, cols);
    let (want, bound) = ref_matmul(&x, &w, None, 1, k, cols);
    for c in 0..cols {
        assert!((y[c] - want[c]).abs() <= bound[c], "[{c}]: {} vs {}", y[c], want[c]);
    }
    assert_eq!(gpu.compiled_kernels(), [Kernel::Matmul(DType::Q4_0)], "running it compiles nothing more");
}

#[test]
fn matmul_matches_reference_for_every_weight_format() {
    for gpu in gpus() {
        // Every stored type, dequantised inside the kernel, against the CPU dequantisation + f64 sums;
        // 1..=16 rows (two row groups), column counts that are no multiple of the tile, bias or not.
        let step = gpu.step_buffer();
        let mut rng = rng(1);
        for dtype in DType::ALL {
            let block = dtype.block_len().max(32);
            for &(n, k, cols) in &[(1, block, 1), (3, 2 * block, 13), (16, 3 * block, 37), (9, block * 6, 6)]
            {
                for with_bias in [false, true] {
                    let what = format!("matmul {dtype} n={n} k={k} cols={cols} bias={with_bias}");
                    let x = rand_vec(&mut rng, n * k, 1.0);
                    let (bytes, w) = random_weights(&mut rng, dtype, cols, k);
                    let bias = rand_vec(&mut rng, cols, 0.3);
                    let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
                    let wb = upload(&gpu, dtype, &bytes, cols, k);
                    assert_eq!(wb.dtype, dtype, "{what}: kept in its stored format ({})", gpu.describe());
                    // Write into the middle columns of a wider output, as a chunk of a split matrix
                    // does; the bias is the whole matrix's (its first columns are another chunk's).
                    let (ldy, off) = (cols + 3, 2usize);
                    let bb =
                        GpuBuffer::<f32>::from_slice(&gpu, "b", &[vec![9.0; off], bias.clone()].concat());
                    let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * ldy);
                    let out = MatmulOut { ldy: ldy as u32, col_offset: off as u32, ..Default::default() };
                    let op = gpu.matmul(&step, &xb, &wb, with_bias.then_some(&bb), &yb, out);
                    run(&gpu, &step, &[op], n, 0);
                    let y = read_f32(&gpu, &yb.raw, n * ldy);
                    let (want, bound) = ref_matmul(&x, &w, with_bias.then_some(&bias[..]), n, k, cols);
                    check_matmul(&what, &y, ldy, off, &want, &bound, n, cols);
                }
            }
        }
    }
}

#[test]
fn matmul_matches_reference_for_float_rows_of_any_length() {
    for gpu in gpus() {
        // k that is no multiple of 32 (rows padded with zeros on the GPU), and k = 8960 over 10 rows:
        // Qwen2.5-1.5B's ffn width, where a thread looping over every row once corrupted lavapipe.
        let step = gpu.step_buffer();
        let mut rng = rng(11);
        for &(n, k, cols) in &[(1, 4, 1), (3, 68, 63), (5, 100, 65), (32, 260, 130), (10, 8960, 9)] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let what = format!("matmul {dtype} n={n} k={k} cols={cols}");
                let x = rand_vec(&mut rng, n * k, 1.0);
                let (bytes, w) = random_weights(&mut rng, dtype, cols, k);
                let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
                let wb = upload(&gpu, dtype, &bytes, cols, k);
                let (ldy, off) = (cols + 1, 1usize);
                let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * ldy);
                let out = MatmulOut { ldy: ldy as u32, col_offset: off as u32, ..Default::default() };
                run(&gpu, &step, &[gpu.matmul(&step, &xb, &wb, None, &yb, out)], n, 0);
                let y = read_f32(&gpu, &yb.raw, n * ldy);
                let (want, bound) = ref_matmul(&x, &w, None, n, k, cols);
                check_matmul(&what, &y, ldy, off, &want, &bound, n, cols);
            }
        }
    }
}

#[test]
fn matmul_rejects_rows_the_kernels_cannot_read() {
    let gpu = gpu();
    assert!(WeightBuffer::from_f32(&gpu, "w", &[0.0; 6], 2, 3).is_err(), "k = 3 is no multiple of 4");
    assert!(WeightBuffer::from_blocks(&gpu, "w", DType::Q4_K, &[0; 144], 1, 128).is_err(), "half a block");
    assert!(WeightBuffer::from_blocks(&gpu, "w", DType::Q8_0, &[0; 33], 1, 32).is_err(), "short bytes");
    for dtype in DType::ALL {
        let packed = wgspec::gpu::pack_rows(dtype, &[], 0, 256, 8).expect("zero rows pack to nothing");
        assert_eq!(packed.rows, 0, "{dtype}");
    }
}

#[test]
fn matmul_splits_columns_between_output_and_kv_cache_and_accumulates() {
    for gpu in gpus() {
        let step = gpu.step_buffer();
        let mut rng = rng(2);
        // columns 0..3 to y (row r), 3..8 to the cache (row start + r, column c - 3); the matrix in
        // two buffers (rows 0..4 and 4..8) that read one bias by the whole matrix's column
        let (n, k, cols, start, split, ctx) = (3, 12, 8, 4, 3, 10);
        let x = rand_vec(&mut rng, n * k, 1.0);
        let w = rand_vec(&mut rng, cols * k, 1.0);
        let bias = rand_vec(&mut rng, cols, 1.0);
        let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
        let bb = GpuBuffer::<f32>::from_slice(&gpu, "bias", &bias);
        let halves =
            [0, 4].map(|r0| WeightBuffer::from_f32(&gpu, "w", &w[r0 * k..(r0 + 4) * k], 4, k).expect("w"));
        let y = GpuBuffer::<f32>::zeros(&gpu, "y", n * split);
        let cache = GpuBuffer::<u32>::zeros(&gpu, "cache", ctx * (cols - split));
        let kv = KvOut { cache: &cache, ld: (cols - split) as u32, split: split as u32, f16: false };
        let ops = [0u32, 4].map(|c0| {
            let out = MatmulOut {
                ldy: split as u32,
                col_offset: c0,
                second: Some(SideOutput::Kv(kv)),
                ..Default::default()
            };
            gpu.matmul(&step, &xb, &halves[c0 as usize / 4], Some(&bb), &y, out)
        });
        run(&gpu, &step, &ops, n, start);
        let (want, _) = ref_matmul(&x, &w, Some(&bias), n, k, cols);
        let got_y = read_f32(&gpu, &y.raw, n * split);
        let got_kv: Vec<f32> =
            read_u32(&gpu, &cache.raw, ctx * (cols - split)).into_iter().map(f32::from_bits).collect();
        let ld = cols - split;
        assert!(got_kv[..start * ld].iter().all(|v| *v == 0.0), "rows before start_pos untouched");
        assert!(got_kv[(start + n) * ld..].iter().all(|v| *v == 0.0), "rows after the pass untouched");
        for r in 0..n {
            let row = &want[r * cols..(r + 1) * cols];
            assert_close("y columns", &got_y[r * split..(r + 1) * split], &row[..split], 1e-5, 1e-5);
            assert_close(
                "kv columns",
                &got_kv[(start + r) * ld..(start + r + 1) * ld],
                &row[split..],
                1e-5,
                1e-5,
            );
        }
        let wb = WeightBuffer::from_f32(&gpu, "w", &w, cols, k).expect("weights");

        // accumulate: y += x w^T, bit for bit the sum of what y held and what the plain matmul writes
        let before = rand_vec(&mut rng, n * cols, 3.0);
        let plain = GpuBuffer::<f32>::zeros(&gpu, "plain", n * cols);
        let acc = GpuBuffer::<f32>::from_slice(&gpu, "acc", &before);
        let to = MatmulOut { ldy: cols as u32, ..Default::default() };
        let ops = [
            gpu.matmul(&step, &xb, &wb, None, &plain, to),
            gpu.matmul(&step, &xb, &wb, None, &acc, MatmulOut { accumulate: true, ..to }),
        ];
        run(&gpu, &step, &ops, n, 0);
        let plain = read_f32(&gpu, &plain.raw, n * cols);
        let got = read_f32(&gpu, &acc.raw, n * cols);
        let want: Vec<f32> = before.iter().zip(&plain).map(|(a, b)| a + b).collect();
        assert_eq!(got, want, "y += x w^T");
    }
}

/// A gate's activation as the reference computes it (f64): SiLU, or GELU's tanh approximation.
fn gate_activation(g: f64, gelu: bool) -> f64 {
    if gelu {
        0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
    } else {
        g / (1.0 + (-g).exp())
    }
}

#[test]
fn matmul_with_glu_epilogues_matches_reference() {
    // Rows interleave gate and up (g0, u0, g1, u1, ...); output i = act(x . g_i) * (x . u_i),
    // act SiLU (SwiGLU) or GELU's tanh approximation (GeGLU, Gemma). Inputs of scale 1 and of
    // scale 30 (gates past +-20: tanh's argument past 250, where sinh / cosh overflow f32).
    for gpu in gpus() {
        let step = gpu.step_buffer();
        let mut rng = rng(12);
        for (dtype, gelu, scale) in [
            (DType::F32, false, 1.0),
            (DType::Q8_0, false, 1.0),
            (DType::Q4_K, false, 1.0),
            (DType::F32, true, 1.0),
            (DType::Q4_K, true, 30.0),
        ] {
            let k = dtype.block_len().max(32) * 3;
            for &(n, f) in &[(1usize, 6usize), (5, 37), (9, 64)] {
                let x = rand_vec(&mut rng, n * k, scale);
                let (bytes, w) = random_weights(&mut rng, dtype, 2 * f, k);
                let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
                let wb = upload(&gpu, dtype, &bytes, 2 * f, k);
                let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * f);
                let out = MatmulOut { ldy: f as u32, glu: true, gelu, ..Default::default() };
                run(&gpu, &step, &[gpu.matmul(&step, &xb, &wb, None, &yb, out)], n, 0);
                let got = read_f32(&gpu, &yb.raw, n * f);
                let (both, _) = ref_matmul(&x, &w, None, n, k, 2 * f);
                let want: Vec<f32> = both
                    .chunks_exact(2)
                    .map(|gu| (gate_activation(gu[0] as f64, gelu) * gu[1] as f64) as f32)
                    .collect();
                if scale > 1.0 {
                    let most = both.chunks_exact(2).map(|gu| gu[0].abs()).fold(0f32, f32::max);
                    assert!(most > 20.0, "gates up to {most} only");
                }
                let what = format!("glu {dtype} gelu={gelu} scale {scale} n={n} f={f}");
                assert!(got.iter().all(|v| v.is_finite()), "{what}: {got:?}");
                assert_close(&what, &got, &want, 1e-4 * scale * scale, 1e-4);
            }
        }
    }
}

#[test]
fn matmul_rows_are_batch_invariant() {
    for gpu in gpus() {
        // Row r of a pass over n rows (up to a pass's most, 64) must equal, bit for bit, the same
        // row computed alone, for the float and the block formats, in every kind of row group
        // (CPU adapters: 8 x 8, 8 x 6 + 1, 8 x 4 + 1, 8 x 4, 8 + 5 in
        // a group of six, 7 in a group of eight, 6, 4, 3, 2; the GPU shape: 16 x 2, 13 and 9 in a
        // group of sixteen, 8 and 7 of eight, 6 and 5 of six (its wide pipeline), 4, 3, 2, and
        // 16 + 13, 16 + 6, 16 + 1). F32 also with a k that is no multiple of 32, whose last unit
        // is partial (a 1-row group writes whole units out and loops over the groups of a
        // partial one). The GPU shape's narrow matrices in each of its column tiles (16, 32 and 64
        // lanes per column quad: 4,240 columns keep 16).
        let step = gpu.step_buffer();
        let mut rng = rng(3);
        let cases = [
            (DType::F32, 768, 97),
            (DType::F32, 808, 97),
            (DType::Q4_K, 768, 97),
            (DType::Q5_K, 768, 97),
            (DType::Q6_K, 768, 97),
            (DType::Q8_0, 768, 97),
            (DType::Q4_K, 2048, 97),
            (DType::Q6_K, 768, 4240),
        ];
        let mut lanes_seen = std::collections::BTreeSet::new();
        let most = wgspec::model::MAX_BATCH; // (a pass's most rows: 64)
        for (dtype, k, cols) in cases {
            let x = rand_vec(&mut rng, most * k, 1.0);
            let (bytes, _) = random_weights(&mut rng, dtype, cols, k);
            let wb = upload(&gpu, dtype, &bytes, cols, k);
            let full_x = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
            let full_y = GpuBuffer::<f32>::zeros(&gpu, "y", most * cols);
            let out = MatmulOut { ldy: cols as u32, ..Default::default() };
            let op = gpu.matmul(&step, &full_x, &wb, None, &full_y, out);
            lanes_seen.insert(op.lanes());
            let mut singles = Vec::new();
            for r in 0..32 {
                let xr = GpuBuffer::<f32>::from_slice(&gpu, "xr", &x[r * k..(r + 1) * k]);
                let yr = GpuBuffer::<f32>::zeros(&gpu, "yr", cols);
                run(&gpu, &step, &[gpu.matmul(&step, &xr, &wb, None, &yr, out)], 1, 0);
                singles.push(read_f32(&gpu, &yr.raw, cols));
            }
            // (rows 32.. as the first rows of a pass of 32: lean; the rows of a 32-row pass are
            // their single-row passes' below)
            let (xs, ys) = (&x[32 * k..], GpuBuffer::<f32>::zeros(&gpu, "ys", (most - 32) * cols));
            let xs = GpuBuffer::<f32>::from_slice(&gpu, "xs", xs);
            run(&gpu, &step, &[gpu.matmul(&step, &xs, &wb, None, &ys, out)], most - 32, 0);
            let rest = read_f32(&gpu, &ys.raw, (most - 32) * cols);
            singles.extend(rest.chunks(cols).map(|r| r.to_vec()));
            for n in [most, 49, 33, 32, 29, 22, 17, 13, 9, 8, 7, 6, 5, 4, 3, 2] {
                run(&gpu, &step, std::slice::from_ref(&op), n, 0);
                let batch = read_f32(&gpu, &full_y.raw, n * cols);
                for (r, single) in singles.iter().enumerate().take(n) {
                    let same = single
                        .iter()
                        .zip(&batch[r * cols..(r + 1) * cols])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{dtype} k={k} cols={cols} ({} lanes): row {r} of a {n}-row pass differs from \
                         the single-row pass",
                        op.lanes()
                    );
                }
            }
        }
        let seen: Vec<u32> = lanes_seen.into_iter().collect();
        let expected: &[u32] = if gpu.matmul_lanes() == 1 { &[1] } else { &[16, 32, 64] };
        assert_eq!(seen, expected, "column tiles exercised ({})", gpu.describe());
    }
}

/// The outputs of the shape that shares loads by shuffles and of the one that does not: the same
/// bits, and not all zeros.
fn assert_same_bits(what: &str, shuffled: &[f32], loaded: &[f32]) {
    assert_eq!(shuffled.len(), loaded.len(), "{what}: length");
    for (i, (a, b)) in shuffled.iter().zip(loaded).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: output {i}: shuffled {a}, loaded {b}");
    }
    assert!(shuffled.iter().any(|v| *v != 0.0), "{what}: all zeros");
}

/// Item 5 of the GPU-shape issue: no float add of a decoding kernel is fed by a multiply but
/// through an explicit `fma`, in every module (every weight and cache format, with and without
/// shuffled loads), so no compiler can round a row differently in two pipelines (the matmul's
/// row groups and lanes) or two branches (its row groups, attention's direct and tree keys).
/// lavapipe never contracts differently; a GPU compiler may (tests/common/contraction.rs). The
/// benchmarks' kernels measure the hardware and are left out.
#[test]
fn no_kernel_arithmetic_can_be_contracted() {
    for kernel in Kernel::all().into_iter().filter(|k| !matches!(k, Kernel::BenchCopy | Kernel::BenchFma)) {
        for shuffle in [false, true] {
            let found = contraction::contractable(&kernel.source(shuffle), "main");
            assert!(found.is_empty(), "{kernel:?} (shuffled loads: {shuffle}): {found:#?}");
        }
    }
}

/// The contraction check finds each way a product can reach an add (and misses none of them by
/// a path the matmul avoids), and passes what cannot be contracted.
#[test]
fn the_contraction_check_finds_every_path_from_a_multiply_to_an_add() {
    let source = r#"
        @group(0) @binding(0) var<storage, read_write> y: array<f32>;
        fn inline_expr(a: f32, b: f32) -> f32 { return a * b + y[1]; }
        fn through_let(a: f32, b: f32) -> f32 { let m = a * b; return y[2] - m; }
        fn through_var(a: f32, b: f32) -> f32 { var m = 0.0; if (a > 0.0) { m = a / b; } return m + 1.0; }
        fn product(a: f32, b: f32) -> f32 { return a * b; }
        fn through_result(a: f32, b: f32) -> f32 { return product(a, b) + b; }
        fn add(v: f32) -> f32 { return v + 2.0; }
        fn through_argument(a: f32, b: f32) -> f32 { return add(-(a * b)); }
        fn put(m: ptr<function, vec4<f32>>, a: f32) { *m = vec4<f32>(a) * a; }
        fn through_pointer(a: f32) -> f32 { var m: vec4<f32>; put(&m, a); return m.x + m.y; }
        fn onto(m: f32, f: f32) -> f32 { return fma(m, f, y[3]); }
        fn by_one(a: f32, b: f32) -> f32 { return onto(a * b, 1.0); }
        fn builtin(a: vec4<f32>) -> f32 { return dot(a, a); }
        fn fine(a: f32, b: f32) -> f32 {
            let p = fma(a, b, y[4]) + y[5];
            let q = onto(p, b) + onto(a * b, a) + add(p);
            var s = vec4<f32>(a);
            s += vec4<f32>(f32(u32(a) * 3u + 1u));
            return q - s.x + exp(a * b) + min(a * b, 1.0) + p;
        }
        @compute @workgroup_size(1)
        fn main() {
            let a = y[0];
            let b = y[6];
            y[7] = inline_expr(a, b) + through_let(a, b) + through_var(a, b) + through_result(a, b)
                + through_argument(a, b) + through_pointer(a) + by_one(a, b) + fine(a, b);
            y[8] = builtin(vec4<f32>(a));
        }
    "#;
    let found = contraction::contractable(source, "main");
    let functions: std::collections::BTreeSet<&str> =
        found.iter().map(|f| f.split(':').next().unwrap_or("")).collect();
    let want = [
        "add",
        "builtin",
        "inline_expr",
        "onto",
        "through_let",
        "through_pointer",
        "through_result",
        "through_var",
    ];
    assert_eq!(functions, want.into_iter().collect(), "{found:#?}");
}

#[test]
fn matmul_x_shared_by_subgroup_shuffles_keeps_every_bit() {
    // lavapipe's default shape passes each vector of x between the matmul's invocations of a
    // subgroup instead of each loading it: the same values, so every output keeps its bits. Rows
    // of each kind of row group (1, 2, 3, 4, 6, 8, and 8 + 5 in a group of six), a k whose last
    // unit is partial (f16), and columns that leave invocations past the matrix in the last
    // subgroup.
    let (shuffled, loading) = (gpu(), gpu_unshared());
    if shuffled.info.name.contains("llvmpipe") && shuffled.info.subgroup_min_size >= 8 {
        assert!(
            shuffled.shuffles_loads(),
            "lavapipe's default shape shares loads by shuffles: {}",
            shuffled.describe()
        );
    }
    assert!(!loading.shuffles_loads(), "{}", loading.describe());
    let mut rng = rng(4);
    for (dtype, k) in [(DType::F16, 808), (DType::Q4_1, 768), (DType::Q4_K, 768), (DType::Q8_0, 768)] {
        let cols = 97;
        let x = rand_vec(&mut rng, 13 * k, 1.0);
        let (bytes, _) = random_weights(&mut rng, dtype, cols, k);
        for n in [1usize, 2, 3, 4, 6, 8, 13] {
            let ys = [&shuffled, &loading].map(|gpu| {
                let step = gpu.step_buffer();
                let wb = upload(gpu, dtype, &bytes, cols, k);
                let xb = GpuBuffer::<f32>::from_slice(gpu, "x", &x);
                let yb = GpuBuffer::<f32>::zeros(gpu, "y", 13 * cols);
                let out = MatmulOut { ldy: cols as u32, ..Default::default() };
                run(gpu, &step, &[gpu.matmul(&step, &xb, &wb, None, &yb, out)], n, 0);
                read_f32(gpu, &yb.raw, n * cols)
            });
            assert_same_bits(&format!("{dtype} k={k} n={n}"), &ys[0], &ys[1]);
        }
    }
}

#[test]
fn attention_q_and_scores_shared_by_subgroup_shuffles_keep_every_bit() {
    // lavapipe's one-pass attention passes q and the scores between the invocations of a subgroup
    // instead of each loading them: every output keeps its bits. Head dims whose q is no multiple
    // of 8 vectors and that leave invocations past head_dim, a cache longer than a workgroup.
    let (shuffled, loading) = (gpu(), gpu_unshared());
    let mut rng = rng(8);
    for &(n, heads, kv_heads, hd, start) in &[(3, 4, 2, 20, 5), (5, 6, 2, 64, 150), (2, 2, 1, 132, 70)] {
        let ctx = 160;
        let q = rand_vec(&mut rng, n * heads * hd, 1.0);
        let kv = rand_vec(&mut rng, ctx * 2 * kv_heads * hd, 2.0);
        let words: Vec<u32> = kv
            .chunks(2)
            .map(|p| {
                half::f16::from_f32(p[0]).to_bits() as u32
                    | (half::f16::from_f32(p[1]).to_bits() as u32) << 16
            })
            .collect();
        let shape = AttentionShape {
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: hd as u32,
            ctx: ctx as u32,
            kv_f16: true,
            window: 0,
        };
        let outs = [&shuffled, &loading].map(|gpu| {
            let step = gpu.step_buffer();
            let qb = GpuBuffer::<f32>::from_slice(gpu, "q", &q);
            let kvb = GpuBuffer::<u32>::from_slice(gpu, "kv", &words);
            let scratch = GpuBuffer::<f32>::zeros(gpu, "scratch", gpu.attention_scratch_len(shape, n));
            let ob = GpuBuffer::<f32>::zeros(gpu, "out", n * heads * hd);
            let no_pages = GpuBuffer::<u32>::zeros(gpu, "no pages", 1);
            run(gpu, &step, &gpu.attention(&step, &qb, (&kvb, &no_pages), &scratch, &ob, shape), n, start);
            read_f32(gpu, &ob.raw, n * heads * hd)
        });
        assert_same_bits(&format!("n={n} hd={hd} start={start}"), &outs[0], &outs[1]);
    }
}

#[test]
fn embed_gathers_rows_of_every_format_from_its_chunk() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(4);
    let tokens: Vec<u32> = vec![0, 36, 5, 20, 20, 19];
    let tb = GpuBuffer::<u32>::from_slice(&gpu, "tokens", &tokens);
    for dtype in DType::ALL {
        // (two blocks a row: a CPU adapter's weight buffers interleave the blocks of 8 rows; 20
        // and 17 rows end each chunk with a partial run)
        let (vocab, dim) = (37, if dtype.block_len() > 1 { (2 * dtype.block_len()).max(64) } else { 68 });
        let (bytes, table) = random_weights(&mut rng, dtype, vocab, dim);
        // Two chunks: rows 0..20 and 20..37.
        let split = dtype.bytes_for((20 * dim) as u64).expect("whole blocks") as usize;
        let a = upload(&gpu, dtype, &bytes[..split], 20, dim);
        let b = upload(&gpu, dtype, &bytes[split..], 17, dim);
        let xb = GpuBuffer::<f32>::zeros(&gpu, "x", tokens.len() * dim);
        // the second chunk also writes x * gamma for its rows (the model asks it of every chunk)
        let gamma = rand_vec(&mut rng, dim, 1.0);
        let gb = GpuBuffer::<f32>::from_slice(&gpu, "gamma", &gamma);
        let scaled = GpuBuffer::<f32>::zeros(&gpu, "x * gamma", tokens.len() * dim);
        let ops = [
            gpu.embed(&step, &tb, &a, &xb, (0, 1.0), None),
            gpu.embed(&step, &tb, &b, &xb, (20, 1.0), Some((&gb, &scaled))),
        ];
        run(&gpu, &step, &ops, tokens.len(), 0);
        let x = read_f32(&gpu, &xb.raw, tokens.len() * dim);
        let want: Vec<f32> =
            tokens.iter().flat_map(|&t| table[t as usize * dim..(t as usize + 1) * dim].to_vec()).collect();
        assert_eq!(x, want, "embedding gather of {dtype}: the exact dequantised values");
        let got = read_f32(&gpu, &scaled.raw, tokens.len() * dim);
        for (r, &t) in tokens.iter().enumerate() {
            let row = &got[r * dim..(r + 1) * dim];
            let want: Vec<f32> = if t >= 20 {
                want[r * dim..(r + 1) * dim].iter().zip(&gamma).map(|(v, g)| v * g).collect()
            } else {
                vec![0.0; dim]
            };
            assert_eq!(row, &want[..], "{dtype}: x * gamma of row {r} (token {t})");
        }
    }
}

/// The dequantisations the kernels write as fused multiply-adds (Q4_1 `d q + m`, Q4_K and Q5_K
/// `(d sc) q - dmin m`: shaders/formats/) round as ggml's multiply then add, the reference order:
/// their products are exact in f32 for every finite f16 scale, 6-bit scale and 5-bit quant (at most
/// 11 + 6 + 5 significant bits; the byte places they are scaled by are powers of two), so the one
/// rounding left is the add's, fused or not.
#[test]
fn quant_products_are_exact_so_fused_dequantisation_rounds_as_ggml() {
    for bits in 0..=u16::MAX {
        let d = half::f16::from_bits(bits).to_f32();
        if !d.is_finite() || d == 0.0 {
            continue;
        }
        for sc in 1..64u32 {
            let s = d * sc as f32;
            assert_eq!(s as f64, d as f64 * sc as f64, "d = {d}, sc = {sc}");
            // s has at most 19 significant bits, so s q is exact for every q < 32
            let significant = 24 - (s.to_bits() & 0x7f_ffff | 0x80_0000).trailing_zeros();
            assert!(significant <= 19, "d = {d}, sc = {sc}: {significant} bits");
            for q in [3u32, 17, 31] {
                assert_eq!((s * q as f32) as f64, s as f64 * q as f64, "d = {d}, sc = {sc}, q = {q}");
                assert_eq!(s.mul_add(q as f32, -d), s * q as f32 - d, "d = {d}, sc = {sc}, q = {q}");
            }
        }
    }
}

#[test]
fn embed_dequantises_edge_scales_and_every_quant_bit_for_bit() {
    // Every quantized format gathered whole by the embedding kernel (its unit_group is the
    // matmul's) and compared bit for bit, signed zeros too, with the CPU's dequantisation. Scales
    // of +-0, +-2^-24, the largest f16 subnormal, +-65504, a negative normal and a small positive
    // one in turn, the second scale (Q4_1's m, the K-quants' dmin) in another turn; Q6_K's scale
    // bytes -128, 127 and 0; random quant bytes over 512 blocks of 32 (every value of every field
    // in every byte of a word, many times over).
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(21);
    let (rows, dim) = (32, 512);
    for dtype in DType::ALL.into_iter().filter(|d| d.block_len() > 1) {
        let bytes = tiny::edge_scale_blocks(dtype, rows * dim, &mut rng);
        let want = quant::dequantize(dtype, &bytes, rows * dim).expect("dequantize");
        let table = upload(&gpu, dtype, &bytes, rows, dim);
        let tokens: Vec<u32> = (0..rows as u32).collect();
        let tb = GpuBuffer::<u32>::from_slice(&gpu, "tokens", &tokens);
        let xb = GpuBuffer::<f32>::zeros(&gpu, "x", rows * dim);
        run(&gpu, &step, &[gpu.embed(&step, &tb, &table, &xb, (0, 1.0), None)], rows, 0);
        let got = read_f32(&gpu, &xb.raw, rows * dim);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let at = (i / dim, i % dim);
            assert_eq!(g.to_bits(), w.to_bits(), "{dtype}: row {}, element {}: {g} vs {w}", at.0, at.1);
        }
    }
}

#[test]
fn rmsnorm_folds_into_the_matmul_that_reads_it() {
    // A residual producer (y = before + a W1^T, and y * gamma as a second output) followed by a
    // normed matmul (rmsnorm(y) * gamma . W2^T, reading y * gamma and dividing by the rms of y):
    // against the CPU's residual add, rmsnorm (in f64) and matmul.
    for gpu in gpus() {
        let step = gpu.step_buffer();
        let mut rng = rng(5);
        for dtype in [DType::F32, DType::Q4_K] {
            let block = dtype.block_len().max(1);
            for &(n, k, cols) in &[(1, 68usize, 5), (3, 200, 13), (13, 256, 40), (5, 576, 7)] {
                let k = k.div_ceil(block) * block;
                let what = format!("normed matmul {dtype} n={n} k={k} cols={cols}");
                let (m, eps) = (24, 1e-5);
                let a = rand_vec(&mut rng, n * m, 1.0);
                let w1 = rand_vec(&mut rng, k * m, 0.5);
                let before = rand_vec(&mut rng, n * k, 2.0);
                let gamma = rand_vec(&mut rng, k, 1.0);
                let (bytes, w2) = random_weights(&mut rng, dtype, cols, k);
                let ab = GpuBuffer::<f32>::from_slice(&gpu, "a", &a);
                let w1b = WeightBuffer::from_f32(&gpu, "w1", &w1, k, m).expect("w1");
                let yb = GpuBuffer::<f32>::from_slice(&gpu, "y", &before);
                let gb = GpuBuffer::<f32>::from_slice(&gpu, "gamma", &gamma);
                let scaled = GpuBuffer::<f32>::zeros(&gpu, "y * gamma", n * k);
                let w2b = upload(&gpu, dtype, &bytes, cols, k);
                let out = GpuBuffer::<f32>::zeros(&gpu, "out", n * cols);
                let produce = MatmulOut {
                    ldy: k as u32,
                    accumulate: true,
                    second: Some(SideOutput::Scaled { out: &scaled, gamma: &gb }),
                    ..Default::default()
                };
                let normed = MatmulOut {
                    ldy: cols as u32,
                    norm: Some(NormIn { raw: &yb, eps }),
                    ..Default::default()
                };
                let ops = [
                    gpu.matmul(&step, &ab, &w1b, None, &yb, produce),
                    gpu.matmul(&step, &scaled, &w2b, None, &out, normed),
                ];
                run(&gpu, &step, &ops, n, 0);
                let y = read_f32(&gpu, &yb.raw, n * k);
                let (add, _) = ref_matmul(&a, &w1, None, n, m, k);
                let want_y: Vec<f32> = before.iter().zip(&add).map(|(b, d)| b + d).collect();
                assert_close(&format!("{what}: residual"), &y, &want_y, 1e-5, 1e-5);
                let got_scaled = read_f32(&gpu, &scaled.raw, n * k);
                let want_scaled: Vec<f32> =
                    y.chunks(k).flat_map(|r| r.iter().zip(&gamma).map(|(v, g)| v * g)).collect();
                assert_eq!(got_scaled, want_scaled, "{what}: the scaled copy is y * gamma exactly");
                let normed: Vec<f32> = y.chunks(k).flat_map(|r| reference::rmsnorm(r, &gamma, eps)).collect();
                let (want, bound) = ref_matmul(&normed, &w2, None, n, k, cols);
                let got = read_f32(&gpu, &out.raw, n * cols);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    let tol = bound[i] + ELEMENTWISE_ABS + ELEMENTWISE_REL * e.abs();
                    assert!((g - e).abs() <= tol, "{what} [{i}]: {g} vs {e} ({})", gpu.describe());
                }
            }
        }
    }
}

/// RoPE angles `[positions, rope_dim / 2]` (cos, sin), as the model computes them (in f64).
fn rope_table(context: usize, rope_dim: usize, theta: f64) -> Vec<f32> {
    let mut table = Vec::new();
    for pos in 0..context {
        for i in 0..rope_dim / 2 {
            let a = pos as f64 * theta.powf(-2.0 * i as f64 / rope_dim as f64);
            table.extend([a.cos() as f32, a.sin() as f32]);
        }
    }
    table
}

/// The rows of a q|k|v matrix in the order the loader uploads them: q rows paired, k rows
/// paired (RopeLayout::pair_rows), v rows as they are.
fn qkv_upload_order(
    layout: RopeLayout,
    (heads, kv_heads): (usize, usize),
    head_dim: usize,
    rope_dim: usize,
) -> Vec<usize> {
    let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
    layout
        .pair_rows(heads, head_dim, rope_dim)
        .into_iter()
        .chain(layout.pair_rows(kv_heads, head_dim, rope_dim).into_iter().map(|r| qd + r))
        .chain(qd + kvd..qd + 2 * kvd)
        .collect()
}

/// A KV cache's `n` values: f32 bits, or f16 pairs (low half first).
fn cache_values(gpu: &Gpu, cache: &GpuBuffer<u32>, n: usize, f16: bool) -> Vec<f32> {
    let words = read_u32(gpu, &cache.raw, n);
    if f16 {
        let halves = words.iter().flat_map(|&w| [w as u16, (w >> 16) as u16]);
        halves.map(|h| half::f16::from_bits(h).to_f32()).collect()
    } else {
        words.iter().map(|&w| f32::from_bits(w)).collect()
    }
}

#[test]
fn fused_qkv_matmul_rotates_q_and_k_and_fills_the_cache_in_both_rope_layouts() {
    // One [q | k | v] matrix whose q and k rows were reordered by RopeLayout::pair_rows (as the
    // loader does): q rotated into its scratch, k rotated and v into the cache at start_pos,
    // each value back at its checkpoint column. Against matmul then rotation on the CPU.
    for gpu in gpus() {
        let step = gpu.step_buffer();
        let mut rng = rng(6);
        let (context, theta) = (300, 10000.0);
        for &(n, heads, kv_heads, head_dim, rope_dim, start) in
            &[(1, 1, 1, 4, 4, 0), (3, 4, 2, 16, 16, 100), (4, 2, 1, 16, 8, 7), (5, 3, 3, 32, 32, 290)]
        {
            for (layout, kv_f16) in [
                (RopeLayout::Interleaved, false),
                (RopeLayout::Halves, false),
                (RopeLayout::Interleaved, true),
                (RopeLayout::Halves, true),
            ] {
                let k = 64;
                let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
                let cols = qd + 2 * kvd;
                let x = rand_vec(&mut rng, n * k, 1.0);
                let w = rand_vec(&mut rng, cols * k, 0.5);
                let bias = rand_vec(&mut rng, cols, 0.5);
                let order = qkv_upload_order(layout, (heads, kv_heads), head_dim, rope_dim);
                let w_up: Vec<f32> = order.iter().flat_map(|&r| w[r * k..(r + 1) * k].to_vec()).collect();
                let b_up: Vec<f32> = order.iter().map(|&r| bias[r]).collect();
                let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
                let wb = WeightBuffer::from_f32(&gpu, "wqkv", &w_up, cols, k).expect("weights");
                let bb = GpuBuffer::<f32>::from_slice(&gpu, "bias", &b_up);
                let tb = GpuBuffer::<f32>::from_slice(&gpu, "cos_sin", &rope_table(context, rope_dim, theta));
                let q = GpuBuffer::<f32>::zeros(&gpu, "q", n * qd);
                let cache = GpuBuffer::<u32>::zeros(&gpu, "kv", context * 2 * kvd);
                let kv = KvOut { cache: &cache, ld: 2 * kvd as u32, split: qd as u32, f16: kv_f16 };
                let out = MatmulOut {
                    ldy: qd as u32,
                    second: Some(SideOutput::Kv(kv)),
                    rope: Some(RopeOut {
                        cos_sin: &tb,
                        cols: (qd + kvd) as u32,
                        head_dim: head_dim as u32,
                        rope_dim: rope_dim as u32,
                        layout,
                    }),
                    ..Default::default()
                };
                run(&gpu, &step, &[gpu.matmul(&step, &xb, &wb, Some(&bb), &q, out)], n, start);
                let got_q = read_f32(&gpu, &q.raw, n * qd);
                let got_kv = cache_values(&gpu, &cache, context * 2 * kvd, kv_f16);
                // f16 values: the f32 result within half an f16 ulp (2^-11 relative), or one ulp
                // where a rounding direction is the implementation's (WGSL allows either)
                let (kv_abs, kv_rel) = if kv_f16 { (1e-5, 1.0 / 1024.0) } else { (1e-5, 1e-5) };
                let (mut want, _) = ref_matmul(&x, &w, Some(&bias), n, k, cols);
                let what = format!(
                    "qkv {layout:?} kv_f16={kv_f16} n={n} heads={heads}/{kv_heads} hd={head_dim} rd={rope_dim}"
                );
                for r in 0..n {
                    let row = &mut want[r * cols..(r + 1) * cols];
                    let pos = start + r;
                    let unscaled = (rope_dim, &[1.0; 64][..rope_dim / 2]);
                    reference::rope(&mut row[..qd], head_dim, unscaled, theta as f32, layout, pos);
                    reference::rope(&mut row[qd..qd + kvd], head_dim, unscaled, theta as f32, layout, pos);
                    assert_close(&what, &got_q[r * qd..(r + 1) * qd], &row[..qd], 1e-5, 1e-5);
                    let cached = &got_kv[pos * 2 * kvd..(pos + 1) * 2 * kvd];
                    assert_close(&what, cached, &row[qd..], kv_abs, kv_rel);
                }
                let untouched = got_kv[..start * 2 * kvd].iter().chain(&got_kv[(start + n) * 2 * kvd..]);
                assert!(untouched.into_iter().all(|v| *v == 0.0), "{what}: other cache rows untouched");
            }
        }
    }
}

#[test]
fn head_norm_normalises_each_head_rotates_and_routes_q_k_v() {
    // The raw q|k|v rows of a matmul whose q and k rows were paired (RopeLayout::pair_rows): each
    // q and k head RMS-normalised with its weights, rotated by the row's position, q into its
    // scratch and k | v into the cache row start_pos + r, back in checkpoint order. Against the
    // CPU: the head's norm, then RoPE, on the checkpoint's columns.
    let step_of = |gpu: &Gpu| gpu.step_buffer();
    for gpu in gpus() {
        let step = step_of(&gpu);
        let mut rng = rng(61);
        let (context, theta, eps) = (300, 10000.0, 1e-6);
        for &(n, heads, kv_heads, head_dim, rope_dim, start) in
            &[(1, 1, 1, 4, 4, 0), (3, 4, 2, 16, 16, 100), (4, 2, 1, 16, 8, 7), (2, 2, 1, 256, 256, 290)]
        {
            for (layout, kv_f16) in
                [(RopeLayout::Halves, false), (RopeLayout::Interleaved, false), (RopeLayout::Halves, true)]
            {
                let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
                let cols = qd + 2 * kvd;
                // checkpoint order, then the matmul's column order
                let raw = rand_vec(&mut rng, n * cols, 2.0);
                let order = qkv_upload_order(layout, (heads, kv_heads), head_dim, rope_dim);
                let paired: Vec<f32> = (0..n)
                    .flat_map(|r| order.iter().map(|&c| raw[r * cols + c]).collect::<Vec<_>>())
                    .collect();
                let norms = [rand_vec(&mut rng, head_dim, 0.5), rand_vec(&mut rng, head_dim, 0.5)];
                let qkv = GpuBuffer::<f32>::from_slice(&gpu, "qkv", &paired);
                let qn = GpuBuffer::<f32>::from_slice(&gpu, "q norm", &norms[0]);
                let kn = GpuBuffer::<f32>::from_slice(&gpu, "k norm", &norms[1]);
                let tb = GpuBuffer::<f32>::from_slice(&gpu, "cos_sin", &rope_table(context, rope_dim, theta));
                let q = GpuBuffer::<f32>::zeros(&gpu, "q", n * qd);
                let cache = GpuBuffer::<u32>::zeros(&gpu, "kv", context * 2 * kvd);
                let io = HeadNormIo { qkv: &qkv, norms: [&qn, &kn], cos_sin: &tb, q: &q, kv: &cache };
                let shape = AttentionShape {
                    heads: heads as u32,
                    kv_heads: kv_heads as u32,
                    head_dim: head_dim as u32,
                    ctx: context as u32,
                    kv_f16,
                    window: 0,
                };
                let op = gpu.head_norm(&step, io, shape, (rope_dim as u32, layout), eps);
                run(&gpu, &step, &[op], n, start);
                let got_q = read_f32(&gpu, &q.raw, n * qd);
                let got_kv = cache_values(&gpu, &cache, context * 2 * kvd, kv_f16);
                let (kv_abs, kv_rel) = if kv_f16 { (1e-5, 1.0 / 1024.0) } else { (1e-5, 1e-5) };
                let what = format!("head norm {layout:?} kv_f16={kv_f16} n={n} heads={heads}/{kv_heads} hd={head_dim} rd={rope_dim}");
                for r in 0..n {
                    let mut want = raw[r * cols..(r + 1) * cols].to_vec();
                    let per_head = |y: &[f32], w: &[f32]| -> Vec<f32> {
                        y.chunks(head_dim).flat_map(|h| reference::rmsnorm(h, w, eps)).collect()
                    };
                    let (mut wq, mut wk) =
                        (per_head(&want[..qd], &norms[0]), per_head(&want[qd..qd + kvd], &norms[1]));
                    let unscaled = (rope_dim, &[1.0; 128][..rope_dim / 2]);
                    reference::rope(&mut wq, head_dim, unscaled, theta as f32, layout, start + r);
                    reference::rope(&mut wk, head_dim, unscaled, theta as f32, layout, start + r);
                    want[..qd].copy_from_slice(&wq);
                    want[qd..qd + kvd].copy_from_slice(&wk);
                    assert_close(&what, &got_q[r * qd..(r + 1) * qd], &want[..qd], 1e-5, 1e-4);
                    let pos = start + r;
                    assert_close(
                        &what,
                        &got_kv[pos * 2 * kvd..(pos + 1) * 2 * kvd],
                        &want[qd..],
                        kv_abs,
                        kv_rel,
                    );
                }
                let untouched = got_kv[..start * 2 * kvd].iter().chain(&got_kv[(start + n) * 2 * kvd..]);
                assert!(untouched.into_iter().all(|v| *v == 0.0), "{what}: other cache rows untouched");
            }
        }
    }
}

#[test]
fn attention_matches_reference() {
    // Both shapes: the one-pass kernel (CPU adapters), which serves up to 4 query heads of a KV
    // group per workgroup, and the split one (GPUs), which cuts the keys into chunks of 64 (128
    // past 4096 cached positions, where each chunk takes two blocks of keys with a running
    // maximum) and serves up to 8 query heads of a KV group per workgroup.
    for gpu in gpus() {
        let step = gpu.step_buffer();
        let mut rng = rng(7);
        // GQA groups of 1, 2, 3, 4 and 18 query heads (the one-pass kernel's blocks of 4: one
        // partial, whole, and four whole and one of 2), passes that start past 64 and 128
        // positions, head dims that are no multiple of 64 (and 132 and 256: the split kernel's
        // third and fourth dimensions per invocation), a long cache
        for &(n, heads, kv_heads, hd, start, ctx) in &[
            (1, 1, 1, 4, 0, 160),
            (3, 4, 2, 8, 5, 160),
            (8, 3, 1, 64, 70, 160),
            (2, 2, 2, 16, 150, 160),
            (5, 6, 3, 12, 0, 160),
            (4, 18, 1, 20, 120, 160),
            (1, 18, 1, 132, 159, 160),
            (2, 2, 1, 256, 70, 160),
            (3, 8, 2, 8, 4490, 4600),
        ] {
            let q = rand_vec(&mut rng, n * heads * hd, 1.0);
            // keys large enough that the running maximum changes from block to block
            let k = rand_vec(&mut rng, ctx * kv_heads * hd, 2.0);
            let v = rand_vec(&mut rng, ctx * kv_heads * hd, 1.0);
            let qb = GpuBuffer::<f32>::from_slice(&gpu, "q", &q);
            // (a sliding window: 37 keys, across the split kernel's chunks of 64)
            for (kv_f16, window) in [(false, 0), (true, 0), (false, 37), (true, 37)] {
                // an f16 cache holds the values rounded to f16: the reference reads those
                let round = |v: &[f32]| -> Vec<f32> {
                    v.iter().map(|&x| if kv_f16 { half::f16::from_f32(x).to_f32() } else { x }).collect()
                };
                let (k, v) = (round(&k), round(&v));
                // the cache holds each position's k row, then its v row: f32 bits or f16 pairs
                let kv: Vec<f32> = k
                    .chunks(kv_heads * hd)
                    .zip(v.chunks(kv_heads * hd))
                    .flat_map(|(a, b)| [a, b].concat())
                    .collect();
                let bits = |x: f32| half::f16::from_f32(x).to_bits() as u32;
                let words: Vec<u32> = if kv_f16 {
                    kv.chunks(2).map(|p| bits(p[0]) | bits(p[1]) << 16).collect()
                } else {
                    kv.iter().map(|x| x.to_bits()).collect()
                };
                let kvb = GpuBuffer::<u32>::from_slice(&gpu, "kv", &words);
                let shape = AttentionShape {
                    heads: heads as u32,
                    kv_heads: kv_heads as u32,
                    head_dim: hd as u32,
                    ctx: ctx as u32,
                    kv_f16,
                    window,
                };
                let scratch = GpuBuffer::<f32>::zeros(&gpu, "scratch", gpu.attention_scratch_len(shape, n));
                let ob = GpuBuffer::<f32>::zeros(&gpu, "out", n * heads * hd);
                let no_pages = GpuBuffer::<u32>::zeros(&gpu, "no pages", 1);
                run(
                    &gpu,
                    &step,
                    &gpu.attention(&step, &qb, (&kvb, &no_pages), &scratch, &ob, shape),
                    n,
                    start,
                );
                let got = read_f32(&gpu, &ob.raw, n * heads * hd);
                let want: Vec<f32> = (0..n)
                    .flat_map(|r| {
                        reference::attention(
                            &q[r * heads * hd..(r + 1) * heads * hd],
                            &k,
                            &v,
                            (start + r, window as usize),
                            heads,
                            kv_heads,
                            hd,
                        )
                    })
                    .collect();
                let what = format!(
                    "attention ({}) kv_f16={kv_f16} window={window} n={n} h={heads}/{kv_heads} hd={hd} start={start}",
                    gpu.describe()
                );
                assert_close(&what, &got, &want, 1e-5, 1e-4);
                // each row alone (its q moved to row 0) gives the same bits as inside the pass
                let width = heads * hd;
                for r in 0..n {
                    let q1 = GpuBuffer::<f32>::from_slice(&gpu, "q row", &q[r * width..(r + 1) * width]);
                    let o1 = GpuBuffer::<f32>::zeros(&gpu, "out row", width);
                    run(
                        &gpu,
                        &step,
                        &gpu.attention(&step, &q1, (&kvb, &no_pages), &scratch, &o1, shape),
                        1,
                        start + r,
                    );
                    let alone = read_f32(&gpu, &o1.raw, width);
                    assert!(
                        alone.iter().zip(&got[r * width..]).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: row {r} alone differs from the pass"
                    );
                }
            }
        }
    }
}

/// The ids the GPU's argmax and top-k rank, in order: values neither NaN nor -inf, larger first,
/// equal ones (-0.0 and +0.0 too) by lower id.
fn ranked(row: &[f32]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..row.len() as u32).filter(|&i| !row[i as usize].is_nan()).collect();
    ids.retain(|&i| row[i as usize] != f32::NEG_INFINITY);
    // a stable sort keeps ids ascending among equal values (-0.0 == +0.0 under partial_cmp)
    ids.sort_by(|a, b| row[*b as usize].partial_cmp(&row[*a as usize]).unwrap_or(std::cmp::Ordering::Equal));
    ids
}

/// Rows that ties, signed zeros, NaN and -inf make hard, across the boundaries of the kernels'
/// slices of [`REDUCE_SLICE`] logits: random rows of `vocab`, each with one kind of trouble.
fn adversarial_rows(rng: &mut SmallRng, n: usize, vocab: usize) -> Vec<f32> {
    // values on a coarse grid, so that many tie
    let mut logits: Vec<f32> = rand_vec(rng, n * vocab, 8.0).iter().map(|v| v.round()).collect();
    let slice = REDUCE_SLICE;
    for (r, row) in logits.chunks_mut(vocab).enumerate() {
        let last = vocab - 1;
        let edge = slice.min(last);
        match r % 8 {
            // a tie at the maximum in two slices, the later slice's first
            0 => {
                row[last] = 50.0;
                row[edge] = 50.0;
                row[vocab / 2] = 50.0;
            }
            // -0.0 and +0.0 as the maximum: the lower id wins whichever sign it has
            1 => {
                row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                row[last] = 0.0;
                row[edge] = -0.0;
            }
            // NaN everywhere but a few
            2 => {
                row.iter_mut().enumerate().filter(|(i, _)| i % 97 != 5).for_each(|(_, v)| *v = f32::NAN);
            }
            // only NaN and -inf: nothing ranks
            3 => row
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = if i % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY }),
            // -inf but for fewer values than a top-k asks
            4 => row
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| i % 1500 != 3)
                .for_each(|(_, v)| *v = f32::NEG_INFINITY),
            // the lowest finite value beside -inf, and the maximum at the very end
            5 => {
                row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                row[0] = f32::MIN;
                row[last] = f32::MIN;
            }
            // NaN right after the maximum, at a slice's end
            6 => {
                row[edge.saturating_sub(1)] = 60.0;
                row[edge] = f32::NAN;
            }
            // a plain random row
            _ => {}
        }
    }
    logits
}

#[test]
fn argmax_picks_the_lowest_index_of_the_maximum() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(9);
    for &(n, vocab) in &[(1, 1), (3, 63), (8, 1000), (8, 1024), (8, 1025), (8, 49157), (8, 151_936)] {
        let logits = adversarial_rows(&mut rng, n, vocab);
        let lb = GpuBuffer::<f32>::from_slice(&gpu, "logits", &logits);
        let ob = GpuBuffer::<u32>::zeros(&gpu, "out", n);
        run(&gpu, &step, &gpu.argmax(&step, &lb, &ob, vocab), n, 0);
        let got = read_u32(&gpu, &ob.raw, n);
        // (nothing ranks: the last id)
        let want: Vec<u32> = logits
            .chunks(vocab)
            .map(|row| ranked(row).first().copied().unwrap_or(vocab as u32 - 1))
            .collect();
        assert_eq!(got, want, "argmax n={n} vocab={vocab}");
    }
}

#[test]
fn top_k_ranks_ids_as_the_argmax_breaks_ties() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(10);
    for &(n, vocab, k) in
        &[(1, 7, 7), (3, 63, 5), (8, 1000, 16), (8, 1025, 3), (8, 49157, 10), (8, 151_936, 16)]
    {
        let logits = adversarial_rows(&mut rng, n, vocab);
        let lb = GpuBuffer::<f32>::from_slice(&gpu, "logits", &logits);
        let ob = GpuBuffer::<u32>::zeros(&gpu, "out", n * k);
        let pb = GpuBuffer::<f32>::zeros(&gpu, "logp", n * k);
        let (ob2, with_logp) = (GpuBuffer::<u32>::zeros(&gpu, "out", n * k), Some(&pb));
        let mut ops = gpu.top_k(&step, &lb, (&ob, None), vocab, k);
        ops.extend(gpu.top_k(&step, &lb, (&ob2, with_logp), vocab, k));
        run(&gpu, &step, &ops, n, 0);
        let (got, got2) = (read_u32(&gpu, &ob.raw, n * k), read_u32(&gpu, &ob2.raw, n * k));
        let logp = read_f32(&gpu, &pb.raw, n * k);
        assert_eq!(got, got2, "the same ids with log-probabilities");
        for (r, row) in logits.chunks(vocab).enumerate() {
            let mut ids = ranked(row);
            // fewer than k: the last repeats (none: the last id)
            let fill = ids.last().copied().unwrap_or(vocab as u32 - 1);
            ids.resize(ids.len().max(k), fill);
            let what = format!("top-{k} of row {r} of {vocab}");
            assert_eq!(&got[r * k..(r + 1) * k], &ids[..k], "{what}");
            if row.iter().any(|v| v.is_nan()) || !row.iter().any(|v| v.is_finite()) {
                continue; // (log-probabilities of NaN or of nothing: not defined)
            }
            // log-softmax in f64
            let m = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            let want: Vec<f32> = ids[..k].iter().map(|&i| (row[i as usize] as f64 - lse) as f32).collect();
            if want.iter().all(|w| w.is_finite()) {
                assert_close(&format!("log-probs of {what}"), &logp[r * k..(r + 1) * k], &want, 1e-5, 1e-5);
            }
        }
    }
}

#[test]
fn gather_rows_take_rows_whole_or_normalised_into_columns_of_another_buffer() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(11);
    for (n, dim, rows) in [(1, 8, vec![0u32]), (5, 64, vec![3, 0, 4]), (9, 200, vec![8, 8, 1, 2, 7, 5])] {
        let src = rand_vec(&mut rng, n * dim, 2.0);
        let gamma = rand_vec(&mut rng, dim, 1.0);
        let sb = GpuBuffer::<f32>::from_slice(&gpu, "src", &src);
        let gb = GpuBuffer::<f32>::from_slice(&gpu, "gamma", &gamma);
        let ib = GpuBuffer::<u32>::from_slice(&gpu, "rows", &rows);
        let m = rows.len();
        // rows normalised into columns [dim, 2 dim) of a [m, 3 dim] buffer; the rest untouched
        let ld = 3 * dim;
        let ob = GpuBuffer::<f32>::from_slice(&gpu, "out", &vec![7.0; m * ld]);
        let norm = Some((&gb, 1e-5));
        run(&gpu, &step, &[gpu.gather_rows(&step, &sb, Some(&ib), norm, (&ob, ld, dim), dim)], m, 0);
        let got = read_f32(&gpu, &ob.raw, m * ld);
        for (i, &r) in rows.iter().enumerate() {
            let r = r as usize;
            let want = reference::rmsnorm(&src[r * dim..(r + 1) * dim], &gamma, 1e-5);
            let what = format!("row {r} of {n}x{dim} normalised into row {i}");
            let row = &got[i * ld..(i + 1) * ld];
            assert_close(&what, &row[dim..2 * dim], &want, ELEMENTWISE_ABS, ELEMENTWISE_REL);
            assert!(row[..dim].iter().chain(&row[2 * dim..]).all(|&v| v == 7.0), "{what}: other columns");
        }
        // the pass's own rows, whole, at column 0 of rows of stride dim + 1
        let ob = GpuBuffer::<f32>::zeros(&gpu, "out", n * (dim + 1));
        run(&gpu, &step, &[gpu.gather_rows(&step, &sb, None, None, (&ob, dim + 1, 0), dim)], n, 0);
        let got = read_f32(&gpu, &ob.raw, n * (dim + 1));
        for r in 0..n {
            assert_eq!(
                &got[r * (dim + 1)..r * (dim + 1) + dim],
                &src[r * dim..(r + 1) * dim],
                "row {r} copied"
            );
        }
    }
}

#[test]
fn map_ids_rename_ranked_ids_through_a_table() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let table: Vec<u32> = (0..50u32).map(|d| d * 3 + 1).collect();
    let ids: Vec<u32> = vec![0, 49, 7, 3, 3, 60, 1, 2, 9, 9, 9, 9];
    let tb = GpuBuffer::<u32>::from_slice(&gpu, "table", &table);
    let ib = GpuBuffer::<u32>::from_slice(&gpu, "ids", &ids);
    // 2 rows of 4 ids: the third row is outside the pass and stays as it was
    run(&gpu, &step, &[gpu.map_ids(&step, &tb, &ib, 4)], 2, 0);
    let got = read_u32(&gpu, &ib.raw, ids.len());
    let want: Vec<u32> =
        ids.iter().enumerate().map(|(i, &d)| if i < 8 { table[(d as usize).min(49)] } else { d }).collect();
    assert_eq!(got, want);
}

#[test]
fn concat_puts_two_inputs_side_by_side() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(13);
    for &(n, a, b) in &[(1, 3, 5), (4, 64, 64), (7, 100, 37)] {
        let (left, right) = (rand_vec(&mut rng, n * a, 1.0), rand_vec(&mut rng, n * b, 1.0));
        let lb = GpuBuffer::<f32>::from_slice(&gpu, "left", &left);
        let rb = GpuBuffer::<f32>::from_slice(&gpu, "right", &right);
        let ob = GpuBuffer::<f32>::from_slice(&gpu, "out", &vec![7.0; (n + 1) * (a + b)]);
        run(&gpu, &step, &[gpu.concat(&step, (&lb, a), (&rb, b), &ob)], n, 0);
        let got = read_f32(&gpu, &ob.raw, (n + 1) * (a + b));
        let mut want: Vec<f32> = (0..n)
            .flat_map(|r| left[r * a..(r + 1) * a].iter().chain(&right[r * b..(r + 1) * b]).copied())
            .collect();
        want.extend(vec![7.0; a + b]); // rows past n untouched
        assert_eq!(got, want, "concat n={n} {a}+{b}");
    }
}

#[test]
fn matmul_with_silu_epilogue_adds_a_residual_block() {
    // y += silu(x w^T + b): a Medusa head's residual block, over y holding x itself
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(12);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for &(n, k) in &[(1, 64), (3, 96)] {
            let x = rand_vec(&mut rng, n * k, 1.0);
            let (bytes, w) = random_weights(&mut rng, dtype, k, k);
            let bias = rand_vec(&mut rng, k, 0.5);
            let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
            let yb = GpuBuffer::<f32>::from_slice(&gpu, "y", &x);
            let bb = GpuBuffer::<f32>::from_slice(&gpu, "b", &bias);
            let out = MatmulOut { ldy: k as u32, accumulate: true, silu: true, ..Default::default() };
            let op = gpu.matmul(&step, &xb, &upload(&gpu, dtype, &bytes, k, k), Some(&bb), &yb, out);
            run(&gpu, &step, &[op], n, 0);
            let got = read_f32(&gpu, &yb.raw, n * k);
            let (lin, bound) = ref_matmul(&x, &w, Some(&bias), n, k, k);
            for i in 0..n * k {
                let v = lin[i] as f64;
                let want = x[i] as f64 + v / (1.0 + (-v).exp());
                let tol = bound[i] as f64 * 1.1 + 1e-5 * want.abs() + 1e-6;
                assert!(
                    (got[i] as f64 - want).abs() <= tol,
                    "silu block {dtype} n={n} [{i}]: {} vs {want}",
                    got[i]
                );
            }
        }
    }
}

#[test]
fn gpu_draws_follow_the_sampling_distribution() {
    use wgspec::gpu::{SampleConfig, SampleSeed};
    use wgspec::sampling::{distribution, Rng, SamplingParams};
    use wgspec::speculative::Dist;
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(31);
    // 150 tokens: six likely ones spread over the invocations' strides, the others unlikely
    let v = 150;
    let rows = 32;
    let likely = [70usize, 131, 5, 64, 127, 149];
    let mut p_row = rand_vec(&mut rng, v, 1.0);
    for (i, &t) in likely.iter().enumerate() {
        p_row[t] = 4.0 + 0.4 * i as f32 + rand::Rng::gen_range(&mut rng, 0.0..0.3);
    }
    // a row whose nucleus ends inside a group of tied logits (ids 3, 40, 64, 99, 140 at 4.0):
    // the lowest ids of the group are kept
    let mut tie_row: Vec<f32> = rand_vec(&mut rng, v, 1.0).iter().map(|l| l - 3.0).collect();
    tie_row[70] = 5.0;
    for t in [140, 3, 99, 64, 40] {
        tie_row[t] = 4.0;
    }
    let p_all: Vec<f32> = (0..rows).flat_map(|_| p_row.clone()).collect();
    let tie_all: Vec<f32> = (0..rows).flat_map(|_| tie_row.clone()).collect();
    let p_buf = GpuBuffer::<f32>::from_slice(&gpu, "p", &p_all);
    let tie_buf = GpuBuffer::<f32>::from_slice(&gpu, "tied p", &tie_all);
    let out = GpuBuffer::<u32>::zeros(&gpu, "out", rows);
    let status = GpuBuffer::<u32>::zeros(&gpu, "status", 1);
    let seed = gpu.uniform("seed", bytemuck::bytes_of(&SampleSeed::new(0)));
    let dense = |d: &Dist| (0..v as u32).map(|t| d.prob(t)).collect::<Vec<f64>>();
    let mut seeds = Rng::new(5);
    for (temperature, top_k, top_p, tied, min_p) in [
        (0.7f32, 0usize, 1.0f32, false, 0.0f32),
        (1.3, 5, 1.0, false, 0.0),
        (1.1, 0, 0.8, false, 0.0),
        (1.2, 5, 0.6, false, 0.0),
        (1.0, 0, 0.55, true, 0.0),
        (1.0, 6, 0.55, true, 0.0),
        (0.9, 40, 1.0, false, 0.0), // (a top-k above the 16 that top_k.wgsl ranks)
        (1.0, 40, 0.8, false, 0.0),
        (1.0, 3, 1.0, true, 0.0), // a top-k that ends inside the tied group
        // (the least temperature that samples: its 1 / T is finite on any GPU, its draws the argmax)
        (wgspec::sampling::MIN_TEMPERATURE, 0, 1.0, false, 0.0),
        (1.0, 0, 1.0, false, 0.1), // a min-p: the six likely tokens of p_row, or some
        (1.1, 0, 0.9, false, 0.05),
        (1.0, 2, 1.0, false, 0.3),
    ] {
        let params = SamplingParams { temperature, top_k, top_p, min_p, seed: 0 };
        let what = format!("T={temperature} top-k={top_k} top-p={top_p} min-p={min_p} tied={tied}");
        let (p_row, p_buf) = if tied { (&tie_row, &tie_buf) } else { (&p_row, &p_buf) };
        let p = Dist::from_logits(p_row, &params);
        assert_eq!(Dist::from_pairs(distribution(p_row, &params)), p);
        if tied {
            let kept: Vec<u32> = p.pairs().iter().map(|&(t, _)| t).collect();
            assert_eq!(kept, [3, 40, 70], "{what}: the cut ends inside the tied group");
        }
        let cfg = SampleConfig {
            vocab: v,
            temperature,
            top_k,
            top_p,
            min_p_offset: params.min_p_offset(),
            last_only: None,
            stream: 3,
        };
        let ops = gpu.sample(&step, &seed, p_buf, (&out, &status), cfg);
        let mut draws = vec![0usize; v];
        for s in 0..150 {
            gpu.queue.write_buffer(&seed, 0, bytemuck::bytes_of(&SampleSeed::new(seeds.next_u64())));
            run(&gpu, &step, &ops, rows, s * rows);
            for d in read_u32(&gpu, &out.raw, rows) {
                draws[d as usize] += 1;
            }
        }
        assert!(
            draws.iter().enumerate().all(|(t, &c)| c == 0 || p.prob(t as u32) > 0.0),
            "{what}: a draw outside p"
        );
        match p.pairs() {
            [(only, _)] => assert_eq!(draws[*only as usize], 150 * rows, "{what}: every draw the argmax"),
            _ => assert_fits(&format!("{what}: draws from p"), &draws, &dense(&p)),
        }
    }
    assert_eq!(read_u32(&gpu, &status.raw, 1), [0], "finite logits");
    // a NaN logit flags the status
    let mut bad = p_all.clone();
    bad[3 * v + 17] = f32::NAN;
    let bad = GpuBuffer::<f32>::from_slice(&gpu, "bad", &bad);
    let cfg = SampleConfig {
        vocab: v,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p_offset: None,
        last_only: None,
        stream: 3,
    };
    let ops = gpu.sample(&step, &seed, &bad, (&out, &status), cfg);
    run(&gpu, &step, &ops, rows, 0);
    assert_eq!(read_u32(&gpu, &status.raw, 1), [4], "a NaN logit in row 3");
}

#[test]
fn gpu_acceptance_keeps_each_draft_its_row_drew() {
    // A draft is kept while its row's draw from p is the draft, and the first other draw is the
    // next token (every row's draw when all are kept); the status word is copied after the drafts.
    let gpu = gpu();
    let step = gpu.step_buffer();
    let status = GpuBuffer::<u32>::from_slice(&gpu, "status", &[3]);
    let drafts = GpuBuffer::<u32>::from_slice(&gpu, "drafts", &[7, 8, 9, 0]);
    let out = GpuBuffer::<u32>::zeros(&gpu, "out", 2 + 4 + 1);
    // rows' draws; (accepted, next) for K = 3
    for (draws, want) in [
        ([7u32, 8, 9, 42], (3, 42)),
        ([7, 5, 9, 42], (1, 5)),
        ([6, 8, 9, 42], (0, 6)),
        ([7, 8, 1, 2], (2, 1)),
    ] {
        let samples = GpuBuffer::<u32>::from_slice(&gpu, "samples", &draws);
        let op = gpu.accept_sampled(&step, &drafts, &samples, &status, &out);
        run(&gpu, &step, std::slice::from_ref(&op), 4, 10);
        let got = read_u32(&gpu, &out.raw, 7);
        assert_eq!(
            (got[0], got[1], &got[2..5], got[6]),
            (want.0, want.1, &[7u32, 8, 9][..], 3),
            "draws {draws:?}"
        );
    }
}

/// A kernel that a shader replaced, kept in `tests/data/` and run beside its successor on the
/// same buffers.
struct Replaced(wgpu::ComputePipeline);

impl Replaced {
    fn new(gpu: &Gpu, label: &str, source: String) -> Replaced {
        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        Replaced(gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        }))
    }

    /// `buffers` bound at bindings 0, 1, ...
    fn bind(&self, gpu: &Gpu, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<_> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.0.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// `groups` workgroups over `bind`, submitted.
    fn dispatch(&self, gpu: &Gpu, bind: &wgpu::BindGroup, groups: u32) {
        let mut enc = gpu.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&self.0);
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        }
        gpu.submit(enc);
    }
}

/// The one-workgroup sampling kernel that `shaders/sample.wgsl` replaced (a row searched by 256
/// invocations, a nucleus by about 35 passes over it, a top-k cut read from ranked ids), on the
/// new kernel's uniforms.
fn one_workgroup_sample(gpu: &Gpu) -> Replaced {
    let new = wgspec::gpu::Kernel::Sample.source(false);
    let prelude = new.strip_suffix(include_str!("../shaders/sample.wgsl")).expect("the prelude");
    let source = format!("{prelude}\n{}", include_str!("data/sample_one_workgroup.wgsl"));
    Replaced::new(gpu, "sample, one workgroup", source)
}

#[test]
fn gpu_draws_are_the_one_workgroup_kernels_over_many_slices() {
    // Rows of several slices of 1,024 logits (and of less than one), random and adversarial (few
    // distinct values: ties across slices, -0.0 beside +0.0, nuclei and top-k cuts that end
    // inside a group of tied logits), every sampling configuration, against the kernel that
    // searched each row in one workgroup (its top-k cut from the rows ranked here): the same draw
    // in every row. And a row's draw does not depend on the rows of its pass.
    use rand::Rng;
    use wgspec::gpu::{SampleConfig, SampleSeed};
    let gpu = gpu();
    let old = one_workgroup_sample(&gpu);
    let step = gpu.step_buffer();
    let mut r = rng(77);
    let (rows, n) = (8, 5); // the buffers' rows, the pass's
    let mut checked = 0;
    // (70,000 logits: 69 slices, more than a workgroup's 64 invocations, so that the loops over a
    // row's slices take several each, and the tied tokens' slice is found in runs of two)
    for (case, &v) in [150usize, 1024, 1500, 3000, 4100, 70_000].iter().enumerate() {
        let wide = v > 64 * 1024;
        // (values drawn from a few: ties in every slice; mostly zeros of either sign: nuclei that
        // end among them)
        let tied = |r: &mut SmallRng, values: &[f32]| -> Vec<f32> {
            (0..rows * v).map(|_| values[r.gen_range(0..values.len())]).collect()
        };
        let few = [2.5f32, 2.5, 1.0, 0.0, -0.0, -0.0, -1.5];
        let zeros = [0.0f32, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 3.0, -1.0];
        for rows_of in ["random", "few values", "zeros"] {
            if wide && rows_of != "zeros" {
                continue; // (lean: the old kernel walks a row of 70,000 about 37 times a nucleus)
            }
            let p_row = match rows_of {
                "random" => rand_vec(&mut r, rows * v, 3.0),
                "few values" => tied(&mut r, &few),
                _ => tied(&mut r, &zeros),
            };
            let p_buf = GpuBuffer::<f32>::from_slice(&gpu, "p", &p_row);
            let status = GpuBuffer::<u32>::zeros(&gpu, "status", 1);
            let seed = gpu.uniform("seed", bytemuck::bytes_of(&SampleSeed::new(0)));
            for (temperature, top_k, top_p, last_only) in [
                (1.0f32, 0usize, 1.0f32, None),
                (0.7, 0, 1.0, None),
                (1.3, 40, 1.0, None),
                (1.0, 0, 0.83, None),
                (1.0, 0, 0.95, None), // (tied rows: inside the zeros, -0.0 and +0.0)
                (0.9, 0, 0.61, None),
                (1.2, 25, 0.7, None),
                (0.8, 0, 0.9, Some(2)),
                (1.1, 700, 0.9, None), // (above some vocabularies: every token kept)
                (1.0, 1, 1.0, None),
                (0.9, 3, 1.0, Some(1)),
            ] {
                let what = format!(
                    "vocab {v} {rows_of} rows T={temperature} top-k={top_k} top-p={top_p} \
                     last_only={last_only:?}"
                );
                let cfg = SampleConfig {
                    vocab: v,
                    temperature,
                    top_k,
                    top_p,
                    min_p_offset: None,
                    last_only,
                    stream: 5,
                };
                let (new_out, old_out) =
                    (GpuBuffer::<u32>::zeros(&gpu, "new", rows), GpuBuffer::<u32>::zeros(&gpu, "old", rows));
                let ops = gpu.sample(&step, &seed, &p_buf, (&new_out, &status), cfg);
                // the old kernel's ranked ids (a top-k below the vocabulary's size; else none)
                let old_k = if top_k < v { top_k } else { 0 };
                let ranks: Vec<u32> = p_row.chunks(v).flat_map(|row| ranked(row)[..old_k].to_vec()).collect();
                let p_top = GpuBuffer::<u32>::from_slice(&gpu, "p top", &[&ranks[..], &[0]].concat());
                // the old kernel's parameters: the new ones' words, its stage and slices unread
                let words: [u32; 12] = [
                    v as u32,
                    old_k as u32,
                    temperature.to_bits(),
                    top_p.to_bits(),
                    last_only.is_some() as u32,
                    last_only.unwrap_or(0) as u32,
                    5,
                    0,
                    0,
                    0,
                    0,
                    0,
                ];
                let params = gpu.uniform("old sample params", bytemuck::cast_slice(&words));
                let buffers = [&step, &params, &seed, &p_buf.raw, &p_top.raw, &old_out.raw, &status.raw];
                let bind = old.bind(&gpu, &buffers);
                for s in 0..if wide { 1 } else { 3u64 } {
                    gpu.queue.write_buffer(
                        &seed,
                        0,
                        bytemuck::bytes_of(&SampleSeed::new(s * 7919 + case as u64)),
                    );
                    run(&gpu, &step, &ops, n, 100);
                    old.dispatch(&gpu, &bind, if last_only.is_some() { 1 } else { n as u32 });
                    let (got, want) =
                        (read_u32(&gpu, &new_out.raw, rows), read_u32(&gpu, &old_out.raw, rows));
                    let out_rows = last_only.map_or(0..n, |o| o..o + 1);
                    for row in out_rows {
                        assert_eq!(got[row], want[row], "{what} seed {s} row {row}: the draws");
                        checked += 1;
                    }
                    // a row's draw whatever the rows of its pass: its first two rows alone
                    if last_only.is_none() {
                        run(&gpu, &step, &ops, 2, 100);
                        let two = read_u32(&gpu, &new_out.raw, 2);
                        assert_eq!(two[..], got[..2], "{what} seed {s}: rows 0-1 in a pass of 2 rows");
                    }
                }
            }
            assert_eq!(read_u32(&gpu, &status.raw, 1), [0], "finite logits");
        }
    }
    eprintln!("{checked} rows' draws equal the one-workgroup kernel's");
}

#[test]
fn a_min_p_draws_as_its_row_with_the_dropped_logits_at_the_lowest() {
    // A min-p keeps the logits at least the row's largest plus T ln(min_p) (src/sampling.rs's
    // floor). Its draws are those of the row with every other logit at the lowest f32, drawn
    // without a min-p (such a logit weighs exp(-huge) = 0): in every row, random and tied (floors
    // exactly at a tied value), alone and under a top-k or a top-p, over one slice and many; the
    // CPU distribution alike. And a row's draw does not depend on the rows of its pass.
    use rand::Rng;
    use wgspec::gpu::{SampleConfig, SampleSeed};
    use wgspec::sampling::{distribution, min_p_floor, SamplingParams};
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut r = rng(91);
    let (rows, n) = (6, 5);
    let mut checked = 0;
    let mut narrower = 0; // rows whose min-p keeps fewer than their top-k (no top-p)
    for &v in &[150usize, 4100, 70_000] {
        // (the floor of T = 1 and min_p = 0.2 under the largest, 2.5, lies on a tied value)
        let on = SamplingParams { temperature: 1.0, min_p: 0.2, ..SamplingParams::greedy() };
        let tie = min_p_floor(2.5, on.min_p_offset().expect("a min-p"));
        let few = [2.5f32, 2.5, tie, tie, 0.0, -0.0, -1.5];
        for rows_of in ["random", "few values"] {
            let p_rows: Vec<f32> = match rows_of {
                "random" => rand_vec(&mut r, rows * v, 3.0),
                _ => (0..rows * v).map(|_| few[r.gen_range(0..few.len())]).collect(),
            };
            let status = GpuBuffer::<u32>::zeros(&gpu, "status", 1);
            let seed = gpu.uniform("seed", bytemuck::bytes_of(&SampleSeed::new(0)));
            let p_buf = GpuBuffer::<f32>::from_slice(&gpu, "p", &p_rows);
            for (temperature, top_k, top_p, min_p) in [
                (1.0f32, 0usize, 1.0f32, 0.2f32),
                (0.7, 0, 1.0, 0.05),
                (1.3, 0, 1.0, 0.9),
                (1.0, 0, 1.0, 1.0), // (only the largest logit's tokens)
                (1.0, 40, 1.0, 0.02),
                (1.0, 3, 1.0, 0.2),          // (a top-k narrower than the min-p)
                (1.0, 100, 1.0, 0.5),        // (a min-p narrower than the top-k: 150 random logits)
                (1.0, 100, 0.9, 0.9),        // (and 4,100; with a top-p)
                (1.0, usize::MAX, 1.0, 0.2), // (the top-k's cut inside the tied group on the floor)
                (1.0, 0, 0.8, 0.1),
                (1.2, 25, 0.7, 0.01),
                (0.9, 0, 0.95, 1e-30), // (a floor below every logit: every token kept)
            ] {
                // (of the few values' rows, 2/7 at the largest, 2/7 at `tie`: 3/7 of the row ranked
                // within the tie)
                let top_k = if top_k == usize::MAX { 3 * v / 7 } else { top_k };
                let params = SamplingParams { temperature, top_k, top_p, min_p, seed: 0 };
                let what = format!(
                    "vocab {v} {rows_of} rows T={temperature} top-k={top_k} top-p={top_p} min-p={min_p}"
                );
                let offset = params.min_p_offset();
                // the rows with the dropped logits at the lowest f32
                let dropped: Vec<f32> = p_rows
                    .chunks(v)
                    .flat_map(|row| {
                        let max = row.iter().copied().fold(f32::MIN, f32::max);
                        let least = min_p_floor(max, offset.unwrap_or(f32::MIN));
                        row.iter().map(move |&l| if l >= least { l } else { f32::MIN }).collect::<Vec<_>>()
                    })
                    .collect();
                let plain = SamplingParams { min_p: 0.0, ..params };
                for (row, low) in p_rows.chunks(v).zip(dropped.chunks(v)) {
                    let mut want = distribution(low, &plain);
                    want.retain(|&(_, p)| p > 0.0);
                    let got = distribution(row, &params);
                    narrower += (top_k > 0 && top_p == 1.0 && got.len() < top_k.min(v)) as usize;
                    assert_eq!(got, want, "{what}: the CPU's distribution");
                }
                let d_buf = GpuBuffer::<f32>::from_slice(&gpu, "dropped", &dropped);
                let cfg = SampleConfig {
                    vocab: v,
                    temperature,
                    top_k,
                    top_p,
                    min_p_offset: offset,
                    last_only: None,
                    stream: 5,
                };
                let (got_out, want_out) =
                    (GpuBuffer::<u32>::zeros(&gpu, "got", rows), GpuBuffer::<u32>::zeros(&gpu, "want", rows));
                let ops = gpu.sample(&step, &seed, &p_buf, (&got_out, &status), cfg);
                let oracle = SampleConfig { min_p_offset: None, ..cfg };
                let oracle = gpu.sample(&step, &seed, &d_buf, (&want_out, &status), oracle);
                for s in 0..3u64 {
                    gpu.queue.write_buffer(
                        &seed,
                        0,
                        bytemuck::bytes_of(&SampleSeed::new(s * 104_729 + v as u64)),
                    );
                    run(&gpu, &step, &ops, n, 40);
                    run(&gpu, &step, &oracle, n, 40);
                    let got = read_u32(&gpu, &got_out.raw, n);
                    assert_eq!(got, read_u32(&gpu, &want_out.raw, n), "{what} seed {s}: the draws");
                    checked += n;
                    run(&gpu, &step, &ops, 2, 40);
                    assert_eq!(
                        read_u32(&gpu, &got_out.raw, 2)[..],
                        got[..2],
                        "{what} seed {s}: rows 0-1 alone"
                    );
                }
            }
            assert_eq!(read_u32(&gpu, &status.raw, 1), [0], "finite logits");
        }
    }
    eprintln!("{checked} rows' min-p draws equal their dropped rows' draws; {narrower} rows' min-p narrower than their top-k");
    assert!(narrower >= 12, "the min-p narrower than a top-k in {narrower} rows");
}

#[test]
fn sampling_spreads_each_row_over_its_slices() {
    // The shape facts of the sampling ops over Qwen2.5's 151,936 logits in a 5-row pass (nothing
    // run): every stage but the last a workgroup per slice of each row, the last one per row
    // reading the slices' 8 bytes; 3 dispatches, 10 with a top-p, 11 with a top-k (of any size),
    // 18 with both, one more with a min-p; no invocation walks a row (the one-workgroup kernel walked it 3 to about 110 times
    // with a stride of 256: 1,800 to 65,000 iterations; top_k.wgsl, which ranked a top-k for it,
    // walks a slice k times).
    use wgspec::gpu::{SampleConfig, SampleSeed};
    let gpu = gpu();
    let (v, rows) = (151_936usize, 5usize);
    let slices = v.div_ceil(wgspec::gpu::REDUCE_SLICE) as u64;
    let logits = GpuBuffer::<f32>::zeros(&gpu, "logits", rows * v);
    let words = GpuBuffer::<u32>::zeros(&gpu, "words", rows);
    let seed = gpu.uniform("seed", bytemuck::bytes_of(&SampleSeed::new(0)));
    let step = gpu.step_buffer();
    for (top_k, top_p, min_p) in [
        (0usize, 1.0f32, None),
        (16, 1.0, None),
        (0, 0.9, None),
        (40, 0.95, None),
        (100_000, 1.0, None),
        (v, 1.0, None),
        (0, 1.0, Some(-3.0f32)),
        (40, 0.95, Some(-3.0)),
    ] {
        let cfg = SampleConfig {
            vocab: v,
            temperature: 1.0,
            top_k,
            top_p,
            min_p_offset: min_p,
            last_only: None,
            stream: 0,
        };
        let ops = gpu.sample(&step, &seed, &logits, (&words, &words), cfg);
        let (cut, nucleus, floor) = (top_k > 0 && top_k < v, top_p < 1.0, min_p.is_some() as usize);
        assert_eq!(
            ops.len(),
            3 + 8 * cut as usize + 7 * nucleus as usize + floor,
            "top-k {top_k} top-p {top_p} min-p {min_p:?}"
        );
        // (the stats' stage: the first after the min-p's maxima and the top-k's levels)
        let stats = floor + 8 * cut as usize;
        for (i, op) in ops.iter().enumerate() {
            let s = gpu.shape(op, rows, 0).expect("dispatched");
            eprintln!("top-k {top_k} top-p {top_p}: stage {i}: {s:?}");
            assert_eq!(s.invocations, 64, "{s:?}");
            let (want, most) = match ops.len() - i {
                1 => (rows as u64, 16),           // the finish: the slices' draws
                2 => (slices * rows as u64, 512), // the draws: the cuts (and ties) per workgroup
                _ if i == stats && (cut || floor == 1) => (slices * rows as u64, 512), // the cut
                _ => (slices * rows as u64, 128),
            };
            assert_eq!(s.workgroups, want, "stage {i}: {s:?}");
            assert!(s.serial_iterations <= most, "stage {i}: {s:?}");
            if ops.len() - i == 1 {
                assert!(s.bytes <= rows as u64 * (8 * slices + 4), "{s:?}");
            }
        }
    }
}

/// The one-invocation EAGLE tree kernel that `shaders/eagle_tree.wgsl` replaced, run on the same
/// buffers: its bindings are the new kernel's.
fn one_invocation_tree(gpu: &Gpu) -> Replaced {
    Replaced::new(
        gpu,
        "eagle tree, one invocation",
        include_str!("data/eagle_tree_one_invocation.wgsl").into(),
    )
}

#[test]
fn eagle_tree_counts_the_orders_the_one_invocation_kernel_searched() {
    // Random trees, grown call by call (start, expansions, finish) by both kernels from the same
    // ranks: random ids over a small vocabulary (children that repeat a token), log-probabilities
    // that often tie (ties broken by depth, then age), widths, depths, node budgets and rooms,
    // with and without the cost model. Every output word and every node of the state: the same
    // bits.
    use rand::Rng;
    use wgspec::gpu::{EagleTreeParams, EAGLE_TREE_OUT, EAGLE_TREE_RESULT, EAGLE_TREE_STATE, MAX_TREE};
    let gpu = gpu();
    let old = one_invocation_tree(&gpu);
    let mut r = rng(95);
    let step = gpu.step_buffer();
    let nodes = 16 + 5 * 256; // the state's counters and candidate arrays (the rest is scratch)
    let mut grown = 0;
    for case in 0..48 {
        let k = [2usize, 4, 8][case % 3];
        let tied = case % 2 == 0;
        let width = r.gen_range(1..=k.min(8));
        let depth = r.gen_range(1..=8usize);
        let mut verify = [0f32; MAX_TREE];
        let mut t = r.gen_range(0.5f32..1.0);
        for v in verify.iter_mut() {
            t += r.gen_range(0.0f32..0.2);
            *v = t;
        }
        let base = EagleTreeParams {
            mode: 0,
            root: r.gen_range(0..40),
            start_pos: r.gen_range(0..100),
            k: k as u32,
            width: width as u32,
            depth: 0,
            slot0: 0,
            max_nodes: r.gen_range(1..=31),
            room: r.gen_range(1..=32),
            use_costs: (case % 4 >= 2) as u32,
            calibration: r.gen_range(0.3f32..2.0),
            draft_pass: r.gen_range(0.05f32..0.5),
            verify,
        };
        let zeros = |len: usize| GpuBuffer::<u32>::zeros(&gpu, "zeros", len);
        let (state_new, out_new) = (zeros(EAGLE_TREE_STATE), zeros(EAGLE_TREE_OUT));
        let (state_old, out_old) = (zeros(EAGLE_TREE_STATE), zeros(EAGLE_TREE_OUT));
        for call in 0..depth {
            let ids: Vec<u32> = (0..8 * k).map(|_| r.gen_range(0..12)).collect();
            let logp: Vec<f32> = (0..8 * k)
                .map(|_| if tied { -0.5 * r.gen_range(1..5) as f32 } else { -r.gen_range(0.01f32..4.0) })
                .collect();
            let (idb, lpb) = (
                GpuBuffer::<u32>::from_slice(&gpu, "ids", &ids),
                GpuBuffer::<f32>::from_slice(&gpu, "logp", &logp),
            );
            let p = EagleTreeParams {
                mode: (call > 0) as u32 + if call + 1 == depth { 4 } else { 0 },
                depth: if call + 1 < depth { call as u32 + 1 } else { 0 },
                slot0: (1 + call.saturating_sub(1) * width) as u32,
                ..base
            };
            let params = gpu.uniform("eagle tree params", bytemuck::bytes_of(&p));
            let op = gpu.eagle_tree(&step, &params, (&idb, &lpb), &state_new, &out_new);
            run(&gpu, &step, &[op], 1, 0);
            let bind = old.bind(&gpu, &[&step, &params, &idb.raw, &lpb.raw, &state_old.raw, &out_old.raw]);
            old.dispatch(&gpu, &bind, 1);
            let what = format!("case {case} call {call} ({p:?})");
            let (o_new, o_old) =
                (read_u32(&gpu, &out_new.raw, EAGLE_TREE_OUT), read_u32(&gpu, &out_old.raw, EAGLE_TREE_OUT));
            assert_eq!(o_new, o_old, "{what}: output");
            let (s_new, s_old) =
                (read_u32(&gpu, &state_new.raw, nodes), read_u32(&gpu, &state_old.raw, nodes));
            assert_eq!(s_new, s_old, "{what}: state");
            if call + 1 == depth && o_new[EAGLE_TREE_RESULT as usize] > 1 {
                grown += 1;
            }
        }
    }
    assert!(grown >= 24, "only {grown} trees of more than one node");
}
