// How the invocations of a subgroup get a value they all need (see shaders/share/shuffle.wgsl):
// here each loads it itself (`SHARE` is false; the ops then read the buffer). Placed ahead of the
// ops that read such values (matmul.wgsl: x; attention.wgsl: q and the scores) wherever the
// shuffles are not used: on GPUs, whose invocations read them through their caches, on adapters
// without subgroups of 8 or more (browsers), and with `KernelShape::shuffle_loads` off.

const SHARE: bool = false;

// The invocation's own ids (an argument of the entry point, which takes the workgroup's id apart:
// WGSL's uniformity analysis counts a whole struct as varying per invocation).
struct Invocation {
    @builtin(local_invocation_id) lid: vec3<u32>,
}

// The invocation's slot among 8 (with SHARE: which of 8 consecutive values it loads).
fn slot8(inv: Invocation) -> u32 {
    return 0u;
}

// (with SHARE: the value slot g loaded)
fn share_vec4(own: vec4<f32>, g: u32) -> vec4<f32> {
    return own;
}

fn share_f32(own: f32, g: u32) -> f32 {
    return own;
}

// Whether this invocation has work (with SHARE: whether any of its subgroup has, so that the
// whole subgroup runs the shuffles or none of it does).
fn share_any(work: bool) -> bool {
    return work;
}
