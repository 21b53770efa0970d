// ids[r, j] = table[ids[r, j]] for the rows r < step.n of a pass and j < p.k: ids ranked in a
// draft vocabulary, renamed to the target's (an EAGLE-3 head's reduced vocabulary, whose id d is
// the target's d + d2t[d]). One workgroup per row, one invocation per id; an id past the table
// takes its last entry.

// The uniforms Step and Params (MapIdsParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> table: array<u32>;        // [size]
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;    // [n, k]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    if (r >= step.n || lid.x >= p.k) { return; }
    let i = r * p.k + lid.x;
    ids[i] = table[min(ids[i], p.size - 1u)];
}
