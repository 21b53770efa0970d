// y[r, col_offset + c] (=|+=) sum_k x[r, k] * w[c, k] (+ bias[c]) for the rows r < step.n of a pass,
// over one chunk of a weight matrix's rows (the output columns c < cols).
//
// Preceded by one weight format file (shaders/formats/*.wgsl) that defines `load_unit(c, u)`: the
// 32 weights w[c, 32u .. 32u + 32] dequantised to f32, straight from the stored blocks.
//
// Shape for a GPU: a workgroup of 64 invocations owns a tile of 4 columns and a group of up to 8
// rows. 16 lanes per column stride over k, 32 weights (one unit) at a time, and apply each unit
// they load to every row of the group (weights are read once per 8 rows, not once per row). The
// 16 partial sums of each (row, column) are then added by a fixed tree in workgroup memory.
//
// Batch-invariant: the order of every sum depends on k and the lane mapping only: a row is computed
// by the same instructions whether the pass holds 1 row or 32, so its bits are the same.

struct Step { n: u32, start_pos: u32 }
struct Params {
    k: u32,           // row length of x (input features)
    units: u32,       // ceil(k / 32): 32-weight units per weight row
    cols: u32,        // output columns in this chunk (weight rows)
    col_offset: u32,  // first output column of this chunk
    ldy: u32,         // row stride of y, in f32
    y_row_base: u32,  // 1: output row r goes to row start_pos + r of y (KV cache); 0: row r
    has_bias: u32,    // 1: add bias[c]
    accumulate: u32,  // 1: y += result (a residual add); 0: y = result
    scale_base: u32,  // u32 word where the format's scale section starts (formats that have one)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const LANES: u32 = 16u; // invocations per column, splitting k
const TILE: u32 = 4u;   // columns per workgroup
const ROWS: u32 = 8u;   // rows per workgroup

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;        // [n, k / 4]
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;        // [cols, units] blocks of the weight format
@group(0) @binding(4) var<storage, read> bias: array<f32>;           // [cols] (this chunk) or unused
@group(0) @binding(5) var<storage, read_write> y: array<f32>;        // [rows_y, ldy]

var<workgroup> partial: array<array<f32, ROWS>, 64>;                // [TILE * LANES, ROWS]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let lane = t % LANES;
    let c = wid.x * TILE + t / LANES;
    let r0 = wid.y * ROWS;
    let k4 = p.k / 4u;

    // 1. this lane's share of k for up to 8 rows: units lane, lane + 16, ...
    var acc: array<f32, ROWS>;
    if (c < p.cols) {
        for (var u = lane; u < p.units; u += LANES) {
            var wu = load_unit(c, u);
            // vec4s of x that exist in this unit (the last unit of a k that is no multiple of 32
            // has fewer; its weights are zero padding)
            let valid = min(8u, k4 - 8u * u);
            for (var r = 0u; r < ROWS; r++) {
                if (r0 + r < step.n) {
                    let xb = (r0 + r) * k4 + 8u * u;
                    var s = 0.0;
                    for (var g = 0u; g < 8u; g++) {
                        if (g < valid) { s += dot(wu[g], x[xb + g]); }
                    }
                    acc[r] += s;
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        partial[t][r] = acc[r];
    }
    workgroupBarrier();

    // 2. the 16 lanes of each column, added by a fixed tree
    for (var stride = LANES / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            for (var r = 0u; r < ROWS; r++) {
                partial[t][r] += partial[t + stride][r];
            }
        }
        workgroupBarrier();
    }

    // 3. one invocation per (column, row) writes its output
    if (t < TILE * ROWS) {
        let oc = wid.x * TILE + t / ROWS;
        let r = t % ROWS;
        if (oc < p.cols && r0 + r < step.n) {
            var v = partial[(t / ROWS) * LANES][r];
            if (p.has_bias == 1u) { v += bias[oc]; }
            let base = select(0u, step.start_pos, p.y_row_base == 1u);
            let i = (base + r0 + r) * p.ldy + p.col_offset + oc;
            if (p.accumulate == 1u) { v = y[i] + v; }
            y[i] = v;
        }
    }
}
