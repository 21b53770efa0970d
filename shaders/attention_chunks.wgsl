// Causal attention split over the cache ("flash-decoding"), first half (the cache's format file,
// shaders/kv/, is placed ahead of this one): each workgroup attends one
// row's queries of up to HB heads of one KV group to one chunk of its keys, and writes the chunk's
// partial result; attention_merge.wgsl combines a row's chunks. The GPU shape of attention.wgsl:
// a decode step runs kv_heads x head blocks x chunks workgroups instead of one per query head,
// and the query heads of a GQA group share each k/v load.
//
// Keys are those of attention.wgsl (row r at its position pos, shaders/share/rows.wgsl, attends to
// its sequence's keys 0..=pos, found by key_row, shaders/kv/pages.wgsl; a tree pass's keys from its
// first position on are its ancestors' rows in depth order; with a sliding window, keys from
// pos - window + 1). Chunk c
// holds keys c * span .. (c + 1) * span (those of the row), a fixed
// partition of the key order, and is walked in blocks of 64 keys with a running maximum:
//   block scores s_j = (q . k_j) * scale;  m' = max(m, max_j s_j);  w_j = exp(s_j - m')
//   l = l * exp(m - m') + sum_j w_j;  o = o * exp(m - m') + sum_j w_j v_j
// The weighted values are read in parallel: the invocations form G = 64 / (head_dim / 4) key
// groups of head_dim / 4 invocations, one vec4 of dimensions each; group g takes keys g, g + G,
// g + 2G, ... of each block (in key order), keeps its own l and o for the chunk, and at the
// chunk's end the groups' sums are added in group order. The chunk writes (m, l) and the
// unnormalised o of each head. Every sum runs in an order fixed by pos, head_dim and the key order
// only (the maximum is exact in any order), so a row's result does not depend on the other rows
// of the pass: batch-invariant, as the one-pass kernel.

// The uniforms Step and Params (ChunksParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 64u;
const HB: u32 = 8u;    // query heads per workgroup, all of one KV group
// (head_dim <= 4 * WG: each invocation of a key group holds one vec4 of a head's dimensions)
const LOWEST: f32 = -0x1.fffffep+127f; // the lowest finite f32, written exactly

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;         // [n, heads * head_dim / 4]
// binding 3: kv, the cache [ctx, 2 * kv_heads * head_dim] (k | v) in the format file's format;
// binding 4: its page table (shaders/kv/pages.wgsl)
@group(0) @binding(5) var<storage, read_write> part: array<f32>;      // [n, heads, chunks, head_dim] o, then
                                                                      //   from ml_base [n, heads, chunks, 2] (m, l)

var<workgroup> sc: array<array<f32, WG>, HB>;   // [HB, WG] the block's scores, then its weights
var<workgroup> mx: array<array<f32, WG>, HB>;   // [HB, WG] the block maximum's tree; at the end
                                                //   [HB, G] each key group's l
var<workgroup> red: array<vec4<f32>, 512>;      // [HB, WG] (HB * WG) each invocation's o at the end

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.y;
    if (r >= step.n) { return; }
    let t = lid.x;
    let c = wid.x % p.chunks;
    let hb = (wid.x / p.chunks) % p.blocks;
    let kvh = wid.x / (p.chunks * p.blocks);
    let group = p.heads / p.kv_heads;
    let h0 = kvh * group + hb * HB;           // this block's first query head
    let nh = min(HB, group - hb * HB);        // and its heads
    let len = row_pos(r) + 1u;
    // (sliding-window attention: the row's keys start at lo; a chunk before them is skipped here
    // and by the merge)
    let lo = select(0u, len - p.window, p.window != 0u && len > p.window);
    let j0 = max(c * p.span, lo);
    let j1 = min(c * p.span + p.span, len);
    if (j0 >= j1) { return; }                 // a chunk outside the row's keys (uniform per workgroup)
    let hd4 = p.head_dim / 4u;
    let kv_row4 = 2u * p.kv_heads * hd4;
    let v_base4 = p.kv_heads * hd4 + kvh * hd4;
    // this invocation's key group and vec4 of dimensions (invocations past the groups only
    // join the barriers)
    let kgroups = max(1u, WG / hd4);
    let kg = t / hd4;
    let col = t % hd4;
    let grouped = kg < kgroups;

    var m: array<f32, HB>;
    var l: array<f32, HB>;                    // this key group's sums of weights
    var acc: array<vec4<f32>, HB>;            // and of weighted values, dims 4 col .. 4 col + 3
    for (var g = 0u; g < HB; g++) { m[g] = LOWEST; l[g] = 0.0; acc[g] = vec4<f32>(0.0); }

    for (var b = j0; b < j1; b += WG) {
        // 1. the scores of key b + t, each k load serving every head of the block
        let j = b + t;
        var s: array<f32, HB>;
        for (var g = 0u; g < HB; g++) { s[g] = 0.0; }
        if (j < j1) {
            let k_base = key_row(r, j) * kv_row4 + kvh * hd4;
            for (var d = 0u; d < hd4; d++) {
                let kd = kv_vec4(k_base + d);
                for (var g = 0u; g < HB; g++) {
                    if (g < nh) { s[g] += dot_fma(q[(r * p.heads + h0 + g) * hd4 + d], kd); }
                }
            }
        }
        for (var g = 0u; g < HB; g++) {
            let v = select(LOWEST, s[g] * p.scale, j < j1 && g < nh);
            sc[g][t] = v;
            mx[g][t] = v;
        }
        workgroupBarrier();
        // 2. the block's maximum per head (a tree; a maximum is exact in any order)
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (t < stride) {
                for (var g = 0u; g < HB; g++) { mx[g][t] = max(mx[g][t], mx[g][t + stride]); }
            }
            workgroupBarrier();
        }
        // 3. the running maximum, the rescaled sums, this key's weights
        var alpha: array<f32, HB>;
        for (var g = 0u; g < HB; g++) {
            let m_new = max(m[g], mx[g][0]);
            alpha[g] = exp(m[g] - m_new);
            m[g] = m_new;
            sc[g][t] = exp(sc[g][t] - m_new);
        }
        workgroupBarrier();
        // 4. each key group sums its keys' weights (the same l in each of its invocations) and
        //    its vec4 of the weighted values, in key order, each v load serving every head: the
        //    block's weights summed apart, then l = l alpha + their sum as one fused
        //    multiply-add (the rescale meets no add a compiler could fuse it with: see dot_fma)
        var lb: array<f32, HB>;
        for (var g = 0u; g < HB; g++) {
            lb[g] = 0.0;
            acc[g] *= alpha[g];
        }
        let keys = min(WG, j1 - b);
        if (grouped) {
            for (var jj = kg; jj < keys; jj += kgroups) {
                let v = kv_vec4(key_row(r, b + jj) * kv_row4 + v_base4 + col);
                for (var g = 0u; g < nh; g++) {
                    let w = sc[g][jj];
                    lb[g] += w;
                    acc[g] = fma(vec4<f32>(w), v, acc[g]);
                }
            }
        }
        for (var g = 0u; g < HB; g++) { l[g] = fma(l[g], alpha[g], lb[g]); }
        workgroupBarrier();                   // the next block rewrites sc and mx
    }

    // 5. the key groups' sums added in group order
    for (var g = 0u; g < HB; g++) {
        red[g * WG + t] = acc[g];
        if (grouped && col == 0u) { mx[g][kg] = l[g]; }
    }
    workgroupBarrier();
    for (var g = 0u; g < HB; g++) {
        if (g < nh) {
            let slot = (r * p.heads + h0 + g) * p.chunks + c;
            if (t < hd4) {
                var o = red[g * WG + t];
                for (var k = 1u; k < kgroups; k++) { o += red[g * WG + k * hd4 + t]; }
                let d = slot * p.head_dim + 4u * t;
                part[d] = o.x;
                part[d + 1u] = o.y;
                part[d + 2u] = o.z;
                part[d + 3u] = o.w;
            }
            if (t == 0u) {
                var l_all = mx[g][0];
                for (var k = 1u; k < kgroups; k++) { l_all += mx[g][k]; }
                part[p.ml_base + 2u * slot] = m[g];
                part[p.ml_base + 2u * slot + 1u] = l_all;
            }
        }
    }
}
