// The dot product of two vec4s as explicit fused multiply-adds, in component order:
// a.x b.x, then + a.y b.y, + a.z b.z, + a.w b.w. Not `dot`: a compiler expands that into its own
// multiplies and adds, which it may contract differently in two pipelines or two branches, and
// a row's bits must not depend on which ran it (shaders/matmul.wgsl, dots).
fn dot_fma(a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, a.x * b.x)));
}
