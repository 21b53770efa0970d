// Rows of one buffer into (part of) the rows of another, optionally RMS-normalised:
//   out[i * p.ld + p.offset + j] = src[s, j] * (NORM ? gamma[j] / sqrt(mean_k src[s, k]^2 + eps) : 1)
// for i < step.n and j < p.dim, where s = rows[i] (GATHER: rows written by the host or an earlier
// op) or i. Heads take the target's final hidden states this way (the output norm of the rows
// a pass kept), an EAGLE-3 head its feature taps and the two normalised halves of its attention
// input. One workgroup per output row; its invocations take strided elements and a fixed tree
// adds their squares.

// The uniforms Step and Params (GatherParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 64u;
const NORM: u32 = 1u;
const GATHER: u32 = 2u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> src: array<f32>;          // [rows, dim]
@group(0) @binding(3) var<storage, read> gamma: array<f32>;        // [dim] (NORM)
@group(0) @binding(4) var<storage, read> rows: array<u32>;         // [n] (GATHER)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;    // [n, ld]

var<workgroup> squares: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = wid.x;
    if (i >= step.n) { return; }
    let t = lid.x;
    let row = select(i, rows[i], (p.flags & GATHER) != 0u);
    let base = row * p.dim;
    let dst = i * p.ld + p.offset;
    if ((p.flags & NORM) == 0u) {
        for (var k = t; k < p.dim; k += WG) {
            out[dst + k] = src[base + k];
        }
        return;
    }
    var sq = 0.0;
    for (var k = t; k < p.dim; k += WG) {
        let v = src[base + k];
        sq = fma(v, v, sq);
    }
    squares[t] = sq;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { squares[t] += squares[t + stride]; }
        workgroupBarrier();
    }
    let inv_rms = 1.0 / sqrt(fma(squares[0], 1.0 / f32(p.dim), p.eps));
    for (var k = t; k < p.dim; k += WG) {
        // (x * gamma) first: the product the forward pass's scaled copy holds
        out[dst + k] = (src[base + k] * gamma[k]) * inv_rms;
    }
}
