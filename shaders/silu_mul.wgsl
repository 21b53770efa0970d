// gate[r, i] = silu(gate[r, i]) * up[r, i]   (SwiGLU), elementwise over n rows.

struct Step { n: u32, start_pos: u32 }
struct Params {
    width: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> gate: array<f32>;      // [n, width]
@group(0) @binding(3) var<storage, read> up: array<f32>;              // [n, width]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.width || r >= step.n) { return; }
    let j = r * p.width + i;
    let g = gate[j];
    gate[j] = g / (1.0 + exp(-g)) * up[j];
}
