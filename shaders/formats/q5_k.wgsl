// Weight format Q5_K (ggml block_q5_K, 256 elements in eleven vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins (as
//   Q4_K); words 4..11: qh, 32 bytes of fifth bits; words 12..43: qs, 128 bytes of nibbles.
//   Element l of sub-block s (elements 32s .. 32s + 32) takes its low four bits from nibble s % 2
//   of qs[32 (s / 2) + l] and its fifth bit from bit s of qh[l]; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block (row * units + u) / 8. A span
// is two (sub-blocks 2i and 2i + 1 read the same 32 bytes of qs, low and high nibbles, and every
// sub-block all of qh): loaded once for both, with the block's scale words.
// Dequantised in f32 exactly as ggml's dequantize_row_q5_K ((d * sc) * q is exact: 11 + 6 + 5
// significant bits, so a fused multiply-add rounds the same). Included ahead of an op (matmul,
// embed) that declares `w: array<vec4<u32>>` and `p.units`; the op reads a unit with `unit_head`,
// or (matmul on CPU adapters) SPAN units at a time with `span_load` and `span_unit`, and calls
// `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit {
    q0: vec4<u32>, q1: vec4<u32>, // the 32 bytes of qs this unit reads
    h0: vec4<u32>, h1: vec4<u32>, // qh, all 32 bytes (one bit of each is this unit's)
    sl: u32,                      // nibble shift in qs: 0 or 4
    sh: u32,                      // bit of qh: the sub-block s
    scale: f32,                   // d * sc
    mn: f32,                      // dmin * m
}

const SPAN: u32 = 2u;
struct Span { head: vec4<u32>, q0: vec4<u32>, q1: vec4<u32>, h0: vec4<u32>, h1: vec4<u32>, first: u32 }

fn span_load(row: u32, s: u32) -> Span {
    let base = (row * p.units + SPAN * s) / 8u * 11u;
    let first = SPAN * s % 8u; // sub-block of the span's first unit
    let q = base + 3u + 2u * (first / 2u);
    return Span(w[base], w[q], w[q + 1u], w[base + 1u], w[base + 2u], first);
}

fn span_unit(sp: Span, j: u32) -> Unit {
    let s = sp.first + j;
    let dd = unpack2x16float(sp.head.x);
    let sm = k_scale_min(sp.head.yzw, s); // shaders/formats/k_scales.wgsl
    return Unit(sp.q0, sp.q1, sp.h0, sp.h1, 4u * (s % 2u), s, dd.x * f32(sm.x), dd.y * f32(sm.y));
}

fn unit_head(row: u32, u: u32) -> Unit {
    return span_unit(span_load(row, u / SPAN), u % SPAN);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let qw = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    let hw = select(h.h1[g % 4u], h.h0[g % 4u], g < 4u);
    let lo = (vec4<u32>(qw) >> vec4<u32>(h.sl, h.sl + 8u, h.sl + 16u, h.sl + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(hw) >> vec4<u32>(h.sh, h.sh + 8u, h.sh + 16u, h.sh + 24u)) & vec4<u32>(1u);
    return h.scale * vec4<f32>(lo | (hi << vec4<u32>(4u))) - h.mn;
}
