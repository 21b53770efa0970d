// Rows of a pass's final hidden state, for heads that draft from it (Medusa, EAGLE):
// out[i, j] = scaled[rows[i], j] / sqrt(mean_k raw[rows[i], k]^2 + eps) for i < step.n: the
// output norm applied to the residual stream `raw` (`scaled` = raw * the norm's weight, as the
// forward pass leaves them). The rows are read from a buffer (written by the host, or by an
// earlier op of the submission). One workgroup per output row; its invocations take strided
// elements and a fixed tree adds their squares.

struct Step { n: u32, start_pos: u32 }
struct Params {
    dim: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> raw: array<f32>;          // [rows of the pass, dim] residual stream
@group(0) @binding(3) var<storage, read> scaled: array<f32>;       // [rows of the pass, dim] raw * the norm's weight
@group(0) @binding(4) var<storage, read> rows: array<u32>;         // [n] the pass's rows to take
@group(0) @binding(5) var<storage, read_write> out: array<f32>;    // [n, dim]

var<workgroup> squares: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = wid.x;
    if (i >= step.n) { return; }
    let t = lid.x;
    let base = rows[i] * p.dim;
    var sq = 0.0;
    for (var k = t; k < p.dim; k += WG) {
        let v = raw[base + k];
        sq += v * v;
    }
    squares[t] = sq;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { squares[t] += squares[t + stride]; }
        workgroupBarrier();
    }
    let inv_rms = 1.0 / sqrt(squares[0] / f32(p.dim) + p.eps);
    for (var k = t; k < p.dim; k += WG) {
        out[i * p.dim + k] = scaled[base + k] * inv_rms;
    }
}
