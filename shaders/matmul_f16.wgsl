// y[r, c] = sum_k x[r, k] * f32(w[c, k]) with w in f16 (+ bias[c]) for r < step.n, over one row-chunk of a weight matrix.
// Batch-invariant: every (r, c) is reduced in the same order (k ascending, vec4 dots) whatever n is,
// and rows are always processed in groups of ROWS through one code path (out-of-range rows are
// computed on a clamped row and not stored), so a pass of 1 row and a pass of 32 give identical bits.

struct Step { n: u32, start_pos: u32 }
struct Params {
    k4: u32,          // row length of x and w, in vec4s (k / 4)
    cols: u32,        // output columns in this chunk (rows of w)
    col_offset: u32,  // first output column of this chunk
    ldy: u32,         // row stride of y, in f32
    y_row_base: u32,  // 1: output row r goes to row start_pos + r of y (KV cache); 0: row r
    has_bias: u32,    // 1: add bias[c]
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;
const ROWS: u32 = 4u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;        // [n, k/4]
@group(0) @binding(3) var<storage, read> w: array<vec2<u32>>;        // [cols, k/4] four f16 packed in two u32 (this chunk)
@group(0) @binding(4) var<storage, read> bias: array<f32>;           // [cols] (this chunk) or [1] unused
@group(0) @binding(5) var<storage, read_write> y: array<f32>;        // [rows_y, ldy]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.cols) { return; }
    let n = step.n;
    let base = select(0u, step.start_pos, p.y_row_base == 1u);
    let wrow = c * p.k4;
    var b = 0.0;
    if (p.has_bias == 1u) { b = bias[c]; }
    for (var r0 = 0u; r0 < n; r0 += ROWS) {
        let r1 = min(r0 + 1u, n - 1u);
        let r2 = min(r0 + 2u, n - 1u);
        let r3 = min(r0 + 3u, n - 1u);
        var a0 = 0.0;
        var a1 = 0.0;
        var a2 = 0.0;
        var a3 = 0.0;
        for (var k = 0u; k < p.k4; k++) {
            let wp = w[wrow + k];
            let wv = vec4<f32>(unpack2x16float(wp.x), unpack2x16float(wp.y));
            a0 += dot(x[r0 * p.k4 + k], wv);
            a1 += dot(x[r1 * p.k4 + k], wv);
            a2 += dot(x[r2 * p.k4 + k], wv);
            a3 += dot(x[r3 * p.k4 + k], wv);
        }
        let col = p.col_offset + c;
        y[(base + r0) * p.ldy + col] = a0 + b;
        if (r0 + 1u < n) { y[(base + r0 + 1u) * p.ldy + col] = a1 + b; }
        if (r0 + 2u < n) { y[(base + r0 + 2u) * p.ldy + col] = a2 + b; }
        if (r0 + 3u < n) { y[(base + r0 + 3u) * p.ldy + col] = a3 + b; }
    }
}
