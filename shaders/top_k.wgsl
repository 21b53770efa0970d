// out[r, j] = the id of the j-th largest logit of row r, j < k: larger values first, equal values
// by lower id (so out[r, 0] is the argmax kernel's choice). One workgroup per row; round j finds
// the best entry strictly after round j - 1's in that order (k passes over the row: drafting
// trees asks for a few, k <= 32). NaN never wins; a row with fewer than k finite values repeats
// its last id.
// With p.log_probs = 1, logp[r, j] = the log-softmax of that id's logit:
//   logits[r, id] - (m + log(sum_i exp(logits[r, i] - m))),  m = the row's maximum,
// the sum reduced in a fixed order (a strided sum per invocation, then a tree).

struct Step { n: u32, start_pos: u32 }
struct Params {
    vocab: u32,
    k: u32,
    log_probs: u32,  // 1: also write logp
    _pad: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;          // [n, vocab]
@group(0) @binding(3) var<storage, read_write> out: array<u32>;       // [n, k]
@group(0) @binding(4) var<storage, read_write> logp: array<f32>;      // [n, k] (log_probs = 1)

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// true when (v, i) comes before (bv, bi): a larger value, or an equal one with a lower id
fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    if (r >= step.n) { return; }
    let t = lid.x;
    let base = r * p.vocab;
    // the previous round's pick: only entries after it compete (none before round 0)
    var prev_v = 0x1.fffffep+127f;
    var prev_i = 0xffffffffu;
    var first = true;
    var top = 0.0; // round 0's pick: the row's maximum
    for (var j = 0u; j < p.k; j++) {
        var bv = -0x1.fffffep+127f; // the lowest finite f32, written exactly
        var bi = 0xffffffffu;
        for (var i = t; i < p.vocab; i += WG) {
            let v = logits[base + i];
            let after = first || before(prev_v, prev_i, v, i);
            if (after && before(v, i, bv, bi)) { bv = v; bi = i; }
        }
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
        let pick_v = best_v[0];
        let pick_i = best_i[0];
        workgroupBarrier(); // every invocation has read the pick before the next round writes
        if (pick_i != 0xffffffffu) {
            if (first) { top = pick_v; }
            prev_v = pick_v;
            prev_i = pick_i;
            first = false;
        }
        if (t == 0u) {
            out[r * p.k + j] = min(prev_i, p.vocab - 1u);
            if (p.log_probs != 0u) { logp[r * p.k + j] = prev_v; }
        }
    }
    if (p.log_probs == 0u) { return; }
    // the row's log-sum-exp around its maximum
    var s = 0.0;
    for (var i = t; i < p.vocab; i += WG) {
        s += exp(logits[base + i] - top);
    }
    best_v[t] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { best_v[t] += best_v[t + stride]; }
        workgroupBarrier();
    }
    if (t == 0u) {
        let lse = top + log(best_v[0]);
        for (var j = 0u; j < p.k; j++) { logp[r * p.k + j] -= lse; }
    }
}
