// How a matmul invocation gets its vectors of x (see matmul.wgsl), on CPU adapters with subgroups
// of at least 8 invocations (lavapipe): the invocations of a subgroup need the same eight vectors
// of x for a unit (each walks all of k for its own columns, LANES = 1), so each loads one of them
// and the others come from its neighbours by a subgroup shuffle. llvmpipe turns each invocation's
// load into one scalar load per component and lane, so this loads x an eighth as often; the values
// are the same, moved, so every sum and every bit is the same as with matmul_x/load.wgsl.
// Valid only where every invocation of a subgroup reads x at the same offsets (LANES = 1) and all
// of them run the loop (the matmul keeps them all active there).

// The invocation's ids (the entry point's argument).
struct Invocation {
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_invocation_id) sid: u32,
}

// Ahead of a unit whose x vectors start at x[i]: invocation s of the subgroup loads x[i + s % 8]
// (past a row's end in the last unit of a k that is no multiple of 32: never used).
fn x_unit(inv: Invocation, i: u32) -> vec4<f32> {
    return x[i + inv.sid % 8u];
}

// x[i + g], g < 8: invocation g's load of the unit
fn x_at(i: u32, g: u32, own: vec4<f32>) -> vec4<f32> {
    return subgroupShuffle(own, g);
}
