// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight   (one workgroup per row)
// The sum of squares is reduced in a fixed order (strided partial sums, then a fixed tree),
// so each row's result does not depend on how many rows the pass holds.

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
@group(0) @binding(2) var<storage, read> x: array<f32>;               // [n, dim]
@group(0) @binding(3) var<storage, read> weight: array<f32>;          // [dim]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;         // [n, dim]

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    if (r >= step.n) { return; }
    let t = lid.x;
    let base = r * p.dim;
    var s = 0.0;
    for (var i = t; i < p.dim; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    partial[t] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { partial[t] += partial[t + stride]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(partial[0] / f32(p.dim) + p.eps);
    for (var i = t; i < p.dim; i += WG) {
        y[base + i] = x[base + i] * inv * weight[i];
    }
}
