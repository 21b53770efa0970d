//! An EAGLE draft head on the GPU (Li et al., "EAGLE", arXiv 2401.15077; EAGLE-2, 2406.16858):
//! one decoder layer that predicts the target's next feature from its current one.
//!
//! The public EAGLE-1/2 layout (a `config.json` of one llama layer and `model.safetensors`):
//!
//! ```text
//!   f_p   the target's final hidden state at position p (after its output norm)   [dim]
//!   e     the target's embedding of token t_{p+1}                               [dim]
//!   x     = fc([e | f_p]) (+ fc.bias)           `fc.weight` [dim, 2 dim], `fc.bias` [dim] (optional)
//!   h     = x + attention(x) at position p      `layers.0.self_attn.{q,k,v,o}_proj.weight`, no input
//!                                               norm (EAGLE-1's first layer has none; an
//!                                               `input_layernorm` is used when present)
//!   f^    = h + mlp(rmsnorm(h))                 `layers.0.post_attention_layernorm.weight`,
//!                                               `layers.0.mlp.{gate,up,down}_proj.weight`
//!   logits = the target's output projection of f^ (no norm): t^_{p+2}; with `draft_vocab_size`
//!            in config.json, of its first rows only (the head ranks the first ids alone)
//! ```
//!
//! The public EAGLE-3 layout (Li et al., arXiv 2503.01840; `LlamaForCausalLMEagle3`, as
//! SafeAILab's EAGLE, vLLM and SGLang read it):
//!
//! ```text
//!   a_p   the target's residual stream at position p after l1, l2, l3 layers, side by side
//!         (default 2, N/2, N-3 of its N layers; config.json's eagle_aux_hidden_state_layer_ids,
//!         vLLM's meaning)                                                       [3 dim]
//!   g     = fc(a_p) (+ fc.bias)                 `fc.weight` [dim, 3 dim]; a draft step's g is
//!                                               the head's own previous output h (no fc)
//!   u     = [rmsnorm(e) | rmsnorm(g)]           `midlayer.input_layernorm.weight`,
//!                                               `midlayer.hidden_norm.weight`       [2 dim]
//!   h     = g + attention(u) at position p      `midlayer.self_attn.{q,k,v}_proj.weight`
//!                                               [*, 2 dim], `o_proj` [dim, q_dim]
//!   h     = h + mlp(rmsnorm(h))                 `midlayer.post_attention_layernorm.weight`,
//!                                               `midlayer.mlp.*`
//!   logits = lm_head(rmsnorm(h))                `norm.weight`, `lm_head.weight` [draft_vocab, dim];
//!         draft id d is the target's d + d2t[d] (`d2t` [draft_vocab] I64; `t2d` is for training)
//! ```
//!
//! The head keeps its own KV cache over the positions it has run. A pass of n rows: the features
//! gathered from the target's pass ([`Gpu::gather_rows`]) or copied from the head's own previous
//! output, the embedding, the concatenation, fc and the layer over every row; then the
//! projection (a `[vocab, dim]` matmul, most of a pass's bytes; EAGLE-3's `[draft_vocab, dim]`)
//! and a top-k of the LAST row only (EAGLE-3: its ids renamed by d2t on the GPU), the one
//! drafting continues from. A pass over the target's kept rows leaves that projection to the next
//! draft: a cycle that drafts nothing (a plain step) never reads the output matrix.
//!
//! Drafting continues in one of two ways:
//! - a chain ([`EagleHead::draft`]): one-row passes, each fed the previous one's f^ and most
//!   likely id, in one submission;
//! - a tree (EAGLE-2's expansion, [`EagleHead::draft_tree`]): tree passes over chosen draft nodes
//!   and their ancestors (each row attends to the cache and its ancestors' rows, as the target's
//!   tree pass does), each node fed its parent's f^ from a store of the expanded nodes' features;
//!   the newest nodes are projected and ranked with the log-probabilities of their ids, by which
//!   `shaders/eagle_tree.wgsl` chooses the next nodes and the tree on the GPU.
//!
//! For a batch of sequences the cache is a pool of pages ([`EagleHead::set_kv_pages`], each
//! sequence's positions in its own pages, as the target's): a pass over the kept rows of several
//! sequences ([`EagleHead::run_pages`], each sequence's last row projected and ranked with it:
//! its first draft and the head's log-probability of it, read when wanted
//! ([`EagleHead::first_drafts`]), which tells how likely the target is to take it before
//! anything is drafted), then their chains in one submission
//! ([`EagleHead::draft_pages`]: one-row steps per sequence drafting more than one).
//! One-sequence passes use the pool's first positions.
//!
//! Building a head (its tensors, checks, upload, buffers, recorded ops and memory plan) is in
//! `build.rs`.

use std::sync::Arc;

use super::config::Config;
use super::transformer::{paged_step, PagedStep, SeqRows, MAX_BATCH};
use super::weights::{Layer, Matrix};
use crate::error::{Error, Result};
use crate::gpu::{
    EagleTreeMode, EagleTreeParams, Gpu, GpuBuffer, Op, Step, EAGLE_TREE_MANY, EAGLE_TREE_NEWEST,
    EAGLE_TREE_OUT, EAGLE_TREE_RESULT, EAGLE_TREE_SLOTS, EAGLE_TREE_STEP, EAGLE_TREE_TOKENS, MAX_TREE,
};

mod build;

/// The most nodes one tree pass expands (its newest rows, projected together).
pub const MAX_EAGLE_WIDTH: usize = 8;

/// The deepest draft tree (depth 1 comes from the target's pass, each further depth is one
/// head pass).
pub const MAX_EAGLE_DEPTH: usize = 16;

/// Slots of the store of expanded nodes' features: the root's, then each pass's expanded nodes.
pub const EAGLE_STORE_SLOTS: usize = 1 + (MAX_EAGLE_DEPTH - 1) * MAX_EAGLE_WIDTH;

/// The most rows one projection ranks: a tree pass's newest nodes, or one per sequence of a
/// batch's chains.
const PROJECTED: usize = MAX_BATCH;

/// Bytes of the batch's step table: per chain step of several sequences a [`Step`], then per
/// projection 16 bytes (its rows).
const BATCH_TABLE_BYTES: usize = MAX_EAGLE_DEPTH * (std::mem::size_of::<Step>() + 16);

/// How a draft tree is grown ([`EagleHead::draft_tree`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeShape {
    /// At most this deep (<= [`MAX_EAGLE_DEPTH`]).
    pub depth: usize,
    /// Nodes expanded per depth (<= [`MAX_EAGLE_WIDTH`] and the head's top-k).
    pub width: usize,
    /// Drafted nodes the tree may hold (<= [`MAX_TREE`] - 1).
    pub max_nodes: usize,
    /// With measured costs (`verify[n - 1]`: seconds of a verify pass of n rows; seconds per
    /// draft pass), the number of nodes maximises expected tokens per second instead of
    /// filling `max_nodes`, each node's chance of acceptance being `calibration * exp(score)`.
    pub costs: Option<([f32; MAX_TREE], f32)>,
    pub calibration: f32,
}

/// One sequence's rows in a head pass over several ([`EagleHead::run_pages`]).
#[derive(Clone, Copy, Debug)]
pub struct HeadRows<'a> {
    /// The sequence's pages of the head's pool in position order, covering its rows.
    pub pages: &'a [u32],
    /// The position of its first row; the head's cache holds its positions before it.
    pub start_pos: usize,
    /// The target's rows of its last pass at positions `start_pos..` (their features).
    pub rows: &'a [u32],
    /// Each row's next token, t_{p+1}.
    pub next: &'a [u32],
}

/// One sequence's chain in a batch's drafting ([`EagleHead::draft_pages`]).
#[derive(Clone, Copy, Debug)]
pub struct HeadChain<'a> {
    /// The sequence's pages of the head's pool, covering `past + drafts - 1` positions.
    pub pages: &'a [u32],
    /// Its positions the head has computed: the first draft step's position.
    pub past: usize,
    /// Its last row in the latest [`EagleHead::run_pages`] pass (whose f^ the next step reads).
    pub row: usize,
    /// That row's ranks: the first draft, its siblings and the head's log-probability of it
    /// ([`EagleHead::first_drafts`]'s).
    pub first: &'a Ranked,
    /// Drafts wanted (1..=[`MAX_EAGLE_DEPTH`]).
    pub drafts: usize,
}

/// A draft step's ranking of one sequence's next token (its first draft's, as a head pass over
/// several ranks it: [`EagleHead::run_pages`]; each step of its chain's:
/// [`EagleHead::draft_pages`]): from the f^ before it, the head's `top_k` ids, most likely
/// first, and the head's log-probability of each (EAGLE-2's confidence: how often the target
/// takes a draft follows it, at any depth).
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    pub ids: Vec<u32>,
    pub log_probs: Vec<f32>,
}

impl Ranked {
    /// A ranking in read-back `words`: its `k` ids at word `ids`, their log-probabilities' bits
    /// at word `logp` (the top-k's `top` and `logp` rows, copied side by side).
    fn read(words: &[u32], ids: usize, logp: usize, k: usize) -> Ranked {
        let log_probs = words[logp..logp + k].iter().map(|&w| f32::from_bits(w)).collect();
        Ranked { ids: words[ids..ids + k].to_vec(), log_probs }
    }

    /// The head's log-probability of its first id (none ranked: minus infinity).
    pub fn confidence(&self) -> f32 {
        self.log_probs.first().copied().unwrap_or(f32::NEG_INFINITY)
    }
}

/// A draft tree as the GPU chose it: its nodes by depth (best first within a depth).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftedTree {
    pub tokens: Vec<u32>,
    /// Each node's parent among the nodes before it; `None`: a child of the root.
    pub parents: Vec<Option<usize>>,
    /// The sum of the nodes' path probabilities (uncalibrated): their predicted accepted number.
    pub predicted: f32,
    /// Head passes run.
    pub passes: usize,
}

/// Which public layout a head's file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EagleLayout {
    /// EAGLE-1/2: `fc` over [embedding | the target's final hidden state], `layers.0.*`, the
    /// target's output projection, of its first `draft_vocab` rows: the head ranks those ids
    /// alone (all of them unless `config.json` has a smaller `draft_vocab_size`; BPE
    /// vocabularies number their tokens about in order of frequency, so the first ids hold most
    /// of what a head guesses right, and the rows after them are never read).
    Eagle1 { draft_vocab: usize },
    /// EAGLE-3: `fc` over three taps of the target's residual stream (after `taps[i]` layers),
    /// `midlayer.*` attending over [input_layernorm(embedding) | hidden_norm(feature)], its own
    /// `norm` and `lm_head` over `draft_vocab` ids, the target's id of draft id d being
    /// `d + d2t[d]`.
    Eagle3 { draft_vocab: usize, taps: [usize; 3] },
}

impl EagleLayout {
    /// Columns of fc's input (`cat`) and ids the head ranks, for a head of width `dim` drafting
    /// for a vocabulary of `vocab` ids.
    fn widths(self, dim: usize, vocab: usize) -> (usize, usize) {
        match self {
            EagleLayout::Eagle1 { draft_vocab } => (2 * dim, draft_vocab.min(vocab)),
            EagleLayout::Eagle3 { draft_vocab, .. } => (3 * dim, draft_vocab),
        }
    }
}

/// An EAGLE-3 head's own tensors on the GPU.
struct Eagle3Weights {
    embed_norm: GpuBuffer<f32>,  // [dim] midlayer.input_layernorm
    hidden_norm: GpuBuffer<f32>, // [dim] midlayer.hidden_norm
    norm: GpuBuffer<f32>,        // [dim] norm (before lm_head)
    lm_head: Matrix,             // [draft_vocab, dim]
    d2t: GpuBuffer<u32>,         // [draft_vocab] the target's id of each draft id
    lastn: GpuBuffer<f32>,       // [PROJECTED, dim] norm(last)
}

/// Buffers of the head, each allocated once for [`MAX_BATCH`] rows.
#[allow(dead_code)] // kept alive for the bind groups that reference them
struct HeadState {
    config: Config,                  // the head's (one layer)
    step: wgpu::Buffer,              // uniform Step of the head's passes
    step_table: wgpu::Buffer,        // [MAX_BATCH, 4] u32: (1, position, 0, 0) of each draft step
    one: wgpu::Buffer,               // uniform Step of one row: the last row's projection
    many: wgpu::Buffer,              // uniform Step of a tree pass's projected rows
    batch: wgpu::Buffer,             // uniform Step of the rows a batch's chain step projects
    batch_table: wgpu::Buffer,       // [BATCH_TABLE_BYTES] a batch's chain steps' Steps, then projections'
    picks: GpuBuffer<u32>,           // [MAX_BATCH] each batched sequence's row of the last pass
    drafts: GpuBuffer<u32>,          // [MAX_EAGLE_DEPTH, 2, MAX_BATCH, top_k] each step's ids, logp bits
    rows: GpuBuffer<u32>,            // [MAX_BATCH] the target's rows a pass gathers
    tokens: GpuBuffer<u32>,          // [MAX_BATCH] t_{p+1} of each row
    feat: GpuBuffer<f32>,            // [MAX_BATCH, dim] f_p of each row (EAGLE-1)
    embd: GpuBuffer<f32>,            // [MAX_BATCH, dim] the tokens' embeddings
    cat: GpuBuffer<f32>,             // [MAX_BATCH, 2 dim] [embd | feat]; EAGLE-3: [MAX_BATCH, 3 dim]
    x: GpuBuffer<f32>,               // [MAX_BATCH, dim] residual stream: f^ at the end of a pass
    xb: GpuBuffer<f32>,              // [MAX_BATCH, dim]
    q: GpuBuffer<f32>,               // [MAX_BATCH, q_dim]
    att: GpuBuffer<f32>,             // [MAX_BATCH, q_dim]
    scores: GpuBuffer<f32>,          // attention scratch (Gpu::attention_scratch_len for MAX_BATCH rows)
    hb: GpuBuffer<f32>,              // [MAX_BATCH, ffn_dim]
    logits: GpuBuffer<f32>,          // [PROJECTED, vocab] the projected rows'
    last: GpuBuffer<f32>,            // [PROJECTED, dim] the projected rows' f^ (row i: where chain i goes on)
    top: GpuBuffer<u32>,             // [PROJECTED, top_k] the projected rows' most likely ids
    logp: GpuBuffer<f32>,            // [PROJECTED, top_k] their log-probabilities
    firsts: GpuBuffer<u32>,          // [2, PROJECTED, top_k] run_pages' ranks: ids, then log-prob bits
    store: GpuBuffer<f32>,           // [EAGLE_STORE_SLOTS, dim] f^ of a draft tree's expanded nodes
    tree_state: GpuBuffer<u32>,      // [EAGLE_TREE_STATE] the draft tree's candidates
    tree_out: GpuBuffer<u32>,        // [EAGLE_TREE_OUT] the next tree pass, the chosen tree
    tree_rows: GpuBuffer<u32>,       // [MAX_TREE] the store slot each tree-pass row reads
    pages: GpuBuffer<u32>, // [MAX_BATCH, pages a context takes] the page table of a pass over several sequences
    tree_newest: GpuBuffer<u32>, // [W] the tree pass's rows to project
    tree_params: Vec<wgpu::Buffer>, // [MAX_EAGLE_DEPTH] uniform EagleTreeParams per call
    kv: GpuBuffer<u32>,    // [kv_pages * KV_PAGE, 2 kv_dim] f32 bits (a head's cache stays f32)
    cos_sin: GpuBuffer<f32>, // [context, rope_dim / 2, 2]
    fc: Matrix,            // [dim, 2 dim] (EAGLE-3: [dim, 3 dim])
    fc_bias: Option<GpuBuffer<f32>>, // [dim]
    layer: Layer,
    eagle3: Option<Eagle3Weights>,
}

impl HeadState {
    /// Where a pass's rows take their feature from: EAGLE-1's `feat` (fc follows), EAGLE-3's x
    /// (the residual stream, fc already applied to the target's taps).
    fn feature_in(&self) -> &GpuBuffer<f32> {
        match self.eagle3 {
            Some(_) => &self.x,
            None => &self.feat,
        }
    }
}

/// An EAGLE head on the GPU for one target (see the module's doc).
pub struct EagleHead {
    /// The head's config (one layer; the target's vocabulary).
    pub config: Config,
    layout: EagleLayout,
    gpu: Arc<Gpu>,
    state: HeadState,
    /// Its recorded ops: the gathering of the target's features, a pass, the projections and
    /// the draft tree's calls.
    ops: HeadOps,
    top_k: usize,
    context: usize,
    /// Pages of its KV cache pool: a one-sequence pass uses its first positions, a pass over
    /// several sequences ([`EagleHead::run_pages`]) their pages.
    kv_pages: usize,
    /// Positions in the head's KV cache (one-sequence passes).
    len: usize,
    /// Sequences ranked in `firsts` by the latest [`EagleHead::run_pages`].
    ranked: usize,
    /// The last pass's row is in `last` but not yet projected: the next draft projects it first
    /// (a plain cycle, which drafts nothing, then never reads the output matrix).
    unprojected: bool,
    gpu_bytes: u64,
    memory_bytes: u64,
}

/// The head's recorded ops (see [`EagleHead`]'s fields for what each does).
struct HeadOps {
    /// Takes the target's features of `rows` (EAGLE-1: into `feat`; EAGLE-3: through fc into x).
    gather: Vec<Op>,
    /// A pass over its rows: embedding, the layer's input, the layer.
    pass: Vec<Op>,
    /// The last row's projection and top-k (one row, from `last`).
    project: Vec<Op>,
    /// A tree pass's projection and top-k (its `many` rows, from `last`).
    project_many: Vec<Op>,
    /// A batch's chain step's projection and top-k (its `batch` rows, from `last`).
    project_batch: Vec<Op>,
    /// The `batch` rows of x that `picks` names to `last`.
    batch_last: Op,
    /// The draft tree's calls of `eagle_tree.wgsl`: the start, then one per expansion (the last
    /// one also finishes).
    tree_calls: Vec<Op>,
    /// A tree pass's features: each row's parent's, from the store.
    tree_features: Op,
    /// A tree pass's newest rows to `last` (to project them).
    tree_last: Op,
    /// Per expansion: its newest rows to their store slots.
    tree_store: Vec<Op>,
}

impl EagleHead {
    /// The head's layout.
    pub fn layout(&self) -> EagleLayout {
        self.layout
    }

    /// Ids ranked per row.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Bytes of GPU memory the head's weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.gpu_bytes
    }

    /// GPU memory the head takes in all: weights, KV cache and scratch.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Positions in the head's KV cache.
    pub fn cached(&self) -> usize {
        self.len
    }

    /// Positions of one sequence's KV cache (the target's context; the pool holds
    /// [`EagleHead::kv_pages`] pages of them).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Rolls the head's cache back to its first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Records a head pass over the target's rows `rows` of its last pass (positions
    /// `start_pos..`, each row's next token in `next`): the target's features of those rows, each
    /// with its next token, through the head. Rows and tokens are written by the host, so this
    /// must be the first head pass of a submission. Submitted without a read-back; the last row's
    /// feature f^ is where drafting continues ([`EagleHead::draft`], which first projects and
    /// ranks it: a generation's plain cycles never pay for the projection).
    pub fn run_target_rows(&mut self, rows: &[usize], next: &[u32], start_pos: usize) -> Result<()> {
        let n = rows.len();
        if n == 0 || n > MAX_BATCH || next.len() != n || start_pos > self.len || start_pos + n > self.context
        {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE pass of {n} rows ({} tokens) at {start_pos} of a cache of {} positions",
                next.len(),
                self.len
            )));
        }
        if let Some(&id) = next.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab: self.config.vocab_size });
        }
        let g = &*self.gpu;
        let rows: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        g.queue.write_buffer(&self.state.rows.raw, 0, bytemuck::cast_slice(&rows));
        g.queue.write_buffer(&self.state.tokens.raw, 0, bytemuck::cast_slice(next));
        g.write_step(&self.state.step, n, start_pos);
        let mut enc = g.encoder();
        g.encode(&mut enc, &self.ops.gather, n as u32);
        self.encode_features(&mut enc, n);
        g.submit(enc);
        self.len = start_pos + n;
        self.unprojected = true;
        Ok(())
    }

    /// A pass of `n` rows (its step uniform set), then the last row's f^ copied to `last`.
    fn encode_features(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        let (g, s) = (&*self.gpu, &self.state);
        let row = 4 * self.config.dim as u64;
        g.encode(enc, &self.ops.pass, n as u32);
        enc.copy_buffer_to_buffer(&s.x.raw, (n as u64 - 1) * row, &s.last.raw, 0, row);
    }

    /// [`EagleHead::encode_features`], then that row projected and ranked.
    fn encode_pass(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        self.encode_features(enc, n);
        self.gpu.encode(enc, &self.ops.project, 1);
    }

    /// The last pass's row projected and ranked, if [`EagleHead::run_target_rows`] left it
    /// unprojected (the caller clears `unprojected` once the submission succeeded).
    fn encode_pending_projection(&self, enc: &mut wgpu::CommandEncoder) {
        if self.unprojected {
            self.gpu.encode(enc, &self.ops.project, 1);
        }
    }

    /// The ids ranked at the last row of the latest pass, then `steps` draft steps, each a
    /// one-row pass at the next position whose input is the previous pass's last feature f^ and
    /// most likely id: `[1 + steps][top_k]` ids. One submission (each step's position copied into
    /// the step uniform by the GPU, from a table written before), one read-back.
    pub async fn draft(&mut self, steps: usize) -> Result<Vec<Vec<u32>>> {
        if steps >= MAX_BATCH || self.len + steps > self.context {
            return Err(Error::InvalidArgument(format!(
                "{steps} EAGLE draft steps at {} of {} positions",
                self.len, self.context
            )));
        }
        let g = self.gpu.clone();
        let mut enc = g.encoder();
        self.encode_pending_projection(&mut enc);
        let s = &self.state;
        let (dim, k, word) = (self.config.dim as u64, self.top_k as u64, 4u64);
        let table: Vec<u32> = (0..steps).flat_map(|i| [1, (self.len + i) as u32, 0, 0]).collect();
        if !table.is_empty() {
            g.queue.write_buffer(&s.step_table, 0, bytemuck::cast_slice(&table));
        }
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, 0, k * word);
        for i in 0..steps as u64 {
            // the input: the previous pass's last feature and most likely id
            enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.feature_in().raw, 0, dim * word);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.tokens.raw, 0, word);
            enc.copy_buffer_to_buffer(&s.step_table, i * 16, &s.step, 0, 16);
            self.encode_pass(&mut enc, 1);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, (1 + i) * k * word, k * word);
        }
        let bytes = (1 + steps as u64) * k * word;
        let raw = g.submit_and_read(enc, &s.drafts.raw, 0, bytes).await?;
        self.len += steps;
        self.unprojected = false;
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        Ok(ids.chunks(self.top_k).map(<[u32]>::to_vec).collect())
    }

    /// EAGLE-2's draft tree below `root` (the context's last token), grown on the GPU from the
    /// latest pass's last row (which ranks the root's children): depth by depth, a tree pass
    /// over the best-scoring unexpanded nodes of the newest depth and their ancestors, each fed
    /// its parent's f^ from a store, the newest rows projected and ranked with log-probabilities
    /// (see `shaders/eagle_tree.wgsl`); then the best nodes. One submission, one read-back.
    pub async fn draft_tree(&mut self, root: u32, shape: TreeShape) -> Result<DraftedTree> {
        let (depth, width, max_nodes) = (shape.depth, shape.width, shape.max_nodes);
        if depth == 0
            || depth > MAX_EAGLE_DEPTH
            || width == 0
            || width > MAX_EAGLE_WIDTH.min(self.top_k)
            || max_nodes == 0
            || max_nodes >= MAX_TREE
            || root as usize >= self.config.vocab_size
        {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE draft tree {depth} deep, {width} wide, of {max_nodes} nodes (at most \
                 {MAX_EAGLE_DEPTH}, {} and {}) below token {root}",
                MAX_EAGLE_WIDTH.min(self.top_k),
                MAX_TREE - 1
            )));
        }
        let g = self.gpu.clone();
        let mut enc = g.encoder();
        self.encode_pending_projection(&mut enc);
        let s = &self.state;
        let room = self.context.saturating_sub(self.len).min(MAX_TREE);
        let (verify, draft_pass) = shape.costs.unwrap_or(([0.0; MAX_TREE], 0.0));
        let params = |mode: EagleTreeMode, depth: usize, slot0: usize| EagleTreeParams {
            mode: mode.word(),
            root,
            start_pos: self.len as u32,
            k: self.top_k as u32,
            width: width as u32,
            depth: depth as u32,
            slot0: slot0 as u32,
            max_nodes: max_nodes as u32,
            room: room as u32,
            use_costs: shape.costs.is_some() as u32,
            calibration: shape.calibration,
            draft_pass,
            verify,
        };
        // call 0 starts (and picks depth 1's nodes to expand when deeper ones are wanted); call e
        // takes expansion e's ranks (its nodes in slots 1 + (e - 1) W..) and picks depth e + 1's;
        // the last call also finishes
        let expansions = depth - 1;
        let next_depth = |e: usize| if e < expansions { e + 1 } else { 0 };
        let mode = |e: usize| EagleTreeMode { expand: e > 0, finish: e == expansions };
        let write =
            |i: usize, p: EagleTreeParams| g.queue.write_buffer(&s.tree_params[i], 0, bytemuck::bytes_of(&p));
        write(0, params(mode(0), next_depth(0), 0));
        for e in 1..=expansions {
            write(e, params(mode(e), next_depth(e), 1 + (e - 1) * MAX_EAGLE_WIDTH));
        }
        let (dim, word) = (self.config.dim as u64 * 4, 4u64);
        enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.store.raw, 0, dim);
        g.encode(&mut enc, &self.ops.tree_calls[..1], 1);
        for e in 1..=expansions {
            let out = |at: u64, to: &wgpu::Buffer, words: u64, enc: &mut wgpu::CommandEncoder| {
                enc.copy_buffer_to_buffer(&s.tree_out.raw, at * word, to, 0, words * word);
            };
            out(EAGLE_TREE_STEP, &s.step, 4 + MAX_TREE as u64, &mut enc);
            out(EAGLE_TREE_MANY, &s.many, 4, &mut enc);
            out(EAGLE_TREE_SLOTS, &s.tree_rows.raw, MAX_TREE as u64, &mut enc);
            out(EAGLE_TREE_NEWEST, &s.tree_newest.raw, MAX_EAGLE_WIDTH as u64, &mut enc);
            out(EAGLE_TREE_TOKENS, &s.tokens.raw, MAX_TREE as u64, &mut enc);
            // grids for the most rows this pass can have; the kernels stop at the pass's own
            let rows = (width * e).min(room) as u32;
            g.encode(&mut enc, std::slice::from_ref(&self.ops.tree_features), rows);
            g.encode(&mut enc, &self.ops.pass, rows);
            g.encode(&mut enc, std::slice::from_ref(&self.ops.tree_last), width as u32);
            g.encode(&mut enc, std::slice::from_ref(&self.ops.tree_store[e - 1]), width as u32);
            g.encode(&mut enc, &self.ops.project_many, width as u32);
            g.encode(&mut enc, &self.ops.tree_calls[e..e + 1], 1);
        }
        let at = EAGLE_TREE_RESULT * word;
        let bytes = (EAGLE_TREE_OUT as u64 - EAGLE_TREE_RESULT) * word;
        let raw = g.submit_and_read(enc, &s.tree_out.raw, at, bytes).await?;
        self.unprojected = false;
        let r: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let n = (r[0] as usize).min(MAX_TREE - 1);
        // (32 token words, then 32 parent words)
        let tokens = r[3..3 + n].to_vec();
        let parents =
            r[3 + MAX_TREE..3 + MAX_TREE + n].iter().map(|&p| Some(p as usize).filter(|&p| p < n)).collect();
        Ok(DraftedTree { tokens, parents, predicted: f32::from_bits(r[1]), passes: r[2] as usize })
    }

    /// A head pass over the rows of several sequences of the target's last pass, as
    /// [`EagleHead::run_target_rows`] runs one sequence's: each row the target's feature of its
    /// row and its next token, each sequence's keys and values in its pages of the head's pool
    /// ([`EagleHead::set_kv_pages`]; the caller owns which pages hold which sequence's
    /// positions). Each sequence's last row is projected and ranked in the same submission (its
    /// first draft: [`EagleHead::first_drafts`] reads them); its chain goes on from that row
    /// ([`EagleHead::draft_pages`], naming it). Submitted without a read-back. A row's f^ and
    /// ranks are the same, bit for bit, as in a pass of its sequence alone (batch-invariant
    /// kernels, a row reads only its keys). The one-sequence cache is gone afterwards (its first
    /// positions may have been written).
    pub fn run_pages(&mut self, seqs: &[HeadRows<'_>]) -> Result<()> {
        let m = seqs.len();
        self.ranked = 0;
        if m == 0 {
            return Ok(());
        }
        if let Some(s) = seqs.iter().find(|s| s.rows.len() != s.next.len()) {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE pass over several sequences: {} rows with {} next tokens",
                s.rows.len(),
                s.next.len()
            )));
        }
        let paged: Vec<SeqRows> = (seqs.iter())
            .map(|s| SeqRows {
                pages: s.pages,
                start_pos: s.start_pos,
                tokens: s.next,
                tree: None,
                logits: 0,
            })
            .collect();
        let PagedStep { step, table, tokens: next, .. } = paged_step(&paged, self.context, self.kv_pages)?;
        if let Some(&id) = next.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab: self.config.vocab_size });
        }
        let rows: Vec<u32> = seqs.iter().flat_map(|s| s.rows.iter().copied()).collect();
        if let Some(r) = rows.iter().find(|&&r| r as usize >= MAX_BATCH) {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE pass reads the target's row {r} of {MAX_BATCH}"
            )));
        }
        // (each sequence's last row of the pass)
        let picks: Vec<u32> = (seqs.iter())
            .scan(0, |end, s| {
                *end += s.rows.len();
                Some(*end as u32 - 1)
            })
            .collect();
        let g = self.gpu.clone();
        let s = &self.state;
        g.queue.write_buffer(&s.rows.raw, 0, bytemuck::cast_slice(&rows));
        g.queue.write_buffer(&s.tokens.raw, 0, bytemuck::cast_slice(&next));
        g.queue.write_buffer(&s.step, 0, bytemuck::bytes_of(&step));
        g.queue.write_buffer(&s.pages.raw, 0, bytemuck::cast_slice(&table));
        g.queue.write_buffer(&s.picks.raw, 0, bytemuck::cast_slice(&picks));
        g.queue.write_buffer(&s.batch, 0, &bytemuck::bytes_of(&Step::chain(m, 0))[..16]);
        let (k, word) = (self.top_k as u64, 4u64);
        let mut enc = g.encoder();
        g.encode(&mut enc, &self.ops.gather, next.len() as u32);
        g.encode(&mut enc, &self.ops.pass, next.len() as u32);
        g.encode(&mut enc, std::slice::from_ref(&self.ops.batch_last), m as u32);
        g.encode(&mut enc, &self.ops.project_batch, m as u32);
        // (the ranks, then their log-probabilities, kept in `firsts`)
        let bytes = m as u64 * k * word;
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.firsts.raw, 0, bytes);
        enc.copy_buffer_to_buffer(&s.logp.raw, 0, &s.firsts.raw, PROJECTED as u64 * k * word, bytes);
        g.submit(enc);
        self.len = 0;
        self.unprojected = false;
        self.ranked = m;
        Ok(())
    }

    /// The first drafts of the sequences of the latest [`EagleHead::run_pages`] pass, one per
    /// sequence in its order (waiting for that pass; none if it ranked none). The one-sequence
    /// passes and [`EagleHead::draft_pages`] leave them; the next `run_pages` replaces them.
    pub async fn first_drafts(&self) -> Result<Vec<Ranked>> {
        let (m, k) = (self.ranked, self.top_k);
        if m == 0 {
            return Ok(Vec::new());
        }
        let words = (PROJECTED * k) as u64 * 4;
        let raw = self.gpu.submit_and_read(self.gpu.encoder(), &self.state.firsts.raw, 0, 2 * words).await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        Ok((0..m).map(|i| Ranked::read(&words, i * k, (PROJECTED + i) * k, k)).collect())
    }

    /// The chains of several sequences, each from its last row of the latest
    /// [`EagleHead::run_pages`] pass: that row's ranks (x1, [`HeadChain::first`]), then each
    /// further step is a pass of one row per sequence still drafting (at its next position, fed
    /// its previous f^ and most likely id), as [`EagleHead::draft`] drafts one sequence's.
    /// `[sequence][drafts]`: each step's ranks, its ids most likely first (the chain's token,
    /// then its siblings') and the head's log-probability of the first (the first step's is
    /// [`HeadChain::first`]). One submission (every step's rows laid out before it), one
    /// read-back; none where every chain is its first draft. The draft steps' keys and values go
    /// to the sequences' pages past `past`.
    pub async fn draft_pages(&mut self, seqs: &[HeadChain<'_>]) -> Result<Vec<Vec<Ranked>>> {
        let m = seqs.len();
        if m == 0 {
            return Ok(Vec::new());
        }
        let k = self.top_k;
        if m > PROJECTED
            || (seqs.iter()).any(|s| {
                !(1..=MAX_EAGLE_DEPTH).contains(&s.drafts) || s.row >= MAX_BATCH || s.first.ids.len() != k
            })
        {
            return Err(Error::InvalidArgument(format!(
                "EAGLE chains of {m} sequences (at most {PROJECTED}), each 1..={MAX_EAGLE_DEPTH} \
                 drafts from a row of the last pass and its {k} ranked ids"
            )));
        }
        if let Some(&id) =
            seqs.iter().flat_map(|s| &s.first.ids).find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::TokenOutOfRange { id, vocab: self.config.vocab_size });
        }
        // the longest chains first: step j's rows are the first `wanting(j)` sequences, whose
        // features and ids are then the first rows of `last` and `top`
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].drafts));
        let depth = seqs[order[0]].drafts;
        if depth == 1 {
            return Ok(seqs.iter().map(|s| vec![s.first.clone()]).collect());
        }
        let wanting = |j: usize| order.iter().take_while(|&&i| seqs[i].drafts > j).count();
        // the table: step j's (1..depth) Step at (j - 1) * size, projection j's rows at proj0 + 16 j
        let size = std::mem::size_of::<Step>();
        let proj0 = MAX_EAGLE_DEPTH * size;
        let mut table = vec![0u8; proj0 + 16 * depth];
        let mut pages = Vec::new();
        for j in 1..depth {
            let rows: Vec<SeqRows> = (order[..wanting(j)].iter())
                .map(|&i| SeqRows {
                    pages: seqs[i].pages,
                    start_pos: seqs[i].past + j - 1,
                    tokens: &[0],
                    tree: None,
                    logits: 0,
                })
                .collect();
            let PagedStep { step, table: table_j, .. } = paged_step(&rows, self.context, self.kv_pages)?;
            table[(j - 1) * size..j * size].copy_from_slice(bytemuck::bytes_of(&step));
            // (each step's sequences lead the first's: its page table serves them all)
            if j == 1 {
                pages = table_j;
            }
        }
        for j in 0..depth {
            let rows = Step::chain(wanting(j), 0);
            table[proj0 + 16 * j..proj0 + 16 * (j + 1)].copy_from_slice(&bytemuck::bytes_of(&rows)[..16]);
        }
        let g = self.gpu.clone();
        let s = &self.state;
        let picks: Vec<u32> = order.iter().map(|&i| seqs[i].row as u32).collect();
        let x1: Vec<u32> = order.iter().map(|&i| seqs[i].first.ids[0]).collect();
        g.queue.write_buffer(&s.picks.raw, 0, bytemuck::cast_slice(&picks));
        g.queue.write_buffer(&s.tokens.raw, 0, bytemuck::cast_slice(&x1));
        g.queue.write_buffer(&s.batch_table, 0, &table);
        if !pages.is_empty() {
            g.queue.write_buffer(&s.pages.raw, 0, bytemuck::cast_slice(&pages));
        }
        let (dim, k, word) = (self.config.dim as u64 * 4, self.top_k as u64, 4u64);
        // (a step's ids in `drafts`, then their log-probabilities)
        let half = MAX_BATCH as u64 * k * word;
        let stride = 2 * half;
        let mut enc = g.encoder();
        let project = |enc: &mut wgpu::CommandEncoder, j: usize, rows: usize| {
            enc.copy_buffer_to_buffer(&s.batch_table, (proj0 + 16 * j) as u64, &s.batch, 0, 16);
            g.encode(enc, &self.ops.project_batch, rows as u32);
            let (at, bytes) = (j as u64 * stride, rows as u64 * k * word);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, at, bytes);
            enc.copy_buffer_to_buffer(&s.logp.raw, 0, &s.drafts.raw, at + half, bytes);
        };
        enc.copy_buffer_to_buffer(&s.batch_table, proj0 as u64, &s.batch, 0, 16);
        g.encode(&mut enc, std::slice::from_ref(&self.ops.batch_last), m as u32);
        for j in 1..depth {
            let rows = wanting(j);
            // the input: each sequence's previous f^ and most likely id (x1's written above)
            enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.feature_in().raw, 0, rows as u64 * dim);
            for r in (0..rows as u64).filter(|_| j > 1) {
                enc.copy_buffer_to_buffer(&s.top.raw, r * k * word, &s.tokens.raw, r * word, word);
            }
            enc.copy_buffer_to_buffer(&s.batch_table, ((j - 1) * size) as u64, &s.step, 0, size as u64);
            g.encode(&mut enc, &self.ops.pass, rows as u32);
            enc.copy_buffer_to_buffer(&s.x.raw, 0, &s.last.raw, 0, rows as u64 * dim);
            project(&mut enc, j, rows);
        }
        // (steps 1.. of `drafts`)
        let raw = g.submit_and_read(enc, &s.drafts.raw, stride, (depth as u64 - 1) * stride).await?;
        self.len = 0;
        self.unprojected = false;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let k = self.top_k;
        let mut ranked = vec![Vec::new(); m];
        for (r, &i) in order.iter().enumerate() {
            // (step j's ids of row r, then its log-probabilities MAX_BATCH k words on)
            let at = |j: usize| {
                let ids = (2 * (j - 1) * MAX_BATCH + r) * k;
                Ranked::read(&words, ids, ids + MAX_BATCH * k, k)
            };
            ranked[i] = std::iter::once(seqs[i].first.clone()).chain((1..seqs[i].drafts).map(at)).collect();
        }
        Ok(ranked)
    }

    /// The head's output features of the latest pass's first `n` rows, `[n, dim]` (tests compare
    /// them with a reference).
    pub async fn features(&self, n: usize) -> Result<Vec<f32>> {
        let bytes = (n.min(MAX_BATCH) * self.config.dim * 4) as u64;
        let raw = self.gpu.submit_and_read(self.gpu.encoder(), &self.state.x.raw, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// The top ids of the latest pass's last row, `[top_k]` (projected now if still pending).
    pub async fn top_ids(&mut self) -> Result<Vec<u32>> {
        let bytes = (self.top_k * 4) as u64;
        let mut enc = self.gpu.encoder();
        self.encode_pending_projection(&mut enc);
        let raw = self.gpu.submit_and_read(enc, &self.state.top.raw, 0, bytes).await?;
        self.unprojected = false;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }
}
