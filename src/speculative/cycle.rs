//! The GPU-resident greedy speculation cycle: the draft model's K steps, the target's verify pass
//! and the greedy acceptance recorded into ONE command submission, with ONE small read-back.
//!
//! ```text
//!   draft step 1 : the unseen context tokens (host)            -> argmax -> drafts[0], next input
//!   draft step i : drafts[i-2] copied into its input (GPU)      -> argmax -> drafts[i-1]
//!   verify       : [id_last (host), drafts[0..K] (GPU copy)]    -> argmax of K + 1 rows
//!   accept       : accept_greedy.wgsl                           -> [a, next, x1..xK]  (read back)
//! ```
//!
//! The tokens equal the CPU-driven cycle's (the same passes, the same kernels, the same rule):
//! only the round trips go. Sampling has its own GPU cycle, which draws on the GPU
//! ([`super::sampled`]).

use super::draft::DraftModel;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuffer, Op};
use crate::model::{Model, MAX_BATCH};

/// Buffers and the acceptance op of the GPU cycle for one target.
pub struct GreedyCycle {
    drafts: GpuBuffer<u32>, // [MAX_BATCH] x1..xK, the draft's argmax ids
    result: GpuBuffer<u32>, // [2 + MAX_BATCH] accepted count, next token, x1..xK
    accept: Op,
}

/// What one GPU-resident cycle produced (greedy here, or sampled: [`super::sampled`]), or a
/// GPU-sampled verify pass of host-given drafts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleOutcome {
    /// The drafted tokens x1..xK.
    pub drafts: Vec<u32>,
    /// How many of them the rule kept.
    pub accepted: usize,
    /// The target's token after the accepted ones (recovered or bonus).
    pub next: u32,
    /// Draft forward passes run (catch-up passes included).
    pub draft_steps: usize,
}

impl GreedyCycle {
    /// The cycle's buffers for `target` (whose argmax and pass uniform the acceptance reads).
    pub fn new(target: &Model) -> GreedyCycle {
        let gpu: &Gpu = target.gpu();
        let drafts = GpuBuffer::<u32>::zeros(gpu, "cycle drafts", MAX_BATCH);
        let result = GpuBuffer::<u32>::zeros(gpu, "cycle result", 2 + MAX_BATCH);
        let accept = gpu.accept_greedy(target.step_buffer(), &drafts, target.argmax_buffer(), &result);
        GreedyCycle { drafts, result, accept }
    }

    /// Drafts up to `at.k` tokens with `at.draft` (greedy) and verifies them with `at.target`
    /// (see [`CycleAt`]). Leaves the target's cache at `n_past + 1 + K` positions (the caller
    /// truncates to what it keeps).
    pub async fn run(&self, mut at: CycleAt<'_>) -> Result<CycleOutcome> {
        let drafts = &self.drafts;
        let draw = |enc: &mut wgpu::CommandEncoder, dm: &Model, i: usize, rows: usize| {
            // x_{i+1}: the argmax of the step's last row
            let word = 4u64;
            enc.copy_buffer_to_buffer(
                &dm.argmax_buffer().raw,
                (rows as u64 - 1) * word,
                &drafts.raw,
                i as u64 * word,
                word,
            );
        };
        let mut rec = at.record(drafts, draw).await?;
        let gpu = at.target.gpu().clone();
        let k = rec.k;
        gpu.encode(&mut rec.enc, std::slice::from_ref(&self.accept), 1);
        let bytes = ((2 + k) * 4) as u64;
        let raw = gpu.submit_and_read(rec.enc, &self.result.raw, 0, bytes).await?;
        let out: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let (accepted, next) = (out[0] as usize, out[1]);
        let drafts = out[2..2 + k].to_vec();
        if accepted > k {
            return Err(Error::Gpu(format!("the GPU accepted {accepted} of {k} drafts")));
        }
        at.commit(&rec.first, &drafts);
        Ok(CycleOutcome { drafts, accepted, next, draft_steps: rec.draft_steps })
    }
}

/// Where a GPU-resident cycle runs: `target`'s cache holds `context[..n_past]` (`context[n_past]`
/// is the last token, not yet run), `draft` (on the same GPU) catches up on the rest, and up to
/// `k` drafts are asked for.
pub struct CycleAt<'a> {
    pub target: &'a mut Model,
    pub draft: &'a mut DraftModel,
    pub context: &'a [u32],
    pub n_past: usize,
    pub k: usize,
}

/// A cycle's passes as [`CycleAt::record`] left them: the encoder (acceptance still to record),
/// the draft's first input, the drafts K and the draft passes.
pub(crate) struct Recorded {
    pub enc: wgpu::CommandEncoder,
    pub first: Vec<u32>,
    pub k: usize,
    pub draft_steps: usize,
}

impl CycleAt<'_> {
    /// Records the draft's catch-up and its K steps (`draw` putting each step's token into
    /// `drafts`, see [`record_draft_steps`]) and the target's verify pass of K + 1 rows.
    pub(crate) async fn record(
        &mut self,
        drafts: &GpuBuffer<u32>,
        draw: impl FnMut(&mut wgpu::CommandEncoder, &Model, usize, usize),
    ) -> Result<Recorded> {
        let n_past = self.n_past;
        let id_last = *self
            .context
            .get(n_past)
            .ok_or_else(|| Error::InvalidArgument(format!("no token at position {n_past} to verify from")))?;
        let (first, k, mut draft_steps) = self.draft.catch_up(self.context, self.k).await?;
        let k = k.min(MAX_BATCH - 1);
        let mut enc = self.target.gpu().encoder();
        draft_steps +=
            record_draft_steps(&mut enc, self.draft.model_mut(), &first, k, drafts, self.target, draw)?;
        self.target.record(&mut enc, 0, &[id_last], k + 1, n_past)?;
        Ok(Recorded { enc, first, k, draft_steps })
    }

    /// Tells the draft which of its steps' tokens were drafted (its cache keeps them).
    pub(crate) fn commit(&mut self, first: &[u32], drafts: &[u32]) {
        if !drafts.is_empty() {
            self.draft.commit_drafts(first, drafts);
        }
    }
}

/// Records a draft model's `k` steps into `enc`, then copies the drafts x1..xK into `target`'s
/// token buffer after its first row (id_last: the verify pass takes it from the host). Step 0
/// runs `first` (the draft's unseen context, see [`DraftModel`]'s catch-up); step i > 0 reads
/// x_i from `drafts[i - 1]`; after each step of `rows` rows, `draw(enc, draft, i, rows)` records
/// what puts x_{i+1} into `drafts[i]` (an argmax, or a draw on the GPU). Returns the passes
/// recorded.
pub(crate) fn record_draft_steps(
    enc: &mut wgpu::CommandEncoder,
    dm: &mut Model,
    first: &[u32],
    k: usize,
    drafts: &GpuBuffer<u32>,
    target: &Model,
    mut draw: impl FnMut(&mut wgpu::CommandEncoder, &Model, usize, usize),
) -> Result<usize> {
    let word = 4u64;
    let mut pos = dm.len();
    for i in 0..k {
        let rows = if i == 0 { first.len() } else { 1 };
        if i > 0 {
            // this step's input is the previous step's draft
            enc.copy_buffer_to_buffer(&drafts.raw, (i as u64 - 1) * word, &dm.tokens_buffer().raw, 0, word);
        }
        dm.record(enc, i, if i == 0 { first } else { &[] }, rows, pos)?;
        draw(enc, dm, i, rows);
        pos += rows;
    }
    if k > 0 {
        // the verify pass reads x1..xK after id_last
        enc.copy_buffer_to_buffer(&drafts.raw, 0, &target.tokens_buffer().raw, word, k as u64 * word);
    }
    Ok(k)
}
