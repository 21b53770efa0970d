// Weight format Q4_1 (ggml block_q4_1, 32 elements: f16 d, f16 m, 16 bytes of nibbles; element
// j < 16 is the low nibble of byte j, element j + 16 its high nibble; x = d * q + m), in two sections:
//   quants: block u of row `row` is one vec4<u32> at vec4 index stored_block(row, u, per_row)
//           (shaders/formats/interleave.wgsl)
//   scales: (d, m) of block b = row * units + u is the f16 pair in u32 word p.scale_base + b
// Dequantised in f32 exactly as ggml's dequantize_row_q4_1 (d * q is exact, so a fused multiply-add
// rounds the same). Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>`,
// `p.units` and `p.scale_base`; the op reads a unit with `unit_head`, or (matmul on CPU adapters)
// SPAN units at a time with `span_load`, `part_load` and `part_unit`
// (shaders/formats/span_one.wgsl), and calls `unit_group(h, g)` for its eight groups of 4 weights.

// (d: d * BYTE_PLACES, the scale of each byte's field in place: shaders/formats/bytes.wgsl)
struct Unit { q: vec4<u32>, d: vec4<f32>, m: f32 }

fn unit_head(row: u32, u: u32) -> Unit {
    let b = row * p.units + u;
    let s = p.scale_base + b;
    let dm = unpack2x16float(w[s / 4u][s % 4u]);
    return Unit(w[stored_block(row, u, p.units)], dm.x * BYTE_PLACES, dm.y);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    // nibble j of the group's word in place: q_j * 2^8j
    // (an explicit fused multiply-add, the same bits as d * q + m: shaders/matmul.wgsl, dots)
    return fma(h.d, vec4<f32>(byte_fields(h.q[g % 4u] >> (4u * (g / 4u)), 4u)), vec4<f32>(h.m));
}
