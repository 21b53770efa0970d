// Keeps the accepted paths of a pass's token trees in one layer's KV cache: cache row dst_i takes
// cache row src_i, for the pairs i < count in order (keep.pairs[i / 2]: (dst, src) of pair 2j in
// .xy, of pair 2j + 1 in .zw). A tree's pairs come by depth, each source at or after its
// destination's position in the tree's scratch rows and every tree in rows of its own, so each
// invocation, one word of a row, reads every source before it can be overwritten.

// The uniforms Step and Keep (KeepParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;   // bound like every op's; not read (see main)
@group(0) @binding(1) var<uniform> keep: Keep;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;  // [cache rows, width] (any format)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    _ = step.n; // keeps the binding in the layout
    if (e >= keep.width) { return; }
    for (var i = 0u; i < keep.count; i++) {
        let q = keep.pairs[i / 2u];
        var pair = q.xy;
        if (i % 2u == 1u) { pair = q.zw; }
        cache[pair.x * keep.width + e] = cache[pair.y * keep.width + e];
    }
}
