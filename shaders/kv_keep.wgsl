// Keeps the accepted path of a token-tree pass in one layer's KV cache: row start_pos + i takes
// row start_pos + slots[i] for i < count (slots ascend and slots[i] >= i, so each invocation, one
// element of a row, reads every source before it can be overwritten).

struct Step { n: u32, start_pos: u32 }
struct Keep {
    start_pos: u32,
    count: u32,                     // rows kept (the path's length)
    width: u32,                     // 32-bit words per cache row (2 kv_dim f32, or kv_dim f16 pairs)
    _pad: u32,
    slots: array<vec4<u32>, 8>,     // [32] the path's rows in the pass, by depth
}

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
