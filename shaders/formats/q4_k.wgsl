// Weight format Q4_K (ggml block_q4_K, 256 elements in nine vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins;
//   words 4..35: 128 bytes of nibbles; sub-block s (elements 32s .. 32s + 32) reads nibble s % 2
//   of bytes 32 (s / 2) .. 32 (s / 2) + 32; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block (row * units + u) / 8.
// Dequantised in f32 exactly as ggml's dequantize_row_q4_K ((d * sc) * q is exact, so a fused
// multiply-add rounds the same). Included ahead of an op (matmul, embed) that declares
// `w: array<vec4<u32>>` and `p.units`; the op calls `unit_head` once per unit and
// `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit { q0: vec4<u32>, q1: vec4<u32>, sh: u32, scale: f32, mn: f32 }

fn unit_head(row: u32, u: u32) -> Unit {
    let base = (row * p.units + u) / 8u * 9u;
    let s = u % 8u;
    let head = w[base];
    let dd = unpack2x16float(head.x);
    let sm = k_scale_min(head.yzw, s); // shaders/formats/k_scales.wgsl
    let q = base + 1u + 2u * (s / 2u);
    return Unit(w[q], w[q + 1u], 4u * (s % 2u), dd.x * f32(sm.x), dd.y * f32(sm.y));
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let word = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    let q = (vec4<u32>(word) >> vec4<u32>(h.sh, h.sh + 8u, h.sh + 16u, h.sh + 24u)) & vec4<u32>(15u);
    return h.scale * vec4<f32>(q) - h.mn;
}
