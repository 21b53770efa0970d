// Weight format Q8_0 (ggml block_q8_0, 32 elements: f16 d, 32 signed bytes q; x = q * d), split
// into two sections so that every load is aligned:
//   quants: block b (= row * units + u) is two vec4<u32> at vec4 index 2b, element j = byte j
//   scales: d of block b is f16 number b of the section starting at u32 word p.scale_base
// Dequantised in f32 exactly as ggml's dequantize_row_q8_0. Included ahead of an op (matmul, embed)
// that declares `w: array<vec4<u32>>`, `p.units` and `p.scale_base`.

fn word_at(i: u32) -> u32 {
    return w[i / 4u][i % 4u];
}

fn half_at(h: u32) -> f32 {
    return unpack2x16float(word_at(p.scale_base + h / 2u))[h % 2u];
}

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = row * p.units + u;
    let d = half_at(b);
    var out: array<vec4<f32>, 8>;
    for (var h = 0u; h < 2u; h++) {
        let v = w[2u * b + h];
        for (var c = 0u; c < 4u; c++) {
            // four signed bytes, sign-extended by an arithmetic shift
            let q = bitcast<vec4<i32>>(vec4<u32>(v[c]) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
            out[4u * h + c] = vec4<f32>(q) * d;
        }
    }
    return out;
}
