// out[r] = argmax_i logits[r, i], the lowest index among equal maxima; NaN never wins (a row with
// no value above -inf gives vocab - 1). Two dispatches of this kernel:
//   stage 0: one workgroup per slice of SLICE logits and row, writing the slice's best
//            (value, id) pair to pairs[r, s];
//   stage 1: one workgroup per row, reducing the row's pairs into out[r].
// The winner is the maximum of one total order over a row's values that are neither NaN nor -inf
// (larger value first, then lower id; -0.0 and +0.0 are equal), so neither the slicing nor the
// reduction order changes it: every adapter and every number of slices picks the same id.

struct Step { n: u32, start_pos: u32 }
struct Params {
    vocab: u32,
    slices: u32,  // ceil(vocab / SLICE)
    stage: u32,   // 0: slices of logits into pairs; 1: pairs into out
    _pad: u32,
}

const WG: u32 = 64u;
// Logits per stage-0 workgroup: 16 loads per invocation.
const SLICE: u32 = 1024u;
// The lowest finite f32, written exactly (Tint refuses an inexact literal): no pick yet.
const NONE_V: f32 = -0x1.fffffep+127f;
const NONE_I: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;          // [n, vocab]
@group(0) @binding(3) var<storage, read_write> pairs: array<u32>;     // [n, slices, 2]: value bits, id
@group(0) @binding(4) var<storage, read_write> out: array<u32>;       // [n]

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// true when (v, i) should replace (bv, bi)
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// The best of the workgroup's (bv, bi), by a fixed tree, in best_v[0], best_i[0].
fn reduce(t: u32, bv: f32, bi: u32) {
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
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    var bv = NONE_V;
    var bi = NONE_I;
    if (p.stage == 0u) {
        let s = wid.x;
        let r = wid.y;
        if (r >= step.n) { return; }
        let end = min((s + 1u) * SLICE, p.vocab);
        for (var i = s * SLICE + t; i < end; i += WG) {
            let v = logits[r * p.vocab + i];
            if (better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        reduce(t, bv, bi);
        if (t == 0u) {
            let at = 2u * (r * p.slices + s);
            pairs[at] = bitcast<u32>(best_v[0]);
            pairs[at + 1u] = best_i[0];
        }
        return;
    }
    let r = wid.x;
    if (r >= step.n) { return; }
    for (var s = t; s < p.slices; s += WG) {
        let at = 2u * (r * p.slices + s);
        let v = bitcast<f32>(pairs[at]);
        let i = pairs[at + 1u];
        if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    reduce(t, bv, bi);
    if (t == 0u) { out[r] = min(best_i[0], p.vocab - 1u); }
}
