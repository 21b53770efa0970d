//! The transformer on the GPU: weights, a preallocated run state and KV cache, and one
//! straight-line forward pass recorded once as an op list and replayed for every call.

use std::sync::Arc;

use super::checkpoint::Precision;
use super::config::Config;
use super::weights::Weights;
use crate::error::{Error, Result};
use crate::gpu::{
    Clock, Gpu, GpuBuffer, KeepParams, MatmulOut, Op, OpShape, Step, KV_PAGE, MAX_TOP_K, MAX_TREE, PASS_ROWS,
};
use bytemuck::Zeroable;

mod build;
use build::{kv_words, record_forward};
pub(crate) use build::{rope_table, Block};

/// The most rows one forward pass takes (a verify pass of K drafts + 1, or the rows of several
/// sequences: [`Model::forward_pages`]).
pub const MAX_BATCH: usize = crate::gpu::PASS_ROWS;

/// The most passes of one model that one submission may record with [`Model::record`].
pub const MAX_PASSES: usize = MAX_BATCH + 1;

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// The longest sequence, in positions; `None` = min(model context, 4096).
    pub context: Option<usize>,
    /// Pages of [`KV_PAGE`] positions in the KV cache's pool, which the sequences of passes over
    /// several ([`Model::forward_pages`]) share; `None` = one `context`'s worth.
    pub kv_pages: Option<usize>,
    /// Precision the weights are kept in on the GPU.
    pub precision: Precision,
    /// Largest buffer one weight matrix chunk may take; `None` = the adapter's max storage binding.
    /// Matrices larger than this are split by rows (tests lower it to exercise the split).
    pub max_chunk_bytes: Option<u64>,
    /// The most GPU memory the model may take (weights, KV cache and scratch, computed before
    /// anything is allocated); `None` = only the adapter's limits. WebGPU does not tell how much
    /// memory a device has: a budget is how a front end keeps a model from exhausting it.
    pub max_memory: Option<u64>,
    /// The most bytes of a model file read at once: weights stream from the file to the GPU in
    /// batches of rows of about this size, so loading holds this much, not the model, in memory
    /// (what keeps the browser's wasm memory bounded). At least one 8-row batch is read.
    pub read_bytes: u64,
    /// Shape facts only ([`Model::shapes`], `wgspec bench --roofline --shape-only`): the weight
    /// buffers are allocated but nothing is read into them (norms and biases are), so the model
    /// records every op of its passes in seconds whatever its size; its passes then compute
    /// nothing meaningful. Off by default.
    pub skip_weight_data: bool,
}

/// [`LoadOptions::read_bytes`] by default.
pub const DEFAULT_READ_BYTES: u64 = 8 << 20;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            context: None,
            kv_pages: None,
            precision: Precision::Auto,
            max_chunk_bytes: None,
            max_memory: None,
            read_bytes: DEFAULT_READ_BYTES,
            skip_weight_data: false,
        }
    }
}

/// What a model needs on the GPU ([`Model::plan`]).
#[derive(Clone, Copy, Debug)]
pub struct MemoryBill {
    /// Bytes in all: weights, KV cache, scratch.
    pub total: u64,
    /// The longest sequence, in positions.
    pub context: usize,
    /// Pages of [`KV_PAGE`] positions in the KV cache's pool.
    pub kv_pages: usize,
    /// Bytes the weights take in the checkpoint's files.
    pub file_weight_bytes: u64,
}

/// Activations and caches, each allocated once for [`MAX_BATCH`] rows.
struct RunState {
    step: wgpu::Buffer, // uniform Step: [n, start_pos, tree, paged, ancestors[PASS_ROWS], rows[PASS_ROWS, 4]]
    step_table: wgpu::Buffer, // [MAX_PASSES, 4] u32: (n, start_pos, 0, 0) of each recorded pass
    keep: wgpu::Buffer, // uniform KeepParams: the rows of a tree pass to keep
    tokens: GpuBuffer<u32>, // [MAX_BATCH]
    x: GpuBuffer<f32>,  // [MAX_BATCH, dim] residual stream
    xb: GpuBuffer<f32>, // [MAX_BATCH, dim] normed input of a sub-block
    q: GpuBuffer<f32>,  // [MAX_BATCH, q_dim]
    att: GpuBuffer<f32>, // [MAX_BATCH, q_dim] attention output
    scores: GpuBuffer<f32>, // attention scratch: [MAX_BATCH, n_heads, context] scores, or
    // [MAX_BATCH, n_heads, chunks, head_dim + 2] (split attention)
    hb: GpuBuffer<f32>,                 // [MAX_BATCH, ffn_dim] silu(gate) * up
    qkv: Option<GpuBuffer<f32>>, // [MAX_BATCH, q_dim + 2 kv_dim] raw q|k|v (models that norm each head)
    post: Option<GpuBuffer<f32>>, // [MAX_BATCH, dim] a sub-block's output before its post-norm (Gemma)
    local_rope: Option<GpuBuffer<f32>>, // [context, rope_dim / 2, 2] the local layers' RoPE (Gemma)
    logits: GpuBuffer<f32>,      // [MAX_BATCH, vocab]
    argmax: GpuBuffer<u32>,      // [MAX_BATCH]
    // (a paged pass's output over the rows that want logits, [`Model::encode_pages`])
    out_step: wgpu::Buffer, // uniform Step: the places of the [m] rows that want logits
    out_rows: GpuBuffer<u32>, // [MAX_BATCH] their rows of the pass
    x_out: GpuBuffer<f32>,  // [MAX_BATCH, dim] their residual rows
    xb_out: GpuBuffer<f32>, // [MAX_BATCH, dim] their rows of xb (x times output_norm)
    kv_cache: Vec<GpuBuffer<u32>>, // per layer [kv_pages * KV_PAGE, 2 kv_dim]: each cache row's k,
    // then v, as f16 pairs ([.., kv_dim] words) or f32 bits: a pool of pages (one sequence's
    // passes use its first `context` rows as positions)
    pages: GpuBuffer<u32>, // [MAX_BATCH, context / KV_PAGE] a paged pass's page table
    kv_f16: bool,
    cos_sin: GpuBuffer<f32>, // [context, rope_dim / 2, 2]
    /// (after how many layers, [MAX_BATCH, taps * dim]) the residual stream's feature taps
    /// ([`Model::set_feature_taps`]): row r holds each tap's copy of row r side by side.
    taps: Option<(Vec<usize>, GpuBuffer<f32>)>,
}

/// One op of a forward pass, timed alone (see [`Model::profile`]).
#[derive(Clone, Copy, Debug)]
pub struct OpProfile {
    pub kernel: crate::gpu::Kernel,
    pub seconds: f64,
    /// Bytes it moves and flops it computes (from the op's [`crate::gpu::Cost`]).
    pub bytes: u64,
    pub flops: u64,
}

/// A model on the GPU with its KV cache. `forward` appends positions; `truncate` rolls back.
pub struct Model {
    pub config: Config,
    gpu: Arc<Gpu>,
    /// Kept alive for the bind groups that reference them.
    weights: Weights,
    state: RunState,
    /// The whole forward pass up to the logits.
    forward_ops: Vec<Op>,
    /// How many of `forward_ops` come before the output projection (a prefill runs those).
    body_ops: usize,
    /// Dispatches of one layer.
    layer_ops: usize,
    /// Argmax of every logits row.
    argmax_ops: Vec<Op>,
    /// A paged pass's output when some rows want no logits: the rows that do gathered
    /// (`out_rows`), their logits and argmax under `out_step` ([`Model::encode_pages`]).
    out_ops: Vec<Op>,
    out_argmax_ops: Vec<Op>,
    /// ([`Model::forward_top_k`]) k, the k most likely ids of every row `[MAX_BATCH, k]`, and
    /// the op ranking them; made on first use.
    top_k: Option<(usize, GpuBuffer<u32>, Vec<Op>)>,
    /// Per layer: keeps a tree pass's accepted path in the KV cache ([`Model::keep_path`],
    /// [`Model::keep_paths_in_pages`]).
    keep_ops: Vec<Op>,
    /// The longest sequence, in positions.
    context: usize,
    /// Pages of [`KV_PAGE`] positions in the KV cache's pool.
    kv_pages: usize,
    /// Bytes the weights take in the checkpoint's files.
    file_weight_bytes: u64,
    /// GPU memory planned before loading: weights, KV cache, scratch.
    memory_bytes: u64,
    /// Positions currently held in the KV cache.
    len: usize,
}

/// Checks a tree pass's `ancestors` (see [`Model::forward_tree`]): at most [`MAX_TREE`] nodes,
/// node 0 the root, and every other node r its parent's ancestors plus r, the parent before r.
fn check_tree(ancestors: &[u32], n: usize) -> Result<()> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("a token tree {why}")));
    if ancestors.len() != n || n > MAX_TREE {
        return bad(format!(
            "of {n} tokens needs as many ancestor sets, at most {MAX_TREE}, got {}",
            ancestors.len()
        ));
    }
    for (r, &a) in ancestors.iter().enumerate() {
        let own = 1u32 << r;
        let parent = (a & (own - 1)).checked_ilog2().map(|p| p as usize);
        let ok = match parent {
            None => r == 0 && a == 1,
            Some(p) => a & !(own | (own - 1)) == 0 && a & own != 0 && a == ancestors[p] | own,
        };
        if !ok {
            return bad(format!("node {r} has ancestors {a:#b}: not a tree rooted at node 0"));
        }
    }
    Ok(())
}

impl Model {
    /// Makes every pass copy its residual stream after each of `after_layers` layers (0: the
    /// embeddings) into the rows of [`Model::feature_taps`], the taps side by side in that order:
    /// an EAGLE-3 head's features. An empty list removes the taps. Other taps than the current
    /// ones get a new buffer: a head loaded before keeps reading the old one, so load heads after
    /// setting their taps.
    pub fn set_feature_taps(&mut self, after_layers: &[usize]) -> Result<()> {
        if let Some(&l) = after_layers.iter().find(|&&l| l > self.config.n_layers) {
            return Err(Error::InvalidArgument(format!(
                "a feature tap after {l} layers of a model of {}",
                self.config.n_layers
            )));
        }
        let current = self.state.taps.as_ref().map_or(&[][..], |(l, _)| l.as_slice());
        if current == after_layers {
            return Ok(());
        }
        let g = &*self.gpu;
        self.state.taps = match after_layers {
            [] => None,
            _ => {
                let width = after_layers.len() * self.config.dim;
                Some((after_layers.to_vec(), GpuBuffer::<f32>::zeros(g, "feature taps", MAX_BATCH * width)))
            }
        };
        g.take_error()?;
        (self.forward_ops, self.body_ops, self.layer_ops) =
            record_forward(g, &self.config, &self.weights, &self.state, self.context);
        // (a kernel first compiled here that failed; in a browser such an error arrives later,
        // by the next read-back)
        g.take_error()
    }

    /// The feature taps of the last pass (`[MAX_BATCH, taps * dim]`) and the layer counts they
    /// follow, when [`Model::set_feature_taps`] set some.
    pub fn feature_taps(&self) -> Option<(&[usize], &GpuBuffer<f32>)> {
        self.state.taps.as_ref().map(|(l, b)| (l.as_slice(), b))
    }

    /// Bytes of GPU memory the weights take (quantized blocks as stored, plus F32 norms and biases).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.gpu_bytes()
    }

    /// GPU memory the model takes: weights, KV cache and scratch (what a
    /// [`LoadOptions::max_memory`] budget is checked against).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Bytes the same weights take in the checkpoint's files (the GPU keeps them within ~1% of
    /// this unless loaded with [`Precision::F32`]).
    pub fn file_weight_bytes(&self) -> u64 {
        self.file_weight_bytes
    }

    /// Whether the KV cache holds f16 values (as llama.cpp's does; under [`Precision::Auto`]),
    /// else f32 ([`Precision::F32`], the exact reference path).
    pub fn kv_f16(&self) -> bool {
        self.state.kv_f16
    }

    /// The GPU this model runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Positions currently in the KV cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the KV cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// KV cache positions allocated (the longest sequence this model instance can hold).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Pages of [`KV_PAGE`] positions in the KV cache's pool ([`Model::forward_pages`]).
    pub fn kv_pages(&self) -> usize {
        self.kv_pages
    }

    /// Bytes one page of the pool takes (every layer's).
    pub fn kv_page_bytes(&self) -> u64 {
        (self.config.n_layers * KV_PAGE * kv_words(&self.config, self.state.kv_f16) * 4) as u64
    }

    /// The most pages a pool may have: each layer's cache is one binding.
    pub fn max_kv_pages(&self) -> usize {
        let page = (KV_PAGE * kv_words(&self.config, self.state.kv_f16) * 4) as u64;
        (self.gpu.max_binding_bytes() / page.max(1)).min(1 << 24) as usize
    }

    /// Makes the KV cache a pool of `pages` pages (at least one context's worth, at most
    /// [`Model::max_kv_pages`]): new buffers, what was cached is gone (the cache is emptied), and
    /// the passes that bind them are recorded again. [`Model::memory_bytes`] follows.
    pub fn set_kv_pages(&mut self, pages: usize) -> Result<()> {
        if pages * KV_PAGE < self.context || pages > self.max_kv_pages() {
            return Err(Error::InvalidArgument(format!(
                "a KV cache pool of {pages} pages of {KV_PAGE} positions: it takes {} to {}",
                self.context.div_ceil(KV_PAGE),
                self.max_kv_pages()
            )));
        }
        let g = &*self.gpu;
        let words = pages * KV_PAGE * kv_words(&self.config, self.state.kv_f16);
        let kv: Vec<GpuBuffer<u32>> = (0..self.config.n_layers)
            .map(|i| GpuBuffer::<u32>::zeros(g, &format!("kv_cache {i}"), words))
            .collect();
        // (an allocation the device could not make fails here, the old pool kept)
        g.take_error()?;
        let old = self.kv_page_bytes() * self.kv_pages as u64;
        self.state.kv_cache = kv;
        self.kv_pages = pages;
        self.memory_bytes = self.memory_bytes - old + self.kv_page_bytes() * pages as u64;
        self.len = 0;
        (self.forward_ops, self.body_ops, self.layer_ops) =
            record_forward(g, &self.config, &self.weights, &self.state, self.context);
        let width = kv_words(&self.config, self.state.kv_f16) as u32;
        self.keep_ops = self
            .state
            .kv_cache
            .iter()
            .map(|kv| g.kv_keep(&self.state.step, &self.state.keep, kv, width))
            .collect();
        g.take_error()
    }

    /// Rolls the KV cache back to its first `len` positions (no copies: later positions are overwritten).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn check(&self, tokens: &[u32], start_pos: usize) -> Result<()> {
        self.check_rows(tokens.len(), start_pos)?;
        self.check_ids(tokens)
    }

    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            Some(&id) => Err(Error::TokenOutOfRange { id, vocab: self.config.vocab_size }),
            None => Ok(()),
        }
    }

    fn check_rows(&self, n: usize, start_pos: usize) -> Result<()> {
        if n == 0 || n > MAX_BATCH {
            return Err(Error::InvalidArgument(format!(
                "a forward pass takes 1..={MAX_BATCH} tokens, got {n}"
            )));
        }
        if start_pos > self.len {
            return Err(Error::InvalidArgument(format!(
                "start position {start_pos} is past the {} cached positions",
                self.len
            )));
        }
        if start_pos + n > self.context {
            return Err(Error::ContextOverflow { needed: start_pos + n, context: self.context });
        }
        Ok(())
    }

    /// Records a pass over `n` rows at `start_pos`, argmax of every row included, into `enc`:
    /// several passes (of this model and others) then go to the GPU in one submission. Rows
    /// `..host.len()` of the pass's tokens are written from `host`; the other rows must be copied
    /// into [`Model::tokens_buffer`] by earlier commands of `enc` (a draft's own argmax, the
    /// drafts a verify pass checks). Host writes land before the submission runs, so only the
    /// first pass of this model in a submission may take host tokens. `slot` (< [`MAX_PASSES`])
    /// holds the pass's `(n, start_pos)` and must differ between the passes of one submission.
    pub fn record(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        slot: usize,
        host: &[u32],
        n: usize,
        start_pos: usize,
    ) -> Result<()> {
        self.check_rows(n, start_pos)?;
        self.check_ids(host)?;
        if host.len() > n || slot >= MAX_PASSES {
            return Err(Error::InvalidArgument(format!(
                "a recorded pass of {n} rows with {} host tokens in slot {slot} (of {MAX_PASSES})",
                host.len()
            )));
        }
        let g = &*self.gpu;
        let entry = [n as u32, start_pos as u32, 0, 0];
        g.queue.write_buffer(&self.state.step_table, slot as u64 * 16, bytemuck::cast_slice(&entry));
        if !host.is_empty() {
            g.queue.write_buffer(&self.state.tokens.raw, 0, bytemuck::cast_slice(host));
        }
        // all 16 bytes: the entry's third word clears the tree flag a host-written tree pass set
        enc.copy_buffer_to_buffer(&self.state.step_table, slot as u64 * 16, &self.state.step, 0, 16);
        g.encode(enc, &self.forward_ops, n as u32);
        g.encode(enc, &self.argmax_ops, n as u32);
        self.len = start_pos + n;
        Ok(())
    }

    /// Times every op of a forward pass of `n` rows at the cache's current length, each alone,
    /// `reps` times, on `clock` (the roofline report of `wgspec bench --roofline`). Leaves the
    /// cache's contents undefined past its length (the timed ops write rows there).
    pub async fn profile(&mut self, n: usize, reps: usize, clock: Clock) -> Result<Vec<OpProfile>> {
        let start_pos = self.len;
        let g = self.timing_pass(n)?;
        let mut out = Vec::with_capacity(self.forward_ops.len() + 1);
        for op in self.forward_ops.iter().chain(&self.argmax_ops) {
            let seconds = g.time_ops(std::slice::from_ref(op), n as u32, reps, clock).await?;
            let (bytes, flops) = op.cost().at(n as u64, (start_pos + n - 1) as u64);
            out.push(OpProfile { kernel: op.kernel(), seconds, bytes, flops });
        }
        Ok(out)
    }

    /// The shape facts of every dispatch of a pass of `n` rows after `past` cached positions,
    /// its argmax included ([`Gpu::shape`]), in order; nothing is run (the cache need not hold
    /// them).
    pub fn shapes(&self, n: usize, past: usize) -> Vec<OpShape> {
        let pos = past + n.max(1) - 1;
        (self.forward_ops.iter().chain(&self.argmax_ops))
            .filter_map(|op| self.gpu.shape(op, n, pos))
            .collect()
    }

    /// Dispatches of the forward pass's layer with the most.
    pub fn dispatches_per_layer(&self) -> usize {
        self.layer_ops
    }

    /// Seconds of one whole forward pass of `n` rows at the cache's current length (up to the
    /// logits: no argmax, no read-back), `reps` times in one submission, on `clock`.
    pub async fn time_forward(&mut self, n: usize, reps: usize, clock: Clock) -> Result<f64> {
        let g = self.timing_pass(n)?;
        g.time_ops(&self.forward_ops, n as u32, reps, clock).await
    }

    /// Sets the pass uniform for a timed pass of `n` rows at the cache's current length.
    fn timing_pass(&self, n: usize) -> Result<Arc<Gpu>> {
        self.check_rows(n, self.len)?;
        self.gpu.write_step(&self.state.step, n, self.len);
        Ok(self.gpu.clone())
    }

    /// The token ids of the pass, `[MAX_BATCH]` (what [`Model::record`] reads).
    pub fn tokens_buffer(&self) -> &GpuBuffer<u32> {
        &self.state.tokens
    }

    /// The logits of every row of the last pass that computed them (not a prefill; a paged
    /// pass's: of its rows that want them, [`Model::encode_pages`]), `[MAX_BATCH, vocab]`.
    pub fn logits_buffer(&self) -> &GpuBuffer<f32> {
        &self.state.logits
    }

    /// The argmax of every row of the last pass that computed it (as [`Model::logits_buffer`]),
    /// `[MAX_BATCH]`.
    pub fn argmax_buffer(&self) -> &GpuBuffer<u32> {
        &self.state.argmax
    }

    /// The residual stream after the last pass, `[MAX_BATCH, dim]`, and the output norm's weight
    /// `[dim]`: the final hidden state of row r is `raw[r] * norm / rms(raw[r])`
    /// ([`Gpu::gather_rows`](crate::gpu::Gpu::gather_rows)), what Medusa and EAGLE heads draft from.
    pub fn hidden_buffers(&self) -> (&GpuBuffer<f32>, &GpuBuffer<f32>) {
        (&self.state.x, &self.weights.output_norm)
    }

    /// Ops gathering this model's embedding rows of `tokens` into `out` (`[n, dim]`) in a pass
    /// of another model, under its `step` (an EAGLE head embeds with its target's table). The
    /// rows as stored: Gemma's √dim is the target's own input scale, which vLLM's EAGLE heads
    /// (sharing the embedding table, not the target's input embedding) do not apply either.
    pub fn embed_ops(&self, step: &wgpu::Buffer, tokens: &GpuBuffer<u32>, out: &GpuBuffer<f32>) -> Vec<Op> {
        self.weights.token_embd.embed(&self.gpu, step, tokens, (out, 1.0), None)
    }

    /// Ops of this model's output projection `y = x . output^T` (`[n, vocab]`, no norm) in a pass
    /// of another model, under its `step` (an EAGLE head's logits).
    pub fn output_ops(
        &self,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        y: &GpuBuffer<f32>,
        out: MatmulOut,
    ) -> Vec<Op> {
        self.weights.output_matrix().matmul(&self.gpu, step, x, None, y, out)
    }

    /// [`Model::output_ops`]' first `first` logits alone (`y: [n, out.ldy]`), each with the bits
    /// the whole projection gives it: an EAGLE-1 head ranking the first ids of the vocabulary.
    pub fn output_first_ops(
        &self,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        y: &GpuBuffer<f32>,
        out: MatmulOut,
        first: usize,
    ) -> Vec<Op> {
        self.weights.output_matrix().matmul_first(&self.gpu, step, (x, None, y), out, first)
    }

    /// The pass uniform `[n, start_pos]` (ops that follow a pass may bind it).
    pub fn step_buffer(&self) -> &wgpu::Buffer {
        &self.state.step
    }

    /// The uniform of the rows with logits of the last paged pass ([`Model::encode_pages`]):
    /// their places (each row's position), row i for the i-th of them; what ops over those
    /// logits bind (a batch's draws).
    pub fn logits_step_buffer(&self) -> &wgpu::Buffer {
        &self.state.out_step
    }

    /// Records a pass over `tokens` at `start_pos` (a token tree when `ancestors` is given, see
    /// [`Model::forward_tree`]), as far as `until` says (the hidden states only, the logits, or
    /// the argmax of every row too).
    fn encode(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        ancestors: Option<&[u32]>,
        until: Until,
    ) -> Result<wgpu::CommandEncoder> {
        self.check(tokens, start_pos)?;
        let g = &*self.gpu;
        match ancestors {
            Some(ancestors) => {
                check_tree(ancestors, tokens.len())?;
                g.write_tree_step(&self.state.step, start_pos, ancestors);
            }
            None => g.write_step(&self.state.step, tokens.len(), start_pos),
        }
        g.queue.write_buffer(&self.state.tokens.raw, 0, bytemuck::cast_slice(tokens));
        let mut enc = g.encoder();
        let ops = match until {
            Until::Hidden => &self.forward_ops[..self.body_ops],
            Until::Logits | Until::Argmax => &self.forward_ops[..],
        };
        g.encode(&mut enc, ops, tokens.len() as u32);
        if until == Until::Argmax {
            g.encode(&mut enc, &self.argmax_ops, tokens.len() as u32);
        }
        self.len = start_pos + tokens.len();
        Ok(enc)
    }

    /// Runs `tokens` at positions `start_pos..` for what they leave behind (their keys and values
    /// in the cache, the hidden states and feature taps of the pass) without the output
    /// projection: a prompt's prefill, a draft catching up, whose logits nobody reads (the
    /// output matrix, up to a fifth of a small model's bytes, is not read). Submitted without a
    /// read-back; a GPU error shows at the next one (or here, if already reported).
    pub fn prefill(&mut self, tokens: &[u32], start_pos: usize) -> Result<()> {
        let enc = self.encode(tokens, start_pos, None, Until::Hidden)?;
        self.gpu.submit(enc);
        self.gpu.take_error()
    }

    /// Waits until the GPU has run everything submitted so far (a 4-byte read-back), surfacing
    /// any error: after [`Model::prefill`]s, so that their time is theirs.
    pub async fn sync(&self) -> Result<()> {
        self.gpu.submit_and_read(self.gpu.encoder(), &self.state.argmax.raw, 0, 4).await.map(|_| ())
    }

    /// Submits `enc` and reads back the logits of its first `rows` rows, `[rows, vocab]`.
    async fn read_logits(&self, enc: wgpu::CommandEncoder, rows: usize) -> Result<Vec<f32>> {
        let bytes = (rows * self.config.vocab_size * 4) as u64;
        let raw = self.gpu.submit_and_read(enc, &self.state.logits.raw, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// Submits `enc` and reads back the argmax of its first `rows` rows.
    async fn read_argmax(&self, enc: wgpu::CommandEncoder, rows: usize) -> Result<Vec<u32>> {
        let raw = self.gpu.submit_and_read(enc, &self.state.argmax.raw, 0, (rows * 4) as u64).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// Runs `tokens` at positions `start_pos..` (at most the cached length: earlier positions are
    /// overwritten) and returns the logits of every row, `[tokens.len(), vocab]` row-major.
    pub async fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        let enc = self.encode(tokens, start_pos, None, Until::Logits)?;
        self.read_logits(enc, tokens.len()).await
    }

    /// As [`Model::forward`], but reads back only the last row's logits, `[vocab]`.
    pub async fn forward_last(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<f32>> {
        let enc = self.encode(tokens, start_pos, None, Until::Logits)?;
        let row = (self.config.vocab_size * 4) as u64;
        let offset = (tokens.len() as u64 - 1) * row;
        let raw = self.gpu.submit_and_read(enc, &self.state.logits.raw, offset, row).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// As [`Model::forward`], but returns only the argmax of every row (computed on the GPU).
    pub async fn forward_argmax(&mut self, tokens: &[u32], start_pos: usize) -> Result<Vec<u32>> {
        let enc = self.encode(tokens, start_pos, None, Until::Argmax)?;
        self.read_argmax(enc, tokens.len()).await
    }

    /// As [`Model::forward_last`], but returns the last row's `k` most likely ids (1..=
    /// [`MAX_TOP_K`]), most likely first (equal logits: lower id first, as the argmax breaks
    /// ties), ranked on the GPU: `k` ids come back instead of a row of logits.
    pub async fn forward_top_k(&mut self, tokens: &[u32], start_pos: usize, k: usize) -> Result<Vec<u32>> {
        if k == 0 || k > MAX_TOP_K {
            return Err(Error::InvalidArgument(format!("ranking 1..={MAX_TOP_K} ids, not {k}")));
        }
        let mut enc = self.encode(tokens, start_pos, None, Until::Logits)?;
        let g = &*self.gpu;
        if self.top_k.as_ref().is_none_or(|(have, _, _)| *have != k) {
            let ids = GpuBuffer::<u32>::zeros(g, "top-k ids", MAX_BATCH * k);
            let ops = g.top_k(&self.state.step, &self.state.logits, (&ids, None), self.config.vocab_size, k);
            self.top_k = Some((k, ids, ops));
        }
        let Some((_, ids, ops)) = self.top_k.as_ref() else {
            return Err(Error::Gpu("the top-k op was not made".into()));
        };
        g.encode(&mut enc, ops, tokens.len() as u32);
        let offset = ((tokens.len() - 1) * k * 4) as u64;
        let raw = g.submit_and_read(enc, &ids.raw, offset, (k * 4) as u64).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// Runs a token tree at `start_pos` in one pass: row r holds node r, `ancestors[r]` its
    /// ancestors as bits (bit j: node j is r or an ancestor of r; node 0 is the root and every
    /// other node's parent comes before it). Node r sits at position start_pos + its depth and
    /// sees the cache before start_pos and its ancestors, so its logits equal those of its
    /// root-to-node path run alone, bit for bit. Its k/v go to cache row start_pos + r until
    /// [`Model::keep_path`] keeps one path. Returns the logits of every node, `[n, vocab]`.
    pub async fn forward_tree(
        &mut self,
        tokens: &[u32],
        ancestors: &[u32],
        start_pos: usize,
    ) -> Result<Vec<f32>> {
        let enc = self.encode(tokens, start_pos, Some(ancestors), Until::Logits)?;
        self.read_logits(enc, tokens.len()).await
    }

    /// Records [`Model::forward_tree`]'s pass up to the logits of every node into a new encoder,
    /// not submitted: ops reading [`Model::logits_buffer`] (a draw from each node's
    /// distribution) follow it in the same submission.
    pub fn tree_encoder(
        &mut self,
        tokens: &[u32],
        ancestors: &[u32],
        start_pos: usize,
    ) -> Result<wgpu::CommandEncoder> {
        self.encode(tokens, start_pos, Some(ancestors), Until::Logits)
    }

    /// As [`Model::forward_tree`], but returns only the argmax of every node.
    pub async fn forward_tree_argmax(
        &mut self,
        tokens: &[u32],
        ancestors: &[u32],
        start_pos: usize,
    ) -> Result<Vec<u32>> {
        let enc = self.encode(tokens, start_pos, Some(ancestors), Until::Argmax)?;
        self.read_argmax(enc, tokens.len()).await
    }

    /// After a tree pass at `start_pos`, keeps the nodes `path` (a root-to-node path: ascending
    /// rows of that pass, starting at the root, 0) as the cache positions start_pos.. and drops
    /// the rest: the cache then holds what running the path as a chain would have left.
    pub fn keep_path(&mut self, start_pos: usize, path: &[usize]) -> Result<()> {
        let ordered = path.first() == Some(&0) && path.windows(2).all(|w| w[0] < w[1]);
        if !ordered || path.len() > MAX_TREE || start_pos + path.last().map_or(0, |&l| l + 1) > self.len {
            return Err(Error::InvalidArgument(format!(
                "a kept path must be ascending rows of the last tree pass from its root, got {path:?}"
            )));
        }
        // (the one-sequence cache: position p in cache row p)
        let pairs = kept_pairs(path, |depth| (start_pos + depth) as u32);
        self.copy_cache_rows(&pairs);
        self.len = start_pos + path.len();
        Ok(())
    }

    /// After a pass over several sequences ([`Model::encode_pages`]) that held token trees, keeps
    /// in each tree's sequence the nodes of its `path` (as [`Model::keep_path`] takes it) as its
    /// positions from the root's on, `(pages, root position, path)` a tree's: its sequence's
    /// pages then hold what running the path as a chain would have left. Submitted, not awaited
    /// (the next pass comes after it).
    pub fn keep_paths_in_pages(&mut self, trees: &[(&[u32], usize, &[usize])]) -> Result<()> {
        let mut pairs = Vec::new();
        for &(pages, root_pos, path) in trees {
            let ordered = path.first() == Some(&0) && path.windows(2).all(|w| w[0] < w[1]);
            let end = root_pos + path.last().map_or(0, |&l| l + 1);
            let bad_page = pages.iter().any(|&p| p as usize >= self.kv_pages);
            if !ordered || path.len() > MAX_TREE || pages.len() * KV_PAGE < end || bad_page {
                return Err(Error::InvalidArgument(format!(
                    "a kept path must be ascending rows of a tree from its root in its pages, got \
                     {path:?} at position {root_pos} of {} pages",
                    pages.len()
                )));
            }
            let row = |depth: usize| {
                let pos = root_pos + depth;
                (pages[pos / KV_PAGE] as usize * KV_PAGE + pos % KV_PAGE) as u32
            };
            pairs.extend(kept_pairs(path, row));
        }
        if pairs.len() > PASS_ROWS {
            return Err(Error::InvalidArgument(format!("{} kept rows, a pass has {PASS_ROWS}", pairs.len())));
        }
        self.copy_cache_rows(&pairs);
        Ok(())
    }

    /// Copies cache rows `(dst, src)` in every layer, in order (none: nothing runs).
    fn copy_cache_rows(&self, pairs: &[(u32, u32)]) {
        if pairs.is_empty() {
            return;
        }
        let mut keep = KeepParams::zeroed();
        keep.count = pairs.len() as u32;
        keep.width = kv_words(&self.config, self.state.kv_f16) as u32;
        for (i, &(dst, src)) in pairs.iter().enumerate() {
            keep.pairs[2 * i..2 * i + 2].copy_from_slice(&[dst, src]);
        }
        let g = &*self.gpu;
        g.queue.write_buffer(&self.state.keep, 0, bytemuck::bytes_of(&keep));
        let mut enc = g.encoder();
        g.encode(&mut enc, &self.keep_ops, 1);
        g.submit(enc);
    }
}

/// The (dst, src) cache rows that keep a tree's accepted `path` (node indices by depth), `row`
/// giving the cache row of the position at the root's plus a depth or an index: the nodes not
/// in their place already.
fn kept_pairs(path: &[usize], row: impl Fn(usize) -> u32) -> Vec<(u32, u32)> {
    (path.iter().enumerate()).filter(|&(d, &node)| node != d).map(|(d, &node)| (row(d), row(node))).collect()
}

/// One sequence's rows in a pass over several ([`Model::forward_pages`]).
#[derive(Clone, Copy, Debug)]
pub struct SeqRows<'a> {
    /// The sequence's pages of the pool in position order (page i holds its positions
    /// `i * KV_PAGE..`), covering `start_pos + tokens.len()` positions at least.
    pub pages: &'a [u32],
    /// The position of its first token here; the cache holds its positions before it.
    pub start_pos: usize,
    /// Its tokens at `start_pos..`.
    pub tokens: &'a [u32],
    /// A token tree in its last rows: `ancestors` of its nodes as [`Model::forward_tree`] takes
    /// them (node 0, the root, at `start_pos + tokens.len() - ancestors.len()`); node i at its
    /// root's position plus its depth, its keys and values at the root's plus i (positions past
    /// the committed ones, in the sequence's pages). None: a chain.
    pub tree: Option<&'a [u32]>,
    /// How many of its last rows want logits (`tokens.len()` at most): a prompt's chunk before
    /// its last token wants none (its rows run for their keys and values), a newest token and
    /// its drafts want theirs. The pass computes the output of these rows only.
    pub logits: usize,
}

/// A paged pass laid out: its [`Step`] (each row's place), its page table, its rows' tokens
/// (ids unchecked) and the rows that want logits, ascending.
pub(crate) struct PagedStep {
    pub step: Step,
    pub table: Vec<u32>,
    pub tokens: Vec<u32>,
    pub out: Vec<u32>,
}

impl PagedStep {
    /// The [`Step`] of the rows that want logits, row i the pass's row `out[i]`: its position
    /// (a chain's row its own start, a tree's node its root's and its ancestor bits), cache row
    /// and page table, for the ops over those rows that read a row's position (a draw keyed by
    /// it). Not for an op that walks a node's ancestors through its first row (attention): the
    /// bits still count from the root's row of the pass.
    fn out_step(&self) -> Step {
        let s = &self.step;
        let mut o = Step::chain(self.out.len(), 0);
        (o.tree, o.paged) = (s.tree, s.paged);
        for (i, &r) in self.out.iter().enumerate() {
            let r = r as usize;
            let [start, first, table, slot] = [0, 1, 2, 3].map(|j| s.rows[4 * r + j]);
            let tree = s.ancestors[r];
            // (a chain's row: its own position, as the first of its rows here)
            let start = if tree == 0 { start + (r as u32 - first) } else { start };
            o.rows[4 * i..4 * i + 4].copy_from_slice(&[start, i as u32, table, slot]);
            o.ancestors[i] = tree;
        }
        o
    }
}

/// Checks the sequences of a paged pass over a cache of `context` positions per sequence in a
/// pool of `pool` pages, and lays out its step. A pass of the target and of an EAGLE head alike
/// (which computes no logits: it ignores `out`).
pub(crate) fn paged_step(seqs: &[SeqRows<'_>], context: usize, pool: usize) -> Result<PagedStep> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("a pass over several sequences {why}")));
    let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    if n == 0 || n > MAX_BATCH {
        return bad(format!("takes 1..={MAX_BATCH} rows, got {n}"));
    }
    let mut step = Step::chain(n, 0);
    step.paged = 1;
    let (mut table, mut tokens, mut out) = (Vec::new(), Vec::with_capacity(n), Vec::new());
    let mut written = Vec::new();
    for s in seqs {
        let end = s.start_pos + s.tokens.len();
        if s.tokens.is_empty() {
            return bad("has a sequence of no rows".into());
        }
        if s.logits > s.tokens.len() {
            return bad(format!("wants the logits of {} of a sequence's {} rows", s.logits, s.tokens.len()));
        }
        if end > context {
            return Err(Error::ContextOverflow { needed: end, context });
        }
        if s.pages.len() * KV_PAGE < end || s.pages.len() > context.div_ceil(KV_PAGE) {
            return bad(format!("has a sequence of {} pages for {end} positions", s.pages.len()));
        }
        if let Some(p) = s.pages.iter().find(|&&p| p as usize >= pool) {
            return bad(format!("names page {p} of a pool of {pool}"));
        }
        let tree = s.tree.unwrap_or(&[]);
        if tree.len() > s.tokens.len() {
            return bad(format!("has a tree of {} nodes in {} rows", tree.len(), s.tokens.len()));
        }
        if !tree.is_empty() {
            check_tree(tree, tree.len())?;
            step.tree = 1;
        }
        let (first, base) = (tokens.len(), table.len());
        // (the tree's root: its row and position)
        let root = s.tokens.len() - tree.len();
        let (root_row, root_pos) = (first + root, s.start_pos + root);
        for pos in s.start_pos..end {
            let slot = s.pages[pos / KV_PAGE] as usize * KV_PAGE + pos % KV_PAGE;
            let r = tokens.len();
            let place = match pos >= root_pos && !tree.is_empty() {
                true => {
                    step.ancestors[r] = tree[pos - root_pos];
                    [root_pos, root_row, base, slot]
                }
                false => [s.start_pos, first, base, slot],
            };
            step.rows[4 * r..4 * r + 4].copy_from_slice(&place.map(|v| v as u32));
            tokens.push(s.tokens[pos - s.start_pos]);
        }
        out.extend((tokens.len() - s.logits..tokens.len()).map(|r| r as u32));
        written.extend_from_slice(&s.pages[s.start_pos / KV_PAGE..end.div_ceil(KV_PAGE)]);
        table.extend_from_slice(s.pages);
    }
    written.sort_unstable();
    if written.windows(2).any(|w| w[0] == w[1]) {
        return bad("writes one page for two sequences".into());
    }
    Ok(PagedStep { step, table, tokens, out })
}

impl Model {
    /// Records a pass over the rows of several sequences (each sequence's rows consecutive, as
    /// `seqs` gives them) into a new encoder, not submitted, up to the logits of the rows that
    /// want them (and their argmax with `argmax`): row i of the logits and argmax buffers is the
    /// i-th such row of the pass (its sequences' [`SeqRows::logits`] last rows, in order); a
    /// pass where none does ends at the hidden states. Each sequence's keys and values go to,
    /// and come from, its pages of the pool; the caller owns the pool (which pages hold which
    /// sequence's positions). A row's logits are the same, bit for bit, as in a pass of its
    /// sequence alone, whatever else shares the pass (the kernels are batch-invariant and a row
    /// reads only its keys). Not to be mixed with the one-sequence passes ([`Model::forward`]
    /// ...), which use the pool's first positions as their own.
    pub fn encode_pages(&mut self, seqs: &[SeqRows<'_>], argmax: bool) -> Result<wgpu::CommandEncoder> {
        let paged = paged_step(seqs, self.context, self.kv_pages)?;
        self.check_ids(&paged.tokens)?;
        let g = &*self.gpu;
        let PagedStep { step, table, tokens, out } = &paged;
        let (s, n, m) = (&self.state, tokens.len(), out.len());
        g.queue.write_buffer(&s.step, 0, bytemuck::bytes_of(step));
        g.queue.write_buffer(&s.out_step, 0, bytemuck::bytes_of(&paged.out_step()));
        g.queue.write_buffer(&s.pages.raw, 0, bytemuck::cast_slice(table));
        g.queue.write_buffer(&s.tokens.raw, 0, bytemuck::cast_slice(tokens));
        let mut enc = g.encoder();
        // (every row: the one-sequence passes' output ops)
        if m == n {
            g.encode(&mut enc, &self.forward_ops, n as u32);
            if argmax {
                g.encode(&mut enc, &self.argmax_ops, n as u32);
            }
            return Ok(enc);
        }
        g.encode(&mut enc, &self.forward_ops[..self.body_ops], n as u32);
        if m > 0 {
            g.queue.write_buffer(&s.out_rows.raw, 0, bytemuck::cast_slice(out));
            g.encode(&mut enc, &self.out_ops, m as u32);
            if argmax {
                g.encode(&mut enc, &self.out_argmax_ops, m as u32);
            }
        }
        Ok(enc)
    }

    /// Runs the rows of several sequences in one pass ([`Model::encode_pages`]) and returns the
    /// logits of the rows that want them, `[rows, vocab]`, in `seqs`' order.
    pub async fn forward_pages(&mut self, seqs: &[SeqRows<'_>]) -> Result<Vec<f32>> {
        let rows = seqs.iter().map(|s| s.logits).sum();
        let enc = self.encode_pages(seqs, false)?;
        if rows == 0 {
            self.gpu.submit(enc);
            return self.sync().await.map(|_| Vec::new());
        }
        self.read_logits(enc, rows).await
    }
}

/// The buffers one transformer block reads and writes in a pass (shapes as in [`RunState`]).
pub(crate) struct BlockIo<'a> {
    pub step: &'a wgpu::Buffer,
    pub x: &'a GpuBuffer<f32>,      // [MAX_BATCH, dim] residual stream
    pub xb: &'a GpuBuffer<f32>,     // [MAX_BATCH, dim] x times the next norm's weight
    pub q: &'a GpuBuffer<f32>,      // [MAX_BATCH, q_dim]
    pub att: &'a GpuBuffer<f32>,    // [MAX_BATCH, q_dim]
    pub scores: &'a GpuBuffer<f32>, // attention scratch (Gpu::attention_scratch_len for MAX_BATCH rows)
    pub hb: &'a GpuBuffer<f32>,     // [MAX_BATCH, ffn_dim]
    /// `[MAX_BATCH, q_dim + 2 kv_dim]`: the q|k|v matmul's raw output, for layers that norm each
    /// q and k head (their weights' `qk_norm`); None where no layer does.
    pub qkv: Option<&'a GpuBuffer<f32>>,
    /// `[MAX_BATCH, dim]`: a sub-block's output before its post-norm, for layers that have them
    /// (Gemma); None where no layer does.
    pub post: Option<&'a GpuBuffer<f32>>,
    pub cos_sin: &'a GpuBuffer<f32>, // [context, rope_dim / 2, 2]
    /// `[MAX_BATCH, pages a sequence's context takes]` the page table of a paged pass.
    pub pages: &'a GpuBuffer<u32>,
    pub context: usize,
    /// The KV cache holds f16 pairs (else f32).
    pub kv_f16: bool,
    /// What q/k/v are projected from instead of (the norm of) x: `[MAX_BATCH, qkv in]`, as it
    /// is (an EAGLE-3 head's normalised [embedding | feature]).
    pub qkv_input: Option<&'a GpuBuffer<f32>>,
    /// The layer's sliding window (Gemma's local layers), or None: every key.
    pub window: Option<usize>,
}

impl BlockIo<'_> {
    /// The layer's attention shape: the model's, with this layer's window.
    pub fn shape(&self, c: &Config) -> crate::gpu::AttentionShape {
        let window = self.window.map_or(0, |w| w.min(u32::MAX as usize) as u32);
        crate::gpu::AttentionShape { window, ..c.attention_shape(self.context, self.kv_f16) }
    }
}

/// How far a pass goes: the hidden states (cache, taps), the logits, or their argmax too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Until {
    Hidden,
    Logits,
    Argmax,
}
