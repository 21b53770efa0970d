// Weight format Q8_0 (ggml block_q8_0, 32 elements: f16 d, 32 signed bytes q; x = q * d), split
// into two sections so that every load is aligned:
//   quants: block u of row `row` is two vec4<u32> at vec4 index 2 stored_block(row, u, per_row)
//           (shaders/formats/interleave.wgsl), element j = byte j
//   scales: d of block b = row * units + u is f16 number b of the section starting at u32 word p.scale_base
// Dequantised in f32 exactly as ggml's dequantize_row_q8_0. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`; the op reads a unit with
// `unit_head`, or (matmul on CPU adapters) SPAN units at a time with `span_load`, `part_load` and
// `part_unit` (shaders/formats/span_one.wgsl), and calls `unit_group(h, g)` for its eight groups of
// 4 weights.

struct Unit { q0: vec4<u32>, q1: vec4<u32>, d: f32 }

fn unit_head(row: u32, u: u32) -> Unit {
    let b = row * p.units + u;
    let s = p.scale_base + b / 2u;
    let d = unpack2x16float(w[s / 4u][s % 4u])[b % 2u];
    let q = 2u * stored_block(row, u, p.units);
    return Unit(w[q], w[q + 1u], d);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let word = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    // four signed bytes, sign-extended by an arithmetic shift
    let q = bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(q) * h.d;
}
