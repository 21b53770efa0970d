// Weight format Q4_K (ggml block_q4_K, 256 elements in nine vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins;
//   words 4..35: 128 bytes of nibbles; sub-block s (elements 32s .. 32s + 32) reads nibble s % 2
//   of bytes 32 (s / 2) .. 32 (s / 2) + 32; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block u / 8 of the row (stored at
// stored_block(row, u / 8, per_row), shaders/formats/interleave.wgsl). A span
// is a super-block: its scale words, loaded once for its eight units; a part is two sub-blocks
// (2h and 2h + 1 read the same 32 bytes, low and high nibbles), loaded once for both.
// Dequantised in f32 exactly as ggml's dequantize_row_q4_K ((d * sc) * q is exact, so a fused
// multiply-add rounds the same). Included ahead of an op (matmul, embed) that declares
// `w: array<vec4<u32>>` and `p.units`; the op reads a unit with `unit_head`, or (matmul on CPU
// adapters) a span and its parts at a time with `span_load`, `part_load` and `part_unit`, and calls
// `unit_group(h, g)` for its eight groups of 4 weights.

// (scale: d * sc * BYTE_PLACES, the scale of each byte's field in place: shaders/formats/bytes.wgsl)
struct Unit { q0: vec4<u32>, q1: vec4<u32>, sh: u32, scale: vec4<f32>, mn: f32 }

const SPAN: u32 = 8u;
const PART: u32 = 2u;
struct Span { head: vec4<u32>, base: u32 } // base: the block's first vec4
struct Part { head: vec4<u32>, q0: vec4<u32>, q1: vec4<u32>, first: u32 }

fn span_load(row: u32, s: u32) -> Span {
    let base = stored_block(row, s, p.units / 8u) * 9u; // shaders/formats/interleave.wgsl
    return Span(w[base], base);
}

// sub-blocks 2h and 2h + 1: bytes 32h .. 32h + 32 of the nibbles
fn part_load(sp: Span, h: u32) -> Part {
    let q = sp.base + 1u + 2u * h;
    return Part(sp.head, w[q], w[q + 1u], 2u * h);
}

fn part_unit(pt: Part, j: u32) -> Unit {
    let dd = unpack2x16float(pt.head.x);
    let sm = k_scale_min(pt.head.yzw, pt.first + j); // shaders/formats/k_scales.wgsl
    return Unit(pt.q0, pt.q1, 4u * j, dd.x * f32(sm.x) * BYTE_PLACES, dd.y * f32(sm.y));
}

fn unit_head(row: u32, u: u32) -> Unit {
    return part_unit(part_load(span_load(row, u / SPAN), u % SPAN / PART), u % PART);
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let word = select(h.q1[g % 4u], h.q0[g % 4u], g < 4u);
    // (an explicit fused multiply-add, the same bits as scale * q - mn: shaders/matmul.wgsl, dots)
    return fma(h.scale, vec4<f32>(byte_fields(word >> h.sh, 4u)), vec4<f32>(-h.mn));
}
