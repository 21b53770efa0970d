// Weight format Q6_K (ggml block_q6_K, 256 elements), in two sections:
//   quants: block b is thirteen vec4<u32> at vec4 index 13b: ql (128 bytes), qh (64 bytes), the 16
//           signed scale bytes, as the file stores them
//   scales: d of block b is f16 number b of the section starting at u32 word p.scale_base
// Element e = 128h + r of a block: low 4 bits from ql[64h + r % 64] (nibble r / 64), high 2 bits
// from qh[32h + r % 32] (bits 2 (r / 32)); x = (d * scales[e / 16]) * (q - 32).
// A unit is 32 elements: unit u of row `row` lives in block (row * units + u) / 8.
// Dequantised in f32 exactly as ggml's dequantize_row_q6_K. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`; the op calls `unit_head` once
// per unit and `unit_group(h, g)` for its eight groups of 4 weights.

struct Unit {
    l0: vec4<u32>, l1: vec4<u32>, // the 32 bytes of ql this unit reads
    h0: vec4<u32>, h1: vec4<u32>, // the 32 bytes of qh
    sl: u32,                      // nibble shift in ql
    sh: u32,                      // 2-bit shift in qh
    sc0: f32,                     // d * scale of elements 0..15 of the unit
    sc1: f32,                     // d * scale of elements 16..31
}

fn unit_head(row: u32, u: u32) -> Unit {
    let b = (row * p.units + u) / 8u;
    let base = 13u * b;
    let j = u % 8u;
    let half = j / 4u;
    let jj = j % 4u;
    let s = p.scale_base + b / 2u;
    let d = unpack2x16float(w[s / 4u][s % 4u])[b % 2u];
    let l = base + 4u * half + 2u * (jj % 2u);
    let hq = base + 8u + 2u * half;
    let scales = w[base + 12u];
    let si = 8u * half + 2u * jj; // scale index of the unit's first 16 elements
    let sc0 = extractBits(bitcast<i32>(scales[si / 4u]), 8u * (si % 4u), 8u);
    let sc1 = extractBits(bitcast<i32>(scales[(si + 1u) / 4u]), 8u * ((si + 1u) % 4u), 8u);
    return Unit(w[l], w[l + 1u], w[hq], w[hq + 1u], 4u * (jj / 2u), 2u * jj, d * f32(sc0), d * f32(sc1));
}

fn unit_group(h: Unit, g: u32) -> vec4<f32> {
    let lw = select(h.l1[g % 4u], h.l0[g % 4u], g < 4u);
    let hw = select(h.h1[g % 4u], h.h0[g % 4u], g < 4u);
    let lo = (vec4<u32>(lw) >> vec4<u32>(h.sl, h.sl + 8u, h.sl + 16u, h.sl + 24u)) & vec4<u32>(15u);
    let hi = (vec4<u32>(hw) >> vec4<u32>(h.sh, h.sh + 8u, h.sh + 16u, h.sh + 24u)) & vec4<u32>(3u);
    let q = vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32);
    return select(h.sc1, h.sc0, g < 4u) * vec4<f32>(q);
}
