// x[r, :] = f32(w[tokens[r], :]) for the rows whose token falls in this chunk of the matrix; the
// chunk is stored transposed as f16 pairs packed in u32 (see embed_f32.wgsl), readable without
// the shader-f16 feature.

struct Step { n: u32, start_pos: u32 }
struct Params {
    dim: u32,        // embedding width
    row_start: u32,  // first vocabulary row held by this chunk
    rows: u32,       // vocabulary rows in this chunk
    _pad: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;          // [n]
@group(0) @binding(3) var<storage, read> wt: array<u32>;              // [dim, ceil(rows / 4) * 4 / 2] f16 pairs
@group(0) @binding(4) var<storage, read_write> x: array<f32>;         // [n, dim]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (i >= p.dim || r >= step.n) { return; }
    let t = tokens[r];
    if (t < p.row_start || t >= p.row_start + p.rows) { return; }
    let stride = (p.rows + 3u) / 4u * 4u;
    let e = i * stride + (t - p.row_start);
    let pair = unpack2x16float(wt[e / 2u]);
    x[r * p.dim + i] = pair[e % 2u];
}
