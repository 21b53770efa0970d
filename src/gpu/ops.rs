//! One constructor per kernel: each writes the kernel's parameter block (laid out exactly as the
//! `Params` struct of its `.wgsl` file) and binds its buffers. Model code only calls these.
//!
//! Every op also binds the shared step uniform `[n, start_pos]` (see [`Step`]), written once per pass.

use super::layout::gpu_struct;
use super::{allocated_bytes, groups, Cost, Gpu, GpuBuffer, Grid, Kernel, Op, Serial, WeightBuffer};
use crate::loader::DType;

/// Rows one matmul workgroup of a GPU's decode-shaped pipeline takes (`ROWS` in
/// `shaders/matmul.wgsl`): a pass of up to 4 rows runs it, and a pass of 5 to 16 rows the wide
/// pipeline (`WIDE_ROWS` = 16 in `src/gpu/kernel.rs`: groups of 5 or 6 compute six rows,
/// of 7 or 8 eight, of 9 to 16 sixteen); either reads each weight once. Each row computed costs
/// its arithmetic, which a GPU's pass of a few rows hides behind the weights' bytes: fixed-K
/// token trees fill their rows up to a multiple of 4. CPU adapters take groups of 8 rows (of 1
/// to 4 rows computing just those, of 5 or 6 six, of 7 or 8 eight).
pub const MATMUL_ROW_STEP: u32 = 4;

/// Most nodes of a token tree in one pass (a row's ancestors are one `u32` of bits).
pub const MAX_TREE: usize = 32;

gpu_struct! {
    /// The per-pass uniform shared by every op (binding 0 of every kernel): rows in the pass and
    /// where they sit (`shaders/share/rows.wgsl`). A pass of one sequence (`paged` 0): row r at
    /// position start_pos + r, its k/v in cache row start_pos + r (the cache is the sequence's
    /// alone). A pass over several sequences of a pool of [`KV_PAGE`]-position pages (`paged`
    /// 1): each row's `rows` entry. For a token-tree pass, each row's ancestors.
    pub struct Step => Step {
        /// Rows in the pass.
        pub n: u32,
        /// The position of row 0 (a one-sequence chain's row r is at start_pos + r).
        pub start_pos: u32,
        /// 1 for a token-tree pass.
        pub tree: u32,
        /// 1 for a pass over pages of a pool: the rows' places are in `rows`.
        pub paged: u32,
        /// `[PASS_ROWS]` (a tree pass) row r's tree: bit j of `ancestors[r]`: row first + j is r
        /// or an ancestor of r, `first` the row of its tree's root (0 in a one-sequence pass,
        /// `rows[r].y` in a paged one); 0: row r is no tree's node (a paged pass's other rows).
        pub ancestors: [u32; PASS_ROWS],
        /// `[PASS_ROWS, 4]` (a paged pass) row r's (start, first, table, slot): the position of
        /// its sequence's first row in the pass, that row's index, where the sequence's pages
        /// begin in the pass's page table, and the cache row its k/v go to.
        pub rows: [u32; 4 * PASS_ROWS],
    }
}

/// Positions in one page of a paged KV cache pool. 16 (vLLM's block): the prefix cache shares
/// whole pages, so a repeated prompt or system prompt of a few dozen tokens finds all but its
/// last few positions computed, and a sequence's last page leaves at most 15 positions unused.
/// The kernels look a position's cache row up in its sequence's page table, whatever the page's
/// size (a chunk of keys of the split attention spans several pages).
pub const KV_PAGE: usize = 16;

/// The most rows of one pass (a token tree's: [`MAX_TREE`]). 64: every kernel is batch-invariant
/// at any count (a row's bits are the same in a pass of 1 row or 64), and the buffers that grow
/// with it stay within WebGPU's default binding of 128 MiB: the logits of 64 rows of a
/// 262,144-token vocabulary are 64 MiB, the split attention's scratch of a 32-head model at
/// 4,096 positions 65 MiB (at 128 rows both would reach the limit). The one-pass attention of
/// CPU adapters keeps rows x heads x context scores: 64 rows of a 9-head model fit up to about
/// 58,000 positions (a longer context is refused at load, by the adapter's limit, naming it).
pub const PASS_ROWS: usize = 64;

impl Step {
    /// A one-sequence chain pass: row r at position start_pos + r.
    pub fn chain(n: usize, start_pos: usize) -> Step {
        Step {
            n: n as u32,
            start_pos: start_pos as u32,
            tree: 0,
            paged: 0,
            ancestors: [0; PASS_ROWS],
            rows: [0; 4 * PASS_ROWS],
        }
    }
}

gpu_struct! {
    /// The parameters of `shaders/kv_keep.wgsl`: the cache rows a pass's token trees keep.
    pub struct KeepParams => Keep {
        /// Pairs copied (at most [`PASS_ROWS`]: a pass's rows).
        pub count: u32,
        /// 32-bit words per cache row (2 kv_dim f32, or kv_dim f16 pairs).
        pub width: u32,
        pub _pad: [u32; 2],
        /// `[PASS_ROWS, 2]` (dst, src) cache rows, copied in order: each tree's by depth, from
        /// its accepted node's scratch row to the row of the node's position.
        pub pairs: [u32; 2 * PASS_ROWS],
    }
}

/// Where a matmul writes its rows, and what it does on the way: RMSNorm of its input, and the
/// epilogues (bias, residual add, SwiGLU, RoPE, KV routing, the next norm's scaled copy).
#[derive(Clone, Copy, Default)]
pub struct MatmulOut<'a> {
    /// Row stride of the output, in f32.
    pub ldy: u32,
    /// The whole matrix's row of this buffer's first row (set per chunk by
    /// [`crate::model::Matrix`]): biases, RoPE, the KV split and the output count columns of the
    /// whole matrix (with `glu`, row `2 i` and `2 i + 1` give output column `i`).
    pub col_offset: u32,
    /// Add the result to what the output holds (a residual add) instead of overwriting it. Not
    /// with `glu`, `rope` or a KV second output.
    pub accumulate: bool,
    /// The weight rows interleave gate and up projections (g0, u0, g1, u1, ...): output column
    /// `i` is `silu(gate_i) * up_i` (SwiGLU), so a matrix of `2 f` rows writes `f` columns.
    pub glu: bool,
    /// With `glu`: GeGLU, `gelu(gate_i) * up_i` with GELU's tanh approximation (Gemma).
    pub gelu: bool,
    /// RMSNorm folded in: x is the norm's input already times its weight (a [`SideOutput::Scaled`]
    /// copy), and each row's sums are scaled by `1 / rms` of this raw row.
    pub norm: Option<NormIn<'a>>,
    /// A second output: the KV cache, or the next norm's input.
    pub second: Option<SideOutput<'a>>,
    /// RoPE on the first columns (the q and k parts of a fused q|k|v matrix).
    pub rope: Option<RopeOut<'a>>,
    /// SiLU after the bias, before the residual add (a Medusa head's residual block:
    /// `y += silu(x . w^T + b)`). Not with `glu` or `rope`.
    pub silu: bool,
    /// The rows of the run of buffers of one stored type this buffer belongs to (a matrix that
    /// a buffer size limit split; set by [`crate::model::Matrix`]; 0: this buffer's): the
    /// matmul's lanes follow the run ([`Gpu::matmul_lanes_for`]), so a column's bits do not
    /// depend on the limit.
    pub matrix_rows: u32,
    /// Only this buffer's first `stored` output columns (0: all; set by
    /// [`crate::model::Matrix::matmul_first`]): a draft head ranking the first ids of a
    /// vocabulary reads those weight rows alone. Each column's bits are what the whole matmul
    /// gives it (the lanes follow `matrix_rows`, not this).
    pub stored: u32,
}

/// The raw rows whose RMS a normed matmul divides by: `[n, k]`, and the norm's epsilon.
#[derive(Clone, Copy)]
pub struct NormIn<'a> {
    pub raw: &'a GpuBuffer<f32>,
    pub eps: f32,
}

/// A matmul's second output, beside y: the K|V columns into a KV cache, or a scaled copy.
#[derive(Clone, Copy)]
pub enum SideOutput<'a> {
    /// Output columns from `split` on go to a KV cache instead of y (a fused q|k|v matrix).
    Kv(KvOut<'a>),
    /// Every value stored in `y[r, c]` is also written times `gamma[c]` to `out[r, c]` (row
    /// stride `ldy`): the input of the next matmul with RMSNorm folded in (`gamma`: its weight).
    Scaled { out: &'a GpuBuffer<f32>, gamma: &'a GpuBuffer<f32> },
}

/// The K|V part of a fused q|k|v matmul: output column `c >= split` of pass row r goes to
/// `cache[start_pos + r, c - split]`.
#[derive(Clone, Copy)]
pub struct KvOut<'a> {
    /// `[context, ld]`: each position's k then v row, as f32 bits, or (`f16`) as f16 pairs
    /// (`[context, ld / 2]` words).
    pub cache: &'a GpuBuffer<u32>,
    pub ld: u32,
    pub split: u32,
    pub f16: bool,
}

/// RoPE in a matmul's epilogue: output columns `< cols` (whole heads of `head_dim`) rotate their
/// first `rope_dim` dimensions by the row's position (`start_pos + r`).
#[derive(Clone, Copy)]
pub struct RopeOut<'a> {
    /// `[positions, rope_dim / 2, 2]` (cos, sin), computed once on the CPU.
    pub cos_sin: &'a GpuBuffer<f32>,
    pub cols: u32,
    pub head_dim: u32,
    pub rope_dim: u32,
    /// The layout of the checkpoint's rows. The kernel rotates adjacent pairs, so a
    /// [`RopeLayout::Halves`] matrix must have its rows reordered by [`RopeLayout::pair_rows`] at load.
    pub layout: RopeLayout,
}

gpu_struct! {
    /// `shaders/matmul.wgsl`'s parameters.
    pub(super) struct MatmulParams => Params {
        /// Row length of x (input features).
        k: u32,
        /// ceil(k / 32): 32-weight units per weight row.
        units: u32,
        /// Output columns in this chunk (weight rows).
        cols: u32,
        /// The whole matrix's row of this chunk's first row (its output column; with glu, rows
        /// 2i and 2i + 1 give output column i).
        col_offset: u32,
        /// Row stride of y, in f32.
        ldy: u32,
        /// Output columns from here on go to second (KV cache row start_pos + r, column
        /// c - split).
        split: u32,
        /// Row stride of that KV cache, in values (f32, or f16 halves).
        ldkv: u32,
        /// 1: add bias[c] (c: the whole matrix's output column).
        has_bias: u32,
        /// 1: y += result (a residual add); 0: y = result.
        accumulate: u32,
        /// 1: weight rows interleave gate and up (g0, u0, g1, u1, ...); output column c / 2 of
        /// each pair is silu(gate) * up (SwiGLU), at col_offset + c / 2.
        glu: u32,
        /// u32 word where the format's scale section starts (formats that have one).
        scale_base: u32,
        /// Output columns before this are rotated by RoPE, in adjacent pairs.
        rope_cols: u32,
        /// (RoPE) columns per head; rope_cols is a multiple of it.
        head_dim: u32,
        /// (RoPE) rotated columns at the start of each head (even).
        rope_dim: u32,
        /// (RoPE) 1: the head's rows were reordered from the Halves layout (i, i + rope_dim / 2)
        /// to adjacent pairs; the store undoes the order.
        halves: u32,
        /// 1: scale each row's sums by 1 / sqrt(mean(x_raw[r]^2) + eps).
        norm: u32,
        eps: f32,
        /// 1: second[r, c] = y[r, c] * gamma[c] as well (row stride ldy).
        scaled_copy: u32,
        /// 1: y = silu(x . w + bias) (a Medusa head's residual block); 0: no activation.
        silu: u32,
        /// 1: the KV cache holds f16 pairs (ldkv and split count halves; see store_kv).
        kv_f16: u32,
        /// (glu) 1: GeGLU, gelu(gate) * up with GELU's tanh approximation (Gemma); 0: SwiGLU.
        gelu: u32,
        /// Output columns of this chunk computed and stored: its first `stored` (at most cols;
        /// each column's bits as when all are).
        stored: u32,
        _pad: [u32; 2],
    }
}

gpu_struct! {
    /// `shaders/embed.wgsl`'s parameters.
    pub(super) struct EmbedParams => Params {
        /// Embedding width.
        dim: u32,
        /// ceil(dim / 32).
        units: u32,
        /// First vocabulary row held by this chunk.
        row_start: u32,
        /// Vocabulary rows in this chunk.
        rows: u32,
        /// u32 word where the format's scale section starts (formats that have one).
        scale_base: u32,
        /// 1: write x_scaled too.
        scaled_copy: u32,
        /// Every value times this (Gemma's embeddings: sqrt(dim); else 1).
        scale: f32,
        _pad: [u32; 1],
    }
}

gpu_struct! {
    /// `shaders/attention.wgsl`'s parameters.
    pub(super) struct AttentionParams => Params {
        /// Query heads.
        heads: u32,
        /// Key/value heads (heads % kv_heads == 0).
        kv_heads: u32,
        /// A multiple of 4.
        head_dim: u32,
        /// Cache positions (row stride of the scores scratch).
        ctx: u32,
        /// 1 / sqrt(head_dim).
        scale: f32,
        /// Keys a query sees at most (sliding-window attention: the last `window` positions,
        /// its own included); 0: all of them.
        window: u32,
        /// Workgroups per KV head, each taking up to [`ONE_PASS_HEAD_BLOCK`] of its query heads:
        /// ceil(heads / kv_heads / 4).
        blocks: u32,
        _pad: u32,
    }
}

gpu_struct! {
    /// `shaders/attention_chunks.wgsl`'s parameters.
    pub(super) struct ChunksParams => Params {
        /// Query heads.
        heads: u32,
        /// Key/value heads (heads % kv_heads == 0).
        kv_heads: u32,
        /// A multiple of 4, at most 4 * WG.
        head_dim: u32,
        /// Cache positions.
        ctx: u32,
        /// 1 / sqrt(head_dim).
        scale: f32,
        /// Keys per chunk (a multiple of WG).
        span: u32,
        /// Chunks per row and head in the scratch: ceil(ctx / span).
        chunks: u32,
        /// Head blocks per KV head: ceil(heads / kv_heads / HB).
        blocks: u32,
        /// f32 offset of the (m, l) section of the scratch.
        ml_base: u32,
        /// Keys a query sees at most (0: all), as [`AttentionParams`]'.
        window: u32,
        _pad: [u32; 2],
    }
}

gpu_struct! {
    /// `shaders/attention_merge.wgsl`'s parameters.
    pub(super) struct MergeParams => Params {
        /// Query heads.
        heads: u32,
        head_dim: u32,
        /// Keys per chunk.
        span: u32,
        /// Chunks per row and head in the scratch.
        chunks: u32,
        /// f32 offset of the (m, l) section of the scratch.
        ml_base: u32,
        /// Keys a query sees at most (0: all): chunks wholly before them are skipped.
        window: u32,
        _pad: [u32; 2],
    }
}

/// What [`Gpu::sample`] draws from and where it writes.
#[derive(Clone, Copy, Debug)]
pub struct SampleConfig {
    pub vocab: usize,
    pub temperature: f32,
    /// 0 (or the vocabulary's size, or more): every token; else the `top_k` ranked first
    /// (larger logits, equal ones by lower id).
    pub top_k: usize,
    /// 1: no nucleus; else the smallest most likely set (after the top-k and the min-p)
    /// holding this mass.
    pub top_p: f32,
    /// A min-p: the tokens whose logits are at least the row's largest plus this offset
    /// ([`crate::sampling::SamplingParams::min_p_offset`]); `None`: no min-p cut.
    pub min_p_offset: Option<f32>,
    /// Only the pass's last row, written to this row of `out` (a draft step's draw).
    pub last_only: Option<usize>,
    /// The op's noise stream (its draws' noise: 2 stream, hashed with the seed, the row's
    /// position and the token): ops whose draws must be independent at one position need
    /// distinct ones; ops that draw the same thing, or must draw alike (a target's rows and its
    /// draft model's), share one.
    pub stream: u32,
}

gpu_struct! {
    /// `shaders/sample.wgsl`'s parameters.
    pub(super) struct SampleParams => Params {
        vocab: u32,
        /// 0: every token kept; else (below vocab) the top_k ranked first.
        top_k: u32,
        /// Above 0.
        temperature: f32,
        /// 1: no nucleus cut.
        top_p: f32,
        /// 1: only the pass's last row, written to out row out_row.
        last_only: u32,
        out_row: u32,
        /// The op's noise stream (the verify rows' and their draft model's share one).
        stream: u32,
        /// The dispatch's stage (`shaders/sample.wgsl`: 0 to 7 the top-k's levels, 8 to 15 the
        /// slices' stats and the nucleus' levels, 16 the draws, 17 their combination, 18 the
        /// slices' largest logits for a min-p).
        stage: u32,
        /// ceil(vocab / SLICE): the workgroups of a row's side.
        slices: u32,
        /// Rows the scratch holds (1 for `last_only`).
        slots: u32,
        /// 1: a min-p cut, the logits below the row's largest plus `min_p_offset` dropped.
        min_p: u32,
        min_p_offset: f32,
    }
}

/// Words of the scratch of [`Gpu::sample`] drawing from `logits` under `cfg`.
pub fn sample_scratch_len(logits: &GpuBuffer<f32>, cfg: SampleConfig) -> usize {
    sample_scratch(sample_slots(logits, cfg), reduce_slices(cfg.vocab))
}

/// Rows a sample op's scratch holds: one for `last_only`, else every row of `logits`.
fn sample_slots(logits: &GpuBuffer<f32>, cfg: SampleConfig) -> usize {
    match cfg.last_only {
        Some(_) => 1,
        None => (logits.len / cfg.vocab.max(1)).max(1),
    }
}

/// Words of [`Gpu::sample`]'s scratch for `slots` rows of `slices` slices (the layout in
/// `shaders/sample.wgsl`: stats, histograms, the levels' picks, the draws, the top-k's cuts).
fn sample_scratch(slots: usize, slices: usize) -> usize {
    const BINS: usize = 16;
    (4 + 4 * BINS) * slots * slices + 6 * slots
}

/// [`Gpu::sample`]'s stages (`shaders/sample.wgsl`): the radix levels (of a key: 8 of 4 bits)
/// of the top-k's select, then from SAMPLE_NUCLEUS the nucleus' (the first also the slices'
/// stats), the draws, their combination; and the slices' largest logits for a min-p.
const SAMPLE_LEVELS: u32 = 8;
const SAMPLE_NUCLEUS: u32 = 8;
const SAMPLE_DRAW: u32 = 16;
const SAMPLE_FINISH: u32 = 17;
const SAMPLE_MAXES: u32 = 18;

gpu_struct! {
    /// The seed of the GPU's draws (a generation's) (`Seed` in `shaders/sample.wgsl`), written
    /// by the host; and the pass row of a draw op's
    /// first row (one request's rows in a pass over several: [`SampleSeed::at`]).
    pub struct SampleSeed => Seed {
        pub lo: u32,
        pub hi: u32,
        /// The draws' first row of the pass (their rows: `row0..row0 + n`, n the rows the op
        /// is encoded for); 0 for every row of the pass.
        pub row0: u32,
        pub _pad: u32,
    }
}

impl SampleSeed {
    pub fn new(seed: u64) -> SampleSeed {
        SampleSeed::at(seed, 0)
    }

    /// Draws of rows `row0..` of the pass, keyed by `seed`.
    pub fn at(seed: u64, row0: usize) -> SampleSeed {
        SampleSeed { lo: seed as u32, hi: (seed >> 32) as u32, row0: row0 as u32, _pad: 0 }
    }
}

/// Keys one workgroup of the split attention walks in a block (`WG` in `attention_chunks.wgsl`).
const ATTENTION_BLOCK: u32 = 64;
/// Most chunks of keys a row is split into (a chunk spans a whole number of blocks).
const ATTENTION_MAX_CHUNKS: u32 = 64;
/// Query heads one workgroup of the split attention serves (`HB` in `attention_chunks.wgsl`).
const ATTENTION_HEAD_BLOCK: u32 = 8;
/// Query heads one workgroup of the one-pass attention serves (`HB` in `attention.wgsl`: the
/// components of its per-head vectors, so exactly 4).
pub(super) const ONE_PASS_HEAD_BLOCK: u32 = 4;
/// Largest head dimension of the split attention (`4 * WG` in `attention_chunks.wgsl`: a key
/// group's invocation holds one vec4 of a head's dimensions).
pub const MAX_SPLIT_HEAD_DIM: u32 = 256;

/// How the split attention cuts the keys of a cache of `ctx` positions: (keys per chunk, chunks).
/// Fixed by the cache, never by a pass's rows, so each row's sums keep their order.
fn attention_chunks(ctx: u32) -> (u32, u32) {
    let span = ctx.div_ceil(ATTENTION_BLOCK * ATTENTION_MAX_CHUNKS).max(1) * ATTENTION_BLOCK;
    (span, ctx.div_ceil(span).max(1))
}

gpu_struct! {
    /// `shaders/accept_greedy.wgsl`'s parameters.
    pub(super) struct AcceptParams => Params {
        /// Drafts the buffers hold (K is clamped to it).
        capacity: u32,
        _pad: [u32; 3],
    }
}

gpu_struct! {
    /// `shaders/accept_sampled.wgsl`'s parameters.
    pub(super) struct AcceptSampledParams => Params {
        /// Drafts the buffers hold (K is clamped to it).
        capacity: u32,
        _pad: [u32; 3],
    }
}

gpu_struct! {
    /// `shaders/gather_rows.wgsl`'s parameters.
    pub(super) struct GatherParams => Params {
        dim: u32,
        eps: f32,
        /// Row stride of out.
        ld: u32,
        /// Column of out where a row starts.
        offset: u32,
        /// 1: NORM, 2: GATHER.
        flags: u32,
        _pad: [u32; 3],
    }
}

gpu_struct! {
    /// `shaders/head_norm.wgsl`'s parameters.
    pub(super) struct HeadNormParams => Params {
        q_heads: u32,
        kv_heads: u32,
        /// At most [`MAX_NORMED_HEAD`].
        head_dim: u32,
        /// Rotated dimensions at the start of each head (even).
        rope_dim: u32,
        /// 1: the q and k rows were reordered from the Halves layout into adjacent pairs.
        halves: u32,
        eps: f32,
        /// 1: the KV cache holds f16 pairs.
        kv_f16: u32,
        _pad: u32,
    }
}

gpu_struct! {
    /// `shaders/norm_add.wgsl`'s parameters.
    pub(super) struct NormAddParams => Params {
        dim: u32,
        eps: f32,
        /// 1: xb = x * gamma as well (the next normed matmul's input).
        scaled_copy: u32,
        _pad: u32,
    }
}

/// The widest head [`Gpu::head_norm`] normalises (its workgroup stages a head: Gemma 3's 256).
pub const MAX_NORMED_HEAD: usize = 256;

/// The raw q|k|v rows a [`Gpu::head_norm`] reads and where it puts them.
pub struct HeadNormIo<'a> {
    pub qkv: &'a GpuBuffer<f32>, // [n, q_heads + 2 kv_heads, head_dim] the matmul's columns
    pub norms: [&'a GpuBuffer<f32>; 2], // [head_dim] q's and k's norm weights
    pub cos_sin: &'a GpuBuffer<f32>, // [context, rope_dim / 2, 2]
    pub q: &'a GpuBuffer<f32>,   // [n, q_heads * head_dim]
    pub kv: &'a GpuBuffer<u32>,  // [context, 2 kv_heads * head_dim] values (f32 bits or f16 pairs)
}

/// Words of `shaders/eagle_tree.wgsl`'s state and output buffers, and where its output holds
/// the next pass (`STEP`: its Step, `MANY`: the projected rows' Step, `SLOTS`: each row's store
/// slot, `NEWEST`: the projected rows, `TOKENS`: each row's token) and the chosen tree (`RESULT`:
/// N, the predicted accepted nodes as f32 bits, the passes run, then 32 tokens and 32 parents).
pub const EAGLE_TREE_STATE: usize = 16 + 5 * 256 + 32 + 8 + 32 + 32 + 8 + 32;
pub const EAGLE_TREE_OUT: usize = 179;
pub const EAGLE_TREE_STEP: u64 = 0;
pub const EAGLE_TREE_MANY: u64 = 36;
pub const EAGLE_TREE_SLOTS: u64 = 40;
pub const EAGLE_TREE_NEWEST: u64 = 72;
pub const EAGLE_TREE_TOKENS: u64 = 80;
pub const EAGLE_TREE_RESULT: u64 = 112;

gpu_struct! {
    /// The parameters of one `shaders/eagle_tree.wgsl` call (see its header).
    pub struct EagleTreeParams => Params {
        /// [`EagleTreeMode`]'s word: start or expand, plus finish on the last call.
        pub mode: u32,
        /// (start) the root's token.
        pub root: u32,
        /// The head's cache length: a pass's first row.
        pub start_pos: u32,
        /// Ids ranked per projected row.
        pub k: u32,
        /// Nodes expanded per pass (at most 8).
        pub width: u32,
        /// (start, expand) the depth of the nodes to expand next (0: expand none).
        pub depth: u32,
        /// (expand) the store slot of the last pass's first expanded node.
        pub slot0: u32,
        /// Drafted nodes the tree may hold (at most 31).
        pub max_nodes: u32,
        /// Rows a pass may have (at most 32).
        pub room: u32,
        /// 1: N from the cost model; else max_nodes.
        pub use_costs: u32,
        pub calibration: f32,
        /// Seconds per draft pass.
        pub draft_pass: f32,
        /// `[MAX_TREE]` seconds of a verify pass of n rows (index n - 1).
        pub verify: [f32; MAX_TREE],
    }
}

/// What one `shaders/eagle_tree.wgsl` call does (its `START`, `EXPAND` and `FINISH`, written
/// into its source from these): start from the root, or expand the last pass's nodes; and on the
/// last call also finish (the best nodes as a tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagleTreeMode {
    pub expand: bool,
    pub finish: bool,
}

impl EagleTreeMode {
    pub const START: u32 = 0;
    pub const EXPAND: u32 = 1;
    pub const FINISH: u32 = 4;

    /// The params' `mode` word.
    pub fn word(self) -> u32 {
        let base = if self.expand { Self::EXPAND } else { Self::START };
        base + if self.finish { Self::FINISH } else { 0 }
    }
}

gpu_struct! {
    /// `shaders/map_ids.wgsl`'s parameters.
    pub(super) struct MapIdsParams => Params {
        /// Ids per row (at most 64).
        k: u32,
        /// Entries of table.
        size: u32,
        _pad: [u32; 2],
    }
}

gpu_struct! {
    /// `shaders/concat.wgsl`'s parameters.
    pub(super) struct ConcatParams => Params {
        /// Columns of left.
        left: u32,
        /// Columns of right.
        right: u32,
        _pad: [u32; 2],
    }
}

/// Logits one workgroup of the first of [`Gpu::argmax`]'s and [`Gpu::top_k`]'s two dispatches
/// (and of [`Gpu::sample`]'s slice stages) reduces (the shaders' `SLICE`, written into their
/// source from this): a row of Qwen2.5's 151,936 logits is 149 workgroups, 16 loads per
/// invocation.
pub const REDUCE_SLICE: usize = 1024;

/// Workgroups of the first dispatch per row of `vocab` logits.
pub fn reduce_slices(vocab: usize) -> usize {
    vocab.div_ceil(REDUCE_SLICE).max(1)
}

gpu_struct! {
    /// `shaders/argmax.wgsl`'s parameters.
    pub(super) struct ArgmaxParams => Params {
        vocab: u32,
        /// ceil(vocab / SLICE).
        slices: u32,
        /// 0: slices of logits into pairs; 1: pairs into out.
        stage: u32,
        _pad: u32,
    }
}

gpu_struct! {
    /// `shaders/top_k.wgsl`'s parameters.
    pub(super) struct TopKParams => Params {
        vocab: u32,
        k: u32,
        /// 1: also write logp.
        log_probs: u32,
        /// ceil(vocab / SLICE).
        slices: u32,
        /// 0: slices of logits into candidates; 1: candidates into out.
        stage: u32,
        _pad: [u32; 3],
    }
}

/// Words of the scratch buffer [`Gpu::argmax`] allocates for `rows` rows of `vocab` logits:
/// `[rows, slices, 2]`, each slice's best value (bits) and id. (Memory bills count it from here.)
pub fn argmax_scratch(rows: usize, vocab: usize) -> usize {
    rows * reduce_slices(vocab) * 2
}

/// Words of the scratch buffers [`Gpu::top_k`] allocates (memory bills count them from here).
#[derive(Clone, Copy, Debug)]
pub struct TopKScratch {
    /// `[rows, slices, k, 2]`: each slice's k best (value bits, id).
    pub candidates: usize,
    /// `[rows, slices, 2]`: each slice's maximum and sum of exponentials (with log-probabilities;
    /// else one word).
    pub sums: usize,
    /// Without log-probabilities, the one-word placeholder bound in their place; else 0 (none).
    pub placeholder: usize,
}

impl TopKScratch {
    /// For `rows` rows of `vocab` logits ranking `k` ids, with or without log-probabilities.
    pub fn new(rows: usize, vocab: usize, k: usize, log_probs: bool) -> TopKScratch {
        let slices = reduce_slices(vocab);
        let k = k.clamp(1, MAX_TOP_K);
        TopKScratch {
            candidates: rows * slices * k * 2,
            sums: if log_probs { rows * slices * 2 } else { 1 },
            placeholder: if log_probs { 0 } else { 1 },
        }
    }

    /// The bytes they take on the device.
    pub fn bytes(&self) -> u64 {
        let placeholder = if self.placeholder > 0 { allocated_bytes(4 * self.placeholder as u64) } else { 0 };
        allocated_bytes(4 * self.candidates as u64) + allocated_bytes(4 * self.sums as u64) + placeholder
    }
}

/// The most ids per row [`Gpu::top_k`] ranks (its kernel makes one pass over the row per id).
pub const MAX_TOP_K: usize = 16;

/// Rotary layouts: which pairs of a head's dimensions rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(x[2i], x[2i+1])`: GGUF llama q/k (llama.cpp's "normal" mode).
    Interleaved,
    /// `(x[i], x[i + rope_dim/2])`: Hugging Face checkpoints and GGUF qwen2 (llama.cpp's "neox" mode).
    Halves,
}

impl RopeLayout {
    /// The order in which the rows of a q or k projection (`heads` heads of `head_dim` rows) are
    /// uploaded so that the pairs that rotate together are adjacent rows: entry j is the
    /// checkpoint row that becomes row j. The identity for [`RopeLayout::Interleaved`].
    pub fn pair_rows(self, heads: usize, head_dim: usize, rope_dim: usize) -> Vec<usize> {
        let half = rope_dim / 2;
        (0..heads * head_dim)
            .map(|j| {
                let (head, i) = (j / head_dim, j % head_dim);
                match self {
                    RopeLayout::Halves if i < rope_dim => head * head_dim + i / 2 + (i % 2) * half,
                    _ => j,
                }
            })
            .collect()
    }
}

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Positions the KV cache holds.
    pub ctx: u32,
    /// The cache holds f16 pairs (`shaders/kv/f16.wgsl`), else f32.
    pub kv_f16: bool,
    /// Sliding-window attention: a query at position p sees keys p - window + 1 ..= p; 0: all
    /// keys 0 ..= p.
    pub window: u32,
}

impl AttentionShape {
    /// The cache's format, as the attention kernels are built for it.
    fn kv_dtype(&self) -> DType {
        if self.kv_f16 {
            DType::F16
        } else {
            DType::F32
        }
    }

    /// Bytes of one cached value.
    pub fn kv_value_bytes(&self) -> u64 {
        if self.kv_f16 {
            2
        } else {
            4
        }
    }
}

impl Gpu {
    /// `y[r, col_offset + c] (+)= x[r, :] . w[c, :] + bias[col_offset + c]` for the rows of one
    /// weight buffer (`w: [cols, k]` in its format, `cols = w.rows`), with the epilogue `out` asks
    /// for; `x: [n, k]`; `bias: [the whole matrix's columns]` or None.
    pub fn matmul(
        &self,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        w: &WeightBuffer,
        bias: Option<&GpuBuffer<f32>>,
        y: &GpuBuffer<f32>,
        out: MatmulOut,
    ) -> Op {
        debug_assert!(
            !out.accumulate
                || !(out.glu || out.rope.is_some() || matches!(out.second, Some(SideOutput::Kv(_)))),
            "a residual add has no SwiGLU, RoPE or KV output (shaders/matmul.wgsl, write_added)"
        );
        // Unused bindings still need buffers: x serves for the read-only ones (never read then),
        // a small buffer of the GPU's own for the writable one.
        let stored = if out.stored > 0 { (out.stored as usize).min(w.rows) } else { w.rows };
        let (kv, scaled, second_raw, gamma_raw) = match out.second {
            Some(SideOutput::Kv(kv)) => (Some(kv), false, &kv.cache.raw, &x.raw),
            Some(SideOutput::Scaled { out, gamma }) => (None, true, &out.raw, &gamma.raw),
            None => (None, false, &self.unused_output, &x.raw),
        };
        let rope = out.rope.map_or((0, 0, 0, 0), |r| {
            (r.cols, r.head_dim.max(1), r.rope_dim, (r.layout == RopeLayout::Halves) as u32)
        });
        let p = MatmulParams {
            k: w.k as u32,
            units: w.units() as u32,
            cols: w.rows as u32,
            col_offset: out.col_offset,
            ldy: out.ldy,
            split: kv.map_or(u32::MAX, |kv| kv.split),
            ldkv: kv.map_or(0, |kv| kv.ld),
            has_bias: bias.is_some() as u32,
            accumulate: out.accumulate as u32,
            glu: out.glu as u32,
            scale_base: w.scale_base,
            rope_cols: rope.0,
            head_dim: rope.1,
            rope_dim: rope.2,
            halves: rope.3,
            norm: out.norm.is_some() as u32,
            eps: out.norm.map_or(0.0, |n| n.eps),
            scaled_copy: scaled as u32,
            silu: out.silu as u32,
            kv_f16: kv.is_some_and(|kv| kv.f16) as u32,
            gelu: out.gelu as u32,
            stored: stored as u32,
            _pad: [0; 2],
        };
        let params = self.uniform("matmul params", bytemuck::bytes_of(&p));
        let bias_raw = bias.map(|b| &b.raw).unwrap_or(&x.raw);
        let cos_sin_raw = out.rope.map(|r| &r.cos_sin.raw).unwrap_or(&x.raw);
        let x_raw = out.norm.map(|n| &n.raw.raw).unwrap_or(&x.raw);
        // (GPUs) narrow matrices in narrower column tiles, more lanes walking each row
        let rows = if out.matrix_rows > 0 { out.matrix_rows as usize } else { w.rows };
        let lanes = self.matmul_lanes_for(rows, w.units());
        // (its pipelines compiled now, inside the caller's error scopes: Gpu::build_scope)
        self.pipelines.get_with(Kernel::Matmul(w.dtype), lanes);
        let grid = Grid::RowGroups {
            y: stored.div_ceil(super::kernel::matmul_columns_per_group(lanes)) as u32,
            rows: self.matmul_rows(),
        };
        let (k, cols) = (w.k as u64, stored as u64);
        // per row: x (and x_raw), each output column read (accumulate) and written (twice with
        // a scaled copy)
        let outs = cols / (1 + out.glu as u64);
        let copies = 1 + out.accumulate as u64 + scaled as u64;
        let cost = Cost {
            fixed_bytes: w.bytes() * cols / w.rows.max(1) as u64 + if bias.is_some() { 4 * cols } else { 0 },
            row_bytes: 4 * (k * (1 + out.norm.is_some() as u64) + outs * copies),
            row_flops: 2 * k * cols,
            ..Cost::default()
        };
        let storage = [&x.raw, &w.raw, bias_raw, &y.raw, second_raw, cos_sin_raw, x_raw, gamma_raw];
        // each lane's units (8 groups of 4 weights each), its lanes' tree, the norm's squares
        // and tree, the epilogue's stores (for the decode pipeline's group of rows: a wide
        // pipeline's 16 rows take the norm's loop and the stores 4 times)
        let lanes = lanes as u64;
        let norm = if out.norm.is_some() { k.div_ceil(256) + 6 } else { 0 };
        let serial = 8 * (w.units() as u64).div_ceil(lanes) + lanes.ilog2() as u64 + norm + 16;
        self.op(Kernel::Matmul(w.dtype), step, &params, &storage, grid)
            .with_cost(cost)
            .with_serial(Serial::fixed(serial))
            .with_lanes(lanes as u32)
    }

    /// `x[r, :] = table[tokens[r] - row_start, :] * scale` for the tokens inside one buffer of an
    /// embedding table (`table: [rows, dim]` in its format, the same buffer a tied output reads); with
    /// `scaled = Some((gamma, out))`, also `out[r, :] = x[r, :] * gamma` (the first normed matmul's input).
    pub fn embed(
        &self,
        step: &wgpu::Buffer,
        tokens: &GpuBuffer<u32>,
        table: &WeightBuffer,
        x: &GpuBuffer<f32>,
        (row_start, scale): (usize, f32),
        scaled: Option<(&GpuBuffer<f32>, &GpuBuffer<f32>)>,
    ) -> Op {
        let p = EmbedParams {
            dim: table.k as u32,
            units: table.units() as u32,
            row_start: row_start as u32,
            rows: table.rows as u32,
            scale_base: table.scale_base,
            scaled_copy: scaled.is_some() as u32,
            scale,
            _pad: [0; 1],
        };
        let params = self.uniform("embed params", bytemuck::bytes_of(&p));
        let grid = Grid::PerRow(groups(table.units()));
        let row = table.dtype.gpu_bytes(1, table.k) + 4 * table.k as u64 * (1 + scaled.is_some() as u64);
        let cost = Cost { row_bytes: row, ..Cost::default() };
        let (gamma, out) = scaled.map_or((&tokens.raw, &self.unused_output), |(g, o)| (&g.raw, &o.raw));
        let storage = [&tokens.raw, &table.raw, &x.raw, gamma, out];
        // one unit per invocation: 8 groups of 4
        self.op(Kernel::Embed(table.dtype), step, &params, &storage, grid)
            .with_cost(cost)
            .with_serial(Serial::fixed(32))
    }

    /// f32 values of the scratch [`Gpu::attention`] needs for passes of up to `rows` rows: the
    /// scores `[rows, heads, ctx]` of the one-pass kernel, or the split kernel's partial results
    /// `[rows, heads, chunks, head_dim + 2]`.
    pub fn attention_scratch_len(&self, shape: AttentionShape, rows: usize) -> usize {
        let (heads, ctx) = (shape.heads as usize, shape.ctx as usize);
        if self.split_attention(shape) {
            let (_, chunks) = attention_chunks(shape.ctx);
            rows * heads * chunks as usize * (shape.head_dim as usize + 2)
        } else {
            rows * heads * ctx
        }
    }

    /// Whether [`Gpu::attention`] splits this layer's attention over the cache: the adapter's
    /// shape, for head dimensions the split kernel holds.
    fn split_attention(&self, shape: AttentionShape) -> bool {
        self.split_attention && shape.head_dim <= MAX_SPLIT_HEAD_DIM
    }

    /// Causal attention of `q: [n, heads * head_dim]` over the cache `kv: [ctx, 2 kv_heads head_dim]`
    /// (each position's k row, then its v row, as f32 bits or f16 pairs: `shape.kv_f16`), whose
    /// page table `pages` a paged pass reads (see [`Step`]; `[rows' sequences, pages each]`), into
    /// `out: [n, heads * head_dim]`, using `scratch`
    /// ([`Gpu::attention_scratch_len`] values for the most rows a pass holds). One dispatch on
    /// CPU adapters; on GPUs two: chunks of keys, then their merge.
    pub fn attention(
        &self,
        step: &wgpu::Buffer,
        q: &GpuBuffer<f32>,
        (kv, pages): (&GpuBuffer<u32>, &GpuBuffer<u32>),
        scratch: &GpuBuffer<f32>,
        out: &GpuBuffer<f32>,
        shape: AttentionShape,
    ) -> Vec<Op> {
        let (h, kvh, hd) = (shape.heads as u64, shape.kv_heads as u64, shape.head_dim as u64);
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        if !self.split_attention(shape) {
            let blocks = (shape.heads / shape.kv_heads).div_ceil(ONE_PASS_HEAD_BLOCK);
            let p = AttentionParams {
                heads: shape.heads,
                kv_heads: shape.kv_heads,
                head_dim: shape.head_dim,
                ctx: shape.ctx,
                scale,
                window: shape.window,
                blocks,
                _pad: 0,
            };
            let params = self.uniform("attention params", bytemuck::bytes_of(&p));
            let cost = Cost {
                row_bytes: 8 * h * hd,
                // each position's K and V rows (read once per block of query heads in this
                // kernel), its scores
                pos_row_bytes: 2 * kvh * blocks as u64 * hd * shape.kv_value_bytes() + 12 * h,
                pos_row_flops: 4 * h * hd + 4 * h,
                ..Cost::default()
            };
            let op = self.op(
                Kernel::Attention(shape.kv_dtype()),
                step,
                &params,
                &[&q.raw, &kv.raw, &pages.raw, &scratch.raw, &out.raw],
                Grid::PerRow(shape.kv_heads * blocks),
            );
            // per 64 cached positions: the scores (head_dim / 4 iterations, each the block's
            // heads' dots), the softmax, the values (64 positions times head_dim / 256 rounds of
            // four columns, each the block's heads' sums); two trees
            let hd4 = hd.div_ceil(4);
            let serial =
                Serial { fixed: 12, per_step: hd4 + 1 + 64 * hd4.div_ceil(64), positions_per_step: 64 };
            return vec![op.with_cost(cost).with_serial(serial)];
        }
        let (span, chunks) = attention_chunks(shape.ctx);
        let blocks = (shape.heads / shape.kv_heads).div_ceil(ATTENTION_HEAD_BLOCK);
        // the (m, l) section follows the o section of the most rows the scratch holds
        let rows = scratch.len / (shape.heads * chunks * (shape.head_dim + 2)) as usize;
        let ml_base = (rows * (shape.heads * chunks * shape.head_dim) as usize) as u32;
        let p = ChunksParams {
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            ctx: shape.ctx,
            scale,
            span,
            chunks,
            blocks,
            ml_base,
            window: shape.window,
            _pad: [0; 2],
        };
        let params = self.uniform("attention chunks params", bytemuck::bytes_of(&p));
        // a chunk's partial results (all heads), spread over its keys
        let part_bytes = 4 * h * (hd + 2) / span as u64;
        let cost = Cost {
            row_bytes: 4 * h * hd,
            // each position's K and V rows, read once per KV head (its query heads share them)
            pos_row_bytes: 2 * kvh * hd * shape.kv_value_bytes() + part_bytes,
            pos_row_flops: 4 * h * hd + 4 * h,
            ..Cost::default()
        };
        let chunk_op = self
            .op(
                Kernel::AttentionChunks(shape.kv_dtype()),
                step,
                &params,
                &[&q.raw, &kv.raw, &pages.raw, &scratch.raw],
                Grid::PerRow(shape.kv_heads * blocks * chunks),
            )
            .with_cost(cost)
            // a chunk's blocks of 64 keys: a workgroup's nh heads' scores of head_dim / 4, their
            // max tree, then a key group's keys of the block (64 / groups, each a load and nh
            // heads' weight and vec4), and at the end the groups' sums (8 heads' vec4 and l each)
            .with_serial({
                let nh = (h / kvh.max(1)).clamp(1, ATTENTION_HEAD_BLOCK as u64);
                let groups = (64 / hd.div_ceil(4)).max(1);
                let block = nh * hd.div_ceil(4) + 48 + (1 + 2 * nh) * 64u64.div_ceil(groups);
                Serial::fixed((span as u64).div_ceil(64) * block + 16 * groups)
            });
        let p = MergeParams {
            heads: shape.heads,
            head_dim: shape.head_dim,
            span,
            chunks,
            ml_base,
            window: shape.window,
            _pad: [0; 2],
        };
        let params = self.uniform("attention merge params", bytemuck::bytes_of(&p));
        let cost = Cost { row_bytes: 4 * h * hd, pos_row_bytes: part_bytes, ..Cost::default() };
        // per chunk of the row's keys: its maximum, its sum, its head_dim / 64 columns
        let serial = Serial { fixed: 0, per_step: 2 + hd.div_ceil(64), positions_per_step: span as u64 };
        let merge_op = self
            .op(Kernel::AttentionMerge, step, &params, &[&scratch.raw, &out.raw], Grid::PerRow(shape.heads))
            .with_cost(cost)
            .with_serial(serial);
        vec![chunk_op, merge_op]
    }

    /// `out[r] = argmax logits[r, :]` (lowest index on ties); `logits: [rows, vocab]`, `out:
    /// [n]`. Two dispatches: each slice of [`REDUCE_SLICE`] logits of each row to its best
    /// (value, id), then each row's slices (an order-free choice: the same id whatever the
    /// slicing).
    pub fn argmax(
        &self,
        step: &wgpu::Buffer,
        logits: &GpuBuffer<f32>,
        out: &GpuBuffer<u32>,
        vocab: usize,
    ) -> Vec<Op> {
        let slices = reduce_slices(vocab);
        let rows = (logits.len / vocab.max(1)).max(1);
        let pairs = GpuBuffer::<u32>::zeros(self, "argmax pairs", argmax_scratch(rows, vocab));
        let stage = |stage: u32| {
            let p = ArgmaxParams { vocab: vocab as u32, slices: slices as u32, stage, _pad: 0 };
            self.uniform("argmax params", bytemuck::bytes_of(&p))
        };
        let buffers = [&logits.raw, &pairs.raw, &out.raw];
        let pair_bytes = 8 * slices as u64;
        let slices_op =
            self.op(Kernel::Argmax, step, &stage(0), &buffers, Grid::PerRow(slices as u32)).with_cost(Cost {
                row_bytes: 4 * vocab as u64 + pair_bytes,
                row_flops: vocab as u64,
                ..Cost::default()
            });
        let rows_op = self.op(Kernel::Argmax, step, &stage(1), &buffers, Grid::Rows).with_cost(Cost {
            row_bytes: pair_bytes + 4,
            row_flops: slices as u64,
            ..Cost::default()
        });
        // a slice's 1024 logits, 16 per invocation, then the row's slices; each with a tree
        let wg = Kernel::WORKGROUP as usize;
        let per_slice = REDUCE_SLICE.min(vocab).div_ceil(wg) as u64 + 6;
        let per_row = slices.div_ceil(wg) as u64 + 6;
        vec![slices_op.with_serial(Serial::fixed(per_slice)), rows_op.with_serial(Serial::fixed(per_row))]
    }

    /// `out[r, j]` = the id of row r's j-th largest logit, j < k (equal values: lower id first, as
    /// [`Gpu::argmax`] breaks ties); `logits: [rows, vocab]`, `out: [n, k]`, k <= [`MAX_TOP_K`].
    /// With `logp: [n, k]`, also each of those ids' log-probability (the log-softmax of its
    /// logit). Two dispatches: each slice of [`REDUCE_SLICE`] logits of each row ranks its k
    /// best, then each row ranks its slices' (the same ids whatever the slicing).
    pub fn top_k(
        &self,
        step: &wgpu::Buffer,
        logits: &GpuBuffer<f32>,
        (out, logp): (&GpuBuffer<u32>, Option<&GpuBuffer<f32>>),
        vocab: usize,
        k: usize,
    ) -> Vec<Op> {
        let k = k.clamp(1, MAX_TOP_K);
        let slices = reduce_slices(vocab);
        let rows = (logits.len / vocab.max(1)).max(1);
        let words = TopKScratch::new(rows, vocab, k, logp.is_some());
        let cand = GpuBuffer::<u32>::zeros(self, "top-k candidates", words.candidates);
        let lse = GpuBuffer::<f32>::zeros(self, "top-k sums", words.sums);
        // (without log-probabilities the kernel writes none: a one-word placeholder is bound)
        let unused;
        let logp_raw = match logp {
            Some(b) => &b.raw,
            None => {
                unused = GpuBuffer::<f32>::zeros(self, "top-k no log-probs", words.placeholder);
                &unused.raw
            }
        };
        let stage = |stage: u32| {
            let p = TopKParams {
                vocab: vocab as u32,
                k: k as u32,
                log_probs: logp.is_some() as u32,
                slices: slices as u32,
                stage,
                _pad: [0; 3],
            };
            self.uniform("top-k params", bytemuck::bytes_of(&p))
        };
        let stages = [stage(0), stage(1)];
        let buffers = [&logits.raw, &cand.raw, &lse.raw, &out.raw, logp_raw];
        let passes = (k + logp.is_some() as usize) as u64;
        let cand_bytes = (8 * slices * k) as u64;
        let slices_op =
            self.op(Kernel::TopK, step, &stages[0], &buffers, Grid::PerRow(slices as u32)).with_cost(Cost {
                row_bytes: 4 * passes * vocab as u64 + cand_bytes,
                row_flops: passes * vocab as u64,
                ..Cost::default()
            });
        let rows_op = self.op(Kernel::TopK, step, &stages[1], &buffers, Grid::Rows).with_cost(Cost {
            row_bytes: k as u64 * cand_bytes + 8 * k as u64,
            row_flops: k as u64 * (slices * k) as u64,
            ..Cost::default()
        });
        // k rounds over a slice's 1024 logits (and the sum of exponentials), then k rounds over
        // the row's slices x k candidates (and the slices' sums); each with a tree
        let (wg, kk, lp) = (Kernel::WORKGROUP as usize, k as u64, logp.is_some() as u64);
        let per_slice = (kk + lp) * (REDUCE_SLICE.min(vocab).div_ceil(wg) as u64 + 6);
        let per_row =
            kk * ((slices * k).div_ceil(wg) as u64 + 6) + lp * (slices.div_ceil(wg) as u64 + 6 + kk);
        vec![slices_op.with_serial(Serial::fixed(per_slice)), rows_op.with_serial(Serial::fixed(per_row))]
    }

    /// `out[i * ld + offset + j] = src[s][j]`, times `gamma[j] / rms(src[s])` with `norm = (gamma,
    /// eps)`, for i < the pass's n and j < dim, where s = `rows[i]` (a gather) or i: heads take
    /// the target's final hidden states of a pass's rows this way (the output norm), an EAGLE-3
    /// head its feature taps and the normalised halves of its attention input. `src: [n', dim]`,
    /// `gamma: [dim]`, `rows: [n]`, `out: [n, ld]`.
    pub fn gather_rows(
        &self,
        step: &wgpu::Buffer,
        src: &GpuBuffer<f32>,
        rows: Option<&GpuBuffer<u32>>,
        norm: Option<(&GpuBuffer<f32>, f32)>,
        (out, ld, offset): (&GpuBuffer<f32>, usize, usize),
        dim: usize,
    ) -> Op {
        let flags = norm.is_some() as u32 | (rows.is_some() as u32) << 1;
        let eps = norm.map_or(0.0, |n| n.1);
        let p =
            GatherParams { dim: dim as u32, eps, ld: ld as u32, offset: offset as u32, flags, _pad: [0; 3] };
        let params = self.uniform("gather rows params", bytemuck::bytes_of(&p));
        let cost = Cost { row_bytes: 8 * dim as u64, row_flops: 3 * dim as u64, ..Cost::default() };
        // (unused inputs are bound to src, read-only like them)
        let gamma = norm.map_or(&src.raw, |n| &n.0.raw);
        let rows = rows.map_or(&src.raw, |r| &r.raw);
        let storage = [&src.raw, gamma, rows, &out.raw];
        // the row's sum of squares (and its tree), then its values
        let columns = dim.div_ceil(Kernel::WORKGROUP as usize) as u64;
        let serial = if norm.is_some() { 2 * columns + 6 } else { columns };
        self.op(Kernel::GatherRows, step, &params, &storage, Grid::Rows)
            .with_cost(cost)
            .with_serial(Serial::fixed(serial))
    }

    /// A sub-block's output normed before its residual add (Gemma's post-attention and
    /// post-feed-forward norms): `x[r] += rmsnorm(y[r]) * w`, and with `next = Some((gamma, xb))`
    /// `xb[r] = x[r] * gamma` (`shaders/norm_add.wgsl`; `y`, `x`, `xb`: `[n, dim]`).
    pub fn norm_add(
        &self,
        step: &wgpu::Buffer,
        (y, w, eps): (&GpuBuffer<f32>, &GpuBuffer<f32>, f32),
        x: &GpuBuffer<f32>,
        next: Option<(&GpuBuffer<f32>, &GpuBuffer<f32>)>,
        dim: usize,
    ) -> Op {
        let p = NormAddParams { dim: dim as u32, eps, scaled_copy: next.is_some() as u32, _pad: 0 };
        let params = self.uniform("norm add params", bytemuck::bytes_of(&p));
        let cost = Cost { row_bytes: 4 * 4 * dim as u64, row_flops: 5 * dim as u64, ..Cost::default() };
        // (unused: bound to y, read-only, and the GPU's own writable scratch)
        let (gamma, xb) = next.map_or((&y.raw, &self.unused_output), |(g, o)| (&g.raw, &o.raw));
        let storage = [&y.raw, &w.raw, gamma, &x.raw, xb];
        // the row's squares and their tree, then its values
        let columns = dim.div_ceil(Kernel::WORKGROUP as usize) as u64;
        self.op(Kernel::NormAdd, step, &params, &storage, Grid::Rows)
            .with_cost(cost)
            .with_serial(Serial::fixed(2 * columns + 6))
    }

    /// Per-head RMSNorm (`eps`, weights `io.norms`) of the q and k heads of `io.qkv` (the raw
    /// q|k|v matmul output, its q and k rows in `layout`'s pair order), RoPE by each row's
    /// position, q into `io.q` and k | v into the cache row `start_pos + r` (`shaders/head_norm.wgsl`).
    pub fn head_norm(
        &self,
        step: &wgpu::Buffer,
        io: HeadNormIo,
        shape: AttentionShape,
        (rope_dim, layout): (u32, RopeLayout),
        eps: f32,
    ) -> Op {
        let p = HeadNormParams {
            q_heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            rope_dim,
            halves: (layout == RopeLayout::Halves) as u32,
            eps,
            kv_f16: shape.kv_f16 as u32,
            _pad: 0,
        };
        let params = self.uniform("head norm params", bytemuck::bytes_of(&p));
        let heads = shape.heads + 2 * shape.kv_heads;
        let width = (heads * shape.head_dim) as u64;
        // per row: q|k|v read, q and k|v written (f32; an f16 cache takes less), 5 flops a value
        let cost = Cost { row_bytes: 8 * width, row_flops: 5 * width, ..Cost::default() };
        let storage =
            [&io.qkv.raw, &io.norms[0].raw, &io.norms[1].raw, &io.cos_sin.raw, &io.q.raw, &io.kv.raw];
        // a head's squares, their tree, its pairs, its stores
        let per = (shape.head_dim as u64).div_ceil(Kernel::WORKGROUP as u64);
        let serial = 3 * per + Kernel::WORKGROUP.ilog2() as u64 + 2;
        self.op(Kernel::HeadNorm, step, &params, &storage, Grid::PerRow(heads))
            .with_cost(cost)
            .with_serial(Serial::fixed(serial))
    }

    /// One call of `shaders/eagle_tree.wgsl` (EAGLE-2's draft tree grown on the GPU), its
    /// [`EagleTreeParams`] in `params` (written before each use): reads the ranks `ids`/`logp`
    /// (`[m, k]`), keeps the candidates in `state` (`[EAGLE_TREE_STATE]`), writes the next pass or
    /// the chosen tree into `out` (`[EAGLE_TREE_OUT]`).
    pub fn eagle_tree(
        &self,
        step: &wgpu::Buffer,
        params: &wgpu::Buffer,
        (ids, logp): (&GpuBuffer<u32>, &GpuBuffer<f32>),
        state: &GpuBuffer<u32>,
        out: &GpuBuffer<u32>,
    ) -> Op {
        let storage = [&ids.raw, &logp.raw, &state.raw, &out.raw];
        // one workgroup of 256: its worst call's invocation counts a candidate's place among 255
        // twice (choosing, and finishing the tree) and a row's place among them once;
        // invocation 0 adds 8 expanded nodes' 16 children (each new token against those before
        // it) and sums the cost model's 31 chances twice; a row walks its 32 ancestors, a chosen
        // node its place and its parent among 31 (shaders/eagle_tree.wgsl: `rank`, `choose`,
        // `add_children`, the finish)
        let serial = 3 * 255 + 8 * (16 + 16 * 15 / 2) + 2 * 31 + 32 + 2 * 31;
        self.op(Kernel::EagleTree, step, params, &storage, Grid::Fixed([1, 1, 1]))
            .with_serial(Serial::fixed(serial))
    }

    /// `ids[r, j] = table[ids[r, j]]` for the pass's rows and j < k (k <= 64): a draft
    /// vocabulary's ids renamed to the target's. `table: [size]`, `ids: [n, k]`.
    pub fn map_ids(&self, step: &wgpu::Buffer, table: &GpuBuffer<u32>, ids: &GpuBuffer<u32>, k: usize) -> Op {
        let p = MapIdsParams { k: k as u32, size: table.len as u32, _pad: [0; 2] };
        let params = self.uniform("map ids params", bytemuck::bytes_of(&p));
        self.op(Kernel::MapIds, step, &params, &[&table.raw, &ids.raw], Grid::Rows)
            .with_serial(Serial::fixed(1))
    }

    /// `out[r] = [left[r] | right[r]]` for the pass's rows; `left: [n, a]`, `right: [n, b]`,
    /// `out: [n, a + b]`.
    pub fn concat(
        &self,
        step: &wgpu::Buffer,
        left: (&GpuBuffer<f32>, usize),
        right: (&GpuBuffer<f32>, usize),
        out: &GpuBuffer<f32>,
    ) -> Op {
        let p = ConcatParams { left: left.1 as u32, right: right.1 as u32, _pad: [0; 2] };
        let params = self.uniform("concat params", bytemuck::bytes_of(&p));
        let width = (left.1 + right.1) as u64;
        let cost = Cost { row_bytes: 8 * width, ..Cost::default() };
        let storage = [&left.0.raw, &right.0.raw, &out.raw];
        let grid = Grid::PerRow(groups(left.1 + right.1));
        self.op(Kernel::Concat, step, &params, &storage, grid).with_cost(cost).with_serial(Serial::fixed(1))
    }

    /// Greedy acceptance of a verify pass over `n = K + 1` rows (`step` is that pass's uniform):
    /// `out = [a, target_argmax[a], drafts[..K]]` with a = the accepted count. `drafts: [capacity]`,
    /// `target_argmax: [K + 1]`, `out: [2 + capacity]`.
    pub fn accept_greedy(
        &self,
        step: &wgpu::Buffer,
        drafts: &GpuBuffer<u32>,
        target_argmax: &GpuBuffer<u32>,
        out: &GpuBuffer<u32>,
    ) -> Op {
        let p = AcceptParams { capacity: drafts.len.min(out.len.saturating_sub(2)) as u32, _pad: [0; 3] };
        let params = self.uniform("accept params", bytemuck::bytes_of(&p));
        let storage = [&drafts.raw, &target_argmax.raw, &out.raw];
        // one invocation: the drafts compared, then copied (capacity at most)
        self.op(Kernel::AcceptGreedy, step, &params, &storage, Grid::Fixed([1, 1, 1]))
            .with_serial(Serial::fixed(2 * p.capacity as u64))
    }

    /// Draws from the sampling distribution of rows of `logits` (`[n, vocab]`, the pass of
    /// `step`) on the GPU, as `shaders/sample.wgsl` says: `out` gets each row's draw (`[rows]`);
    /// `seed`: the generation's [`SampleSeed`] uniform; `status: [1]` becomes at least r + 1
    /// where row r holds a logit that is not finite.
    ///
    /// Every stage runs a workgroup per slice of [`REDUCE_SLICE`] logits of each row: with a
    /// min-p the slices' largest logits, with a top-k the 8 levels of its radix select, the
    /// slices' stats, with a top-p 7 more levels of the nucleus' radix select, the draws, then
    /// one workgroup per row combining them: 3 dispatches, 10 with a top-p, 11 with a top-k, 18
    /// with both; one more with a min-p.
    pub fn sample(
        &self,
        step: &wgpu::Buffer,
        seed: &wgpu::Buffer,
        logits: &GpuBuffer<f32>,
        (out, status): (&GpuBuffer<u32>, &GpuBuffer<u32>),
        cfg: SampleConfig,
    ) -> Vec<Op> {
        let scratch = GpuBuffer::<u32>::zeros(self, "sample scratch", sample_scratch_len(logits, cfg));
        self.sample_into(step, seed, logits, (out, status), &scratch, cfg)
    }

    /// [`Gpu::sample`] with its scratch given (at least [`sample_scratch_len`] words): the
    /// draws of ops that run one after another may share one.
    pub fn sample_into(
        &self,
        step: &wgpu::Buffer,
        seed: &wgpu::Buffer,
        logits: &GpuBuffer<f32>,
        (out, status): (&GpuBuffer<u32>, &GpuBuffer<u32>),
        scratch: &GpuBuffer<u32>,
        cfg: SampleConfig,
    ) -> Vec<Op> {
        debug_assert!(scratch.len >= sample_scratch_len(logits, cfg), "a sample scratch too small");
        let slices = reduce_slices(cfg.vocab);
        let slots = sample_slots(logits, cfg);
        // (a top-k of the whole vocabulary keeps every token: no cut)
        let top_k = if cfg.top_k < cfg.vocab { cfg.top_k } else { 0 };
        let storage = [&logits.raw, &out.raw, &status.raw, &scratch.raw];
        let op = |stage: u32, grid: Grid| {
            let params = SampleParams {
                vocab: cfg.vocab as u32,
                top_k: top_k as u32,
                temperature: cfg.temperature,
                top_p: cfg.top_p,
                last_only: cfg.last_only.is_some() as u32,
                out_row: cfg.last_only.unwrap_or(0) as u32,
                stream: cfg.stream,
                stage,
                slices: slices as u32,
                slots: slots as u32,
                min_p: cfg.min_p_offset.is_some() as u32,
                min_p_offset: cfg.min_p_offset.unwrap_or(0.0),
            };
            let params = self.uniform("sample params", bytemuck::bytes_of(&params));
            self.op_with_uniform(Kernel::Sample, step, &params, seed, &storage, grid)
        };
        let per_row = |x: u32| match cfg.last_only {
            Some(_) => Grid::Fixed([x, 1, 1]),
            None => Grid::PerRow(x),
        };
        let row_bytes = 4 * cfg.vocab as u64;
        let slice_op = |stage: u32, serial: u64| {
            op(stage, per_row(slices as u32))
                .with_cost(Cost { row_bytes, ..Cost::default() })
                .with_serial(Serial::fixed(serial))
        };
        // the serial loops of an invocation: a slice's SLICE / WG logits, the row's slices
        // (SLICE / WG at most each for the stats, a quarter of them for a level's bins), trees;
        // a cut inside tied tokens: their slice (runs of slices, then slices) and its runs of ids
        let wg = Kernel::invocations(Kernel::Sample) as u64;
        let scan = (REDUCE_SLICE.min(cfg.vocab) as u64).div_ceil(wg);
        let across = (slices as u64).div_ceil(wg) + 6;
        let bins = (slices as u64).div_ceil(4) + 4 + 16;
        let histogram = scan + wg / 4 + 4;
        let ties = (slices as u64).div_ceil(wg) + wg + 2 * scan + wg;
        let nucleus = cfg.top_p < 1.0;
        let mut ops = Vec::new();
        if cfg.min_p_offset.is_some() {
            ops.push(slice_op(SAMPLE_MAXES, scan + 6));
        }
        if top_k > 0 {
            ops.extend(
                (0..SAMPLE_LEVELS).map(|level| slice_op(level, bins * (level > 0) as u64 + histogram)),
            );
        }
        // (a min-p's floor: the row's largest logit from its slices')
        let top_cut =
            if top_k > 0 { bins + ties } else { 0 } + if cfg.min_p_offset.is_some() { across } else { 0 };
        let levels = if nucleus { SAMPLE_LEVELS } else { 1 };
        ops.extend((0..levels).map(|level| {
            let serial = match level {
                0 => top_cut + 2 * (scan + 6) + if nucleus { histogram } else { 0 },
                _ => 2 * across + bins + histogram,
            };
            slice_op(SAMPLE_NUCLEUS + level, serial)
        }));
        // a cut: the row's stats; with a nucleus the last level's pick, and its ties
        let cut = 2 * across + if nucleus { bins + ties } else { 0 };
        let draw = slice_op(SAMPLE_DRAW, cut + scan + 12);
        let finish_grid = match cfg.last_only {
            Some(_) => Grid::Fixed([1, 1, 1]),
            None => Grid::Rows,
        };
        let finish = op(SAMPLE_FINISH, finish_grid)
            .with_cost(Cost { row_bytes: 8 * slices as u64 + 4, ..Cost::default() })
            .with_serial(Serial::fixed(across + 6));
        ops.extend([draw, finish]);
        ops
    }

    /// Speculative sampling's acceptance of a verify pass (`step`: K + 1 rows) from the draws
    /// [`Gpu::sample`] wrote into `samples` (`[K + 1]`): drafts x_i kept while row i drew x_i
    /// (`shaders/accept_sampled.wgsl`); `out` (`[2 + capacity + 1]`) gets the accepted count,
    /// the next token, the drafts, and the status word.
    pub fn accept_sampled(
        &self,
        step: &wgpu::Buffer,
        drafts: &GpuBuffer<u32>,
        samples: &GpuBuffer<u32>,
        status: &GpuBuffer<u32>,
        out: &GpuBuffer<u32>,
    ) -> Op {
        let capacity = drafts.len.min(out.len.saturating_sub(3)) as u32;
        let p = AcceptSampledParams { capacity, _pad: [0; 3] };
        let params = self.uniform("accept sampled params", bytemuck::bytes_of(&p));
        let storage = [&drafts.raw, &samples.raw, &status.raw, &out.raw];
        // one invocation: each draft compared, then the copies (capacity at most)
        self.op(Kernel::AcceptSampled, step, &params, &storage, Grid::Fixed([1, 1, 1]))
            .with_serial(Serial::fixed(2 * capacity as u64))
    }

    /// The step uniform buffer (write it with [`Gpu::write_step`] before each pass).
    pub fn step_buffer(&self) -> wgpu::Buffer {
        self.uniform("step", bytemuck::bytes_of(&Step::chain(0, 0)))
    }

    /// Sets the rows and start position of the next pass (a chain pass: only the first 16 bytes,
    /// the tree flag cleared).
    pub fn write_step(&self, step: &wgpu::Buffer, n: usize, start_pos: usize) {
        let s = Step::chain(n, start_pos);
        self.queue.write_buffer(step, 0, &bytemuck::bytes_of(&s)[..16]);
    }

    /// Sets the next pass to a token tree: `ancestors[r]` as in [`Step::ancestors`].
    pub fn write_tree_step(&self, step: &wgpu::Buffer, start_pos: usize, ancestors: &[u32]) {
        let mut s = Step::chain(ancestors.len(), start_pos);
        s.tree = 1;
        s.ancestors[..ancestors.len()].copy_from_slice(ancestors);
        self.queue.write_buffer(step, 0, bytemuck::bytes_of(&s));
    }

    /// Copies the cache rows of `kv: [cache rows, width]` that `keep` pairs (`keep`: a
    /// [`KeepParams`] uniform written before the op runs).
    pub fn kv_keep(&self, step: &wgpu::Buffer, keep: &wgpu::Buffer, kv: &GpuBuffer<u32>, width: u32) -> Op {
        let grid = Grid::Fixed([width.div_ceil(Kernel::WORKGROUP), 1, 1]);
        // one word of each kept row per invocation (a pass's rows at most)
        self.op(Kernel::KvKeep, step, keep, &[&kv.raw], grid).with_serial(Serial::fixed(PASS_ROWS as u64))
    }
}
