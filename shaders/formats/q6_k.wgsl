// Weight format Q6_K (ggml block_q6_K, 256 elements), in two sections:
//   quants: block j of row r is thirteen vec4<u32> at vec4 index 13 stored_block(r, j, per_row)
//           (shaders/formats/interleave.wgsl): ql (128 bytes), qh (64 bytes), the 16 signed
//           scale bytes, as the file stores them
//   scales: d of block b = r * blocks per row + j is f16 number b of the section starting at u32
//           word p.scale_base (rows in order)
// Element e = 128h + r of a block: low 4 bits from ql[64h + r % 64] (nibble r / 64), high 2 bits
// from qh[32h + r % 32] (bits 2 (r / 32)); x = (d * scales[e / 16]) * (q - 32).
// A unit is 32 elements: unit u of row `row` lives in block u / 8 of the row. A span is a half
// block (units 4h .. 4h + 3: 128 elements, which read the same 64 bytes of ql, two units each, and
// the same 32 bytes of qh): loaded once for its four units, with its d and scale bytes; its one part
// is the span itself.
// Dequantised in f32 exactly as ggml's dequantize_row_q6_K. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`; the op reads a unit with
// `unit_head`, or (matmul on CPU adapters) SPAN units at a time with `span_load`, `part_load` and
// `part_unit`, and calls `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit {
    l0: vec4<u32>, l1: vec4<u32>, // the 32 bytes of ql this unit reads
    h0: vec4<u32>, h1: vec4<u32>, // the 32 bytes of qh
    sl: u32,                      // nibble shift in ql
    sh: u32,                      // 2-bit shift in qh
    sc0: f32,                     // d * scale of elements 0..15 of the unit
    sc1: f32,                     // d * scale of elements 16..31
}

const SPAN: u32 = 4u;
const PART: u32 = 4u;
struct Span {
    l: array<vec4<u32>, 4>,       // the half's 64 bytes of ql
    h0: vec4<u32>, h1: vec4<u32>, // its 32 bytes of qh
    sc: vec2<u32>,                // its 8 scale bytes (two per unit)
    d: f32,
}

// unit jj (0..4) of a half block from its words: the 32 bytes of ql it reads (l0, l1), the half's
// qh and 8 scale bytes (bytes 2 jj and 2 jj + 1 are the unit's) and the block's d
fn half_unit(l0: vec4<u32>, l1: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, sc: vec2<u32>, jj: u32,
             d: f32) -> Unit {
    let word = select(sc.x, sc.y, jj >= 2u);
    let sc0 = extractBits(bitcast<i32>(word), 16u * (jj % 2u), 8u);
    let sc1 = extractBits(bitcast<i32>(word), 16u * (jj % 2u) + 8u, 8u);
    return Unit(l0, l1, h0, h1, 4u * (jj / 2u), 2u * jj, d * f32(sc0), d * f32(sc1));
}

// d of block b
fn block_d(b: u32) -> f32 {
    let s = p.scale_base + b / 2u;
    return unpack2x16float(w[s / 4u][s % 4u])[b % 2u];
}

// (one unit: GPUs, embed) only the words the unit reads
fn unit_head(row: u32, u: u32) -> Unit {
    let b = (row * p.units + u) / 8u;
    let base = 13u * stored_block(row, u / 8u, p.units / 8u); // shaders/formats/interleave.wgsl
    let half = u % 8u / 4u;
    let jj = u % 4u;
    let l = base + 4u * half + 2u * (jj % 2u);
    let hq = base + 8u + 2u * half;
    let sc = vec2<u32>(w[base + 12u][2u * half], w[base + 12u][2u * half + 1u]);
    return half_unit(w[l], w[l + 1u], w[hq], w[hq + 1u], sc, jj, block_d(b));
}

fn span_load(row: u32, s: u32) -> Span {
    let b = (row * p.units + SPAN * s) / 8u;
    let half = s % 2u;
    let base = 13u * stored_block(row, s / 2u, p.units / 8u);
    let l = base + 4u * half;
    let hq = base + 8u + 2u * half;
    let sc = vec2<u32>(w[base + 12u][2u * half], w[base + 12u][2u * half + 1u]);
    return Span(array<vec4<u32>, 4>(w[l], w[l + 1u], w[l + 2u], w[l + 3u]), w[hq], w[hq + 1u], sc,
                block_d(b));
}

alias Part = Span;

fn part_load(sp: Span, h: u32) -> Part {
    return sp;
}

// unit jj of the span: ql bytes 32 (jj % 2) .. + 32 of the half (nibble jj / 2); picked by
// selects (an array indexed by jj would live in memory on CPU adapters)
fn part_unit(sp: Part, jj: u32) -> Unit {
    let odd = jj % 2u == 1u;
    return half_unit(select(sp.l[0], sp.l[2], odd), select(sp.l[1], sp.l[3], odd), sp.h0, sp.h1,
                     sp.sc, jj, sp.d);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let lw = select(h.l1[g % 4u], h.l0[g % 4u], g < 4u);
    let hw = select(h.h1[g % 4u], h.h0[g % 4u], g < 4u);
    // the four 6-bit quants q, one per byte (a word's bytes at once), each xor 32: that is q - 32
    // as a 6-bit two's complement field
    let q = (((lw >> h.sl) & 0x0F0F0F0Fu) | (((hw >> h.sh) & 0x03030303u) << 4u)) ^ 0x20202020u;
    // field j moved to the top of a word and shifted back with its sign: q_j - 32
    let s = bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(26u, 18u, 10u, 2u)) >> vec4<u32>(26u);
    return select(h.sc1, h.sc0, g < 4u) * vec4<f32>(s);
}
