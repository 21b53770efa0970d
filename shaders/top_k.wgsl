// out[r, j] = the id of the j-th largest logit of row r, j < k: larger values first, equal values
// by lower id (so out[r, 0] is the argmax kernel's choice). NaN and -inf never rank; a row with
// fewer than k other values repeats its last id. Preceded by shaders/share/rank.wgsl (the order,
// the workgroup's pick, SLICE). Two dispatches of this kernel:
//   stage 0: one workgroup per slice of SLICE logits and row ranks the slice's top k into
//            cand[r, s, :] (round j finds the best entry strictly after round j - 1's in that
//            order), unfilled places (NONE_V, NONE_I); with log-probs also the slice's maximum m_s
//            and sum_i exp(logits[r, i] - m_s) into lse[r, s] (m_s = 0 where nothing ranks);
//   stage 1: one workgroup per row ranks the row's slices x k candidates the same way. The k
//            best of a row are the k best of its slices' k best, so the ids do not depend on
//            the slicing.
// With p.log_probs = 1, logp[r, j] = the log-softmax of that id's logit:
//   logits[r, id] - (m + log(sum_s exp(m_s - m) * sum_{i in s} exp(logits[r, i] - m_s))),
// m = the row's maximum, m_s slice s's; each sum in a fixed order (a strided sum per
// invocation, then a tree).

// The uniforms Step and Params (TopKParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;          // [n, vocab]
@group(0) @binding(3) var<storage, read_write> cand: array<u32>;      // [n, slices, k, 2]: value bits, id
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;       // [n, slices, 2]: m_s, its sum
@group(0) @binding(5) var<storage, read_write> out: array<u32>;       // [n, k]
@group(0) @binding(6) var<storage, read_write> logp: array<f32>;      // [n, k] (log_probs = 1)

// The sum of the workgroup's s by a fixed tree, returned to every invocation.
fn sum_of(t: u32, s: f32) -> f32 {
    best_v[t] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { best_v[t] += best_v[t + stride]; }
        workgroupBarrier();
    }
    let total = best_v[0];
    workgroupBarrier();
    return total;
}

// The value and id of entry e (< count) of the set being ranked: logits begin.. of row r
// (stage 0), or the row's candidates (stage 1).
fn entry(r: u32, begin: u32, e: u32) -> vec2<u32> {
    if (p.stage == 0u) {
        return vec2<u32>(bitcast<u32>(logits[r * p.vocab + begin + e]), begin + e);
    }
    let at = 2u * (r * p.slices * p.k + e);
    return vec2<u32>(cand[at], cand[at + 1u]);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    // stage 0: slice s of row r; stage 1: row r
    var r = wid.x;
    var s = 0u;
    var begin = 0u;
    var count = p.slices * p.k;
    if (p.stage == 0u) {
        s = wid.x;
        r = wid.y;
        begin = s * SLICE;
        count = min(begin + SLICE, p.vocab) - begin;
    }
    if (r >= step.n) { return; }
    // the previous round's pick: only entries after it compete (none before round 0)
    var prev_v = 0x1.fffffep+127f;
    var prev_i = NONE_I;
    var first = true;
    var top = 0.0; // round 0's pick: the set's maximum
    for (var j = 0u; j < p.k; j++) {
        var bv = NONE_V;
        var bi = NONE_I;
        for (var e = t; e < count; e += WG) {
            let x = entry(r, begin, e);
            let v = bitcast<f32>(x.x);
            let after = first || before(prev_v, prev_i, v, x.y);
            if (after && before(v, x.y, bv, bi)) { bv = v; bi = x.y; }
        }
        let pick = first_of(t, bv, bi);
        if (p.stage == 0u) {
            // the slice's j-th, or no pick
            if (t == 0u) {
                let at = 2u * ((r * p.slices + s) * p.k + j);
                cand[at] = pick.x;
                cand[at + 1u] = pick.y;
            }
        }
        if (pick.y != NONE_I) {
            if (first) { top = bitcast<f32>(pick.x); }
            prev_v = bitcast<f32>(pick.x);
            prev_i = pick.y;
            first = false;
        }
        if (p.stage == 1u && t == 0u) {
            out[r * p.k + j] = min(prev_i, p.vocab - 1u);
            if (p.log_probs != 0u) { logp[r * p.k + j] = prev_v; }
        }
    }
    if (p.log_probs == 0u) { return; }
    if (p.stage == 0u) {
        // the slice's sum of exp around its maximum (0 where it has none)
        var acc = 0.0;
        for (var e = t; e < count; e += WG) {
            acc += exp(logits[r * p.vocab + begin + e] - top);
        }
        let total = sum_of(t, acc);
        if (t == 0u) {
            lse[2u * (r * p.slices + s)] = top;
            lse[2u * (r * p.slices + s) + 1u] = total;
        }
        return;
    }
    // the row's: each slice's sum moved to the row's maximum (a slice with no pick has summed
    // exp of its -inf and NaN values as they are: 0, or NaN)
    var acc = 0.0;
    for (var e = t; e < p.slices; e += WG) {
        let at = 2u * (r * p.slices + e);
        let picked = cand[2u * (r * p.slices + e) * p.k + 1u] != NONE_I;
        acc = select(acc + lse[at + 1u], fma(lse[at + 1u], exp(lse[at] - top), acc), picked);
    }
    let total = sum_of(t, acc);
    if (t == 0u) {
        let l = top + log(total);
        for (var j = 0u; j < p.k; j++) { logp[r * p.k + j] -= l; }
    }
}
