// out[r, :] = [left[r, :] | right[r, :]] for the rows r < step.n of a pass: the two inputs of an
// EAGLE head's fc side by side (the token's embedding, then the target's feature).

struct Step { n: u32, start_pos: u32 }
struct Params {
    left: u32,    // columns of left
    right: u32,   // columns of right
    _pad0: u32,
    _pad1: u32,
}

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
