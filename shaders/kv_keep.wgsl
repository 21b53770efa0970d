// Keeps the accepted path of a token-tree pass in one layer's KV cache: row start_pos + i takes
// row start_pos + slots[i] for i < count (slots ascend and slots[i] >= i, so each invocation, one
// element of a row, reads every source before it can be overwritten).

// The uniforms Step and Keep (KeepParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;   // bound like every op's; not read (see main)
@group(0) @binding(1) var<uniform> keep: Keep;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;  // [ctx, width] (any format)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    _ = step.n; // keeps the binding in the layout
    if (e >= keep.width) { return; }
    for (var i = 0u; i < keep.count; i++) {
        let s = keep.slots[i / 4u][i % 4u];
        if (s != i) {
            cache[(keep.start_pos + i) * keep.width + e] = cache[(keep.start_pos + s) * keep.width + e];
        }
    }
}
