// Sampling on the GPU: each row of logits drawn from by the Gumbel-max trick, and what speculative
// sampling's acceptance needs from the row, so that only a few words go back to the host.
//
// A row's sampling distribution is p_j = exp((l_j - m) / T) / Z over the kept tokens j (all of
// them, or with top_k > 0 those ranked at most top_k: larger logits first, equal ones by lower id,
// as top_k.wgsl ranks; `top` holds each row's ranked ids; then with top_p < 1 the nucleus, see
// cut_of), m their largest logit, Z the sum (reduced in a fixed order) -- the distribution of
// src/sampling.rs, computed in f32. Per row r of the pass (or only its last row, `last_only`):
//   out[4 o + 0] = a draw from p: argmax_j (l_j - m) / T + G_j over the kept j
//   out[4 o + 1] = a draw from norm(max(0, p - q)), the recovered-token rule of speculative
//                  sampling, against the draft's distribution q of the same row: argmax_j
//                  log(p_j - q_j) + G'_j over the j with p_j > q_j; q is the one-hot of x_r when
//                  no q rows are bound (a deterministic draft), else the q row's own softmax at T
//                  over its own kept tokens; with no such j (p = q), the draw from p. (Rows from
//                  p.drafts on, and the pass's last row, check no draft: their q rows are not
//                  read, and this word repeats the draw from p.)
//   out[4 o + 2] = bits of p(x_r)   (rows r < p.drafts but the pass's last; x_r = drafts[r], the
//                                    token row r checks)
//   out[4 o + 3] = bits of q(x_r)   (1.0 for a one-hot q)
// with o = r (or p.out_row for `last_only`). G_j, G'_j are independent standard Gumbel variables
// hashed from (the cycle's seed, the op's stream, the row's position, j): argmax of log-weight +
// Gumbel is an exact draw from the normalised weights. A non-finite logit in row r sets status[0]
// to at least r + 1.

// The uniforms Step and Params (SampleParams), Seed (SampleSeed) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source.

const WG: u32 = 256u;   // invocations per row: each strides over the vocabulary (3 passes; about 37 with a top-p)
const LOWEST: f32 = -0x1.fffffep+127f; // the lowest finite f32, written exactly
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> seed: Seed;                      // written by the host each cycle
@group(0) @binding(3) var<storage, read> logits: array<f32>;        // [n, vocab] the target's p rows
@group(0) @binding(4) var<storage, read> top: array<u32>;           // [n, top_k] (top_k > 0)
@group(0) @binding(5) var<storage, read> q_logits: array<f32>;      // [n, vocab] (has_q)
@group(0) @binding(6) var<storage, read> q_top: array<u32>;         // [n, top_k] (has_q, top_k > 0)
@group(0) @binding(7) var<storage, read> drafts: array<u32>;        // [drafts] x_r
@group(0) @binding(8) var<storage, read_write> out: array<u32>;     // [rows, 4]
@group(0) @binding(9) var<storage, read_write> status: array<atomic<u32>>; // [1] 1 + the last row with a
                                                                          // non-finite logit, or 0

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

fn mix(x: u32) -> u32 { // the PCG hash (O'Neill; Jarzynski & Olano, "Hash Functions for GPU Rendering")
    let s = x * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn hash(stream: u32, pos: u32, j: u32) -> u32 {
    return mix(seed.lo ^ mix(seed.hi ^ mix(stream ^ mix(pos ^ mix(j)))));
}

// A standard Gumbel variable -log(E), E = -log(1 - w) exponential, w uniform in (0, 1) from 32
// hashed bits; for small w the series of -log(1 - w) keeps E's relative precision (E >= 2^-33).
fn gumbel(h: u32) -> f32 {
    let w = ldexp(f32(h) + 0.5, -32);
    var e = -log(1.0 - w);
    if (w < 0x1p-8f) { e = w * fma(w, fma(w, fma(w, 0.25, 0x1.555556p-2f), 0.5), 1.0); }
    return -log(e);
}

// (v, j) ranks at least as high as (tv, ti): a larger logit, or an equal one with a lower id
fn at_least(v: f32, j: u32, tv: f32, ti: u32) -> bool {
    return v > tv || (v == tv && j <= ti);
}

fn finite(v: f32) -> bool {
    return abs(v) <= 0x1.fffffep+127f; // false for NaN and infinities
}

// Reductions over the workgroup in a fixed tree (the host of each value is fixed by its index);
// the result is read with workgroupUniformLoad, so that loops over it (the nucleus' bisection)
// stay in uniform control flow for their barriers
fn reduce_max(t: u32, v: f32) -> f32 {
    red_v[t] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { red_v[t] = max(red_v[t], red_v[t + stride]); }
        workgroupBarrier();
    }
    let m = workgroupUniformLoad(&red_v[0]);
    workgroupBarrier();
    return m;
}

fn reduce_sum(t: u32, v: f32) -> f32 {
    red_v[t] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) { red_v[t] += red_v[t + stride]; }
        workgroupBarrier();
    }
    let s = workgroupUniformLoad(&red_v[0]);
    workgroupBarrier();
    return s;
}

// the best (value, id): the larger value, on ties the lower id (NONE loses to every id)
fn reduce_best(t: u32, v: f32, i: u32) -> u32 {
    red_v[t] = v;
    red_i[t] = i;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) {
            let ov = red_v[t + stride];
            let oi = red_i[t + stride];
            if (oi != NONE && (red_i[t] == NONE || ov > red_v[t] || (ov == red_v[t] && oi < red_i[t]))) {
                red_v[t] = ov;
                red_i[t] = oi;
            }
        }
        workgroupBarrier();
    }
    let best = workgroupUniformLoad(&red_i[0]);
    workgroupBarrier();
    return best;
}

// The order-preserving key of a finite f32 (larger value, larger key) and back.
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// logit idx of the p rows, or of the q rows
fn logit(q_row: bool, idx: u32) -> f32 {
    if (q_row) { return q_logits[idx]; }
    return logits[idx];
}

// A row's kept tokens, those ranking at least (v, i) (a larger logit, or v with an id <= i), its
// largest logit m and the normaliser z = sum of exp((l - m) / T) over them.
struct Cut { v: f32, i: u32, m: f32, z: f32 }

var<private> bad: bool; // a non-finite logit was read

// The kept tokens of row r (base: its first logit) of the p or q rows: its top_k ranked (all
// without a top-k), then with top_p < 1 the smallest prefix of them in rank order whose mass
// reaches top_p. The nucleus' last value v* (the largest value whose tokens at or above it hold
// the mass) is found by bisection over the order-preserving keys, each step a pass over the row;
// of the tokens tied at v*, the lowest ids are kept until the mass is reached, as the ranking
// orders them. Every invocation of the workgroup calls it (its reductions have barriers).
fn cut_of(t: u32, q_row: bool, r: u32, base: u32) -> Cut {
    let inv_t = 1.0 / p.temperature;
    var c = Cut(LOWEST, NONE, LOWEST, 0.0);
    if (p.top_k > 0u) {
        let at = r * p.top_k + p.top_k - 1u;
        c.i = select(top[at], q_top[at], q_row);
        c.v = logit(q_row, base + c.i);
    }
    var m = LOWEST;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(q_row, base + j);
        bad = bad || !finite(v);
        if (at_least(v, j, c.v, c.i)) { m = max(m, v); }
    }
    c.m = reduce_max(t, m);
    var z = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(q_row, base + j);
        if (at_least(v, j, c.v, c.i)) { z += exp((v - c.m) * inv_t); }
    }
    c.z = reduce_sum(t, z);
    if (p.top_p >= 1.0) { return c; }

    let need = p.top_p * c.z;
    var lo = key(LOWEST);
    var hi = key(c.m);
    while (lo < hi) {
        let mid = lo + (hi - lo + 1u) / 2u;
        let v_mid = value(mid);
        var s = 0.0;
        for (var j = t; j < p.vocab; j += WG) {
            let v = logit(q_row, base + j);
            if (v >= v_mid && at_least(v, j, c.v, c.i)) { s += exp((v - c.m) * inv_t); }
        }
        if (reduce_sum(t, s) >= need) { lo = mid; } else { hi = mid - 1u; }
    }
    let vs = value(lo);
    var gt = 0.0;
    var tied = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(q_row, base + j);
        if (at_least(v, j, c.v, c.i)) {
            if (v > vs) { gt += exp((v - c.m) * inv_t); }
            if (v == vs) { tied += 1.0; }
        }
    }
    gt = reduce_sum(t, gt);
    tied = reduce_sum(t, tied);
    // tied tokens needed: the fewest c >= 1 with gt + c w* >= need
    let ws = exp((vs - c.m) * inv_t);
    let want = u32(clamp(ceil(fma(p.top_p, c.z, -gt) / ws), 1.0, tied));
    var ti = select(NONE, c.i, vs == c.v); // all of them (those the top-k kept)
    if (want < u32(tied)) {
        // the smallest id with `want` tied tokens at or below it
        var a = 0u;
        var b = p.vocab - 1u;
        while (a < b) {
            let mid = (a + b) / 2u;
            var n = 0.0;
            for (var j = t; j <= mid; j += WG) {
                let v = logit(q_row, base + j);
                if (v == vs && at_least(v, j, c.v, c.i)) { n += 1.0; }
            }
            if (reduce_sum(t, n) >= f32(want)) { b = mid; } else { a = mid + 1u; }
        }
        ti = a;
    }
    c.v = vs;
    c.i = ti;
    z = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(q_row, base + j);
        if (at_least(v, j, c.v, c.i)) { z += exp((v - c.m) * inv_t); }
    }
    c.z = reduce_sum(t, z);
    return c;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    var r = wid.x;
    var o = wid.x;
    if (p.last_only == 1u) {
        r = step.n - 1u;
        o = p.out_row;
    } else if (r >= step.n) {
        return;
    }
    let base = r * p.vocab;
    let pos = step.start_pos + r;
    let inv_t = 1.0 / p.temperature;
    let has_x = r < p.drafts && r + 1u < step.n;  // (the pass's last row checks no draft)
    let x = select(NONE, drafts[min(r, max(p.drafts, 1u) - 1u)], has_x);
    let use_q = p.has_q == 1u && has_x;          // (the q rows past the drafts are not read)

    // 1. the kept tokens of p (and of q), their largest logits and normalisers
    bad = false;
    let cp = cut_of(t, false, r, base);
    var cq = Cut(LOWEST, NONE, LOWEST, 1.0);
    if (use_q) { cq = cut_of(t, true, r, base); }
    if (bad) { atomicMax(&status[0], r + 1u); }

    // 2. the draws: from p, and from the residual max(0, p - q). (Each product that meets an add
    //    is an explicit fused multiply-add, a division by Z a multiply by 1 / Z: a compiler may
    //    contract either differently from pipeline to pipeline: shaders/matmul.wgsl, dots.)
    let inv_zp = 1.0 / cp.z;
    let inv_zq = 1.0 / cq.z;
    var bv = LOWEST;
    var bi = NONE;
    var rv = LOWEST;
    var ri = NONE;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logits[base + j];
        if (!at_least(v, j, cp.v, cp.i)) { continue; }
        let lw = (v - cp.m) * inv_t;            // log of p_j * Z
        let g = fma(v - cp.m, inv_t, gumbel(hash(2u * p.stream, pos, j))); // lw + the noise

        if (bi == NONE || g > bv) { bv = g; bi = j; }
        if (!has_x) { continue; }               // (no draft checked: no residual drawn)
        // the log of the residual's weight (times Z) + its noise: with a one-hot q, lw's
        let noise = gumbel(hash(2u * p.stream + 1u, pos, j));
        var gr = fma(v - cp.m, inv_t, noise);
        if (use_q) {
            let pj = exp(lw) * inv_zp;
            let u = q_logits[base + j];
            let qj = select(0.0, exp((u - cq.m) * inv_t) * inv_zq, at_least(u, j, cq.v, cq.i));
            if (pj <= qj) { continue; }
            gr = log(fma(exp(lw), inv_zp, -qj)) + noise; // log(pj - qj) + the noise
        } else if (j == x) {
            continue;                           // max(0, p_x - 1) = 0
        }
        if (ri == NONE || gr > rv) { rv = gr; ri = j; }
    }
    let sample = reduce_best(t, bv, bi);
    let residual = reduce_best(t, rv, ri);

    if (t == 0u) {
        var px = 0.0;
        var qx = 1.0;
        if (has_x) {
            let v = logits[base + x];
            px = select(0.0, exp((v - cp.m) * inv_t) / cp.z, at_least(v, x, cp.v, cp.i));
            if (use_q) {
                let u = q_logits[base + x];
                qx = select(0.0, exp((u - cq.m) * inv_t) / cq.z, at_least(u, x, cq.v, cq.i));
            }
        }
        out[4u * o] = min(sample, p.vocab - 1u);
        out[4u * o + 1u] = select(residual, sample, residual == NONE);
        out[4u * o + 2u] = bitcast<u32>(px);
        out[4u * o + 3u] = bitcast<u32>(qx);
    }
}
