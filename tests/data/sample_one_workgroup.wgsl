// Sampling on the GPU: each row of logits drawn from by the Gumbel-max trick. (The kernel as it
// was, less the draft's q rows, residual draws and probabilities it also computed then.)
//
// A row's sampling distribution is p_j = exp((l_j - m) / T) / Z over the kept tokens j (all of
// them, or with top_k > 0 those ranked at most top_k: larger logits first, equal ones by lower id,
// as top_k.wgsl ranks; `top` holds each row's ranked ids; then with top_p < 1 the nucleus, see
// cut_of), m their largest logit, Z the sum (reduced in a fixed order) -- the distribution of
// src/sampling.rs, computed in f32. Per row r of the pass (or only its last row, `last_only`):
//   out[o] = a draw from p: argmax_j (l_j - m) / T + G_j over the kept j
// with o = r (or p.out_row for `last_only`). G_j are independent standard Gumbel variables hashed
// from (the cycle's seed, the op's stream, the row's position, j): argmax of log-weight + Gumbel
// is an exact draw from the normalised weights. A non-finite logit in row r sets status[0]
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
@group(0) @binding(5) var<storage, read_write> out: array<u32>;     // [rows]
@group(0) @binding(6) var<storage, read_write> status: array<atomic<u32>>; // [1] 1 + the last row with a
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

// logit idx of the rows
fn logit(idx: u32) -> f32 {
    return logits[idx];
}

// A row's kept tokens, those ranking at least (v, i) (a larger logit, or v with an id <= i), its
// largest logit m and the normaliser z = sum of exp((l - m) / T) over them.
struct Cut { v: f32, i: u32, m: f32, z: f32 }

var<private> bad: bool; // a non-finite logit was read

// The kept tokens of row r (base: its first logit): its top_k ranked (all
// without a top-k), then with top_p < 1 the smallest prefix of them in rank order whose mass
// reaches top_p. The nucleus' last value v* (the largest value whose tokens at or above it hold
// the mass) is found by bisection over the order-preserving keys, each step a pass over the row;
// of the tokens tied at v*, the lowest ids are kept until the mass is reached, as the ranking
// orders them. Every invocation of the workgroup calls it (its reductions have barriers).
fn cut_of(t: u32, r: u32, base: u32) -> Cut {
    let inv_t = 1.0 / p.temperature;
    var c = Cut(LOWEST, NONE, LOWEST, 0.0);
    if (p.top_k > 0u) {
        let at = r * p.top_k + p.top_k - 1u;
        c.i = top[at];
        c.v = logit(base + c.i);
    }
    var m = LOWEST;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(base + j);
        bad = bad || !finite(v);
        if (at_least(v, j, c.v, c.i)) { m = max(m, v); }
    }
    c.m = reduce_max(t, m);
    var z = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(base + j);
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
            let v = logit(base + j);
            if (v >= v_mid && at_least(v, j, c.v, c.i)) { s += exp((v - c.m) * inv_t); }
        }
        if (reduce_sum(t, s) >= need) { lo = mid; } else { hi = mid - 1u; }
    }
    let vs = value(lo);
    var gt = 0.0;
    var tied = 0.0;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logit(base + j);
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
                let v = logit(base + j);
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
        let v = logit(base + j);
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

    // 1. the kept tokens of p, their largest logit and normaliser
    bad = false;
    let cp = cut_of(t, r, base);
    if (bad) { atomicMax(&status[0], r + 1u); }

    // 2. the draw from p (the product that meets the add an explicit fused multiply-add)
    var bv = LOWEST;
    var bi = NONE;
    for (var j = t; j < p.vocab; j += WG) {
        let v = logits[base + j];
        if (!at_least(v, j, cp.v, cp.i)) { continue; }
        let g = fma(v - cp.m, inv_t, gumbel(hash(2u * p.stream, pos, j))); // log of p_j * Z + the noise
        if (bi == NONE || g > bv) { bv = g; bi = j; }
    }
    let sample = reduce_best(t, bv, bi);
    if (t == 0u) { out[o] = min(sample, p.vocab - 1u); }
}
