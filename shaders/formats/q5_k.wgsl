// Weight format Q5_K (ggml block_q5_K, 256 elements in eleven vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins (as
//   Q4_K); words 4..11: qh, 32 bytes of fifth bits; words 12..43: qs, 128 bytes of nibbles.
//   Element l of sub-block s (elements 32s .. 32s + 32) takes its low four bits from nibble s % 2
//   of qs[32 (s / 2) + l] and its fifth bit from bit s of qh[l]; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block u / 8 of the row (stored at
// stored_block(row, u / 8, per_row), shaders/formats/interleave.wgsl). A span
// is a super-block: its scale words and qh (every sub-block reads all of qh), loaded once for its
// eight units; a part is two sub-blocks (2h and 2h + 1 read the same 32 bytes of qs, low and high
// nibbles), loaded once for both.
// Dequantised in f32 exactly as ggml's dequantize_row_q5_K ((d * sc) * q is exact: 11 + 6 + 5
// significant bits, so a fused multiply-add rounds the same). Included ahead of an op (matmul,
// embed) that declares `w: array<vec4<u32>>` and `p.units`; the op reads a unit with `unit_head`,
// or (matmul on CPU adapters) a span and its parts at a time with `span_load`, `part_load` and
// `part_unit`, and calls `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit {
    q0: vec4<u32>, q1: vec4<u32>, // the 32 bytes of qs this unit reads
    h0: vec4<u32>, h1: vec4<u32>, // qh, all 32 bytes (one bit of each is this unit's)
    sl: u32,                      // nibble shift in qs: 0 or 4
    sh: u32,                      // bit of qh: the sub-block s
    scale: vec4<f32>,             // d * sc * BYTE_PLACES (each byte's field in place: shaders/formats/bytes.wgsl)
    mn: f32,                      // dmin * m
}

const SPAN: u32 = 8u;
const PART: u32 = 2u;
struct Span { head: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, base: u32 } // base: the block's first vec4
struct Part { head: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, q0: vec4<u32>, q1: vec4<u32>, first: u32 }

fn span_load(row: u32, s: u32) -> Span {
    let base = stored_block(row, s, p.units / 8u) * 11u; // shaders/formats/interleave.wgsl
    return Span(w[base], w[base + 1u], w[base + 2u], base);
}

// sub-blocks 2h and 2h + 1: bytes 32h .. 32h + 32 of qs
fn part_load(sp: Span, h: u32) -> Part {
    let q = sp.base + 3u + 2u * h;
    return Part(sp.head, sp.h0, sp.h1, w[q], w[q + 1u], 2u * h);
}

fn part_unit(pt: Part, j: u32) -> Unit {
    let s = pt.first + j;
    let dd = unpack2x16float(pt.head.x);
    let sm = k_scale_min(pt.head.yzw, s); // shaders/formats/k_scales.wgsl
    return Unit(pt.q0, pt.q1, pt.h0, pt.h1, 4u * (s % 2u), s, dd.x * f32(sm.x) * BYTE_PLACES, dd.y * f32(sm.y));
}

fn unit_head(row: u32, u: u32) -> Unit {
    return part_unit(part_load(span_load(row, u / SPAN), u % SPAN / PART), u % PART);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let qw = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    let hw = select(h.h1[g % 4u], h.h0[g % 4u], g < 4u);
    // the four 5-bit quants, one per byte: the low nibbles and the fifth bits (bit sh of each qh byte)
    let q = ((qw >> h.sl) & 0x0F0F0F0Fu) | (((hw >> h.sh) & 0x01010101u) << 4u);
    // (an explicit fused multiply-add, the same bits as scale * q - mn: shaders/matmul.wgsl, dots)
    return fma(h.scale, vec4<f32>(byte_fields(q, 5u)), vec4<f32>(-h.mn));
}
