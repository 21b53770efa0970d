// Where a row's keys are in the KV cache (after shaders/share/rows.wgsl, ahead of an attention op).

@group(0) @binding(4) var<storage, read> pages: array<u32>;   // (paged passes) the pass's page table:
                                                              //   each sequence's pages, in position order

// The cache row of key j (at most its position) of pass row r: a tree node's keys from its tree's
// first position on are its ancestors' rows in depth order (row row_first(r) + the (j - start)-th
// set bit of its ancestor bits); every other key is position j of r's sequence: cache row j (one
// sequence), or row j % PAGE of the sequence's page j / PAGE.
fn key_row(r: u32, j: u32) -> u32 {
    let start = row_start(r);
    var m = row_tree(r);
    if (m != 0u && j >= start) {
        for (var i = start; i < j; i++) { m &= m - 1u; }
        return cache_row(row_first(r) + firstTrailingBit(m));
    }
    if (step.paged == 0u) { return j; }
    return pages[step.rows[r].z + j / PAGE] * PAGE + j % PAGE;
}

// For the keys j of page `page` of r's sequence that are its own positions (not a tree's
// ancestors): key_row(r, j) = j + page_base(r, page), wrapping (a loop over keys looks the page
// table up once a page).
fn page_base(r: u32, page: u32) -> u32 {
    if (step.paged == 0u) { return 0u; }
    return (pages[step.rows[r].z + page] - page) * PAGE;
}
