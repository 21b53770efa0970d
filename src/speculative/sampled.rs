//! Sampling on the GPU: a verify pass (or a plain decoding step) whose draws and speculative
//! sampling's acceptance run on the GPU, so that a cycle reads back a few words, not logits rows.
//!
//! ```text
//!   draft step i : (a draft model) its pass, then sample.wgsl draws x_i from its last row q_i
//!                  with the noise of the target's row at that position; x_i is copied into the
//!                  next step's input
//!   verify       : [id_last (host), x1..xK] -> sample.wgsl per row: a draw y_i from p_i
//!   accept       : accept_sampled.wgsl: x_i kept while y_i = x_i -> [a, next, x1..xK, status]
//!                  (read back)
//! ```
//!
//! Draws use the Gumbel-max trick with noise hashed from the generation's seed, the op's stream,
//! the row's position and the token: the draw from p at a position is the same in a plain step,
//! a chain's verify row and a tree's node. Drafts are kept while the draw from p is the draft
//! (`shaders/accept_sampled.wgsl`), and the draw is emitted where it is not: every token is the one
//! plain sampled decoding with the same seed gives, whatever K and whatever drafted, so the
//! output has the target's sampling distribution (tested by frequencies against exact
//! marginals too). Deterministic drafts (n-gram, heads, host-given chains and trees) are kept
//! with probability p(x) (the ratio rule against a one-hot q). A draft model draws its chain
//! with the same noise as the target's rows at the same positions ([`DraftDraws`], in the
//! resident cycle and in its CPU-driven steps alike): a drawn x_i is kept with the probability
//! that the two Gumbel-max draws agree, at least (1 - TV) / (1 + TV) where the ratio rule of
//! [`verify_sampled`](super::verify_sampled) keeps 1 - TV (TV the total variation between p
//! and q; the Qwen2.5-Coder pair accepted as many either way, BENCHMARKS.md), and its tokens no
//! longer depend on K: a request's output is the same alone, in a batch, whatever the load.
//! Every sampling configuration draws this way (any temperature, top-k, min-p and top-p:
//! `sample.wgsl` cuts the top-k and the min-p itself); the host's rules of [`super::verify`] stay as tested references.
//!
//! ```text
//!   token tree   : the tree pass -> sample.wgsl: a draw y_i from p_i at every node i (at its
//!                  depth's position: the noise of the verify rows) (read back: n + 1 words,
//!                  the rows' draws and the status) -> follow the child holding y_i
//! ```
//!
//! Following the child that holds a draw from p is the multi-candidate rule of
//! [`TokenTree::verify_sampled`] in one step: that rule's "child c1? else c2? ..., else a draw
//! from what is left of p" emits each child c with probability p(c) and any other token t with
//! probability p(t), exactly as one draw from p does.

use super::cycle::{CycleAt, CycleOutcome};
use super::tree::{TokenTree, TreeVerdict};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuffer, Op, SampleConfig, SampleSeed};
use crate::model::{Model, MAX_BATCH};
use crate::sampling::SamplingParams;

/// The noise stream of the generation's draws (a sample op's Gumbel noise is hashed with 2s):
/// the target's rows (plain steps, chains and trees alike) and a draft model's, which draws with
/// the target's noise at each position.
const STREAM_VERIFY: u32 = 2;

/// The draws of the target's rows under `params` (plain steps, chains and trees, one request or
/// one request's rows of a batched pass: the same noise stream, so the same token at the same
/// position), and a draft model's (the same noise: its draw is the target's where the two
/// distributions put it on the same token).
pub(crate) fn target_draws(params: &SamplingParams, vocab: usize) -> SampleConfig {
    SampleConfig {
        vocab,
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p_offset: params.min_p_offset(),
        last_only: None,
        stream: STREAM_VERIFY,
    }
}

/// A draft model's draws on its GPU: the ops drawing from its pass's last row with the target's
/// noise (the draws of [`target_draws`], keyed by the
/// uniform `seed`), and the draw. Their non-finite flag is their own, and nothing reads it: a
/// draft's non-finite logits fail nothing, as its argmax does not (the draw is a token of the
/// vocabulary all the same, which the target's row keeps or not).
pub(crate) struct DraftDraws {
    sample: Vec<Op>,
    pub draw: GpuBuffer<u32>, // [1] the draw from the pass's last row
}

impl DraftDraws {
    /// The draws of `dm`'s passes under `params` (sampling), keyed by `seed` (a
    /// uniform [`SampleSeed`] on `dm`'s GPU).
    pub fn new(dm: &Model, seed: &wgpu::Buffer, params: &SamplingParams) -> DraftDraws {
        let g: &Gpu = dm.gpu();
        let draw = GpuBuffer::<u32>::zeros(g, "draft draw", 1);
        let cfg = SampleConfig { last_only: Some(0), ..target_draws(params, dm.config.vocab_size) };
        let status = GpuBuffer::<u32>::zeros(g, "draft draw status", 1);
        let sample = g.sample(dm.step_buffer(), seed, dm.logits_buffer(), (&draw, &status), cfg);
        DraftDraws { sample, draw }
    }

    /// Records the draw from the last of the `rows` rows of `dm`'s pass just recorded.
    pub fn encode(&self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, rows: usize) {
        gpu.encode(enc, &self.sample, rows as u32);
    }
}

/// Buffers and ops of sampled verification on the GPU for one target (and at most one draft model).
pub struct SampledCycle {
    params: SamplingParams,
    vocab: usize,
    seed: wgpu::Buffer,          // uniform SampleSeed: the generation's seed
    drafts: GpuBuffer<u32>,      // [MAX_BATCH] x1..xK
    status: GpuBuffer<u32>,      // [1] 1: a non-finite logit
    result: GpuBuffer<u32>,      // [2 + MAX_BATCH + 1] a, next, x1..xK, status
    draws: Vec<Op>,              // a draw from every row of the pass (a chain's or a tree's)
    tree_result: GpuBuffer<u32>, // [MAX_BATCH] a tree's rows' draws, then [1] the status
    accept: Op,                  // drafts kept where the row's draw is the draft
    draft: Option<DraftDraws>,
    samples: GpuBuffer<u32>, // [MAX_BATCH] the draw of each verify (or tree) row
}

impl SampledCycle {
    /// The cycle's buffers for `target`, and for drawing from `draft`'s steps when given (on the
    /// same GPU). `params` must sample (not greedy); its seed keys the noise of every draw
    /// ([`SampledCycle::reseed`] changes it).
    pub fn new(target: &Model, draft: Option<&Model>, params: &SamplingParams) -> Result<SampledCycle> {
        if params.is_greedy() {
            return Err(Error::InvalidArgument("a sampled cycle of greedy decoding".into()));
        }
        let g: &Gpu = target.gpu();
        let vocab = target.config.vocab_size;
        let seed = g.uniform("sample seed", bytemuck::bytes_of(&SampleSeed::new(params.seed)));
        let words = |label: &str, len: usize| GpuBuffer::<u32>::zeros(g, label, len.max(1));
        let drafts = words("sampled drafts", MAX_BATCH);
        let samples = words("verify draws", MAX_BATCH);
        let status = words("sample status", 1);
        let result = words("sampled result", 2 + MAX_BATCH + 1);
        let step = target.step_buffer();
        let draws =
            g.sample(step, &seed, target.logits_buffer(), (&samples, &status), target_draws(params, vocab));
        let tree_result = words("tree draws", MAX_BATCH + 1);
        let accept = g.accept_sampled(step, &drafts, &samples, &status, &result);
        let draft = draft.map(|dm| DraftDraws::new(dm, &seed, params));
        Ok(SampledCycle {
            params: *params,
            vocab,
            seed,
            drafts,
            status,
            result,
            draws,
            tree_result,
            accept,
            draft,
            samples,
        })
    }

    /// Whether the cycle draws a draft model's steps too ([`SampledCycle::run`]).
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// The sampling parameters the cycle draws with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Keys the noise of the next cycles' draws by `seed` instead of the parameters' (the same
    /// cycle repeated then draws afresh).
    pub fn reseed(&self, gpu: &Gpu, seed: u64) {
        gpu.queue.write_buffer(&self.seed, 0, bytemuck::bytes_of(&SampleSeed::new(seed)));
    }

    /// Verifies host-given drafts `xs` (a deterministic draft, or a draft model's drawn with the
    /// target's noise; none for a plain decoding step) after `id_last` at `n_past`, drawing on the GPU: one submission, one
    /// read-back of `2 + K + 1` words. Leaves the target's cache at `n_past + 1 + K` positions.
    pub async fn check(
        &self,
        target: &mut Model,
        id_last: u32,
        xs: &[u32],
        n_past: usize,
    ) -> Result<CycleOutcome> {
        let k = xs.len();
        if k >= MAX_BATCH {
            return Err(Error::InvalidArgument(format!(
                "{k} drafts in one verify pass (at most {})",
                MAX_BATCH - 1
            )));
        }
        let gpu = target.gpu().clone();
        self.begin(&gpu);
        gpu.queue.write_buffer(&self.drafts.raw, 0, bytemuck::cast_slice(xs));
        let mut batch = Vec::with_capacity(k + 1);
        batch.push(id_last);
        batch.extend_from_slice(xs);
        let mut enc = gpu.encoder();
        target.record(&mut enc, 0, &batch, k + 1, n_past)?;
        self.encode_verify(&gpu, &mut enc, k);
        self.finish(&gpu, enc, k, 0, n_past).await
    }

    /// Drafts up to `at.k` tokens with `at.draft`, each drawn on the GPU from its sampling
    /// distribution with the target's noise at its position, and verifies them with `at.target`
    /// (see [`CycleAt`]): one submission, one read-back. Leaves the target's cache at
    /// `n_past + 1 + K` positions.
    pub async fn run(&self, mut at: CycleAt<'_>) -> Result<CycleOutcome> {
        let side = self
            .draft
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("a sampled cycle built without a draft model".into()))?;
        let gpu = at.target.gpu().clone();
        self.begin(&gpu);
        let drafts = &self.drafts;
        let draw = |enc: &mut wgpu::CommandEncoder, _: &Model, i: usize, rows: usize| {
            // x_{i+1}: a draw from the step's last row q_{i+1}, with the noise the verify pass's
            // row at its position draws with
            side.encode(&gpu, enc, rows);
            enc.copy_buffer_to_buffer(&side.draw.raw, 0, &drafts.raw, i as u64 * 4, 4);
        };
        let mut rec = at.record(drafts, draw).await?;
        self.encode_verify(&gpu, &mut rec.enc, rec.k);
        let out = self.finish(&gpu, rec.enc, rec.k, rec.draft_steps, at.n_past).await?;
        at.commit(&rec.first, &out.drafts);
        Ok(out)
    }

    /// Verifies a token tree of deterministic drafts (its root the last token, at `n_past`) with
    /// the multi-candidate rule, drawing on the GPU (see the module's doc): one submission, one
    /// read-back of `n + 1` words for `n` nodes. Leaves the target's cache holding every node
    /// ([`Model::keep_path`] keeps the verdict's path).
    pub async fn check_tree(
        &self,
        target: &mut Model,
        tree: &TokenTree,
        n_past: usize,
    ) -> Result<TreeVerdict> {
        let n = tree.len();
        let gpu = target.gpu().clone();
        let mut enc = target.tree_encoder(tree.tokens(), &tree.ancestors(), n_past)?;
        self.begin(&gpu);
        gpu.encode(&mut enc, &self.draws, n as u32);
        let bytes = (n * 4) as u64;
        enc.copy_buffer_to_buffer(&self.samples.raw, 0, &self.tree_result.raw, 0, bytes);
        enc.copy_buffer_to_buffer(&self.status.raw, 0, &self.tree_result.raw, bytes, 4);
        let raw = gpu.submit_and_read(enc, &self.tree_result.raw, 0, bytes + 4).await?;
        let out: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let short = || Error::Gpu("a short tree read-back".into());
        let status = *out.get(n).ok_or_else(short)?;
        if let Some(row) = status.checked_sub(1) {
            return Err(Error::NonFinite(format!(
                "a logit of node {row} of a token tree (at position {n_past}) is not finite"
            )));
        }
        let draws = &out[..n];
        if let Some(&bad) = draws.iter().find(|&&d| d as usize >= self.vocab) {
            return Err(Error::Gpu(format!("the GPU drew token {bad} from a vocabulary of {}", self.vocab)));
        }
        tree.verify_greedy(draws)
    }

    /// A new cycle: the status cleared.
    fn begin(&self, gpu: &Gpu) {
        gpu.queue.write_buffer(&self.status.raw, 0, bytemuck::bytes_of(&0u32));
    }

    /// The verify pass's draws and the acceptance (a pass of K + 1 rows).
    fn encode_verify(&self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, k: usize) {
        let n = (k + 1) as u32;
        gpu.encode(enc, &self.draws, n);
        gpu.encode(enc, std::slice::from_ref(&self.accept), n);
    }

    /// Submits, reads back `[a, next, x1..xK]` and the status word.
    async fn finish(
        &self,
        gpu: &Gpu,
        enc: wgpu::CommandEncoder,
        k: usize,
        draft_steps: usize,
        n_past: usize,
    ) -> Result<CycleOutcome> {
        let raw = gpu.submit_and_read(enc, &self.result.raw, 0, self.result.len as u64 * 4).await?;
        let out: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let status = *out.get(2 + MAX_BATCH).ok_or_else(|| Error::Gpu("a short sampled read-back".into()))?;
        if let Some(row) = status.checked_sub(1) {
            return Err(Error::NonFinite(format!(
                "a logit of row {row} of a pass of the sampled cycle (at position {n_past}) is not finite"
            )));
        }
        let (accepted, next) = (out[0] as usize, out[1]);
        if accepted > k || next as usize >= self.vocab {
            return Err(Error::Gpu(format!("the GPU accepted {accepted} of {k} drafts, next token {next}")));
        }
        let drafts = out.get(2..2 + k).ok_or_else(|| Error::Gpu("a short sampled read-back".into()))?;
        Ok(CycleOutcome { drafts: drafts.to_vec(), accepted, next, draft_steps })
    }
}
