// Per-head RMSNorm of q and k, then RoPE, then q to its scratch and k | v to the KV cache: the
// attention input of models that normalise each head (Qwen3, Gemma 3), whose q|k|v matmul writes
// its raw output to `qkv` instead (a head's norm needs the whole head, which the matmul's
// epilogue never holds).
//
//   q[r, h]  = rope(rmsnorm(qkv[r, q head h]) * q_norm, pos)          h < q_heads
//   kv[cache_row(r), k head h] = rope(rmsnorm(qkv[r, k head h]) * k_norm, pos)
//   kv[cache_row(r), v head h] = qkv[r, v head h]
//
// for the rows r < step.n of a pass at their positions pos and cache rows (shaders/share/rows.wgsl:
// start_pos + r, or start_pos + its depth in a token-tree pass, in a pass of one sequence).
// `qkv` holds the matmul's columns: with a Halves layout the q and k rows were reordered at load
// into adjacent RoPE pairs (src/gpu/ops.rs, RopeLayout::pair_rows), so the pair (2i, 2i + 1) of
// a head is checkpoint dimensions (i, i + rope_dim / 2); the outputs go back to the checkpoint's
// order. One workgroup per head and row (wid.x: q heads, then k heads, then v heads; wid.y: the
// row); its invocations take strided pairs and a fixed tree adds their squares (the same order
// for every pass: batch-invariant). No float add is fed by a product but through `fma`.

// The uniforms Step and Params (HeadNormParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 64u;
const MAX_HEAD: u32 = 256u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;            // [n, q_heads + 2 kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> q_norm: array<f32>;         // [head_dim]
@group(0) @binding(4) var<storage, read> k_norm: array<f32>;         // [head_dim]
@group(0) @binding(5) var<storage, read> cos_sin: array<vec2<f32>>;  // [context, rope_dim / 2]
@group(0) @binding(6) var<storage, read_write> q: array<f32>;        // [n, q_heads * head_dim]
@group(0) @binding(7) var<storage, read_write> kv: array<u32>;       // [context, 2 kv_heads * head_dim] (f32
                                                                     // bits, or f16 pairs: half as many words)

var<workgroup> squares: array<f32, WG>;
var<workgroup> staged: array<f32, MAX_HEAD>;                        // [head_dim] the head's outputs, checkpoint order


// The checkpoint dimension of the matmul's column j of a q or k head (`paired`; v's rows keep
// their order).
fn dimension(j: u32, paired: bool) -> u32 {
    if (paired && p.halves == 1u && j < p.rope_dim) { return j / 2u + (j % 2u) * (p.rope_dim / 2u); }
    return j;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let row = wid.y;
    if (row >= step.n) { return; }
    let t = lid.x;
    let hd = p.head_dim;
    let heads = p.q_heads + 2u * p.kv_heads;
    let src = (row * heads + head) * hd;
    let is_v = head >= p.q_heads + p.kv_heads;
    let is_q = head < p.q_heads;

    // 1. (q and k heads) 1 / rms of the head: strided squares, then a fixed tree
    var sq = 0.0;
    for (var j = t; j < hd; j += WG) {
        let v = qkv[src + j];
        sq = fma(v, v, sq);
    }
    squares[t] = sq;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { squares[t] += squares[t + stride]; }
        workgroupBarrier();
    }
    let inv_rms = 1.0 / sqrt(fma(squares[0], 1.0 / f32(hd), p.eps));

    // 2. each pair (2i, 2i + 1) of the matmul's columns normalised, scaled by the norm's weight
    //    and rotated, staged at its checkpoint dimensions (v: copied)
    let pos = row_pos(row);
    for (var j = 2u * t; j < hd; j += 2u * WG) {
        let da = dimension(j, !is_v);
        let db = dimension(j + 1u, !is_v);
        var a = qkv[src + j];
        var b = qkv[src + j + 1u];
        if (!is_v) {
            let wa = select(k_norm[da], q_norm[da], is_q);
            let wb = select(k_norm[db], q_norm[db], is_q);
            a = a * inv_rms * wa;
            b = b * inv_rms * wb;
            if (j < p.rope_dim) {
                let cs = cos_sin[pos * (p.rope_dim / 2u) + j / 2u];
                let ra = fma(a, cs.x, -(b * cs.y));
                let rb = fma(a, cs.y, b * cs.x);
                a = ra;
                b = rb;
            }
        }
        staged[da] = a;
        staged[db] = b;
    }
    workgroupBarrier();

    // 3. stores, in checkpoint order: q to its scratch; k | v to the cache row, as f32 bits or
    //    as f16 pairs (dimensions 2i, 2i + 1 in one word, low half first)
    if (is_q) {
        for (var j = t; j < hd; j += WG) { q[row * p.q_heads * hd + head * hd + j] = staged[j]; }
        return;
    }
    let kv_head = head - p.q_heads; // k heads, then v heads: the cache row's order
    let base = cache_row(row) * (2u * p.kv_heads * hd) + kv_head * hd;
    if (p.kv_f16 == 0u) {
        for (var j = t; j < hd; j += WG) { kv[base + j] = bitcast<u32>(staged[j]); }
        return;
    }
    for (var j = 2u * t; j < hd; j += 2u * WG) {
        // (clamped to f16's finite range: pack2x16float leaves larger values undefined)
        let pair = clamp(vec2<f32>(staged[j], staged[j + 1u]), vec2<f32>(-65504.0), vec2<f32>(65504.0));
        kv[(base + j) / 2u] = pack2x16float(pair);
    }
}
