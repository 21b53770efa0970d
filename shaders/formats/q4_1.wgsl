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

struct Unit { q: vec4<u32>, dm: vec2<f32> }

fn unit_head(row: u32, u: u32) -> Unit {
    let b = row * p.units + u;
    let s = p.scale_base + b;
    return Unit(w[stored_block(row, u, p.units)], unpack2x16float(w[s / 4u][s % 4u]));
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let sh = 4u * (g / 4u);
    let q = (vec4<u32>(h.q[g % 4u]) >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(15u);
    return h.dm.x * vec4<f32>(q) + h.dm.y;
}
