// out[r] = argmax_i logits[r, i], the lowest index among equal maxima; NaN never wins (a row with
// no value above -inf gives vocab - 1). Preceded by shaders/share/rank.wgsl (the order, the
// workgroup's pick, SLICE). Two dispatches of this kernel:
//   stage 0: one workgroup per slice of SLICE logits and row, writing the slice's best
//            (value, id) pair to pairs[r, s];
//   stage 1: one workgroup per row, reducing the row's pairs into out[r].
// The winner is the maximum of rank.wgsl's total order, so neither the slicing nor the reduction
// order changes it: every adapter and every number of slices picks the same id.

// The uniforms Step and Params (ArgmaxParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> logits: array<f32>;          // [n, vocab]
@group(0) @binding(3) var<storage, read_write> pairs: array<u32>;     // [n, slices, 2]: value bits, id
@group(0) @binding(4) var<storage, read_write> out: array<u32>;       // [n]

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
            if (before(v, i, bv, bi)) { bv = v; bi = i; }
        }
        let pick = first_of(t, bv, bi);
        if (t == 0u) {
            let at = 2u * (r * p.slices + s);
            pairs[at] = pick.x;
            pairs[at + 1u] = pick.y;
        }
        return;
    }
    let r = wid.x;
    if (r >= step.n) { return; }
    for (var s = t; s < p.slices; s += WG) {
        let at = 2u * (r * p.slices + s);
        let v = bitcast<f32>(pairs[at]);
        let i = pairs[at + 1u];
        if (before(v, i, bv, bi)) { bv = v; bi = i; }
    }
    let pick = first_of(t, bv, bi);
    if (t == 0u) { out[r] = min(pick.y, p.vocab - 1u); }
}
