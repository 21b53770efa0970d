// x[r, :] = f32(table[tokens[r] - row_start, :]) for the rows whose token falls in this chunk;
// the table holds f16 pairs packed in u32 (works without the shader-f16 feature).

struct Step { n: u32, start_pos: u32 }
struct Params {
    dim: u32,        // embedding width (even)
    row_start: u32,  // first vocabulary row held by this chunk
    rows: u32,       // vocabulary rows in this chunk
    _pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;          // [n]
@group(0) @binding(3) var<storage, read> table: array<u32>;           // [rows, dim/2] packed f16 pairs
@group(0) @binding(4) var<storage, read_write> x: array<vec2<f32>>;   // [n, dim/2]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    let half_dim = p.dim / 2u;
    if (i >= half_dim || r >= step.n) { return; }
    let t = tokens[r];
    if (t < p.row_start || t >= p.row_start + p.rows) { return; }
    x[r * half_dim + i] = unpack2x16float(table[(t - p.row_start) * half_dim + i]);
}
