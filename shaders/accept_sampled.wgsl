// Speculative sampling's acceptance, on the GPU (sample.wgsl wrote each verify row's draw from p,
// with the noise of its position): draft x_i (i < K) is kept while row i's draw is x_i; the next
// token is row a's draw, which at the first rejection a is not x_a. A deterministic draft is so
// kept with probability p_i(x_i) (the ratio rule of Leviathan et al. 2023 against a one-hot q),
// and the draw emitted at a rejection is p conditioned on another token, that rule's residual; a
// draft model drawing x_i with the same noise from its own q_i is kept where the two draws agree.
// Every emitted token is the draw from p at its position, whatever K was and whatever drafted.
//   out[0] = accepted count a, out[1] = the next token, out[2 + i] = drafts[i] for i < K,
//   out[2 + capacity] = status (r + 1: a non-finite logit in row r of a pass of the cycle)
// One invocation; the verify pass's uniform gives K + 1 rows.

// The uniforms Step and Params (AcceptSampledParams) are declared in Rust (src/gpu/ops.rs) and
// written ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;                      // the verify pass: n = K + 1
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> drafts: array<u32>;          // [capacity] x1..xK
@group(0) @binding(3) var<storage, read> samples: array<u32>;         // [K + 1] sample.wgsl's draws
@group(0) @binding(4) var<storage, read> status: array<u32>;          // [1]
@group(0) @binding(5) var<storage, read_write> out: array<u32>;       // [2 + capacity + 1]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    if (lid.x != 0u) { return; }
    let k = min(step.n - 1u, p.capacity);
    var a = 0u;
    for (; a < k; a++) {
        if (samples[a] != drafts[a]) { break; }
    }
    out[0] = a;
    out[1] = samples[a];
    for (var i = 0u; i < k; i++) {
        out[2u + i] = drafts[i];
    }
    out[2u + p.capacity] = status[0];
}
