// KV cache format F16: each position's row holds its k values then its v values as f16, packed in
// pairs (low half first), as the q|k|v matmul's epilogue writes them with pack2x16float. Widened
// with unpack2x16float, so no adapter needs the shader-f16 feature. Included ahead of an attention
// op, which reads the cache through `kv_vec4(i)` (values 4 i .. 4 i + 3, i in vec4 units).

@group(0) @binding(3) var<storage, read> kv: array<vec2<u32>>;   // [ctx, 2 kv_dim / 4] (4 halves each)

fn kv_vec4(i: u32) -> vec4<f32> {
    let w = kv[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
