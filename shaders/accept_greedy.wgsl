// Greedy acceptance of a verify pass, on the GPU: the drafts x1..xK are kept while each equals the
// target's argmax at its position; the next token is the target's argmax after the accepted ones
// (the correction at the first mismatch, or the bonus token when all K are accepted).
//   out[0] = accepted count a, out[1] = verified[a], out[2 + i] = drafts[i] for i < K
// One invocation does it all (K is at most a few dozen); the verify pass's uniform gives K + 1.

// The uniforms Step and Params (AcceptParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;                      // the verify pass: n = K + 1
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> drafts: array<u32>;          // [capacity] x1..xK
@group(0) @binding(3) var<storage, read> verified: array<u32>;        // [K + 1] argmax of the verify rows
@group(0) @binding(4) var<storage, read_write> out: array<u32>;       // [2 + capacity]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    if (lid.x != 0u) { return; }
    let k = min(step.n - 1u, p.capacity);
    var a = 0u;
    for (; a < k; a++) {
        if (drafts[a] != verified[a]) { break; }
    }
    out[0] = a;
    out[1] = verified[a];
    for (var i = 0u; i < k; i++) {
        out[2u + i] = drafts[i];
    }
}
