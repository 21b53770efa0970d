// Causal multi-head attention with grouped KV heads over the KV cache: one workgroup per row and
// block of up to 4 query heads of one KV head's group, which load each key's k and v row once for
// the block (`p.blocks` blocks per KV head).
// The cache holds each position's k row then its v row: [ctx, 2 * kv_heads * head_dim], in the
// format of the file placed ahead of this one (shaders/kv/: f32 or f16), read by kv_vec4.
// Row r of the pass sits at position pos (shaders/share/rows.wgsl: start_pos + r in a pass of one
// sequence) and attends to its sequence's positions 0..=pos, found by key_row (shaders/kv/pages.wgsl)
// (with a sliding window, the last `window` of them: pos - window + 1 ..= pos):
//   s_j = (q . k_j) * scale;  p_j = exp(s_j - max s) / sum exp;  out = sum_j p_j v_j
// Preceded by one file of shaders/share/ (after the cache's format file): the entry point's
// `Invocation`, and whether (`SHARE`, CPU adapters with subgroups) the invocations of a subgroup
// share their loads of q and of the scores by shuffles (a workgroup's invocations all need them).
// Every reduction runs in a fixed order that depends only on pos, never on n, so a verify pass
// over K+1 rows reproduces single-row steps bit for bit.
// A token-tree pass (step.tree = 1): row r, a tree's node (row_tree(r) != 0; a paged pass may
// hold trees beside other rows), is at depth d = popcount(its ancestor bits) - 1,
// pos = start + d (start: its tree's first position), and its keys j >= start are its ancestors'
// cache rows in depth order, itself last. The keys are the ones its root-to-node path would have
// alone, in the same order, so a node's output equals that path's last row bit for bit.

// The uniforms Step and Params (AttentionParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source, with the host's constants PAGE (positions per page of the
// cache) and HB (query heads per workgroup: 4, the components of the per-head vectors below).

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;         // [n, heads * head_dim / 4]
// binding 3: kv, the cache (see the format file); binding 4: its page table (shaders/kv/pages.wgsl)
@group(0) @binding(5) var<storage, read_write> scores: array<f32>;    // [n, heads, ctx] scratch
@group(0) @binding(6) var<storage, read_write> out: array<f32>;       // [n, heads * head_dim]

var<workgroup> partial: array<vec4<f32>, WG>; // [WG] one value of each of the block's (up to) 4 heads

// (SHARE) this invocation's load of a run of 8 values that start at q[i] (or scores[i]): its
// slot's (nothing otherwise: the load stays out of the shader)
fn q_own(inv: Invocation, i: u32) -> vec4<f32> {
    if (SHARE) { return q[i + slot8(inv)]; }
    return vec4<f32>(0.0);
}

fn score_own(inv: Invocation, i: u32) -> f32 {
    if (SHARE) { return scores[i + slot8(inv)]; }
    return 0.0;
}

// q[i] (the run's value g < 8): loaded, or (SHARE) the subgroup's invocation g's load of it
// (`own`: q_own's for the run)
fn q_at(i: u32, g: u32, own: vec4<f32>) -> vec4<f32> {
    if (SHARE) { return share_vec4(own, g); }
    return q[i];
}

// scores[i] as q_at
fn score_at(i: u32, g: u32, own: f32) -> f32 {
    if (SHARE) { return share_f32(own, g); }
    return scores[i];
}

@compute @workgroup_size(64)
fn main(inv: Invocation, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.y;
    if (r >= step.n) { return; }
    let t = inv.lid.x;
    let len = row_pos(r) + 1u;
    // (sliding-window attention: the row's first key; the loops below start there)
    let lo = select(0u, len - p.window, p.window != 0u && len > p.window);
    let hd4 = p.head_dim / 4u;
    // the block's query heads: up to HB (4) of one KV head's group, h0 .. h0 + nh - 1 (the
    // vectors' components past nh repeat the last head, computed and never stored)
    let group = p.heads / p.kv_heads;
    let kvh = wid.x / p.blocks;
    let b = wid.x % p.blocks;
    let h0 = kvh * group + HB * b;
    let nh = min(HB, group - HB * b);
    let hs = min(vec4<u32>(h0, h0 + 1u, h0 + 2u, h0 + 3u), vec4<u32>(h0 + nh - 1u));
    let q_base = (vec4<u32>(r * p.heads) + hs) * hd4;
    let kv_row4 = 2u * p.kv_heads * hd4; // a cache row: k then v
    let s_base = (vec4<u32>(r * p.heads) + hs) * p.ctx;

    // 1. scores and the running max of this thread's keys j = t, t + WG, ..., each key's k loaded
    //    once for the block's heads. Every invocation of a subgroup with keys left runs the round
    //    (sharing loads by shuffles needs the whole subgroup): past the last key it scores the
    //    last one again and keeps nothing. q is read in runs of 8 vectors, each invocation
    //    loading one with SHARE (past the head's end when hd4 is no multiple of 8: never used);
    //    each head's sum over d runs in d order either way.
    var m = vec4<f32>(-0x1.fffffep+127f); // the lowest finite f32, written exactly (Tint refuses an inexact literal)
    for (var j0 = lo; j0 < len; j0 += WG) {
        let j = j0 + t;
        if (share_any(j < len)) {
            let k_base = key_row(r, min(j, len - 1u)) * kv_row4 + kvh * hd4;
            var s = vec4<f32>(0.0);
            for (var d0 = 0u; d0 < hd4; d0 += 8u) {
                let own0 = q_own(inv, q_base.x + d0);
                let own1 = q_own(inv, q_base.y + d0);
                let own2 = q_own(inv, q_base.z + d0);
                let own3 = q_own(inv, q_base.w + d0);
                for (var d = d0; d < min(d0 + 8u, hd4); d++) {
                    let k = kv_vec4(k_base + d);
                    s.x += dot_fma(q_at(q_base.x + d, d - d0, own0), k);
                    s.y += dot_fma(q_at(q_base.y + d, d - d0, own1), k);
                    s.z += dot_fma(q_at(q_base.z + d, d - d0, own2), k);
                    s.w += dot_fma(q_at(q_base.w + d, d - d0, own3), k);
                }
            }
            let scaled = s * p.scale;
            if (j < len) {
                store_heads(s_base + vec4<u32>(j), scaled, nh);
                m = max(m, scaled);
            }
        }
    }
    partial[t] = m;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { partial[t] = max(partial[t], partial[t + stride]); }
        workgroupBarrier();
    }
    let m_all = partial[0];
    workgroupBarrier();

    // 2. exponentials and their sums (each head's four read before any is written: the
    //    components past nh repeat the last head's)
    var l = vec4<f32>(0.0);
    for (var j = lo + t; j < len; j += WG) {
        let i = s_base + vec4<u32>(j);
        let e = exp(vec4<f32>(scores[i.x], scores[i.y], scores[i.z], scores[i.w]) - m_all);
        store_heads(i, e, nh);
        l += e;
    }
    partial[t] = l;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { partial[t] += partial[t + stride]; }
        workgroupBarrier();
    }
    let inv_l = 1.0 / partial[0];
    storageBarrier();

    // 3. weighted sums of values, four consecutive output dimensions per thread for each of the
    //    block's heads (one load of four values for the heads' sixteen sums: a CPU adapter's
    //    lanes each load and widen their own); each dimension's sum runs in key order
    let v_base4 = p.kv_heads * hd4 + kvh * hd4;
    // the sequence's keys before a tree's, then (a tree pass) the ancestors': one sum in key order.
    // Every invocation of a subgroup with dimensions left runs each round (as in 1: past
    // head_dim it sums the last four dimensions again and stores nothing); the scores of the
    // direct keys are read in runs of 8, each invocation loading one with SHARE (past the direct
    // keys: never used).
    let direct = max(lo, select(len, min(len, row_start(r)), row_tree(r) != 0u));
    for (var d0 = 0u; d0 < hd4; d0 += WG) {
        if (share_any(d0 + t < hd4)) {
            let d = min(d0 + t, hd4 - 1u);
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            var page = 0xffffffffu;
            var base = 0u; // (the keys' cache rows: j + base within a page)
            for (var j0 = lo; j0 < direct; j0 += 8u) {
                let own0 = score_own(inv, s_base.x + j0);
                let own1 = score_own(inv, s_base.y + j0);
                let own2 = score_own(inv, s_base.z + j0);
                let own3 = score_own(inv, s_base.w + j0);
                for (var j = j0; j < min(j0 + 8u, direct); j++) {
                    if (j / PAGE != page) {
                        page = j / PAGE;
                        base = page_base(r, page);
                    }
                    let v = kv_vec4((j + base) * kv_row4 + v_base4 + d);
                    a0 = fma(vec4<f32>(score_at(s_base.x + j, j - j0, own0)), v, a0);
                    a1 = fma(vec4<f32>(score_at(s_base.y + j, j - j0, own1)), v, a1);
                    a2 = fma(vec4<f32>(score_at(s_base.z + j, j - j0, own2)), v, a2);
                    a3 = fma(vec4<f32>(score_at(s_base.w + j, j - j0, own3)), v, a3);
                }
            }
            for (var j = direct; j < len; j++) {
                let v = kv_vec4(key_row(r, j) * kv_row4 + v_base4 + d);
                a0 = fma(vec4<f32>(scores[s_base.x + j]), v, a0);
                a1 = fma(vec4<f32>(scores[s_base.y + j]), v, a1);
                a2 = fma(vec4<f32>(scores[s_base.z + j]), v, a2);
                a3 = fma(vec4<f32>(scores[s_base.w + j]), v, a3);
            }
            if (d0 + t < hd4) {
                let o = 4u * d;
                store_out(hs.x * p.head_dim + o, r, a0 * inv_l.x);
                if (nh > 1u) { store_out(hs.y * p.head_dim + o, r, a1 * inv_l.y); }
                if (nh > 2u) { store_out(hs.z * p.head_dim + o, r, a2 * inv_l.z); }
                if (nh > 3u) { store_out(hs.w * p.head_dim + o, r, a3 * inv_l.w); }
            }
        }
    }
}

// scores[i[c]] = v[c] for the block's nh heads
fn store_heads(i: vec4<u32>, v: vec4<f32>, nh: u32) {
    scores[i.x] = v.x;
    if (nh > 1u) { scores[i.y] = v.y; }
    if (nh > 2u) { scores[i.z] = v.z; }
    if (nh > 3u) { scores[i.w] = v.w; }
}

// Output row r's four values at within-row offset `at` (a head's dimensions)
fn store_out(at: u32, r: u32, o: vec4<f32>) {
    let i = r * p.heads * p.head_dim + at;
    for (var c = 0u; c < 4u; c++) { out[i + c] = o[c]; }
}
