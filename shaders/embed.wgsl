// x[r, :] = table[tokens[r], :] * scale for the rows r < step.n whose token falls in this chunk of
// an embedding table [vocab, dim] (scale: 1, or Gemma's sqrt(dim)) (the same weight buffers a tied output projection reads).
//
// Preceded by one weight format file (shaders/formats/*.wgsl) that defines `unit_head(row, u)` and
// `unit_group(h, g)`: the values table[row, 32u + 4g .. 32u + 4g + 4] dequantised to f32. One invocation per (unit, row).
// With `scaled_copy`, x_scaled[r, e] = x[r, e] * gamma[e] as well: the input of the first matmul
// with RMSNorm folded in (shaders/matmul.wgsl).

// The uniforms Step and Params (EmbedParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;          // [n]
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;         // [rows, units] blocks of the weight format (runs of rows interleaved on CPU adapters)
@group(0) @binding(4) var<storage, read_write> x: array<f32>;         // [n, dim]
@group(0) @binding(5) var<storage, read> gamma: array<f32>;           // [dim] or unused
@group(0) @binding(6) var<storage, read_write> x_scaled: array<f32>;  // [n, dim] or unused

// The rows of this chunk's weight buffer (shaders/formats/interleave.wgsl)
fn weight_rows() -> u32 {
    return p.rows;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u = gid.x;
    let r = gid.y;
    if (u >= p.units || r >= step.n) { return; }
    let t = tokens[r];
    if (t < p.row_start || t >= p.row_start + p.rows) { return; }
    let h = unit_head(t - p.row_start, u);
    for (var g = 0u; g < 8u; g++) {
        let v = unit_group(h, g);
        for (var i = 0u; i < 4u; i++) {
            let e = 32u * u + 4u * g + i;
            if (e < p.dim) {
                let s = v[i] * p.scale;
                x[r * p.dim + e] = s;
                if (p.scaled_copy == 1u) { x_scaled[r * p.dim + e] = s * gamma[e]; }
            }
        }
    }
}
