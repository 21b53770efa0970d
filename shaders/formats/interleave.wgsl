// Where a block of a weight row is stored (placed ahead of every format file; a block: the
// K-quants' 256 elements, the other formats' 32-element units; scale sections keep rows in
// order). On CPU adapters (a matmul of 1 lane per column: GROUP = 8) a weight buffer
// interleaves the blocks of each run of GROUP consecutive rows, block by block: the run's
// block 0 of every row, then its block 1 of every row, and so on (the buffer's last run holds
// the rows that are left). A matmul invocation there walks
// the blocks of its four rows in step, so its loads move forward through one stretch of memory
// that the CPU's prefetchers follow, where four rows of a few hundred bytes each were four short
// streams. GPUs (GROUP = 1) keep the rows in order. The op including this declares
// `weight_rows()`, the rows its weight buffer holds (matmul.wgsl: its columns; embed.wgsl: the
// vocabulary); per_row below is the row's blocks (src/gpu/format.rs lays the buffers out).

override GROUP: u32 = 1u;

// the stored index of block b of row `row`, in a buffer of rows of `per_row` blocks
fn stored_block(row: u32, b: u32, per_row: u32) -> u32 {
    let first = row / GROUP * GROUP;
    let run = min(GROUP, weight_rows() - first);
    return first * per_row + b * run + row - first;
}
