// EAGLE-2's dynamic draft tree, grown on the GPU between an EAGLE head's tree passes, so that a
// whole proposal is one submission with one read-back. One invocation keeps the candidate nodes
// (a node's score: the sum of its path's draft log-probabilities) in `state` and, per call:
//   mode 0 (start):  the root and its children (row 0 of the last projection's ranks);
//   mode 1 (expand): the children of the nodes the last pass expanded (rows 0..m of the ranks),
//                    whose predicted features went to store slots slot0..slot0 + m;
//   then (modes 0, 1) it chooses the nodes to expand next: the unexpanded nodes at `depth` among
//   the best N (N sized by the cost model, else max_nodes), best first, at most `width`; and
//   writes the pass that expands them into `out`: its Step (rows: their ancestors by depth and
//   age, then them; each row's ancestor bits), its tokens, each row's store slot (its parent's
//   feature) and the rows to project. No node to expand (or no room): a pass of 0 rows.
//   FINISH (mode + 4, on the last call): then the best N nodes as a tree (by depth, best first
//                    within a depth; parents as indices into it) into `out`, with their predicted
//                    number of accepted nodes and the passes run.
// Candidates rank by score, then depth (shallower first), then age: a node comes after its
// parent. The cost model: N maximises (1 + sum of the best N chances) / (passes * draft_pass +
// verify[N]) with a node's chance min(1, calibration * exp(score)), the smallest such N.

struct Step { n: u32, start_pos: u32 }
struct Params {
    mode: u32,        // 0 start, 1 expand; + FINISH
    root: u32,        // mode 0: the root's token
    start_pos: u32,   // the head's cache length: a pass's first row
    k: u32,           // ids ranked per projected row
    width: u32,       // nodes expanded per pass (<= 8)
    depth: u32,       // modes 0, 1: the depth of the nodes to expand next (0: expand none)
    slot0: u32,       // mode 1: the store slot of the last pass's first expanded node
    max_nodes: u32,   // drafted nodes the tree may hold (<= 31)
    room: u32,        // rows a pass may have (<= 32)
    use_costs: u32,   // 1: N from the cost model; else max_nodes
    calibration: f32,
    draft_pass: f32,  // seconds per draft pass
    verify: array<vec4<f32>, 8>, // [32] seconds of a verify pass of n rows (index n - 1)
}

const NMAX: u32 = 256u;     // candidate nodes kept
const NODES: u32 = 16u;     // state: [0] count, [1] m, [2..10) the last pass's expanded nodes, [10] passes
const TOKEN: u32 = NODES;
const PARENT: u32 = NODES + NMAX;
const DEPTH: u32 = NODES + 2u * NMAX;
const SCORE: u32 = NODES + 3u * NMAX;  // f32 bits
const SLOT: u32 = NODES + 4u * NMAX;   // NONE: not expanded
// scratch (in the state buffer: lavapipe runs code that indexes function arrays slowly)
const BEST: u32 = NODES + 5u * NMAX;   // [32] the best candidates, best first
const FRONT: u32 = BEST + 32u;         // [8] the nodes to expand
const ROWS: u32 = FRONT + 8u;          // [32] a pass's rows (nodes)
const BITS: u32 = ROWS + 32u;          // [32] their ancestor bits
const ANC: u32 = BITS + 32u;           // [8] bits: the ancestors of the nodes to expand
const ORDER: u32 = ANC + 8u;           // [32] the chosen tree, by depth
const NONE: u32 = 0xffffffffu;
const FINISH: u32 = 4u;
// out: [0, 36) the pass's Step, [36, 40) the projected rows' Step, [40, 72) each row's store slot,
// [72, 80) the projected rows, [80, 112) each row's token; FINISH: [112] N, [113] the predicted
// accepted nodes (f32 bits), [114] the passes run, [115, 147) tokens, [147, 179) parents (a child
// of the root: NONE)
const O_STEP: u32 = 0u;
const O_MANY: u32 = 36u;
const O_SLOTS: u32 = 40u;
const O_NEWEST: u32 = 72u;
const O_TOKENS: u32 = 80u;
const O_RESULT: u32 = 112u;

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;          // [m, k] the last projection's ranked ids
@group(0) @binding(3) var<storage, read> logp: array<f32>;         // [m, k] their log-probabilities
@group(0) @binding(4) var<storage, read_write> state: array<u32>;  // see NODES..SLOT
@group(0) @binding(5) var<storage, read_write> out: array<u32>;    // see O_STEP..O_RESULT

fn score(v: u32) -> f32 { return bitcast<f32>(state[SCORE + v]); }

// whether candidate a ranks before candidate b
fn before(a: u32, b: u32) -> bool {
    let sa = score(a);
    let sb = score(b);
    if (sa != sb) { return sa > sb; }
    let da = state[DEPTH + a];
    let db = state[DEPTH + b];
    if (da != db) { return da < db; }
    return a < b;
}

// Adds row r of the ranks as children of node v, each token once (v is expanded once, so its
// children are the nodes this call adds).
fn add_children(v: u32, r: u32) {
    let first = state[0];
    for (var j = 0u; j < p.k; j++) {
        let count = state[0];
        if (count >= NMAX) { return; }
        let t = ids[r * p.k + j];
        var seen = false;
        for (var c = first; c < count; c++) {
            if (state[TOKEN + c] == t) { seen = true; }
        }
        if (seen) { continue; }
        state[TOKEN + count] = t;
        state[PARENT + count] = v;
        state[DEPTH + count] = state[DEPTH + v] + 1u;
        state[SCORE + count] = bitcast<u32>(score(v) + logp[r * p.k + j]);
        state[SLOT + count] = NONE;
        state[0] = count + 1u;
    }
}


// The best `n` candidates into `best`, best first; returns how many there are.
fn rank(n: u32) -> u32 {
    let count = state[0];
    var got = 0u;
    var prev = NONE;
    for (var i = 0u; i < n; i++) {
        var pick = NONE;
        for (var c = 1u; c < count; c++) {
            let after = prev == NONE || before(prev, c);
            if (after && (pick == NONE || before(c, pick))) { pick = c; }
        }
        if (pick == NONE) { break; }
        state[BEST + i] = pick;
        prev = pick;
        got = i + 1u;
    }
    return got;
}

// The number of nodes worth verifying after `passes` draft passes (ranks the best first).
fn size(passes: u32) -> u32 {
    let n = rank(p.max_nodes);
    if (p.use_costs == 0u) { return n; }
    var chosen = min(n, 1u);
    var best_rate = -1.0;
    var expected = 1.0;
    let draft = f32(passes) * p.draft_pass;
    for (var i = 0u; i < n; i++) {
        expected += min(1.0, p.calibration * exp(score(state[BEST + i])));
        let t = draft + p.verify[(i + 1u) / 4u][(i + 1u) % 4u];
        var rate = expected;
        if (t > 0.0) { rate = expected / t; }
        if (rate > best_rate) {
            chosen = i + 1u;
            best_rate = rate;
        }
    }
    return chosen;
}

// Writes a pass of no rows.
fn no_pass() {
    out[O_STEP] = 0u;
    out[O_STEP + 1u] = p.start_pos;
    out[O_STEP + 2u] = 1u;
    out[O_MANY] = 0u;
    state[1] = 0u;
}

// Chooses the nodes to expand next and writes their pass.
fn choose() {
    if (p.depth == 0u) { no_pass(); return; }
    let n = size(state[10] + 1u);
    var m = 0u;
    for (var i = 0u; i < n && m < p.width; i++) {
        let v = state[BEST + i];
        if (state[DEPTH + v] == p.depth && state[SLOT + v] == NONE) {
            state[FRONT + m] = v;
            m += 1u;
        }
    }
    if (m == 0u) { no_pass(); return; }
    // rows: the ancestors below the root (by depth, then age), then the frontier
    for (var i = 0u; i < 8u; i++) { state[ANC + i] = 0u; }
    for (var i = 0u; i < m; i++) {
        var a = state[PARENT + state[FRONT + i]];
        for (var up = 0u; up < 32u && a != 0u; up++) {
            state[ANC + a / 32u] |= 1u << (a % 32u);
            a = state[PARENT + a];
        }
    }
    var nr = 0u;
    for (var d = 1u; d < p.depth; d++) {
        for (var c = 1u; c < state[0]; c++) {
            if ((state[ANC + c / 32u] & (1u << (c % 32u))) == 0u || state[DEPTH + c] != d) { continue; }
            if (nr >= 32u) { no_pass(); return; }
            state[ROWS + nr] = c;
            nr += 1u;
        }
    }
    if (nr + m > min(p.room, 32u)) { no_pass(); return; }
    for (var i = 0u; i < m; i++) {
        state[ROWS + nr] = state[FRONT + i];
        nr += 1u;
    }
    // each row's ancestor bits (its parent's row is before it, or it hangs from the root)
    for (var r = 0u; r < nr; r++) {
        let node = state[ROWS + r];
        let parent = state[PARENT + node];
        var above = 0u;
        for (var j = 0u; j < r; j++) {
            if (state[ROWS + j] == parent) { above = state[BITS + j]; }
        }
        let bits = above | (1u << r);
        state[BITS + r] = bits;
        out[O_STEP + 4u + r] = bits;
        out[O_SLOTS + r] = state[SLOT + parent];
        out[O_TOKENS + r] = state[TOKEN + node];
    }
    out[O_STEP] = nr;
    out[O_STEP + 1u] = p.start_pos;
    out[O_STEP + 2u] = 1u;
    out[O_MANY] = m;
    out[O_MANY + 1u] = 0u;
    state[1] = m;
    for (var i = 0u; i < m; i++) {
        out[O_NEWEST + i] = nr - m + i;
        state[2u + i] = state[FRONT + i];
    }
}

@compute @workgroup_size(1)
fn main() {
    _ = step.n; // keeps the binding in the layout
    let mode = p.mode & 3u;
    if (mode == 0u) {
        state[0] = 1u;
        state[10] = 0u;
        state[TOKEN] = p.root;
        state[PARENT] = 0u;
        state[DEPTH] = 0u;
        state[SCORE] = bitcast<u32>(0.0);
        state[SLOT] = 0u;
        add_children(0u, 0u);
        choose();
    } else {
        let m = state[1];
        if (m == 0u) {
            no_pass();
        } else {
            state[10] += 1u;
            for (var i = 0u; i < m; i++) {
                let v = state[2u + i];
                state[SLOT + v] = p.slot0 + i;
                add_children(v, i);
            }
            choose();
        }
    }
    if ((p.mode & FINISH) == 0u) { return; }
    // the best N as a tree, by depth (stable: best first within a depth)
    let n = size(state[10]);
    var placed = 0u;
    var predicted = 0.0;
    for (var d = 1u; d <= 32u && placed < n; d++) {
        for (var i = 0u; i < n; i++) {
            if (state[DEPTH + state[BEST + i]] == d) {
                state[ORDER + placed] = state[BEST + i];
                placed += 1u;
            }
        }
    }
    out[O_RESULT] = n;
    for (var i = 0u; i < n; i++) {
        let v = state[ORDER + i];
        predicted += min(1.0, exp(score(v)));
        out[O_RESULT + 3u + i] = state[TOKEN + v];
        var parent = NONE;
        for (var j = 0u; j < i; j++) {
            if (state[ORDER + j] == state[PARENT + v]) { parent = j; }
        }
        out[O_RESULT + 35u + i] = parent;
    }
    out[O_RESULT + 1u] = bitcast<u32>(predicted);
    out[O_RESULT + 2u] = state[10];
}
