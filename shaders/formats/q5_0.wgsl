// Weight format Q5_0 (ggml block_q5_0, 32 elements: f16 d, u32 qh of fifth bits, 16 bytes of low
// nibbles; element j < 16 is the low nibble of byte j, element j + 16 its high nibble, bit j of qh
// is element j's fifth bit; x = d * (q - 16)), in two sections:
//   quants: block u of row `row` is five u32 words at word 5 stored_block(row, u, per_row)
//           (shaders/formats/interleave.wgsl): the 16 nibble bytes, then qh
//   scales: d of block b = row * units + u is f16 number b of the section starting at u32 word p.scale_base
// Dequantised in f32 exactly as ggml's dequantize_row_q5_0. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`; the op reads a unit with
// `unit_head`, or (matmul on CPU adapters) SPAN units at a time with `span_load`, `part_load` and
// `part_unit` (shaders/formats/span_one.wgsl), and calls `unit_group(h, g)` for its eight groups of
// 4 weights.

// (d: d * BYTE_PLACES, the scale of each byte's field in place: shaders/formats/bytes.wgsl)
struct Unit { q: vec4<u32>, qh: u32, d: vec4<f32> }

fn word_at(i: u32) -> u32 {
    return w[i / 4u][i % 4u];
}

fn unit_head(row: u32, u: u32) -> Unit {
    let b = row * p.units + u;
    let i = 5u * stored_block(row, u, p.units);
    let q = vec4<u32>(word_at(i), word_at(i + 1u), word_at(i + 2u), word_at(i + 3u));
    let d = unpack2x16float(word_at(p.scale_base + b / 2u))[b % 2u];
    return Unit(q, word_at(i + 4u), d * BYTE_PLACES);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    // the group's four low nibbles, one per byte
    let lo = (h.q[g % 4u] >> (4u * (g / 4u))) & 0x0F0F0F0Fu;
    // its fifth bits, qh bits 4g .. 4g + 3, to bit 4 of each byte: the multiply copies bit i to
    // bits i, i + 7, i + 14 and i + 21 (no carries: the four copies of the 4 bits do not overlap),
    // so bit 8i holds bit i
    let hi = ((((h.qh >> (4u * g)) & 15u) * 0x00204081u) & 0x01010101u) << 4u;
    // q_j * 2^8j less 16 * 2^8j: (q_j - 16) * 2^8j exactly
    let q = vec4<f32>(byte_fields(lo | hi, 5u));
    return h.d * (q - vec4<f32>(16.0, 0x1p12f, 0x1p20f, 0x1p28f));
}
