// Sampling on the GPU: each row of logits drawn from by the Gumbel-max trick, so that only a word
// per row goes back to the host.
//
// A row's sampling distribution is p_j = exp((l_j - m) / T) / Z over the kept tokens j (all of
// them, or with 0 < top_k < vocab those ranked at most top_k: larger logits first, equal ones by
// lower id, -0.0 as +0.0, as top_k.wgsl ranks; with a min-p only those whose logit is at least
// the row's largest plus p.min_p_offset, T ln(min_p), added in f32 as src/sampling.rs adds it;
// then with top_p < 1 the nucleus of those, see final_cut),
// m their largest logit, Z the sum (reduced in a fixed order) -- the distribution of
// src/sampling.rs, computed in f32. Per row r of the pass (or only its last row, `last_only`; or,
// in a pass over several requests, rows seed.row0.. of one request, as many as the op is encoded
// for):
//   out[o] = a draw from p: argmax_j (l_j - m) / T + G_j over the kept j
// with o = r (or p.out_row for `last_only`). G_j are independent standard Gumbel variables hashed
// from (the generation's seed, the op's stream, the row's position -- a tree node's: its depth's
// -- and j): argmax of log-weight + Gumbel is an exact draw from the normalised weights. Two
// models' rows at one position (a target's and its draft model's) drawn with one stream share
// their noise: their draws agree where the two distributions put their maxima on one token.
// Speculative sampling's acceptance keeps a draft where its row's draw is the draft
// (accept_sampled.wgsl). A non-finite logit in row r sets status[0] to at least r + 1.
//
// No row is searched by one workgroup: a row is cut into slices of SLICE logits (the argmax's),
// one workgroup each, and the kernel runs in stages, one dispatch each (p.stage):
//   stage MAXES  (a min-p only, first) each slice's largest finite logit
//   stages 0-7   (a top-k only) the top_k-th ranked key, by a radix select over the
//                order-preserving keys, 4 bits a level: each workgroup combines the row's counts
//                of the level before (each slice's counts of its keys in 16 bins), picks the bin
//                where the counts from the top reach top_k, as every workgroup of the row does,
//                then counts its slice under the longer prefix
//   stage 8      each slice of each row: the top-k's cut (the last level's pick; of the tokens
//                tied at its key, the lowest ids up to top_k, as the ranking orders them), or
//                the min-p's floor (the row's largest logit from the slices'; plus the offset)
//                where that keeps fewer, kept for the later stages; its largest kept logit m_s
//                and z_s = sum of
//                exp((l - m_s) / T) over its kept tokens; with a top-p, its histogram of the
//                nucleus' first level (below)
//   stages 9-15  (a top-p only) the nucleus' last value, by a radix select of the same kind
//                weighed by mass: each workgroup combines the row's histograms of the level
//                before (each slice's masses and counts in 16 bins), picks the bin as every
//                workgroup of the row does, then histograms its slice under the longer prefix
//   stage DRAW   each slice's best draw from p (every workgroup derives the row's m, Z and
//                nucleus from the slices' stats and histograms, and reads its top-k cut: the
//                same bits)
//   stage FINISH one workgroup per row: the slices' draws in slice order
// The row's m is the largest m_s; Z = sum over s of z_s exp((m_s - m) / T) in a fixed order,
// whatever the rows of the pass. The draws are maxima of one total order (a larger value, then
// a lower id), the same whatever the slicing.

// The uniforms Step and Params (SampleParams), Seed (SampleSeed) and the constant SLICE are
// declared in Rust (src/gpu/ops.rs) and written ahead of this file by Kernel::source.

const WG: u32 = 64u;
const LOWEST: f32 = -0x1.fffffep+127f; // the lowest finite f32, written exactly
const NONE: u32 = 0xffffffffu;
const BINS: u32 = 16u;    // a level's bins: 4 bits of the key
const LEVELS: u32 = 8u;   // the levels of a 32-bit key
const NUCLEUS: u32 = 8u;  // the stats' stage, the nucleus' first level (the top-k's before it)
const DRAW: u32 = 16u;    // the stage that draws
const FINISH: u32 = 17u;  // the stage that combines the draws
const MAXES: u32 = 18u;   // a min-p's first stage: the slices' largest logits

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<uniform> seed: Seed;                      // the generation's, written by the host
@group(0) @binding(3) var<storage, read> logits: array<f32>;        // [n, vocab] the rows p
@group(0) @binding(4) var<storage, read_write> out: array<u32>;     // [rows]
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>; // [1] 1 + the last row with a
                                                                          // non-finite logit, or 0
// The stages' words, for p.slots rows and p.slices slices:
//   stats   [slots, slices, 2]           m_s, z_s (bits)
//   hist    [2, slots, slices, 2 BINS]   a level's masses (bits; the top-k's: unused), then
//                                        counts, by its parity
//   state   [2, slots, 2]                the prefix picked so far, the mass (bits; the top-k's:
//                                        the count) above it
//   draws   [slots, slices, 2]           the slice's best draw from p (value bits, id); before
//                                        stage DRAW, with a min-p: its largest logit, id unused
//   cut     [slots, 2]                   the top-k's or min-p's cut (value bits, id)
@group(0) @binding(6) var<storage, read_write> scratch: array<u32>;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> bin_m: array<f32, 1024>; // [BINS, WG] each invocation's masses per bin
var<workgroup> bin_c: array<u32, 1024>; // [BINS, WG] and counts
var<workgroup> tot_m: array<f32, BINS>;
var<workgroup> tot_c: array<u32, BINS>;
var<workgroup> shared_word: u32;

fn stats_at(slot: u32, s: u32) -> u32 {
    return 2u * (slot * p.slices + s);
}

fn hist_at(level: u32, slot: u32, s: u32) -> u32 {
    let base = 2u * p.slots * p.slices;
    return base + 2u * BINS * (((level & 1u) * p.slots + slot) * p.slices + s);
}

fn state_at(level: u32, slot: u32) -> u32 {
    let base = (2u + 4u * BINS) * p.slots * p.slices;
    return base + 2u * ((level & 1u) * p.slots + slot);
}

fn draws_at(slot: u32, s: u32) -> u32 {
    let base = (2u + 4u * BINS) * p.slots * p.slices + 4u * p.slots;
    return base + 2u * (slot * p.slices + s);
}

fn cut_at(slot: u32) -> u32 {
    let base = (4u + 4u * BINS) * p.slots * p.slices + 4u * p.slots;
    return base + 2u * slot;
}

fn word_f(at: u32) -> f32 {
    return bitcast<f32>(scratch[at]);
}

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
// the result is read with workgroupUniformLoad, so that what depends on it stays in uniform
// control flow for its barriers
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

// the best (value, id): the larger value, on ties the lower id (NONE loses to every id); returned
// as (value bits, id)
fn reduce_best(t: u32, v: f32, i: u32) -> vec2<u32> {
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
    let best = vec2<u32>(bitcast<u32>(red_v[0]), red_i[0]);
    workgroupBarrier();
    return best;
}

// The order-preserving key of a finite f32 (larger value, larger key; -0.0 is +0.0's) and back.
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(select(v, 0.0, v == 0.0));
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn value(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// A row's kept tokens, those ranking at least (v, i) (a larger logit, or v with an id <= i), its
// largest logit m and the normaliser z = sum of exp((l - m) / T) over them.
struct Cut { v: f32, i: u32, m: f32, z: f32 }

// Every token kept.
fn all_kept() -> Cut {
    return Cut(LOWEST, NONE, LOWEST, 0.0);
}

// The top-k's or the min-p's cut of the row in `slot` (every token without either), after stage
// NUCLEUS.
fn top_cut(slot: u32) -> Cut {
    var c = all_kept();
    if (p.top_k > 0u || p.min_p == 1u) {
        c.v = word_f(cut_at(slot));
        c.i = scratch[cut_at(slot) + 1u];
    }
    return c;
}

// The row's largest kept logit m and Z = sum of z_s exp((m_s - m) / T), from the slices' stats.
fn row_stats(t: u32, slot: u32) -> vec2<f32> {
    let inv_t = 1.0 / p.temperature;
    var m = LOWEST;
    for (var s = t; s < p.slices; s += WG) { m = max(m, word_f(stats_at(slot, s))); }
    m = reduce_max(t, m);
    var z = 0.0;
    for (var s = t; s < p.slices; s += WG) {
        let at = stats_at(slot, s);
        z = fma(word_f(at + 1u), exp((word_f(at) - m) * inv_t), z);
    }
    return vec2<f32>(m, reduce_sum(t, z));
}

// A level of the nucleus' radix select: the key prefix picked so far (4 bits a level), the mass
// of the kept tokens whose keys are above it, and (once picked) the count of those within it.
struct Level { prefix: u32, above: f32, count: u32 }

// The next 4 bits of the nucleus' last key: the row's histograms of `level` combined (each
// slice's masses times exp((m_s - m) / T), in a fixed order), then from the highest bin down the
// first whose mass, with all above it, reaches `need`; none reaching it (a rounding), the lowest
// nonempty one. Every workgroup of the row picks the same.
fn pick_bin(t: u32, at: Level, level: u32, need: f32, slot: u32, m: f32) -> Level {
    let inv_t = 1.0 / p.temperature;
    // invocation t: bin t / 4 of a quarter of the slices
    let b = t / 4u;
    var acc = 0.0;
    var cnt = 0u;
    for (var s = t % 4u; s < p.slices; s += 4u) {
        let h = hist_at(level, slot, s);
        acc = fma(word_f(h + b), exp((word_f(stats_at(slot, s)) - m) * inv_t), acc);
        cnt += scratch[h + BINS + b];
    }
    red_v[t] = acc;
    red_i[t] = cnt;
    workgroupBarrier();
    if (t < BINS) {
        let q = 4u * t;
        tot_m[t] = ((red_v[q] + red_v[q + 1u]) + red_v[q + 2u]) + red_v[q + 3u];
        tot_c[t] = red_i[q] + red_i[q + 1u] + red_i[q + 2u] + red_i[q + 3u];
    }
    workgroupBarrier();
    var pick = Level(at.prefix * BINS, at.above, 0u);
    var above = 0.0;
    for (var i = 0u; i < BINS; i++) {
        let bin = BINS - 1u - i;
        if (tot_c[bin] == 0u) { continue; }
        pick = Level(at.prefix * BINS + bin, at.above + above, tot_c[bin]);
        above += tot_m[bin];
        if (at.above + above >= need) { break; }
    }
    workgroupBarrier(); // every invocation has read the totals before their next use writes
    return pick;
}

// Slice s of row r: per bin of the key's 4 bits at `level`, the kept tokens whose keys start with
// `prefix` (the bits of the levels above): the sum of their exp((l - m_s) / T) (with `masses`)
// and their count. Each invocation fills its own column, then each bin's columns are added in
// order.
fn histogram(t: u32, at: vec3<u32>, level: u32, prefix: u32, ms: f32, cut: Cut, masses: bool) {
    let r = at.x;
    let slot = at.y;
    let s = at.z;
    let inv_t = 1.0 / p.temperature;
    for (var b = 0u; b < BINS; b++) {
        bin_m[b * WG + t] = 0.0;
        bin_c[b * WG + t] = 0u;
    }
    let end = min((s + 1u) * SLICE, p.vocab);
    for (var j = s * SLICE + t; j < end; j += WG) {
        let v = logits[r * p.vocab + j];
        let k = key(v);
        if (!at_least(v, j, cut.v, cut.i) || (level > 0u && (k >> (32u - 4u * level)) != prefix)) {
            continue;
        }
        let b = (k >> (28u - 4u * level)) & (BINS - 1u);
        if (masses) { bin_m[b * WG + t] += exp((v - ms) * inv_t); }
        bin_c[b * WG + t] += 1u;
    }
    workgroupBarrier();
    // invocation t: a quarter of bin t / 4's columns, in order; then the quarters in order
    let b = t / 4u;
    var acc = 0.0;
    var cnt = 0u;
    for (var c = (t % 4u) * (WG / 4u); c < (t % 4u + 1u) * (WG / 4u); c++) {
        acc += bin_m[b * WG + c];
        cnt += bin_c[b * WG + c];
    }
    red_v[t] = acc;
    red_i[t] = cnt;
    workgroupBarrier();
    if (t < BINS) {
        let q = 4u * t;
        let h = hist_at(level, slot, s);
        scratch[h + t] = bitcast<u32>(((red_v[q] + red_v[q + 1u]) + red_v[q + 2u]) + red_v[q + 3u]);
        scratch[h + BINS + t] = red_i[q] + red_i[q + 1u] + red_i[q + 2u] + red_i[q + 3u];
    }
    workgroupBarrier();
}

// A level of the top-k's radix select: the key prefix picked so far (4 bits a level), the count
// of the tokens whose keys are above it, and (once picked) the count of those within it.
struct Rank { prefix: u32, above: u32, count: u32 }

// The next 4 bits of the top_k-th ranked key: the row's counts of `level` combined, then from
// the highest bin down the first where the count with all above it reaches top_k; none reaching
// it (fewer ranked tokens: NaN and -inf never rank), the lowest nonempty one. Every workgroup of
// the row picks the same.
fn pick_rank(t: u32, at: Rank, level: u32, slot: u32) -> Rank {
    // invocation t: bin t / 4 of a quarter of the slices
    let b = t / 4u;
    var cnt = 0u;
    for (var s = t % 4u; s < p.slices; s += 4u) {
        cnt += scratch[hist_at(level, slot, s) + BINS + b];
    }
    red_i[t] = cnt;
    workgroupBarrier();
    if (t < BINS) {
        let q = 4u * t;
        tot_c[t] = red_i[q] + red_i[q + 1u] + red_i[q + 2u] + red_i[q + 3u];
    }
    workgroupBarrier();
    var pick = Rank(at.prefix * BINS, at.above, 0u);
    var above = at.above;
    for (var i = 0u; i < BINS; i++) {
        let bin = BINS - 1u - i;
        if (tot_c[bin] == 0u) { continue; }
        pick = Rank(at.prefix * BINS + bin, above, tot_c[bin]);
        above += tot_c[bin];
        if (above >= p.top_k) { break; }
    }
    workgroupBarrier(); // every invocation has read the totals before their next use writes
    return pick;
}

// Stages 0 to LEVELS - 1 (a top-k) for slice s of row r: the prefix picked from the level
// before, then the slice's counts of this level under it.
fn select_stage(t: u32, at: vec3<u32>, level: u32) {
    let slot = at.y;
    var now = Rank(0u, 0u, 0u);
    if (level > 0u) {
        let was = state_at(level - 1u, slot);
        now = pick_rank(t, Rank(scratch[was], scratch[was + 1u], 0u), level - 1u, slot);
    }
    if (at.z == 0u && t == 0u) {
        scratch[state_at(level, slot)] = now.prefix;
        scratch[state_at(level, slot) + 1u] = now.above;
    }
    histogram(t, at, level, now.prefix, 0.0, all_kept(), false);
}

// Row r's top-k cut from the select's last level: the top_k-th ranked key's value v* and, where
// fewer than the tokens tied at v* are kept, the last kept one's id (the lowest ids of a tie rank
// first).
fn select_cut(t: u32, r: u32, slot: u32) -> Cut {
    let was = state_at(LEVELS - 1u, slot);
    let last = pick_rank(t, Rank(scratch[was], scratch[was + 1u], 0u), LEVELS - 1u, slot);
    var c = all_kept();
    c.v = value(last.prefix);
    let want = p.top_k - min(last.above, p.top_k); // the tied tokens kept
    if (t == 0u) { shared_word = u32(want < last.count); }
    if (workgroupUniformLoad(&shared_word) == 1u) {
        c.i = nth_tied(t, r, slot, c.v, all_kept(), want, last.prefix & (BINS - 1u));
    }
    return c;
}

// Stages NUCLEUS + level for slice s of row r: the top-k's cut and the slice's stats (level 0),
// then the prefix picked from the level before and the slice's histogram of this level (a top-p
// only).
fn level_stage(t: u32, at: vec3<u32>, level: u32) {
    let r = at.x;
    let slot = at.y;
    let s = at.z;
    let inv_t = 1.0 / p.temperature;
    var cut = all_kept();
    if (level > 0u) {
        cut = top_cut(slot);
    } else if (p.top_k > 0u || p.min_p == 1u) { // (stored for the stages after this one)
        if (p.top_k > 0u) { cut = select_cut(t, r, slot); }
        if (p.min_p == 1u) { cut = min_p_cut(t, slot, cut); }
        if (s == 0u && t == 0u) {
            scratch[cut_at(slot)] = bitcast<u32>(cut.v);
            scratch[cut_at(slot) + 1u] = cut.i;
        }
    }
    if (level == 0u) {
        let end = min((s + 1u) * SLICE, p.vocab);
        var m = LOWEST;
        var bad = false;
        for (var j = s * SLICE + t; j < end; j += WG) {
            let v = logits[r * p.vocab + j];
            bad = bad || !finite(v);
            if (at_least(v, j, cut.v, cut.i)) { m = max(m, v); }
        }
        if (bad) { atomicMax(&status[0], r + 1u); }
        let ms = reduce_max(t, m);
        var z = 0.0;
        for (var j = s * SLICE + t; j < end; j += WG) {
            let v = logits[r * p.vocab + j];
            if (at_least(v, j, cut.v, cut.i)) { z += exp((v - ms) * inv_t); }
        }
        z = reduce_sum(t, z);
        if (t == 0u) {
            scratch[stats_at(slot, s)] = bitcast<u32>(ms);
            scratch[stats_at(slot, s) + 1u] = bitcast<u32>(z);
            if (s == 0u) { // the empty prefix, nothing above it
                scratch[state_at(0u, slot)] = 0u;
                scratch[state_at(0u, slot) + 1u] = 0u;
            }
        }
        if (p.top_p < 1.0) { histogram(t, at, 0u, 0u, ms, cut, true); }
        return;
    }
    let mz = row_stats(t, slot);
    let was = state_at(level - 1u, slot);
    let now = pick_bin(t, Level(scratch[was], word_f(was + 1u), 0u), level - 1u, p.top_p * mz.y, slot, mz.x);
    if (s == 0u && t == 0u) {
        scratch[state_at(level, slot)] = now.prefix;
        scratch[state_at(level, slot) + 1u] = bitcast<u32>(now.above);
    }
    histogram(t, at, level, now.prefix, word_f(stats_at(slot, s)), cut, true);
}

// Stage MAXES for slice s of row r: its largest finite logit, in its draws' first word.
fn maxes_stage(t: u32, at: vec3<u32>) {
    let end = min((at.z + 1u) * SLICE, p.vocab);
    var m = LOWEST;
    for (var j = at.z * SLICE + t; j < end; j += WG) {
        let v = logits[at.x * p.vocab + j];
        if (finite(v)) { m = max(m, v); }
    }
    m = reduce_max(t, m);
    if (t == 0u) { scratch[draws_at(at.y, at.z)] = bitcast<u32>(m); }
}

// `top` (a top-k's cut, or every token) narrowed to the min-p's: the tokens whose logits are at
// least the floor, the row's largest (from the slices' of stage MAXES) plus the offset, where
// that keeps fewer. Both keep a most likely prefix, so the narrower is their intersection.
fn min_p_cut(t: u32, slot: u32, top: Cut) -> Cut {
    var m = LOWEST;
    for (var s = t; s < p.slices; s += WG) { m = max(m, word_f(draws_at(slot, s))); }
    let least = reduce_max(t, m) + p.min_p_offset;
    if (least > top.v) { return Cut(least, NONE, LOWEST, 0.0); }
    return top;
}

// The id of the n-th (from 1) kept token of row r at the value vs, in id order: the slice
// holding it from the slices' counts in the last level's bin `bin` (a run of slices per
// invocation), then that slice's runs of SLICE / WG ids counted (one per invocation).
fn nth_tied(t: u32, r: u32, slot: u32, vs: f32, top: Cut, n: u32, bin: u32) -> u32 {
    let per = (p.slices + WG - 1u) / WG;
    let last = LEVELS - 1u;
    var c = 0u;
    for (var s = t * per; s < min((t + 1u) * per, p.slices); s++) {
        c += scratch[hist_at(last, slot, s) + BINS + bin];
    }
    red_i[t] = c;
    workgroupBarrier();
    var left = n;
    var run = 0u;
    for (; run + 1u < WG; run++) {
        if (left <= red_i[run]) { break; }
        left -= red_i[run];
    }
    var s = run * per;
    for (; s + 1u < min((run + 1u) * per, p.slices); s++) {
        let k = scratch[hist_at(last, slot, s) + BINS + bin];
        if (left <= k) { break; }
        left -= k;
    }
    if (t == 0u) { shared_word = NONE; }
    workgroupBarrier();
    let lo = s * SLICE + t * (SLICE / WG);
    let hi = min(lo + SLICE / WG, p.vocab);
    c = 0u;
    for (var j = lo; j < hi; j++) {
        let v = logits[r * p.vocab + j];
        if (v == vs && at_least(v, j, top.v, top.i)) { c += 1u; }
    }
    red_i[t] = c;
    workgroupBarrier();
    var holder = 0u;
    for (; holder + 1u < WG; holder++) {
        if (left <= red_i[holder]) { break; }
        left -= red_i[holder];
    }
    if (t == holder) {
        var k = 0u;
        for (var j = lo; j < hi; j++) {
            let v = logits[r * p.vocab + j];
            if (v == vs && at_least(v, j, top.v, top.i)) {
                k += 1u;
                if (k == left) {
                    shared_word = j;
                    break;
                }
            }
        }
    }
    return workgroupUniformLoad(&shared_word);
}

// Row r's kept tokens, its m and Z: the top-k's, then with top_p < 1 the smallest prefix of them
// in rank order whose mass reaches top_p. The nucleus' last value v* is the
// largest value whose tokens at or above it hold the mass (the radix select's last pick); of the
// tokens tied at v*, the lowest ids are kept until the mass is reached, as the ranking orders them.
fn final_cut(t: u32, r: u32, slot: u32) -> Cut {
    let inv_t = 1.0 / p.temperature;
    let top = top_cut(slot);
    let mz = row_stats(t, slot);
    if (p.top_p >= 1.0) { return Cut(top.v, top.i, mz.x, mz.y); }
    let was = state_at(LEVELS - 1u, slot);
    let at = Level(scratch[was], word_f(was + 1u), 0u);
    let last = pick_bin(t, at, LEVELS - 1u, p.top_p * mz.y, slot, mz.x);
    let vs = value(last.prefix);
    let tied = f32(last.count);
    let ws = exp((vs - mz.x) * inv_t);
    // tied tokens needed: the fewest c >= 1 with gt + c w* >= need (gt: the mass above v*)
    let want = clamp(ceil(fma(p.top_p, mz.y, -last.above) / ws), 1.0, tied);
    var c = Cut(vs, select(NONE, top.i, vs == top.v), mz.x, fma(want, ws, last.above));
    if (t == 0u) { shared_word = u32(want < tied); }
    if (workgroupUniformLoad(&shared_word) == 1u) {
        c.i = nth_tied(t, r, slot, vs, top, u32(want), last.prefix & (BINS - 1u));
    }
    return c;
}

// Stage DRAW for slice s of row r: its best draw from p.
fn draw_stage(t: u32, at: vec3<u32>) {
    let r = at.x;
    let slot = at.y;
    let s = at.z;
    let base = r * p.vocab;
    // the row's position: a chain's row r is at start_pos + r, a tree's node at start_pos + its
    // depth (the noise of a position is the same in a plain step, a chain and a tree)
    let pos = row_pos(r);
    let inv_t = 1.0 / p.temperature;
    let cp = final_cut(t, r, slot);
    // (the product meets the add in an explicit fused multiply-add: a compiler may contract it
    // differently from pipeline to pipeline, shaders/matmul.wgsl)
    var bv = LOWEST;
    var bi = NONE;
    let end = min((s + 1u) * SLICE, p.vocab);
    for (var j = s * SLICE + t; j < end; j += WG) {
        let v = logits[base + j];
        if (!at_least(v, j, cp.v, cp.i)) { continue; }
        let g = fma(v - cp.m, inv_t, gumbel(hash(2u * p.stream, pos, j))); // log of p_j * Z + the noise
        if (bi == NONE || g > bv) { bv = g; bi = j; }
    }
    let sample = reduce_best(t, bv, bi);
    if (t == 0u) {
        let d = draws_at(slot, s);
        scratch[d] = sample.x;
        scratch[d + 1u] = sample.y;
    }
}

// Stage FINISH for row r: the slices' draws combined in slice order.
fn finish_stage(t: u32, slot: u32, o: u32) {
    var bv = LOWEST;
    var bi = NONE;
    for (var s = t; s < p.slices; s += WG) {
        let d = draws_at(slot, s);
        let v = word_f(d);
        let i = scratch[d + 1u];
        if (i != NONE && (bi == NONE || v > bv)) { bv = v; bi = i; }
    }
    let sample = reduce_best(t, bv, bi).y;
    if (t == 0u) { out[o] = min(sample, p.vocab - 1u); }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    // a row per workgroup along x for FINISH, along y (its slices along x) for the others
    // (the op's rows: from seed.row0 of the pass, each its own scratch slot)
    var slot = select(wid.y, wid.x, p.stage == FINISH);
    var r = slot + seed.row0;
    var o = r;
    if (p.last_only == 1u) {
        r = step.n - 1u;
        slot = 0u;
        o = p.out_row;
    } else if (r >= step.n) {
        return;
    }
    if (p.stage == FINISH) {
        finish_stage(t, slot, o);
        return;
    }
    let at = vec3<u32>(r, slot, wid.x);
    if (p.stage == MAXES) {
        maxes_stage(t, at);
        return;
    }
    if (p.stage == DRAW) {
        draw_stage(t, at);
        return;
    }
    if (p.stage < NUCLEUS) {
        select_stage(t, at, p.stage);
        return;
    }
    level_stage(t, at, p.stage - NUCLEUS);
}
