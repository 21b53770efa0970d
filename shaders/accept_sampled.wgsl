// Speculative sampling's acceptance, on the GPU, by one of two rules (sample.wgsl wrote each verify
// row's draw from p, its residual draw and the probabilities):
//   ratio (Leviathan et al. 2023; Chen et al. 2023; the rule of src/speculative/verify.rs): draft
//     x_i (i < K) is kept while u_i < p_i(x_i) / q_i(x_i), u_i uniform; the next token is row a's
//     residual draw at the first rejection a, or row K's draw from p when all K are kept;
//   equal (p.equal, deterministic drafts): x_i is kept while row i's draw from p is x_i (with
//     probability p_i(x_i), the ratio rule's against a one-hot q); the next token is row a's draw
//     from p, which at the first rejection is not x_a: p conditioned on another token, the ratio
//     rule's residual. Every emitted token is the draw from p at its position, whatever K was.
//   out[0] = accepted count a, out[1] = the next token, out[2 + i] = drafts[i] for i < K,
//   out[2 + capacity] = status (r + 1: a non-finite logit in row r of a pass of the cycle)
// One invocation; the verify pass's uniform gives K + 1 rows at positions start_pos + i, which
// with the generation's seed pick the u_i (the ratio rule).

// The uniforms Step and Params (AcceptSampledParams), Seed (SampleSeed) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;                      // the verify pass: n = K + 1
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> seed: Seed;
@group(0) @binding(3) var<storage, read> drafts: array<u32>;          // [capacity] x1..xK
@group(0) @binding(4) var<storage, read> samples: array<u32>;         // [K + 1, 4] sample.wgsl's rows
@group(0) @binding(5) var<storage, read> status: array<u32>;          // [1]
@group(0) @binding(6) var<storage, read_write> out: array<u32>;       // [2 + capacity + 1]

fn mix(x: u32) -> u32 { // the PCG hash, as sample.wgsl
    let s = x * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    if (lid.x != 0u) { return; }
    let k = min(step.n - 1u, p.capacity);
    var a = 0u;
    for (; a < k; a++) {
        if (p.equal == 1u) {
            if (samples[4u * a] != drafts[a]) { break; }
            continue;
        }
        let h = mix(seed.lo ^ mix(seed.hi ^ mix(p.stream ^ mix(step.start_pos + a))));
        let u = (f32(h >> 8u) + 0.5) * 0x1p-24f;
        let px = bitcast<f32>(samples[4u * a + 2u]);
        let qx = bitcast<f32>(samples[4u * a + 3u]);
        if (!(u * qx < px)) { break; }
    }
    out[0] = a;
    out[1] = select(select(samples[4u * a + 1u], samples[4u * k], a == k), samples[4u * a], p.equal == 1u);
    for (var i = 0u; i < k; i++) {
        out[2u + i] = drafts[i];
    }
    out[2u + p.capacity] = status[0];
}
