// Weight format F32: each matrix row is its k values, padded with zeros to a multiple of 32.
// Unit u of row `row` (elements 32u .. 32u + 32) is eight vec4 at vec4 index
// stored_block(row, u, per_row) * 8 (shaders/formats/interleave.wgsl).
// Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>` and `p.units`; the op
// reads a unit with `unit_head`, or (matmul on CPU adapters) SPAN units at a time with `span_load`,
// `part_load` and `part_unit` (shaders/formats/span_one.wgsl), and calls `unit_group(h, g)` for its
// eight groups of 4 weights.

struct Unit { base: u32 }

fn unit_head(row: u32, u: u32) -> Unit {
    return Unit(stored_block(row, u, p.units) * 8u);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(w[h.base + g]);
}
