// KV cache format F32: each position's row holds its k values then its v values as f32.
// Included ahead of an attention op, which reads the cache through `kv_vec4(i)` (values
// 4 i .. 4 i + 3 of the cache, i in vec4 units).

@group(0) @binding(3) var<storage, read> kv: array<vec4<f32>>;   // [ctx, 2 kv_dim / 4]

fn kv_vec4(i: u32) -> vec4<f32> {
    return kv[i];
}
