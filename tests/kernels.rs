//! Every kernel against a plain CPU reference on fresh random data, several shapes including sizes
//! that are not multiples of the workgroup size, with named tolerances.

mod common;
mod reference;

use common::{assert_close, gpu, rand_vec, read_f32, read_u32, rng};
use half::f16;
use wgspec::gpu::{
    transpose_for_matmul as tr, AttentionShape, Gpu, GpuBuffer, MatmulOut, Op, PackedF16, RopeLayout,
    WeightsRef,
};

/// f32 dot products of length k: error bound relative to the magnitude of the terms.
const MATMUL_REL: f32 = 2e-6;
/// Normalisation, rotation, attention: a few ulps of f32 after exp/sqrt.
const ELEMENTWISE_ABS: f32 = 2e-6;
const ELEMENTWISE_REL: f32 = 2e-5;

fn run(gpu: &Gpu, step: &wgpu::Buffer, ops: &[Op], n: usize, start_pos: usize) {
    gpu.write_step(step, n, start_pos);
    let mut enc = gpu.encoder();
    gpu.encode(&mut enc, ops, n as u32);
    gpu.submit(enc);
}

fn f16_round(v: &[f32]) -> (Vec<f16>, Vec<f32>) {
    let h: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
    let f = h.iter().map(|x| x.to_f32()).collect();
    (h, f)
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

#[test]
fn matmul_matches_reference_f32_and_f16() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(1);
    // (10, 8960, 9): a row loop inside one thread would run 89,600 iterations, which lavapipe
    // corrupted past 65,536 (Qwen2.5-1.5B's ffn width).
    for &(n, k, cols) in &[(1, 4, 1), (3, 64, 63), (5, 100, 65), (32, 260, 130), (7, 576, 200), (10, 8960, 9)]
    {
        for f16_weights in [false, true] {
            for with_bias in [false, true] {
                let x = rand_vec(&mut rng, n * k, 1.0);
                let w = rand_vec(&mut rng, cols * k, 0.5);
                let (w_h, w_used) = if f16_weights { f16_round(&w) } else { (Vec::new(), w.clone()) };
                let bias = rand_vec(&mut rng, cols, 0.3);
                let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
                let wb32 = GpuBuffer::<f32>::from_slice(&gpu, "w", &tr(&w, cols, k));
                let wb16 = GpuBuffer::<PackedF16>::from_f16(&gpu, "w16", &tr(&w_h, cols, k));
                let bb = GpuBuffer::<f32>::from_slice(&gpu, "b", &bias);
                // Write into the middle columns of a wider output, as a chunk of a split matrix does.
                let (ldy, off) = (cols + 3, 2usize);
                let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * ldy);
                let weights = if f16_weights { WeightsRef::F16(&wb16) } else { WeightsRef::F32(&wb32) };
                let out = MatmulOut { ldy: ldy as u32, col_offset: off as u32, at_start_pos: false };
                let op = gpu.matmul(&step, &xb, weights, with_bias.then_some(&bb), &yb, k, cols, out);
                run(&gpu, &step, &[op], n, 0);
                let y = read_f32(&gpu, &yb.raw, n * ldy);
                let (want, bound) = ref_matmul(&x, &w_used, with_bias.then_some(&bias[..]), n, k, cols);
                for r in 0..n {
                    assert_eq!(y[r * ldy], 0.0, "column before the chunk was written");
                    for c in 0..cols {
                        let (g, e) = (y[r * ldy + off + c], want[r * cols + c]);
                        assert!(
                            (g - e).abs() <= bound[r * cols + c],
                            "matmul n={n} k={k} cols={cols} f16={f16_weights} bias={with_bias} [{r},{c}]: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_writes_kv_rows_at_start_pos() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(2);
    let (n, k, cols, start) = (3, 12, 5, 4);
    let x = rand_vec(&mut rng, n * k, 1.0);
    let w = rand_vec(&mut rng, cols * k, 1.0);
    let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
    let wb = GpuBuffer::<f32>::from_slice(&gpu, "w", &tr(&w, cols, k));
    let cache = GpuBuffer::<f32>::zeros(&gpu, "cache", 10 * cols);
    let out = MatmulOut { ldy: cols as u32, col_offset: 0, at_start_pos: true };
    let op = gpu.matmul(&step, &xb, WeightsRef::F32(&wb), None, &cache, k, cols, out);
    run(&gpu, &step, &[op], n, start);
    let y = read_f32(&gpu, &cache.raw, 10 * cols);
    let (want, _) = ref_matmul(&x, &w, None, n, k, cols);
    assert!(y[..start * cols].iter().all(|v| *v == 0.0), "rows before start_pos untouched");
    assert!(y[(start + n) * cols..].iter().all(|v| *v == 0.0), "rows after the pass untouched");
    assert_close("kv rows", &y[start * cols..(start + n) * cols], &want, 1e-5, 1e-5);
}

#[test]
fn matmul_rows_are_batch_invariant() {
    // Row r of a pass over n rows must equal, bit for bit, the same row computed alone.
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(3);
    let (k, cols) = (576, 97);
    let x = rand_vec(&mut rng, 32 * k, 1.0);
    let w = rand_vec(&mut rng, cols * k, 1.0);
    let wb = GpuBuffer::<f32>::from_slice(&gpu, "w", &tr(&w, cols, k));
    let full_x = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
    let full_y = GpuBuffer::<f32>::zeros(&gpu, "y", 32 * cols);
    let out = MatmulOut { ldy: cols as u32, col_offset: 0, at_start_pos: false };
    let op = gpu.matmul(&step, &full_x, WeightsRef::F32(&wb), None, &full_y, k, cols, out);
    for n in [32usize, 5, 2] {
        run(&gpu, &step, std::slice::from_ref(&op), n, 0);
        let batch = read_f32(&gpu, &full_y.raw, n * cols);
        for r in 0..n {
            let xr = GpuBuffer::<f32>::from_slice(&gpu, "xr", &x[r * k..(r + 1) * k]);
            let yr = GpuBuffer::<f32>::zeros(&gpu, "yr", cols);
            let one = gpu.matmul(&step, &xr, WeightsRef::F32(&wb), None, &yr, k, cols, out);
            run(&gpu, &step, &[one], 1, 0);
            let single = read_f32(&gpu, &yr.raw, cols);
            let same =
                single.iter().zip(&batch[r * cols..(r + 1) * cols]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "row {r} of a {n}-row pass differs from the single-row pass");
        }
    }
}

#[test]
fn embed_gathers_rows_from_its_chunk() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(4);
    let (vocab, dim) = (37, 70);
    let table = rand_vec(&mut rng, vocab * dim, 1.0);
    let (table_h, table_hf) = f16_round(&table);
    let tokens: Vec<u32> = vec![0, 36, 5, 20, 20, 19];
    let tb = GpuBuffer::<u32>::from_slice(&gpu, "tokens", &tokens);
    for f16_table in [false, true] {
        // Two chunks: rows 0..20 and 20..37.
        let values = if f16_table { &table_hf } else { &table };
        let xb = GpuBuffer::<f32>::zeros(&gpu, "x", tokens.len() * dim);
        let mut ops = Vec::new();
        let a32 = GpuBuffer::<f32>::from_slice(&gpu, "a", &tr(&table[..20 * dim], 20, dim));
        let b32 = GpuBuffer::<f32>::from_slice(&gpu, "b", &tr(&table[20 * dim..], 17, dim));
        let a16 = GpuBuffer::<PackedF16>::from_f16(&gpu, "a", &tr(&table_h[..20 * dim], 20, dim));
        let b16 = GpuBuffer::<PackedF16>::from_f16(&gpu, "b", &tr(&table_h[20 * dim..], 17, dim));
        if f16_table {
            ops.push(gpu.embed(&step, &tb, WeightsRef::F16(&a16), &xb, dim, 0, 20));
            ops.push(gpu.embed(&step, &tb, WeightsRef::F16(&b16), &xb, dim, 20, 17));
        } else {
            ops.push(gpu.embed(&step, &tb, WeightsRef::F32(&a32), &xb, dim, 0, 20));
            ops.push(gpu.embed(&step, &tb, WeightsRef::F32(&b32), &xb, dim, 20, 17));
        }
        run(&gpu, &step, &ops, tokens.len(), 0);
        let x = read_f32(&gpu, &xb.raw, tokens.len() * dim);
        let want: Vec<f32> =
            tokens.iter().flat_map(|&t| values[t as usize * dim..(t as usize + 1) * dim].to_vec()).collect();
        assert_eq!(x, want, "embedding gather (f16={f16_table})");
    }
}

#[test]
fn rmsnorm_matches_reference() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(5);
    for &(n, dim) in &[(1, 7), (3, 64), (5, 200), (2, 576)] {
        let x = rand_vec(&mut rng, n * dim, 2.0);
        let w = rand_vec(&mut rng, dim, 1.0);
        let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
        let wb = GpuBuffer::<f32>::from_slice(&gpu, "w", &w);
        let yb = GpuBuffer::<f32>::zeros(&gpu, "y", n * dim);
        run(&gpu, &step, &[gpu.rmsnorm(&step, &xb, &wb, &yb, dim, 1e-5)], n, 0);
        let y = read_f32(&gpu, &yb.raw, n * dim);
        let want: Vec<f32> = x.chunks(dim).flat_map(|r| reference::rmsnorm(r, &w, 1e-5)).collect();
        assert_close(&format!("rmsnorm n={n} dim={dim}"), &y, &want, ELEMENTWISE_ABS, ELEMENTWISE_REL);
    }
}

#[test]
fn rope_matches_reference_in_both_layouts() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(6);
    let context = 300;
    for &(n, heads, head_dim, rope_dim, start, at_start) in &[
        (1, 1, 4, 4, 0, false),
        (3, 3, 64, 64, 100, false),
        (4, 2, 16, 8, 7, true),
        (2, 5, 32, 32, 290, true),
    ] {
        for layout in [RopeLayout::Interleaved, RopeLayout::Halves] {
            let theta = 10000.0f32;
            let half = rope_dim / 2;
            let mut table = Vec::new();
            for pos in 0..context {
                for i in 0..half {
                    let a = pos as f64 * (theta as f64).powf(-2.0 * i as f64 / rope_dim as f64);
                    table.push(a.cos() as f32);
                    table.push(a.sin() as f32);
                }
            }
            let rows = if at_start { context } else { n };
            let width = heads * head_dim;
            let x = rand_vec(&mut rng, rows * width, 1.0);
            let tb = GpuBuffer::<f32>::from_slice(&gpu, "cos_sin", &table);
            let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &x);
            run(
                &gpu,
                &step,
                &[gpu.rope(&step, &tb, &xb, heads, head_dim, rope_dim, layout, at_start)],
                n,
                start,
            );
            let got = read_f32(&gpu, &xb.raw, rows * width);
            let mut want = x.clone();
            for r in 0..n {
                let row = if at_start { start + r } else { r };
                reference::rope(
                    &mut want[row * width..(row + 1) * width],
                    head_dim,
                    rope_dim,
                    theta,
                    layout,
                    start + r,
                );
            }
            assert_close(
                &format!("rope {layout:?} n={n} hd={head_dim} rd={rope_dim}"),
                &got,
                &want,
                1e-5,
                1e-5,
            );
        }
    }
}

#[test]
fn attention_matches_reference() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(7);
    let ctx = 160;
    for &(n, heads, kv_heads, hd, start) in
        &[(1, 1, 1, 4, 0), (3, 4, 2, 8, 5), (8, 3, 1, 64, 70), (2, 2, 2, 16, 150), (5, 6, 3, 12, 0)]
    {
        let q = rand_vec(&mut rng, n * heads * hd, 1.0);
        let k = rand_vec(&mut rng, ctx * kv_heads * hd, 1.0);
        let v = rand_vec(&mut rng, ctx * kv_heads * hd, 1.0);
        let qb = GpuBuffer::<f32>::from_slice(&gpu, "q", &q);
        let kb = GpuBuffer::<f32>::from_slice(&gpu, "k", &k);
        let vb = GpuBuffer::<f32>::from_slice(&gpu, "v", &v);
        let sb = GpuBuffer::<f32>::zeros(&gpu, "scores", n * heads * ctx);
        let ob = GpuBuffer::<f32>::zeros(&gpu, "out", n * heads * hd);
        let shape = AttentionShape {
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: hd as u32,
            ctx: ctx as u32,
        };
        run(&gpu, &step, &[gpu.attention(&step, &qb, &kb, &vb, &sb, &ob, shape)], n, start);
        let got = read_f32(&gpu, &ob.raw, n * heads * hd);
        let want: Vec<f32> = (0..n)
            .flat_map(|r| {
                reference::attention(
                    &q[r * heads * hd..(r + 1) * heads * hd],
                    &k,
                    &v,
                    start + r,
                    heads,
                    kv_heads,
                    hd,
                )
            })
            .collect();
        assert_close(
            &format!("attention n={n} h={heads}/{kv_heads} hd={hd} start={start}"),
            &got,
            &want,
            1e-5,
            1e-4,
        );
    }
}

#[test]
fn silu_mul_and_add_match_reference() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(8);
    for &(n, width) in &[(1, 1), (3, 65), (4, 300)] {
        let g = rand_vec(&mut rng, n * width, 6.0);
        let u = rand_vec(&mut rng, n * width, 2.0);
        let gb = GpuBuffer::<f32>::from_slice(&gpu, "gate", &g);
        let ub = GpuBuffer::<f32>::from_slice(&gpu, "up", &u);
        run(&gpu, &step, &[gpu.silu_mul(&step, &gb, &ub, width)], n, 0);
        let got = read_f32(&gpu, &gb.raw, n * width);
        let want: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| ((*g as f64 / (1.0 + (-*g as f64).exp())) * *u as f64) as f32)
            .collect();
        assert_close("silu_mul", &got, &want, ELEMENTWISE_ABS, ELEMENTWISE_REL);

        let xb = GpuBuffer::<f32>::from_slice(&gpu, "x", &g);
        run(&gpu, &step, &[gpu.add(&step, &xb, &ub, width)], n, 0);
        let got = read_f32(&gpu, &xb.raw, n * width);
        let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
        assert_eq!(got, want, "add is exact");
    }
}

#[test]
fn argmax_picks_the_lowest_index_of_the_maximum() {
    let gpu = gpu();
    let step = gpu.step_buffer();
    let mut rng = rng(9);
    for &(n, vocab) in &[(1, 1), (3, 63), (5, 1000), (2, 49157)] {
        let mut logits = rand_vec(&mut rng, n * vocab, 10.0);
        // Row 0: a tie between two late indices; the lower must win.
        if vocab > 10 {
            logits[vocab - 3] = 50.0;
            logits[vocab - 1] = 50.0;
        }
        let lb = GpuBuffer::<f32>::from_slice(&gpu, "logits", &logits);
        let ob = GpuBuffer::<u32>::zeros(&gpu, "out", n);
        run(&gpu, &step, &[gpu.argmax(&step, &lb, &ob, vocab)], n, 0);
        let got = read_u32(&gpu, &ob.raw, n);
        let want: Vec<u32> = logits
            .chunks(vocab)
            .map(|row| {
                let mut best = 0;
                for (i, v) in row.iter().enumerate() {
                    if *v > row[best] {
                        best = i;
                    }
                }
                best as u32
            })
            .collect();
        assert_eq!(got, want, "argmax n={n} vocab={vocab}");
    }
}
