// y[r, c] (=|+=) sum_k x[r, k] * w[c, k] (+ bias[c]) for the rows r < step.n of a pass, over one
// chunk of a weight matrix's rows (output columns col_offset .. col_offset + cols).
//
// Preceded by one weight format file (shaders/formats/*.wgsl) that defines `unit_head(c, u)` and
// `unit_group(h, g)`: the weights w[c, 32u + 4g .. 32u + 4g + 4] dequantised to f32, straight from
// the stored blocks; and the same units a span and a part at a time, each loaded once: a span
// (`span_load(c, s)`) holds the words its SPAN units share (the K-quants' scale words), a part
// (`part_load(sp, h)`, part h of the span) the words its PART units share (quant bytes whose low
// and high bits are different units), and `part_unit(pt, j)` is unit SPAN * s + PART * h + j
// (shaders/formats/span_one.wgsl: spans and parts of one unit, for formats whose units share
// nothing). A row is a whole number of spans (the K-quants' rows are whole blocks). Then by one
// file of shaders/share/ that defines the entry point's `Invocation` and whether (`SHARE`, CPU
// adapters with subgroups) the invocations of a subgroup share their loads of x by shuffles (they
// all need the same x with LANES = 1).
//
// Shape: each invocation owns 4 adjacent columns x a group of rows (up to 8 on CPU adapters; on
// GPUs 4, or 16 in the pipeline of passes of more rows: ROWS); it decodes each group of 4 weights
// once and applies it to every row, and loads each vec4 of x once for the 4 columns (weights are
// read once per group of rows, not once per row).
// On a GPU a workgroup of 64 invocations is
// 64 / LANES column quads x LANES lanes (16, or 32 and 64 for narrow matrices, which thus launch
// more workgroups: src/gpu/kernel.rs, matmul_lanes): the lanes of a quad stride over k, 32 weights
// (one unit) at a time, and their partial sums are added by a fixed tree in workgroup memory
// (256 / LANES columns per workgroup).
// On a CPU adapter LANES = 1: each invocation walks all of k (256 columns per workgroup), through
// weight buffers that interleave the blocks of runs of 8 rows (shaders/formats/interleave.wgsl).
//
// RMSNorm folded in (`norm`): x holds the previous op's output already multiplied by the norm's
// weight, x_raw the residual stream itself; the workgroup sums the squares of each x_raw row (a
// fixed tree) and scales the row's sums by 1 / sqrt(mean + eps), so y = rmsnorm(x_raw) . w^T.
//
// Epilogues (per pipeline call, from the params): the bias; SiLU (`silu`); a residual add
// (`accumulate`); SwiGLU (or GeGLU: `gelu`) over interleaved gate|up rows (`glu`); for a fused q|k|v matrix, RoPE on the columns before
// `rope_cols` (pairs of adjacent columns: rows of a Halves layout were reordered at load, so the
// store puts each value back at its column; a row's position is start_pos + r, or start_pos + its
// depth in a token-tree pass) and the columns from `split` on routed to the KV cache row
// start_pos + r (as f32, or as f16 pairs: `kv_f16`); and (`scaled_copy`) each stored value times gamma[c] written to `second` too:
// the input of the next normed matmul.
//
// Batch-invariant: the order of every sum depends on k and LANES only (fixed per device and
// weight matrix): a row
// is computed by the same operations in the same order whether the pass holds 1 row or 64 (and
// whichever of a GPU's two pipelines runs it), so its bits are the same. And no compiler can
// round them differently: a GPU compiler may contract `a * b + c` into a fused multiply-add in
// one pipeline or branch and not in another, so no float add here is fed by a multiply (or a
// divide, or `dot`) but through an explicit `fma` (checked on the IR of every format's module by
// tests/kernels.rs, no_kernel_arithmetic_can_be_contracted).

// The uniforms Step and Params (MatmulParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

// Invocations per column quad, splitting k: on GPUs 16, 32 or 64, chosen per weight matrix from its
// columns and units only (never from a pass's rows: the lanes' tree is part of a row's order). An
// adapter that runs invocations on a CPU
// (lavapipe, SwiftShader) gets 1, where workgroup barriers cost more than they save: each
// invocation then walks all of k for its four columns (with the same per-output code).
override LANES: u32 = 16u;
const WG: u32 = 64u;    // invocations per workgroup; 4 * 64 / LANES columns per workgroup
// Rows per workgroup: 8 on CPU adapters (a group of 1 to 4 rows computes just those, of 5 or 6
// six, of 7 or 8 eight: each row computed costs a CPU adapter its dot products and x loads). GPUs
// (LANES > 1) have two pipelines: ROWS = 4 for passes of up to 4 rows (a decode step, whose
// occupancy the wider branches' registers would cost), and ROWS = 16 for more (verify passes,
// prefill chunks: groups of 5-6, 7-8 and 9-16 rows, so that a pass of up to 16 rows reads each
// weight once). 4, 8 (LANES = 1 only) or 16 (LANES > 1 only).
override ROWS: u32 = 4u;
// WG * min(ROWS, 8): the workgroup memory of the lanes' partial sums (of 8 rows at a time)
override PARTIAL: u32 = 256u;
// WG * ROWS / 4: the workgroup memory of the rows' sums of squares (norm)
override SQUARES: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;        // [n, k / 4]
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;        // [cols, units] blocks of the weight format (runs of rows interleaved on CPU adapters)
@group(0) @binding(4) var<storage, read> bias: array<f32>;           // [whole matrix's columns] or unused
@group(0) @binding(5) var<storage, read_write> y: array<f32>;        // [n, ldy]
@group(0) @binding(6) var<storage, read_write> second: array<u32>;   // K|V cache [context, ldkv] (f32 bits,
                                                                     // or f16 pairs: [context, ldkv / 2]),
                                                                     // or [n, ldy] the scaled copy (f32
                                                                     // bits), or unused
@group(0) @binding(7) var<storage, read> cos_sin: array<vec2<f32>>;  // [context, rope_dim / 2] or unused
@group(0) @binding(8) var<storage, read> x_raw: array<vec4<f32>>;    // [n, k / 4] (norm) or unused
@group(0) @binding(9) var<storage, read> gamma: array<f32>;          // [columns of y] (scaled_copy) or unused

var<workgroup> partial: array<vec4<f32>, PARTIAL>;                 // [WG, min(ROWS, 8)] (4 columns each)
var<workgroup> squares: array<vec4<f32>, SQUARES>;                // [WG, ROWS / 4] (4 rows' sums of squares each)

// The rows of this chunk's weight buffer (shaders/formats/interleave.wgsl)
fn weight_rows() -> u32 {
    return p.cols;
}

// The checkpoint column of output column c: a Halves layout's q/k rows were reordered at load
// into adjacent RoPE pairs, and go back to their columns here.
fn column(c: u32) -> u32 {
    if (p.halves == 1u && c < p.rope_cols) {
        let i = c % p.head_dim;
        if (i < p.rope_dim) { return c - i + i / 2u + (i % 2u) * (p.rope_dim / 2u); }
    }
    return c;
}

// output column c of pass row `row` = v at its place: y (and with `scaled_copy` v * gamma[c] in
// `second`), or (f32) the KV cache past `split`. Not for a residual add (write_added).
fn store(c: u32, row: u32, v: f32) {
    let col = column(c);
    if (col >= p.split) {
        second[cache_row(row) * p.ldkv + col - p.split] = bitcast<u32>(v);
        return;
    }
    let i = row * p.ldy + col;
    y[i] = v;
    if (p.scaled_copy == 1u) { second[i] = bitcast<u32>(v * gamma[col]); }
}

// (accumulate) output column c of pass row `row` += m * f, one fused multiply-add (and with
// `scaled_copy` the sum times gamma[c] in `second`)
fn store_added(c: u32, row: u32, m: f32, f: f32) {
    let i = row * p.ldy + c;
    let out = fma(m, f, y[i]);
    y[i] = out;
    if (p.scaled_copy == 1u) { second[i] = bitcast<u32>(out * gamma[c]); }
}

// (f16 KV cache) output columns c .. c + 3 of pass row `row`, all past `split`, into the cache as
// f16 pairs: each even checkpoint column with its odd neighbour, both among the four (adjacent
// columns, or with a Halves layout columns (i, i + 1) and (i + h, i + h + 1), h = rope_dim / 2
// even: the loader keeps f32 caches otherwise)
fn store_kv(c: u32, row: u32, v: vec4<f32>) {
    let cols = vec4<u32>(column(c), column(c + 1u), column(c + 2u), column(c + 3u));
    let base = cache_row(row) * p.ldkv;
    for (var j = 0u; j < 4u; j++) {
        if (cols[j] % 2u != 0u) { continue; }
        for (var k = 0u; k < 4u; k++) {
            if (cols[k] == cols[j] + 1u) {
                // (clamped to f16's finite range: pack2x16float leaves larger values undefined)
                let pair = clamp(vec2<f32>(v[j], v[k]), vec2<f32>(-65504.0), vec2<f32>(65504.0));
                second[(base + cols[j] - p.split) / 2u] = pack2x16float(pair);
            }
        }
    }
}

// (SHARE) this invocation's load for the unit whose x vectors start at x[i]: x[i + slot8]
// (nothing otherwise: the load stays out of the shader)
fn x_own(inv: Invocation, i: u32) -> vec4<f32> {
    if (SHARE) { return x[i + slot8(inv)]; }
    return vec4<f32>(0.0);
}

// x[i + g] (g < 8) of the unit whose x vectors start at x[i]: loaded, or (SHARE) the subgroup's
// invocation g's load of it (`own`: x_own's)
fn x_at(i: u32, g: u32, own: vec4<f32>) -> vec4<f32> {
    if (SHARE) { return share_vec4(own, g); }
    return x[i + g];
}

// RoPE of the pair (a, b) at within-head columns (i, i + 1) of a row at position `pos`, with the
// angles of a table computed once on the CPU in f64 (every GPU rotates by the same angles)
fn rotate(a: f32, b: f32, i: u32, pos: u32) -> vec2<f32> {
    if (i >= p.rope_dim) { return vec2<f32>(a, b); }
    let cs = cos_sin[pos * (p.rope_dim / 2u) + i / 2u];
    return vec2<f32>(fma(a, cs.x, -(b * cs.y)), fma(a, cs.y, b * cs.x));
}

// The unit of each of an invocation's four columns (cs: their weight rows)
struct Quad { h0: Unit, h1: Unit, h2: Unit, h3: Unit }

// (GPUs) unit u of the four columns, loaded
fn heads(cs: vec4<u32>, u: u32) -> Quad {
    return Quad(unit_head(cs.x, u), unit_head(cs.y, u), unit_head(cs.z, u), unit_head(cs.w, u));
}

// (CPU adapters) span s of the four columns, loaded once for its SPAN units
struct Spans { s0: Span, s1: Span, s2: Span, s3: Span }

fn spans(cs: vec4<u32>, s: u32) -> Spans {
    return Spans(span_load(cs.x, s), span_load(cs.y, s), span_load(cs.z, s), span_load(cs.w, s));
}

// part h of a span of the four columns, loaded once for its PART units
struct Parts { p0: Part, p1: Part, p2: Part, p3: Part }

fn parts(sp: Spans, h: u32) -> Parts {
    return Parts(part_load(sp.s0, h), part_load(sp.s1, h), part_load(sp.s2, h), part_load(sp.s3, h));
}

// unit j of a part of the four columns (no loads)
fn quad(pt: Parts, j: u32) -> Quad {
    return Quad(part_unit(pt.p0, j), part_unit(pt.p1, j), part_unit(pt.p2, j), part_unit(pt.p3, j));
}

// vec4s of x in unit u (groups of 4 weights): 8, fewer only in the last unit of a k that is no multiple of 32, whose
// remaining weights are zero padding
fn valid(u: u32) -> u32 {
    return min(8u, p.k / 4u - 8u * u);
}

// The four columns' weights of group g (4 weights) of a unit, dequantised once for every row
struct Group { w0: vec4<f32>, w1: vec4<f32>, w2: vec4<f32>, w3: vec4<f32> }

fn group(q: Quad, g: u32) -> Group {
    return Group(unit_group(q.h0, g), unit_group(q.h1, g), unit_group(q.h2, g), unit_group(q.h3, g));
}

// The group's four dot products with one row's vector of x (column j in component j), in k order
// as explicit fused multiply-adds: x0 w0, then + x1 w1, + x2 w2, + x3 w3. Neither `dot` nor
// `a * b + c`: a compiler may contract those into fused multiply-adds differently in each
// pipeline and in each branch of row groups, and a row's bits must not depend on which ran it
// (every float operation of this file is written so: tests/kernels.rs,
// no_kernel_arithmetic_can_be_contracted).
fn dots(ws: Group, xv: vec4<f32>) -> vec4<f32> {
    let m = vec4<f32>(ws.w0.x, ws.w1.x, ws.w2.x, ws.w3.x) * xv.x;
    let s = fma(vec4<f32>(ws.w0.y, ws.w1.y, ws.w2.y, ws.w3.y), vec4<f32>(xv.y), m);
    let t = fma(vec4<f32>(ws.w0.z, ws.w1.z, ws.w2.z, ws.w3.z), vec4<f32>(xv.z), s);
    return fma(vec4<f32>(ws.w0.w, ws.w1.w, ws.w2.w, ws.w3.w), vec4<f32>(xv.w), t);
}

// a += dots(ws, xv)
fn add_dots(a: ptr<function, vec4<f32>>, ws: Group, xv: vec4<f32>) {
    *a += dots(ws, xv);
}

// The sums of squares of four vectors (one of each of four rows), in component order as dots'
// (explicit fused multiply-adds)
fn squares4(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>) -> vec4<f32> {
    let e0 = vec4<f32>(a.x, b.x, c.x, d.x);
    let e1 = vec4<f32>(a.y, b.y, c.y, d.y);
    let e2 = vec4<f32>(a.z, b.z, c.z, d.z);
    let e3 = vec4<f32>(a.w, b.w, c.w, d.w);
    return fma(e3, e3, fma(e2, e2, fma(e1, e1, e0 * e0)));
}

// Whole unit u of the four columns (q) applied to row r0 (a group of one row): a0 += the four
// sums. With SHARE an invocation loads one vector of x per unit and row; otherwise x_at loads
// each. The groups are written out: on a CPU adapter a loop over them picks each group's word by
// a run-time index, shifts by run-time amounts and stores the sums back under the loop's mask
// every group; written out, the picks and shifts are constants and the sums stay in registers
// until the unit ends (5% less time for a decode step's Q4_K matmuls on lavapipe). The same
// operations in the same order as a loop (apply1_partial's): the same bits. Groups of more rows
// keep the loop: written out, 2 and 4 rows measured no faster, and 6 rows 3% slower (likely
// because their sums and the group's weights no longer fit in registers).
fn apply1(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>) {
    let xi = r0 * (p.k / 4u) + 8u * u;
    let own = x_own(inv, xi);
    var a = *a0;
    add_dots(&a, group(q, 0u), x_at(xi, 0u, own));
    add_dots(&a, group(q, 1u), x_at(xi, 1u, own));
    add_dots(&a, group(q, 2u), x_at(xi, 2u, own));
    add_dots(&a, group(q, 3u), x_at(xi, 3u, own));
    add_dots(&a, group(q, 4u), x_at(xi, 4u, own));
    add_dots(&a, group(q, 5u), x_at(xi, 5u, own));
    add_dots(&a, group(q, 6u), x_at(xi, 6u, own));
    add_dots(&a, group(q, 7u), x_at(xi, 7u, own));
    *a0 = a;
}

// Any unit u (a row's last, partial where k is no multiple of 32, too) of the four columns
// applied to row r0: a0 += the four sums, a group at a time (`own`: past a row's end in a partial
// unit, never used). Kept apart from apply1: a CPU adapter runs a loop's body once more with every
// lane masked off, so a loop beside apply1's written-out groups, even one that never runs, cost
// each unit a group's work (a decode step's Q4_K matmuls took 11% longer on lavapipe).
fn apply1_partial(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>) {
    let xi = r0 * (p.k / 4u) + 8u * u;
    let own = x_own(inv, xi);
    for (var g = 0u; g < valid(u); g++) {
        add_dots(a0, group(q, g), x_at(xi, g, own));
    }
}

// unit u of the four columns applied to rows r0, r0 + 1 (a group of 2 rows). The groups of apply2
// .. apply8 loop with the exit test at the end (every unit has at least one group): a CPU adapter
// runs a loop whose test comes first once more with every lane masked off, a ninth group's work
// per unit (3% of a 5-row pass on lavapipe).
fn apply2(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>,
          a1: ptr<function, vec4<f32>>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    let own0 = x_own(inv, xi);
    let own1 = x_own(inv, xi + k4);
    var g = 0u;
    loop {
        let ws = group(q, g);
        add_dots(a0, ws, x_at(xi, g, own0));
        add_dots(a1, ws, x_at(xi + k4, g, own1));
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// unit u of the four columns applied to rows r0 .. r0 + 2 (a group of 3 rows)
fn apply3(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>,
          a1: ptr<function, vec4<f32>>, a2: ptr<function, vec4<f32>>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    let own0 = x_own(inv, xi);
    let own1 = x_own(inv, xi + k4);
    let own2 = x_own(inv, xi + 2u * k4);
    var g = 0u;
    loop {
        let ws = group(q, g);
        add_dots(a0, ws, x_at(xi, g, own0));
        add_dots(a1, ws, x_at(xi + k4, g, own1));
        add_dots(a2, ws, x_at(xi + 2u * k4, g, own2));
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// unit u of the four columns applied to rows r0 .. r0 + 3 (a group of 4 rows)
fn apply4(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>,
          a1: ptr<function, vec4<f32>>, a2: ptr<function, vec4<f32>>, a3: ptr<function, vec4<f32>>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    let own0 = x_own(inv, xi);
    let own1 = x_own(inv, xi + k4);
    let own2 = x_own(inv, xi + 2u * k4);
    let own3 = x_own(inv, xi + 3u * k4);
    var g = 0u;
    loop {
        let ws = group(q, g);
        add_dots(a0, ws, x_at(xi, g, own0));
        add_dots(a1, ws, x_at(xi + k4, g, own1));
        add_dots(a2, ws, x_at(xi + 2u * k4, g, own2));
        add_dots(a3, ws, x_at(xi + 3u * k4, g, own3));
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// unit u of the four columns applied to rows r0 .. r0 + 5 (a group of 5 or 6 rows: CPU adapters,
// GPUs' 16-row pipeline)
fn apply6(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>,
          a1: ptr<function, vec4<f32>>, a2: ptr<function, vec4<f32>>, a3: ptr<function, vec4<f32>>,
          a4: ptr<function, vec4<f32>>, a5: ptr<function, vec4<f32>>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    let own0 = x_own(inv, xi);
    let own1 = x_own(inv, xi + k4);
    let own2 = x_own(inv, xi + 2u * k4);
    let own3 = x_own(inv, xi + 3u * k4);
    let own4 = x_own(inv, xi + 4u * k4);
    let own5 = x_own(inv, xi + 5u * k4);
    var g = 0u;
    loop {
        let ws = group(q, g);
        add_dots(a0, ws, x_at(xi, g, own0));
        add_dots(a1, ws, x_at(xi + k4, g, own1));
        add_dots(a2, ws, x_at(xi + 2u * k4, g, own2));
        add_dots(a3, ws, x_at(xi + 3u * k4, g, own3));
        add_dots(a4, ws, x_at(xi + 4u * k4, g, own4));
        add_dots(a5, ws, x_at(xi + 5u * k4, g, own5));
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// unit u of the four columns applied to rows r0 .. r0 + 7 (a group of 7 or 8 rows: CPU adapters,
// GPUs' 16-row pipeline)
fn apply8(q: Quad, u: u32, r0: u32, inv: Invocation, a0: ptr<function, vec4<f32>>,
          a1: ptr<function, vec4<f32>>, a2: ptr<function, vec4<f32>>, a3: ptr<function, vec4<f32>>,
          a4: ptr<function, vec4<f32>>, a5: ptr<function, vec4<f32>>, a6: ptr<function, vec4<f32>>,
          a7: ptr<function, vec4<f32>>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    let own0 = x_own(inv, xi);
    let own1 = x_own(inv, xi + k4);
    let own2 = x_own(inv, xi + 2u * k4);
    let own3 = x_own(inv, xi + 3u * k4);
    let own4 = x_own(inv, xi + 4u * k4);
    let own5 = x_own(inv, xi + 5u * k4);
    let own6 = x_own(inv, xi + 6u * k4);
    let own7 = x_own(inv, xi + 7u * k4);
    var g = 0u;
    loop {
        let ws = group(q, g);
        add_dots(a0, ws, x_at(xi, g, own0));
        add_dots(a1, ws, x_at(xi + k4, g, own1));
        add_dots(a2, ws, x_at(xi + 2u * k4, g, own2));
        add_dots(a3, ws, x_at(xi + 3u * k4, g, own3));
        add_dots(a4, ws, x_at(xi + 4u * k4, g, own4));
        add_dots(a5, ws, x_at(xi + 5u * k4, g, own5));
        add_dots(a6, ws, x_at(xi + 6u * k4, g, own6));
        add_dots(a7, ws, x_at(xi + 7u * k4, g, own7));
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// The sums of a group of 16 rows (GPUs): one struct, so that apply16 takes one pointer (a
// function may not take a pointer into a variable's member everywhere WGSL runs)
struct Acc16 {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
    a8: vec4<f32>, a9: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>,
    a12: vec4<f32>, a13: vec4<f32>, a14: vec4<f32>, a15: vec4<f32>,
}

// unit u of the four columns applied to rows r0 .. r0 + 15 (a group of 9 to 16 rows; GPUs, whose
// invocations load their own x: no SHARE)
fn apply16(q: Quad, u: u32, r0: u32, a: ptr<function, Acc16>) {
    let k4 = p.k / 4u;
    let xi = r0 * k4 + 8u * u;
    var g = 0u;
    loop {
        let ws = group(q, g);
        let xg = xi + g;
        (*a).a0 += dots(ws, x[xg]);
        (*a).a1 += dots(ws, x[xg + k4]);
        (*a).a2 += dots(ws, x[xg + 2u * k4]);
        (*a).a3 += dots(ws, x[xg + 3u * k4]);
        (*a).a4 += dots(ws, x[xg + 4u * k4]);
        (*a).a5 += dots(ws, x[xg + 5u * k4]);
        (*a).a6 += dots(ws, x[xg + 6u * k4]);
        (*a).a7 += dots(ws, x[xg + 7u * k4]);
        (*a).a8 += dots(ws, x[xg + 8u * k4]);
        (*a).a9 += dots(ws, x[xg + 9u * k4]);
        (*a).a10 += dots(ws, x[xg + 10u * k4]);
        (*a).a11 += dots(ws, x[xg + 11u * k4]);
        (*a).a12 += dots(ws, x[xg + 12u * k4]);
        (*a).a13 += dots(ws, x[xg + 13u * k4]);
        (*a).a14 += dots(ws, x[xg + 14u * k4]);
        (*a).a15 += dots(ws, x[xg + 15u * k4]);
        continuing {
            g++;
            break if g >= valid(u);
        }
    }
}

// (LANES > 1) the partial sums `v` of m rows (at most 8) of every lane of each column quad,
// added by a fixed tree in workgroup memory; lane 0's v then holds the quad's sums (the others'
// partial sums of the tree). Called in uniform control flow (it has barriers); it ends past its
// last barrier with reads of the invocation's own slots only, so a second call may follow.
fn add_lanes(t: u32, lane: u32, m: u32, v: ptr<function, array<vec4<f32>, 8>>) {
    let per = min(ROWS, 8u); // rows per invocation in `partial`
    for (var r = 0u; r < m; r++) { partial[t * per + r] = (*v)[r]; }
    workgroupBarrier();
    for (var stride = LANES / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            for (var r = 0u; r < m; r++) {
                partial[t * per + r] += partial[(t + stride) * per + r];
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < m; r++) { (*v)[r] = partial[t * per + r]; }
}

// The bias of output columns c .. c + 3 of the whole matrix (those up to `last`'s)
fn bias4(c: u32, c0: u32, last: u32) -> vec4<f32> {
    return vec4<f32>(bias[c], bias[c + min(1u, last - c0)], bias[c + min(2u, last - c0)],
                     bias[c + min(3u, last - c0)]);
}

// A gate's activation: SiLU, or (gelu) GELU's tanh approximation
//   0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
// (its constants the f32 values nearest, in hex: Tint refuses an inexact literal; the cubic's
// add through an explicit fma). tanh's argument is clamped to +-10, where tanh is +-1 in f32
// (from 9.01 on): WGSL's tanh inherits sinh / cosh's accuracy, and SwiftShader's overflows to
// NaN for large arguments (Gemma's gates reach them).
fn activation(g: f32) -> f32 {
    if (p.gelu == 1u) {
        let inner = 0x1.988454p-1 * fma(0x1.6e4e26p-5 * g * g, g, g);
        return 0.5 * g * (1.0 + tanh(clamp(inner, -10.0, 10.0)));
    }
    return g / (1.0 + exp(-g));
}

// The epilogue of output columns c0 .. c0 + 3 (those up to `last`) of pass row `row`: `sums`, their
// four sums, times `scale` (the row's 1 / rms, or 1), through the params' epilogues to their
// places. No product meets an add but in an explicit fused multiply-add (the bias, RoPE, the
// residual add): see `dots`.
fn write_out(c0: u32, last: u32, row: u32, sums: vec4<f32>, scale: f32) {
    let c = p.col_offset + c0;
    if (p.accumulate == 1u) {
        write_added(c0, last, row, sums, scale);
        return;
    }
    if (p.glu == 1u) {
        // (gate, up) pairs: columns c0, c0 + 1 and c0 + 2, c0 + 3 (cols is even); output column
        // c / 2 of the pair: silu(gate) * up, or (gelu) gelu(gate) * up
        let v = sums * scale;
        store(c / 2u, row, activation(v.x) * v.y);
        if (c0 + 2u <= last) { store(c / 2u + 1u, row, activation(v.z) * v.w); }
        return;
    }
    var v = sums * scale;
    if (p.has_bias == 1u) { v = fma(sums, vec4<f32>(scale), bias4(c, c0, last)); }
    if (p.silu == 1u) { v = v / (1.0 + exp(-v)); }
    if (c < p.rope_cols) {
        let i = c % p.head_dim;
        let pos = row_pos(row);
        v = vec4<f32>(rotate(v.x, v.y, i, pos), rotate(v.z, v.w, i + 2u, pos));
    }
    if (p.kv_f16 == 1u && column(c) >= p.split) {
        store_kv(c, row, v);
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (c0 + j <= last) { store(c + j, row, v[j]); }
    }
}

// (accumulate: a residual add, as `wo`, `down` and a Medusa block's; never with glu, RoPE or the
// KV cache) y += sums * scale (+ bias, then SiLU), each output's last operation one fused
// multiply-add onto y
fn write_added(c0: u32, last: u32, row: u32, sums: vec4<f32>, scale: f32) {
    let c = p.col_offset + c0;
    let n = min(4u, last + 1u - c0); // the columns of the four up to `last`
    if (p.silu == 1u) {
        // y += v * sigmoid(v)
        var v = sums * scale;
        if (p.has_bias == 1u) { v = fma(sums, vec4<f32>(scale), bias4(c, c0, last)); }
        let f = 1.0 / (1.0 + exp(-v));
        for (var j = 0u; j < n; j++) { store_added(c + j, row, v[j], f[j]); }
    } else if (p.has_bias == 1u) {
        // y += (sums * scale + bias)
        let v = fma(sums, vec4<f32>(scale), bias4(c, c0, last));
        for (var j = 0u; j < n; j++) { store_added(c + j, row, v[j], 1.0); }
    } else {
        for (var j = 0u; j < n; j++) { store_added(c + j, row, sums[j], scale); }
    }
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = inv.lid.x;
    let lane = t % LANES;
    let c0 = 4u * (wid.y * (WG / LANES) + t / LANES); // first of this invocation's four columns
    let r0 = wid.x * ROWS;
    // (a grid sized for more rows than the pass has: a draft tree's passes, whose rows the GPU
    // chooses)
    if (r0 >= step.n) { return; }
    let nr = min(ROWS, step.n - r0); // rows of this group
    let k4 = p.k / 4u;
    // columns past the chunk's stored ones read the last of them (their sums are never stored)
    let last = p.stored - 1u;
    let cs = vec4<u32>(min(c0, last), min(c0 + 1u, last), min(c0 + 2u, last), min(c0 + 3u, last));

    // 0. (norm) 1 / rms of each row of the group: the workgroup's invocations take strided vec4s
    //    of x_raw, then a fixed tree adds their sums (the same order for every pass size)
    //    (rows r0 .. r0 + 3, then r0 + 4 .. r0 + 7, ... as far as the group reaches)
    var inv_rms = array<vec4<f32>, 4>(vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0));
    if (p.norm == 1u) {
        let quads = (nr + 3u) / 4u;
        var sq = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        for (var h = 0u; h < quads; h++) {
            let r = r0 + 4u * h;
            for (var i = t; i < k4; i += WG) {
                let a = x_raw[r * k4 + i];
                let b = x_raw[(r + 1u) * k4 + i];
                let c = x_raw[(r + 2u) * k4 + i];
                let d = x_raw[(r + 3u) * k4 + i];
                sq[h] += squares4(a, b, c, d);
            }
        }
        // (q: the pipeline's vec4s of sums per invocation, a constant trip count)
        let q = ROWS / 4u;
        for (var h = 0u; h < q; h++) { squares[t * q + h] = sq[h]; }
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (t < stride) {
                for (var h = 0u; h < q; h++) { squares[t * q + h] += squares[(t + stride) * q + h]; }
            }
            workgroupBarrier();
        }
        // (mean + eps as one fused multiply-add by 1 / k: a division may be a multiply by a
        // reciprocal, which a compiler could contract with the add)
        let inv_k = vec4<f32>(1.0 / f32(p.k));
        for (var h = 0u; h < q; h++) { inv_rms[h] = 1.0 / sqrt(fma(squares[h], inv_k, vec4<f32>(p.eps))); }
    }

    // 1. this lane's share of k: units lane, lane + LANES, ... Each group of 4 weights of the four
    //    columns is dequantised once and applied to every row, each vec4 of x is loaded once and
    //    applied to the four columns (apply1 .. apply16). a0 .. a7 hold rows r0 .. r0 + 7 for the
    //    four columns (`wide` all 16 of a group of 9 to 16); every output is one accumulator
    //    summed in k order within the lane, by the same operations whatever kind of group
    //    computes it (group, dots). Groups of 1 to 4 rows (a decode step, verify passes of K = 1
    //    to 3) have a loop each; a group of 5 or 6 computes six rows, of 7 or 8 all eight, of 9 to
    //    16 all sixteen, without a branch per row (CPU adapters would run masked rows anyway):
    //    rows past n read finite values of the x buffer and are never stored. An invocation whose
    //    columns are past the chunk skips the loop, unless another of its subgroup runs it with
    //    SHARE (sharing x by shuffles needs the whole subgroup; it then reads the last column and
    //    stores nothing).
    //    On CPU adapters (LANES = 1, every unit in order) the units come a span at a time, and
    //    within it a part at a time: the words the format's units share (a K-quant block's scale
    //    words, the quant bytes of two sub-blocks) are loaded once (span_load, part_load), and
    //    each unit is taken from them (part_unit). Loads are what a CPU adapter's invocation pays
    //    for most; the sums and their order are unchanged.
    // (named accumulators, not an array: an array indexed by a loop variable below would
    // live in memory on CPU adapters, every += of the loop a load and a store)
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    var wide: Acc16; // (rows r0 .. r0 + 15 of a group of 9 to 16; zeros otherwise)
    // units of the row: none where this invocation has no columns in the chunk (with SHARE: where
    // no invocation of its subgroup has)
    let units = select(0u, p.units, share_any(c0 <= last));
    // (one loop nest per kind of row group: the accumulators a group does not use stay out of its
    // loop, where they would hold registers; each nest loops over spans, parts and units on CPU
    // adapters, over units on GPUs)
    if (nr == 1u) {
        if (LANES == 1u) {
            // whole units a span at a time (every unit of a K-quant row, whose spans are whole
            // too), then a row's last unit where it is partial (span_one formats: spans and parts
            // of one unit)
            let whole = min(units, p.k / 32u);
            for (var s = 0u; s * SPAN < whole; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply1(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0);
                    }
                }
            }
            if (whole < units) {
                let pt = parts(spans(cs, whole / SPAN), whole % SPAN / PART);
                apply1_partial(quad(pt, whole % PART), whole, r0, inv, &a0);
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                if (valid(u) == 8u) {
                    apply1(heads(cs, u), u, r0, inv, &a0);
                } else {
                    apply1_partial(heads(cs, u), u, r0, inv, &a0);
                }
            }
        }
    } else if (nr == 2u) {
        if (LANES == 1u) {
            for (var s = 0u; s * SPAN < units; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply2(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0, &a1);
                    }
                }
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                apply2(heads(cs, u), u, r0, inv, &a0, &a1);
            }
        }
    } else if (nr == 3u) {
        if (LANES == 1u) {
            for (var s = 0u; s * SPAN < units; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply3(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0, &a1, &a2);
                    }
                }
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                apply3(heads(cs, u), u, r0, inv, &a0, &a1, &a2);
            }
        }
    } else if (ROWS <= 4u || nr == 4u) {
        if (LANES == 1u) {
            for (var s = 0u; s * SPAN < units; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply4(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0, &a1, &a2, &a3);
                    }
                }
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                apply4(heads(cs, u), u, r0, inv, &a0, &a1, &a2, &a3);
            }
        }
    } else if (nr <= 6u) {
        if (LANES == 1u) {
            for (var s = 0u; s * SPAN < units; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply6(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0, &a1, &a2, &a3, &a4, &a5);
                    }
                }
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                apply6(heads(cs, u), u, r0, inv, &a0, &a1, &a2, &a3, &a4, &a5);
            }
        }
    } else if (ROWS <= 8u || nr <= 8u) {
        if (LANES == 1u) {
            for (var s = 0u; s * SPAN < units; s++) {
                let sp = spans(cs, s);
                for (var h = 0u; h < SPAN / PART; h++) {
                    let pt = parts(sp, h);
                    for (var j = 0u; j < PART; j++) {
                        apply8(quad(pt, j), s * SPAN + h * PART + j, r0, inv, &a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7);
                    }
                }
            }
        } else {
            for (var u = lane; u < units; u += LANES) {
                apply8(heads(cs, u), u, r0, inv, &a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7);
            }
        }
    } else {
        // (GPUs' ROWS = 16 pipeline: 9 to 16 rows)
        for (var u = lane; u < units; u += LANES) {
            apply16(heads(cs, u), u, r0, &wide);
        }
        a0 = wide.a0;
        a1 = wide.a1;
        a2 = wide.a2;
        a3 = wide.a3;
        a4 = wide.a4;
        a5 = wide.a5;
        a6 = wide.a6;
        a7 = wide.a7;
    }

    var acc = array<vec4<f32>, 8>(a0, a1, a2, a3, a4, a5, a6, a7);
    // (rows r0 + 8 .. r0 + 15 of a group of 9 to 16; unused otherwise)
    var hi = array<vec4<f32>, 8>(wide.a8, wide.a9, wide.a10, wide.a11, wide.a12, wide.a13, wide.a14,
                                 wide.a15);

    // 2. the LANES partial sums of each output, added by a fixed tree in workgroup memory
    //    (the group's nr rows only, 8 at a time)
    if (LANES > 1u) {
        add_lanes(t, lane, min(nr, 8u), &acc);
        if (ROWS > 8u && nr > 8u) { add_lanes(t, lane, nr - 8u, &hi); }
    }

    // 3. lane 0 writes the outputs of its columns (c = col_offset + c0 + j of the whole matrix)
    if (lane == 0u && c0 <= last) {
        for (var r = 0u; r < min(nr, 8u); r++) {
            write_out(c0, last, r0 + r, acc[r], inv_rms[r / 4u][r % 4u]);
        }
        if (ROWS > 8u) {
            for (var r = 8u; r < nr; r++) {
                write_out(c0, last, r0 + r, hi[r - 8u], inv_rms[r / 4u][r % 4u]);
            }
        }
    }
}
