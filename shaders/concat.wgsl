// out[r, :] = [left[r, :] | right[r, :]] for the rows r < step.n of a pass: the two inputs of an
// EAGLE head's fc side by side (the token's embedding, then the target's feature).

// The uniforms Step and Params (ConcatParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> left: array<f32>;         // [n, left]
@group(0) @binding(3) var<storage, read> right: array<f32>;        // [n, right]
@group(0) @binding(4) var<storage, read_write> out: array<f32>;    // [n, left + right]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.y;
    let j = gid.x;
    let width = p.left + p.right;
    if (r >= step.n || j >= width) { return; }
    if (j < p.left) {
        out[r * width + j] = left[r * p.left + j];
    } else {
        out[r * width + j] = right[r * p.right + j - p.left];
    }
}
