// Arithmetic ceiling (benchmarks only): each invocation runs `iters` rounds of 8 independent vec4
// fused multiply-adds (2 * 4 * 8 flops a round) on registers, then stores one value so that the
// work cannot be dropped. Few iterations per invocation (lavapipe miscomputes past ~65k).

// The uniforms Step and Params (BenchFmaParams) are declared in Rust (src/gpu/roofline.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;                      // n scales nothing (kept bound)
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;     // [invocations]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 64u + gid.x;
    let s = f32(i % 7u) * 0x1p-10f + f32(step.n) * 0x1p-20f;
    var a0 = vec4<f32>(s); var a1 = a0 + 0.25; var a2 = a0 + 0.5; var a3 = a0 + 0.75;
    var a4 = a0 - 0.25; var a5 = a0 - 0.5; var a6 = a0 - 0.75; var a7 = a0 + 1.0;
    let m = vec4<f32>(0.999);
    let c = vec4<f32>(0x1p-8f);
    for (var k = 0u; k < p.iters; k++) {
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    }
    let v = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    out[i] = v.x + v.y + v.z + v.w;
}
