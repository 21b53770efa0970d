// Weight format BF16: each matrix row is its k values as bfloat16 (the top half of an f32), padded
// with zeros to a multiple of 32, packed in pairs (low half first). Unit u of row `row` is four
// vec4<u32> at (row * units + u) * 4. Widening is exact: the bits move to the top of an f32.
// Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>` and `p.units`.

fn bf16_pair(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (row * p.units + u) * 4u;
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 4u; g++) {
        let v = w[base + g];
        out[2u * g] = vec4<f32>(bf16_pair(v.x), bf16_pair(v.y));
        out[2u * g + 1u] = vec4<f32>(bf16_pair(v.z), bf16_pair(v.w));
    }
    return out;
}
