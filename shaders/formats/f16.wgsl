// Weight format F16: each matrix row is its k values as f16, padded with zeros to a multiple of 32,
// packed in pairs (low half first). Unit u of row `row` is four vec4<u32> at (row * units + u) * 4.
// Widened with unpack2x16float, so no adapter needs the shader-f16 feature.
// Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>` and `p.units`.

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (row * p.units + u) * 4u;
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 4u; g++) {
        let v = w[base + g];
        out[2u * g] = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
        out[2u * g + 1u] = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
    }
    return out;
}
