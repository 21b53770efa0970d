// How the invocations of a subgroup get a value they all need, on CPU adapters with subgroups of
// at least 8 invocations (lavapipe): of 8 consecutive values that every invocation of the subgroup
// needs, invocation s loads value s % 8 (`slot8`), and the others come from it by a subgroup
// shuffle (`share_vec4`, `share_f32`). llvmpipe turns each invocation's load into one scalar load
// per component and lane, so this loads such values an eighth as often. The values are moved,
// not recomputed: every sum and every bit is the same as with shaders/share/load.wgsl.
// Valid only where every invocation of the subgroup needs the same values and runs the shuffle
// (the ops keep all of them active there: `share_any`). Native only (naga, SPIR-V): WGSL's
// uniformity analysis would refuse the shuffles in the matmul's loop, whose start depends on the
// invocation's lane (0 whenever this file is used), and browsers expose no subgroups to wgpu.

const SHARE: bool = true;

// The invocation's own ids (an argument of the entry point, which takes the workgroup's id apart:
// WGSL's uniformity analysis counts a whole struct as varying per invocation).
struct Invocation {
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(subgroup_invocation_id) sid: u32,
}

// The invocation's slot among 8: which of 8 consecutive values it loads.
fn slot8(inv: Invocation) -> u32 {
    return inv.sid % 8u;
}

// The value slot g loaded (g < 8).
fn share_vec4(own: vec4<f32>, g: u32) -> vec4<f32> {
    return subgroupShuffle(own, g);
}

fn share_f32(own: f32, g: u32) -> f32 {
    return subgroupShuffle(own, g);
}

// Whether any invocation of the subgroup has work: the whole subgroup runs the shuffles, or none.
fn share_any(work: bool) -> bool {
    return subgroupAny(work);
}
