// Causal attention, part 2 of 2: merges the per-chunk partials of shaders/attention.wgsl.
// For row r (position pos = start_pos + r) and query head h, over its chunks c = 0 .. pos / 64 in
// order: M = max m_c;  out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c.
// One workgroup per (head, row); the order is fixed by the position, so rows are batch-invariant.

struct Step { n: u32, start_pos: u32 }
struct Params {
    heads: u32,
    head_dim: u32,
    chunks: u32,   // stride of the partials (chunks of the whole cache)
    _pad0: u32,
}

const WG: u32 = 64u;
const CH: u32 = 64u; // positions per chunk (as in attention.wgsl)
const LOWEST: f32 = -0x1.fffffep+127f;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> part: array<f32>;           // [n, heads, chunks, head_dim]
@group(0) @binding(3) var<storage, read> stats: array<vec2<f32>>;    // [n, heads, chunks]
@group(0) @binding(4) var<storage, read_write> out: array<f32>;      // [n, heads * head_dim]

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let r = wid.y;
    if (r >= step.n) { return; }
    let nc = (step.start_pos + r) / CH + 1u;
    let base = (r * p.heads + h) * p.chunks;
    var mx = LOWEST;
    for (var c = 0u; c < nc; c++) { mx = max(mx, stats[base + c].x); }
    var l = 0.0;
    for (var c = 0u; c < nc; c++) {
        let st = stats[base + c];
        l += st.y * exp(st.x - mx);
    }
    for (var d = lid.x; d < p.head_dim; d += WG) {
        var o = 0.0;
        for (var c = 0u; c < nc; c++) {
            o += part[(base + c) * p.head_dim + d] * exp(stats[base + c].x - mx);
        }
        out[(r * p.heads + h) * p.head_dim + d] = o / l;
    }
}
