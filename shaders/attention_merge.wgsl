// Causal attention split over the cache, second half: out = the chunks' partial results of
// attention_chunks.wgsl combined, one workgroup per (query head, row):
//   M = max_c m_c;  L = sum_c l_c exp(m_c - M);  out = (sum_c o_c exp(m_c - M)) / L
// over the row's chunks (those from its first key's: a sliding window's) .. ceil(len / span) in order (a fixed order that depends on the row's
// position only: batch-invariant).

// The uniforms Step and Params (MergeParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> part: array<f32>;        // attention_chunks.wgsl's scratch
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // [n, heads * head_dim]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let r = wid.y;
    if (r >= step.n) { return; }
    let t = lid.x;
    let len = row_pos(r) + 1u;
    let nc = (len + p.span - 1u) / p.span;
    // (sliding-window attention: the chunks before the row's first key hold nothing of it)
    let lo = select(0u, len - p.window, p.window != 0u && len > p.window);
    let c0 = lo / p.span;
    let first = (r * p.heads + h) * p.chunks;

    var m_all = part[p.ml_base + 2u * (first + c0)];
    for (var c = c0 + 1u; c < nc; c++) { m_all = max(m_all, part[p.ml_base + 2u * (first + c)]); }
    var l_all = 0.0;
    for (var c = c0; c < nc; c++) {
        let ml = 2u * (first + c) + p.ml_base;
        l_all = fma(part[ml + 1u], exp(part[ml] - m_all), l_all);
    }
    let inv_l = 1.0 / l_all;
    for (var d = t; d < p.head_dim; d += WG) {
        var o = 0.0;
        for (var c = c0; c < nc; c++) {
            o = fma(part[(first + c) * p.head_dim + d], exp(part[p.ml_base + 2u * (first + c)] - m_all), o);
        }
        out[(r * p.heads + h) * p.head_dim + d] = o * inv_l;
    }
}
