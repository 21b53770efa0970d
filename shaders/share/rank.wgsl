// The order argmax and top-k rank logits in, and a workgroup's pick of its first entry in that
// order, placed ahead of shaders/argmax.wgsl and shaders/top_k.wgsl (with `const SLICE`, the
// logits of one first-stage workgroup, written from src/gpu/ops.rs's REDUCE_SLICE).
// A larger value comes first, then a lower id; NaN never comes before anything, and -0.0 and
// +0.0 are equal: one total order over the values that are neither NaN nor -inf, so a maximum
// (or the k first) is the same whatever order the entries are visited in.

const WG: u32 = 64u;
// No pick: the lowest finite f32, written exactly (Tint refuses an inexact literal), no id.
const NONE_V: f32 = -0x1.fffffep+127f;
const NONE_I: u32 = 0xffffffffu;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// true when (v, i) comes before (bv, bi)
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// The first of the workgroup's (bv, bi) by a fixed tree, returned to every invocation as
// (value bits, id).
fn first_of(t: u32, bv: f32, bi: u32) -> vec2<u32> {
    best_v[t] = bv;
    best_i[t] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride && before(best_v[t + stride], best_i[t + stride], best_v[t], best_i[t])) {
            best_v[t] = best_v[t + stride];
            best_i[t] = best_i[t + stride];
        }
        workgroupBarrier();
    }
    let pick = vec2<u32>(bitcast<u32>(best_v[0]), best_i[0]);
    workgroupBarrier(); // every invocation has read the pick before the next use writes
    return pick;
}
