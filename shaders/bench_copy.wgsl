// Bandwidth ceiling (benchmarks only): dst[i] = src[i] over vec4<u32>, one element per invocation,
// rows of 65535 * 64 elements along y. Moves 2 * 16 bytes per invocation.

// The uniforms Step and Params (BenchCopyParams) are declared in Rust (src/gpu/roofline.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;                      // unused by the copy (n = 1)
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> src: array<vec4<u32>>;      // [len]
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>; // [len]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i >= p.len || step.n == 0u) { return; }
    dst[i] = src[i];
}
