// Causal attention with grouped KV heads over the KV cache, split over positions (flash-decoding),
// part 1 of 2: partial results per chunk of 64 positions.
// Row r of the pass sits at position pos = start_pos + r and attends to cache positions 0..=pos:
//   s_j = (q . k_j) * scale;  out = sum_j exp(s_j - max s) v_j / sum_j exp(s_j - max s)
// Workgroup (kv head g and a block of up to 8 of its query heads, row r, chunk c) reads the k and v
// rows of positions 64c .. 64c + 64 (those <= pos) once for all the heads of the block, and writes
// for each head its chunk's max m_c, sum l_c = sum exp(s_j - m_c) and unnormalised output
// o_c = sum exp(s_j - m_c) v_j. shaders/attention_combine.wgsl merges the chunks.
// Chunks start at fixed positions and every reduction runs in a fixed order, so a row's result
// depends on its position only, never on n: a verify pass reproduces single-row steps bit for bit.
// The cache holds each position's k row then its v row: [ctx, 2 * kv_heads * head_dim].

struct Step { n: u32, start_pos: u32 }
struct Params {
    heads: u32,      // query heads
    kv_heads: u32,   // key/value heads (heads % kv_heads == 0)
    head_dim: u32,   // multiple of 4
    chunks: u32,     // chunks of the whole cache: ceil(ctx / CH), the stride of the partials
    scale: f32,      // 1 / sqrt(head_dim)
    hblocks: u32,    // blocks of up to HB query heads per kv head
    _pad0: u32,
    _pad1: u32,
}

const WG: u32 = 64u;
const CH: u32 = 64u; // positions per chunk: one per invocation while scoring
const HB: u32 = 8u;  // query heads per workgroup (of one kv head's group)
const LOWEST: f32 = -0x1.fffffep+127f; // the lowest finite f32, written exactly (Tint refuses an inexact literal)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;         // [n, heads * head_dim / 4]
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<f32>>;   // [ctx, 2 * kv_heads * head_dim / 4] (k | v)
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;         // the same buffer: [ctx, 2 * kv_heads * head_dim]
@group(0) @binding(5) var<storage, read_write> part: array<f32>;      // [n, heads, chunks, head_dim] o_c
@group(0) @binding(6) var<storage, read_write> stats: array<vec2<f32>>; // [n, heads, chunks] (m_c, l_c)

var<workgroup> e: array<array<f32, CH>, HB>;   // exp(s_j - m) of each head of the block
var<workgroup> red: array<array<f32, HB>, WG>; // reductions across the invocations

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = wid.x / p.hblocks;
    let hb = wid.x % p.hblocks;
    let r = wid.y;
    let c = wid.z;
    let len = step.start_pos + r + 1u;
    let j0 = c * CH;
    if (r >= step.n || j0 >= len) { return; } // the same for the whole workgroup
    let t = lid.x;
    let group = p.heads / p.kv_heads;
    let h0 = g * group + hb * HB;        // first query head of the block
    let nh = min(HB, group - hb * HB);   // its heads
    let hd4 = p.head_dim / 4u;
    let kv_row4 = 2u * p.kv_heads * hd4; // a cache row: k then v

    // 1. scores: invocation t takes position j0 + t, each k vector loaded once for the block
    let j = j0 + t;
    let valid = j < len;
    var s: array<f32, HB>;
    if (valid) {
        let kb = j * kv_row4 + g * hd4;
        for (var d = 0u; d < hd4; d++) {
            let kv = k_cache[kb + d];
            for (var i = 0u; i < HB; i++) {
                if (i < nh) { s[i] += dot(q[(r * p.heads + h0 + i) * hd4 + d], kv); }
            }
        }
    }
    for (var i = 0u; i < HB; i++) {
        s[i] = select(LOWEST, s[i] * p.scale, valid);
        red[t][i] = s[i];
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) {
            for (var i = 0u; i < HB; i++) { red[t][i] = max(red[t][i], red[t + stride][i]); }
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();

    // 2. exponentials and their sums
    for (var i = 0u; i < HB; i++) {
        let x = select(0.0, exp(s[i] - m[i]), valid);
        e[i][t] = x;
        red[t][i] = x;
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) {
            for (var i = 0u; i < HB; i++) { red[t][i] += red[t + stride][i]; }
        }
        workgroupBarrier();
    }
    let l = red[0];

    // 3. unnormalised outputs: invocation t takes dimensions t, t + 64, ...; each v value loaded
    //    once for the block, positions added in order
    let count = min(CH, len - j0);
    let kv_row = 2u * p.kv_heads * p.head_dim;
    let v_base = p.kv_heads * p.head_dim + g * p.head_dim;
    for (var d = t; d < p.head_dim; d += WG) {
        var o: array<f32, HB>;
        for (var jj = 0u; jj < count; jj++) {
            let v = v_cache[(j0 + jj) * kv_row + v_base + d];
            for (var i = 0u; i < HB; i++) { o[i] += e[i][jj] * v; }
        }
        for (var i = 0u; i < nh; i++) {
            part[((r * p.heads + h0 + i) * p.chunks + c) * p.head_dim + d] = o[i];
        }
    }
    if (t == 0u) {
        for (var i = 0u; i < nh; i++) {
            stats[(r * p.heads + h0 + i) * p.chunks + c] = vec2<f32>(m[i], l[i]);
        }
    }
}
