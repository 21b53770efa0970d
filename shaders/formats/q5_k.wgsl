// Weight format Q5_K (ggml block_q5_K, 256 elements in eleven vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins (as
//   Q4_K); words 4..11: qh, 32 bytes of fifth bits; words 12..43: qs, 128 bytes of nibbles.
//   Element l of sub-block s (elements 32s .. 32s + 32) takes its low four bits from nibble s % 2
//   of qs[32 (s / 2) + l] and its fifth bit from bit s of qh[l]; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block (row * units + u) / 8.
// Dequantised in f32 exactly as ggml's dequantize_row_q5_K ((d * sc) * q is exact: 11 + 6 + 5
// significant bits, so a fused multiply-add rounds the same). Included ahead of an op (matmul,
// embed) that declares `w: array<vec4<u32>>` and `p.units`; the op calls `unit_head` once per
// unit and `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit {
    q0: vec4<u32>, q1: vec4<u32>, // the 32 bytes of qs this unit reads
    h0: vec4<u32>, h1: vec4<u32>, // qh, all 32 bytes (one bit of each is this unit's)
    sl: u32,                      // nibble shift in qs: 0 or 4
    sh: u32,                      // bit of qh: the sub-block s
    scale: f32,                   // d * sc
    mn: f32,                      // dmin * m
}

fn unit_head(row: u32, u: u32) -> Unit {
    let base = (row * p.units + u) / 8u * 11u;
    let s = u % 8u;
    let head = w[base];
    let dd = unpack2x16float(head.x);
    let sm = k_scale_min(head.yzw, s); // shaders/formats/k_scales.wgsl
    let q = base + 3u + 2u * (s / 2u);
    return Unit(w[q], w[q + 1u], w[base + 1u], w[base + 2u], 4u * (s % 2u), s, dd.x * f32(sm.x), dd.y * f32(sm.y));
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let qw = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    let hw = select(h.h1[g % 4u], h.h0[g % 4u], g < 4u);
    let lo = (vec4<u32>(qw) >> vec4<u32>(h.sl, h.sl + 8u, h.sl + 16u, h.sl + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(hw) >> vec4<u32>(h.sh, h.sh + 8u, h.sh + 16u, h.sh + 24u)) & vec4<u32>(1u);
    return h.scale * vec4<f32>(lo | (hi << vec4<u32>(4u))) - h.mn;
}
