// EAGLE-2's dynamic draft tree, grown on the GPU between an EAGLE head's tree passes, so that a
// whole proposal is one submission with one read-back. One workgroup keeps the candidate nodes
// (a node's score: the sum of its path's draft log-probabilities) in `state` and, per call:
//   START:           the root and its children (row 0 of the last projection's ranks);
//   EXPAND:          the children of the nodes the last pass expanded (rows 0..m of the ranks),
//                    whose predicted features went to store slots slot0..slot0 + m;
//   then (both) it chooses the nodes to expand next: the unexpanded nodes at `depth` among
//   the best N (N sized by the cost model, else max_nodes), best first, at most `width`; and
//   writes the pass that expands them into `out`: its Step (rows: their ancestors by depth and
//   age, then them; each row's ancestor bits), its tokens, each row's store slot (its parent's
//   feature) and the rows to project. No node to expand (or no room): a pass of 0 rows.
//   + FINISH (on the last call):        then the best N nodes as a tree (by depth, best first
//                    within a depth; parents as indices into it) into `out`, with their predicted
//                    number of accepted nodes and the passes run.
// Candidates rank by score, then depth (shallower first), then age: a node comes after its
// parent. The cost model: N maximises (1 + sum of the best N chances) / (passes * draft_pass +
// verify[N]) with a node's chance min(1, calibration * exp(score)), the smallest such N.
//
// Shape: the orders are counted, not searched. Invocation c (one per candidate slot, 256) finds
// its candidate's place in an order by counting the candidates before it (a strict total order:
// the same places as picking the best one after another), as it does for the ancestors' rows
// (by depth, then age) and for the chosen tree (by depth, then rank); each row's ancestor bits
// come from walking its own node's parents. Invocation 0 keeps what is serial and small (the
// children of at most 8 expanded nodes, the cost model's sums over at most 31 nodes) and hands
// its decisions to the others through workgroup memory. The same outputs, bit for bit, as the
// one-invocation kernel that walked every order itself (tests/data/eagle_tree_one_invocation.wgsl,
// compared on random and tied candidates in tests/kernels.rs).

// The uniforms Step and Params (EagleTreeParams) are declared in Rust (src/gpu/ops.rs) and written
// ahead of this file by Kernel::source, with the host's constants: the modes START, EXPAND and
// FINISH (EagleTreeMode), the offsets O_STEP..O_RESULT into `out` below (EAGLE_TREE_STEP..), and
// the buffers' sizes STATE_WORDS and OUT_WORDS (EAGLE_TREE_STATE, EAGLE_TREE_OUT), checked here:
const_assert ORDER + 32u == STATE_WORDS;
const_assert O_RESULT + 3u + 2u * 32u == OUT_WORDS;

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
const ANC: u32 = BITS + 32u;           // [8] (unused: the ancestors' bits are kept in `anc`)
const ORDER: u32 = ANC + 8u;           // [32] the chosen tree, by depth
const NONE: u32 = 0xffffffffu;
// out: [0, 36) the pass's Step, [36, 40) the projected rows' Step, [40, 72) each row's store slot,
// [72, 80) the projected rows, [80, 112) each row's token; FINISH: [112] N, [113] the predicted
// accepted nodes (f32 bits), [114] the passes run, [115, 147) tokens, [147, 179) parents (a child
// of the root: NONE)

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> ids: array<u32>;          // [m, k] the last projection's ranked ids
@group(0) @binding(3) var<storage, read> logp: array<f32>;         // [m, k] their log-probabilities
@group(0) @binding(4) var<storage, read_write> state: array<u32>;  // see NODES..SLOT
@group(0) @binding(5) var<storage, read_write> out: array<u32>;    // see O_STEP..O_RESULT

const WGS: u32 = 256u;      // invocations: one per candidate slot (NMAX)
var<workgroup> told: u32;                        // a decision of invocation 0, for all
var<workgroup> anc: array<atomic<u32>, 8>;       // [8] bits: the ancestors of the nodes to expand
var<workgroup> marked: atomic<u32>;              // how many
var<workgroup> row_of: array<u32, NMAX>;         // [NMAX] each row node's row in the pass

// Invocation 0's `value` (in its uniform control flow, every invocation's call) to all.
fn tell(t: u32, value: u32) -> u32 {
    if (t == 0u) { told = value; }
    storageBarrier();
    workgroupBarrier();
    return workgroupUniformLoad(&told);
}

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


// The best `n` candidates into BEST, best first (invocation c places candidate c: its place is
// the number of candidates before it); returns how many there are (uniform).
fn rank(t: u32, n: u32) -> u32 {
    let count = state[0];
    if (t >= 1u && t < count) {
        var place = 0u;
        for (var d = 1u; d < count; d++) {
            if (before(d, t)) { place += 1u; }
        }
        if (place < n) { state[BEST + place] = t; }
    }
    storageBarrier();
    return tell(t, min(n, count - 1u));
}

// The number of nodes worth verifying after `passes` draft passes (ranks the best first).
fn size(t: u32, passes: u32) -> u32 {
    let n = rank(t, p.max_nodes);
    if (p.use_costs == 0u) { return n; }
    var chosen = min(n, 1u);
    if (t == 0u) {
        var best_rate = -1.0;
        var expected = 1.0;
        let passes_f = f32(passes);
        for (var i = 0u; i < n; i++) {
            expected += min(1.0, p.calibration * exp(score(state[BEST + i])));
            let time = fma(passes_f, p.draft_pass, p.verify[(i + 1u) / 4u][(i + 1u) % 4u]);
            var rate = expected;
            if (time > 0.0) { rate = expected / time; }
            if (rate > best_rate) {
                chosen = i + 1u;
                best_rate = rate;
            }
        }
    }
    return tell(t, chosen);
}

// Writes a pass of no rows (invocation 0).
fn no_pass(t: u32) {
    if (t != 0u) { return; }
    out[O_STEP] = 0u;
    out[O_STEP + 1u] = p.start_pos;
    out[O_STEP + 2u] = 1u;
    out[O_STEP + 3u] = 0u; // (one sequence: not paged)
    out[O_MANY] = 0u;
    state[1] = 0u;
}

// Whether candidate c is an ancestor (below the root) of a node to expand.
fn is_marked(c: u32) -> bool {
    return (atomicLoad(&anc[c / 32u]) & (1u << (c % 32u))) != 0u;
}

// Chooses the nodes to expand next and writes their pass.
fn choose(t: u32) {
    if (p.depth == 0u) { no_pass(t); return; }
    let n = size(t, state[10] + 1u);
    // the frontier: the best unexpanded nodes at the depth, at most `width`
    var front = 0u;
    if (t == 0u) {
        for (var i = 0u; i < n && front < p.width; i++) {
            let v = state[BEST + i];
            if (state[DEPTH + v] == p.depth && state[SLOT + v] == NONE) {
                state[FRONT + front] = v;
                front += 1u;
            }
        }
    }
    let m = tell(t, front);
    if (m == 0u) { no_pass(t); return; }
    // their ancestors below the root: each frontier node's invocation walks its parents
    if (t < 8u) { atomicStore(&anc[t], 0u); }
    if (t == 0u) { atomicStore(&marked, 0u); }
    workgroupBarrier();
    if (t < m) {
        var a = state[PARENT + state[FRONT + t]];
        for (var up = 0u; up < 32u && a != 0u; up++) {
            atomicOr(&anc[a / 32u], 1u << (a % 32u));
            a = state[PARENT + a];
        }
    }
    workgroupBarrier();
    // rows: the ancestors by depth, then age (each one's row: the ancestors before it), then
    // the frontier
    let count = state[0];
    if (t >= 1u && t < count && is_marked(t) && state[DEPTH + t] < p.depth) {
        let dt = state[DEPTH + t];
        var row = 0u;
        for (var e = 1u; e < count; e++) {
            let de = state[DEPTH + e];
            if (is_marked(e) && de < p.depth && (de < dt || (de == dt && e < t))) { row += 1u; }
        }
        atomicAdd(&marked, 1u);
        if (row < 32u) {
            state[ROWS + row] = t;
            row_of[t] = row;
        }
    }
    storageBarrier();
    workgroupBarrier();
    var rows = 0u;
    if (t == 0u) {
        let nr = atomicLoad(&marked);
        if (nr + m <= min(p.room, 32u)) {
            for (var i = 0u; i < m; i++) {
                let v = state[FRONT + i];
                state[ROWS + nr + i] = v;
                row_of[v] = nr + i;
            }
            rows = nr + m;
        }
    }
    let nr = tell(t, rows);
    if (nr == 0u) { no_pass(t); return; }
    // each row's ancestor bits: itself and its ancestors' rows
    if (t < nr) {
        let node = state[ROWS + t];
        let parent = state[PARENT + node];
        var bits = 1u << t;
        var a = parent;
        for (var up = 0u; up < 32u && a != 0u; up++) {
            bits |= 1u << row_of[a];
            a = state[PARENT + a];
        }
        state[BITS + t] = bits;
        out[O_STEP + 4u + t] = bits;
        out[O_SLOTS + t] = state[SLOT + parent];
        out[O_TOKENS + t] = state[TOKEN + node];
    }
    if (t == 0u) {
        out[O_STEP] = nr;
        out[O_STEP + 1u] = p.start_pos;
        out[O_STEP + 2u] = 1u;
        out[O_STEP + 3u] = 0u;
        out[O_MANY] = m;
        out[O_MANY + 1u] = 0u;
        state[1] = m;
        for (var i = 0u; i < m; i++) {
            out[O_NEWEST + i] = nr - m + i;
            state[2u + i] = state[FRONT + i];
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32) {
    _ = step.n; // keeps the binding in the layout
    let mode = p.mode & ~FINISH;
    // (invocation 0) the root and its children, or the expanded nodes' children
    var expand = 1u;
    if (t == 0u) {
        if (mode == START) {
            state[0] = 1u;
            state[10] = 0u;
            state[TOKEN] = p.root;
            state[PARENT] = 0u;
            state[DEPTH] = 0u;
            state[SCORE] = bitcast<u32>(0.0);
            state[SLOT] = 0u;
            add_children(0u, 0u);
        } else {
            let m = state[1];
            if (m == 0u) {
                expand = 0u;
            } else {
                state[10] += 1u;
                for (var i = 0u; i < m; i++) {
                    let v = state[2u + i];
                    state[SLOT + v] = p.slot0 + i;
                    add_children(v, i);
                }
            }
        }
    }
    if (tell(t, expand) == 1u) {
        choose(t);
    } else {
        no_pass(t);
    }
    if ((p.mode & FINISH) == 0u) { return; }
    // the best N as a tree, by depth (stable: best first within a depth): each chosen node's
    // place is the number of chosen nodes before it in that order
    storageBarrier();
    let n = size(t, state[10]);
    if (t < n) {
        let v = state[BEST + t];
        let d = state[DEPTH + v];
        var place = 0u;
        for (var i = 0u; i < n; i++) {
            let di = state[DEPTH + state[BEST + i]];
            if (di < d || (di == d && i < t)) { place += 1u; }
        }
        state[ORDER + place] = v;
    }
    storageBarrier();
    if (t < n) {
        let v = state[ORDER + t];
        out[O_RESULT + 3u + t] = state[TOKEN + v];
        var parent = NONE;
        for (var j = 0u; j < t; j++) {
            if (state[ORDER + j] == state[PARENT + v]) { parent = j; }
        }
        out[O_RESULT + 35u + t] = parent;
    }
    if (t == 0u) {
        var predicted = 0.0;
        for (var i = 0u; i < n; i++) { predicted += min(1.0, exp(score(state[ORDER + i]))); }
        out[O_RESULT] = n;
        out[O_RESULT + 1u] = bitcast<u32>(predicted);
        out[O_RESULT + 2u] = state[10];
    }
}
