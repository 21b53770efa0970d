// out[r] = argmax_i logits[r, i], the lowest index among equal maxima (one workgroup per row).
// NaN never wins. The reduction order is fixed, so ties resolve the same on every adapter.

struct Step { n: u32, start_pos: u32 }
struct Params {
    vocab: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;          // [n, vocab]
@group(0) @binding(3) var<storage, read_write> out: array<u32>;       // [n]

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// true when (v, i) should replace (bv, bi)
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    if (r >= step.n) { return; }
    let t = lid.x;
    let base = r * p.vocab;
    var bv = -0x1.fffffep+127f; // the lowest finite f32, written exactly (Tint refuses an inexact literal)
    var bi = 0xffffffffu;
    for (var i = t; i < p.vocab; i += WG) {
        let v = logits[base + i];
        if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    best_v[t] = bv;
    best_i[t] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride && better(best_v[t + stride], best_i[t + stride], best_v[t], best_i[t])) {
            best_v[t] = best_v[t + stride];
            best_i[t] = best_i[t + stride];
        }
        workgroupBarrier();
    }
    if (t == 0u) { out[r] = min(best_i[0], p.vocab - 1u); }
}
