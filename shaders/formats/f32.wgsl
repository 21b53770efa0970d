// Weight format F32: each matrix row is its k values, padded with zeros to a multiple of 32.
// Row `row`, unit u (elements 32u .. 32u + 32) is eight vec4 at vec4 index (row * units + u) * 8.
// Included ahead of an op (matmul, embed) that declares `w: array<vec4<u32>>` and `p.units`.

fn load_unit(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (row * p.units + u) * 8u;
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 8u; g++) {
        out[g] = bitcast<vec4<f32>>(w[base + g]);
    }
    return out;
}
