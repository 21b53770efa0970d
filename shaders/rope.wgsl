// Rotary position embedding, in place, on rows [row0 + r] of x for r < step.n, at position start_pos + r.
// cos/sin come from a table computed once on the CPU in f64 ([positions, rope_dim/2]), so every GPU
// (native or browser) rotates by bit-identical angles.
// layout 0 = interleaved pairs (x[2i], x[2i+1]) as GGUF llama stores q/k;
// layout 1 = halves (x[i], x[i + rope_dim/2]) as Hugging Face (and GGUF qwen2) store them.

struct Step { n: u32, start_pos: u32 }
struct Params {
    heads: u32,      // heads in a row
    head_dim: u32,
    rope_dim: u32,   // rotated dimensions per head (<= head_dim, even)
    pairing: u32,    // 0 interleaved, 1 halves
    row_base: u32,   // 1: row r of the pass lives at row start_pos + r of x (KV cache); 0: row r
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cos_sin: array<vec2<f32>>;   // [positions, rope_dim/2] (cos, sin)
@group(0) @binding(3) var<storage, read_write> x: array<f32>;         // [rows, heads * head_dim]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_rot = p.rope_dim / 2u;
    let i = gid.x % half_rot;       // pair index within a head
    let h = gid.x / half_rot;       // head
    let r = gid.y;
    if (h >= p.heads || r >= step.n) { return; }
    let pos = step.start_pos + r;
    let row = select(r, pos, p.row_base == 1u);
    let cs = cos_sin[pos * half_rot + i];
    let head = row * p.heads * p.head_dim + h * p.head_dim;
    var a = head + 2u * i;
    var b = a + 1u;
    if (p.pairing == 1u) {
        a = head + i;
        b = head + i + half_rot;
    }
    let xa = x[a];
    let xb = x[b];
    x[a] = xa * cs.x - xb * cs.y;
    x[b] = xa * cs.y + xb * cs.x;
}
