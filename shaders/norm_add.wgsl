// A sub-block's output normed before it joins the residual stream (Gemma's post-attention and
// post-feed-forward norms), for the rows r < step.n of a pass:
//   x[r, j] += y[r, j] / sqrt(mean_k y[r, k]^2 + eps) * w[j]
// and with `scaled_copy` xb[r, j] = x[r, j] * gamma[j] (the next normed matmul's input). One
// workgroup per row; its invocations take strided elements and a fixed tree adds their squares
// (the same order for every pass: batch-invariant). The add is one fused multiply-add.

// The uniforms Step and Params (NormAddParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> y: array<f32>;             // [n, dim] the sub-block's output
@group(0) @binding(3) var<storage, read> w: array<f32>;             // [dim] the post-norm's weight
@group(0) @binding(4) var<storage, read> gamma: array<f32>;         // [dim] the next norm's weight (scaled_copy)
@group(0) @binding(5) var<storage, read_write> x: array<f32>;       // [n, dim] the residual stream
@group(0) @binding(6) var<storage, read_write> xb: array<f32>;      // [n, dim] (scaled_copy) or unused

var<workgroup> squares: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    if (r >= step.n) { return; }
    let t = lid.x;
    let base = r * p.dim;
    var sq = 0.0;
    for (var j = t; j < p.dim; j += WG) {
        let v = y[base + j];
        sq = fma(v, v, sq);
    }
    squares[t] = sq;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { squares[t] += squares[t + stride]; }
        workgroupBarrier();
    }
    let inv_rms = 1.0 / sqrt(fma(squares[0], 1.0 / f32(p.dim), p.eps));
    for (var j = t; j < p.dim; j += WG) {
        let sum = fma(y[base + j] * inv_rms, w[j], x[base + j]);
        x[base + j] = sum;
        if (p.scaled_copy == 1u) { xb[base + j] = sum * gamma[j]; }
    }
}
