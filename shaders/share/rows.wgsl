// Where the rows of a pass sit (the Step uniform, declared in Rust: src/gpu/ops.rs), placed ahead
// of every op that puts rows at positions or reads or writes the KV cache.
// A pass of one sequence (step.paged == 0): row r at position start_pos + r, or a token tree's
// node at start_pos + its depth; its k/v go to cache row start_pos + r (kv_keep compacts a
// tree's), the cache being that sequence's alone.
// A pass over several sequences of a pool of pages of PAGE positions (step.paged == 1): rows of
// one sequence are consecutive, and step.rows[r] = (start, first, table, slot): the position of
// the sequence's first row in the pass, that row's index, where the sequence's pages begin in the
// pass's page table (shaders/kv/pages.wgsl), and the cache row that r's k/v go to; a token tree's
// node has its tree's root as its first row, the root's position as its start, and its cache row
// at the root's position + its index in the tree (scratch positions, compacted after).
// A tree pass (step.tree == 1): step.ancestors[r] the bits of r's tree's rows (bit j: row
// row_first(r) + j) that are r or its ancestors; 0 for a row that is no tree's node (a paged
// pass holds trees beside chains).
// Nothing here depends on the other rows of the pass: a row's keys and their order are those of
// its own sequence, whatever shares the pass.

// The position of the first row of r's sequence in the pass.
fn row_start(r: u32) -> u32 {
    if (step.paged == 0u) { return step.start_pos; }
    return step.rows[r].x;
}

// The pass row of the first row of r's sequence (a tree node's: its tree's root).
fn row_first(r: u32) -> u32 {
    if (step.paged == 0u) { return 0u; }
    return step.rows[r].y;
}

// Row r's ancestor bits if it is a tree's node, else 0.
fn row_tree(r: u32) -> u32 {
    if (step.tree == 0u) { return 0u; }
    return step.ancestors[r / 4u][r % 4u];
}

// Row r's offset from row_start: its index among its sequence's rows, or a tree node's depth.
fn row_depth(r: u32) -> u32 {
    let tree = row_tree(r);
    if (tree != 0u) { return countOneBits(tree) - 1u; }
    return r - row_first(r);
}

// Row r's position in its sequence.
fn row_pos(r: u32) -> u32 {
    return row_start(r) + row_depth(r);
}

// The cache row that row r's k and v go to.
fn cache_row(r: u32) -> u32 {
    if (step.paged == 0u) { return step.start_pos + r; }
    return step.rows[r].w;
}
