// How a matmul invocation gets its vectors of x (see matmul.wgsl): each invocation loads them
// itself. Placed ahead of matmul.wgsl where the shuffle (matmul_x/shuffle.wgsl) is not used:
// GPUs, whose invocations of a workgroup read the same x through their caches, and adapters
// without subgroups (WebGPU in browsers).

// The invocation's ids (the entry point's argument).
struct Invocation {
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
}

// What the invocation loads ahead of a unit whose x vectors start at x[i]: nothing here.
fn x_unit(inv: Invocation, i: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

// x[i + g], g < 8, of the unit that starts at x[i] (`own`: what x_unit returned for it)
fn x_at(i: u32, g: u32, own: vec4<f32>) -> vec4<f32> {
    return x[i + g];
}
