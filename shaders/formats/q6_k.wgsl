// Weight format Q6_K (ggml block_q6_K, 256 elements), in two sections:
//   quants: block b is thirteen vec4<u32> at vec4 index 13b: ql (128 bytes), qh (64 bytes), the 16
//           signed scale bytes, as the file stores them
//   scales: d of block b is f16 number b of the section starting at u32 word p.scale_base
// Element e = 128h + r of a block: low 4 bits from ql[64h + r % 64] (nibble r / 64), high 2 bits
// from qh[32h + r % 32] (bits 2 (r / 32)); x = (d * scales[e / 16]) * (q - 32).
// A unit is 32 elements: unit u of row `row` lives in block (row * units + u) / 8.
// Dequantised in f32 exactly as ggml's dequantize_row_q6_K. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`.

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (row * p.units + u) / 8u;
    let base = 13u * b;
    let j = u % 8u;
    let h = j / 4u;
    let jj = j % 4u;
    let s = p.scale_base + b / 2u;
    let d = unpack2x16float(w[s / 4u][s % 4u])[b % 2u];
    let l0 = w[base + 4u * h + 2u * (jj % 2u)];
    let l1 = w[base + 4u * h + 2u * (jj % 2u) + 1u];
    let h0 = w[base + 8u + 2u * h];
    let h1 = w[base + 8u + 2u * h + 1u];
    let scales = w[base + 12u];
    let sl = 4u * (jj / 2u);
    let shh = 2u * jj;
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 8u; g++) {
        let lw = select(l1[g % 4u], l0[g % 4u], g < 4u);
        let hw = select(h1[g % 4u], h0[g % 4u], g < 4u);
        let lo = (vec4<u32>(lw) >> vec4<u32>(sl, sl + 8u, sl + 16u, sl + 24u)) & vec4<u32>(15u);
        let hi = (vec4<u32>(hw) >> vec4<u32>(shh, shh + 8u, shh + 16u, shh + 24u)) & vec4<u32>(3u);
        let q = vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32);
        let si = 8u * h + 2u * jj + g / 4u; // scale index of elements 32j + 4g ..
        let sc = extractBits(bitcast<i32>(scales[si / 4u]), 8u * (si % 4u), 8u);
        out[g] = (d * f32(sc)) * vec4<f32>(q);
    }
    return out;
}
