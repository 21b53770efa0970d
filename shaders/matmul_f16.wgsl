// y[r, col_offset + c] = sum_k x[r, k] * f32(w[c, k]) (+ bias[c]), w in f16 packed in pairs, for r < step.n, over one chunk of
// output columns of a weight matrix. The chunk is stored transposed, k-major: wt[k, c], with the
// columns padded to a multiple of 4, so each thread owns 4 adjacent columns and neighbouring
// threads read neighbouring memory.
// Batch-invariant: every (r, c) is one accumulator summed over k in ascending order, through the
// same code whatever n is, so a pass of 1 row and a pass of 32 give identical bits.

struct Step { n: u32, start_pos: u32 }
struct Params {
    k: u32,           // row length of x (input features)
    cols: u32,        // output columns in this chunk
    col_offset: u32,  // first output column of this chunk
    ldy: u32,         // row stride of y, in f32
    y_row_base: u32,  // 1: output row r goes to row start_pos + r of y (KV cache); 0: row r
    has_bias: u32,    // 1: add bias[c]
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;              // [n, k]
@group(0) @binding(3) var<storage, read> wt: array<vec2<u32>>;       // [k, ceil(cols / 4)] four f16 per element (this chunk, transposed)
@group(0) @binding(4) var<storage, read> bias: array<f32>;           // [cols] (this chunk) or unused
@group(0) @binding(5) var<storage, read_write> y: array<f32>;        // [rows_y, ldy]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    // One invocation per (4 columns, row): a thread's loop never runs past k iterations.
    let c4 = gid.x;
    let r = gid.y;
    let cols4 = (p.cols + 3u) / 4u;
    if (c4 >= cols4 || r >= step.n) { return; }
    let base = select(0u, step.start_pos, p.y_row_base == 1u);
    var b = vec4<f32>(0.0);
    if (p.has_bias == 1u) {
        for (var i = 0u; i < 4u; i++) {
            if (c4 * 4u + i < p.cols) { b[i] = bias[c4 * 4u + i]; }
        }
    }
    {
        let xr = r * p.k;
        var acc = vec4<f32>(0.0);
        for (var k = 0u; k < p.k; k++) {
            let w = wt[k * cols4 + c4];
            acc += x[xr + k] * vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
        }
        acc += b;
        let row = (base + r) * p.ldy + p.col_offset + c4 * 4u;
        for (var i = 0u; i < 4u; i++) {
            if (c4 * 4u + i < p.cols) { y[row + i] = acc[i]; }
        }
    }
}
