// Weight format Q4_K (ggml block_q4_K, 256 elements in nine vec4<u32>, kept as the file stores it):
//   word 0: f16 d | f16 dmin << 16; words 1..3: twelve bytes of packed 6-bit scales and mins;
//   words 4..35: 128 bytes of nibbles; sub-block s (elements 32s .. 32s + 32) reads nibble s % 2
//   of bytes 32 (s / 2) .. 32 (s / 2) + 32; x = (d * sc) * q - dmin * m.
// A unit is one sub-block: unit u of row `row` lives in super-block (row * units + u) / 8.
// Dequantised in f32 exactly as ggml's dequantize_row_q4_K ((d * sc) * q is exact, so a fused
// multiply-add rounds the same). Included ahead of an op (matmul, embed) that declares
// `w: array<vec4<u32>>` and `p.units`.

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (row * p.units + u) / 8u * 9u;
    let s = u % 8u;
    let head = w[base];
    let dd = unpack2x16float(head.x);
    // the twelve scale bytes
    var sb = array<u32, 3>(head.y, head.z, head.w);
    var sc: u32;
    var m: u32;
    if (s < 4u) {
        sc = (sb[s / 4u] >> (8u * (s % 4u))) & 63u;
        m = (sb[(s + 4u) / 4u] >> (8u * ((s + 4u) % 4u))) & 63u;
    } else {
        let a = (sb[(s + 4u) / 4u] >> (8u * ((s + 4u) % 4u))) & 255u; // byte s + 4
        let lo = (sb[(s - 4u) / 4u] >> (8u * ((s - 4u) % 4u))) & 255u; // byte s - 4
        let hi = (sb[s / 4u] >> (8u * (s % 4u))) & 255u; // byte s
        sc = (a & 15u) | ((lo >> 6u) << 4u);
        m = (a >> 4u) | ((hi >> 6u) << 4u);
    }
    let scale = dd.x * f32(sc);
    let mn = dd.y * f32(m);
    let sh = 4u * (s % 2u);
    let q0 = w[base + 1u + 2u * (s / 2u)];
    let q1 = w[base + 2u + 2u * (s / 2u)];
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 8u; g++) {
        let word = select(q1[g % 4u], q0[g % 4u], g < 4u);
        let q = (vec4<u32>(word) >> vec4<u32>(sh, sh + 8u, sh + 16u, sh + 24u)) & vec4<u32>(15u);
        out[g] = scale * vec4<f32>(q) - mn;
    }
    return out;
}
