// Weight format BF16: each matrix row is its k values as bfloat16 (the top half of an f32), padded
// with zeros to a multiple of 32, packed in pairs (low half first). Unit u of row `row` is four
// vec4<u32> at stored_block(row, u, per_row) * 4 (shaders/formats/interleave.wgsl). Widening is exact: the bits move to the top of an f32.
// Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>` and `p.units`; the op
// reads a unit with `unit_head`, or (matmul on CPU adapters) SPAN units at a time with `span_load`,
// `part_load` and `part_unit` (shaders/formats/span_one.wgsl), and calls `unit_group(h, g)` for its
// eight groups of 4 weights.

struct Unit { base: u32 }

fn unit_head(row: u32, u: u32) -> Unit {
    return Unit(stored_block(row, u, p.units) * 4u);
}

fn bf16_pair(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let v = w[h.base + g / 2u];
    let i = 2u * (g % 2u);
    return vec4<f32>(bf16_pair(v[i]), bf16_pair(v[i + 1u]));
}
