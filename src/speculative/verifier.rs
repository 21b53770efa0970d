//! The verify side of a cycle, chosen once per generation from the sampling parameters and the
//! draft:
//!
//! ```text
//!   greedy     -> Greedy      argmax ids read back; with a draft model on the target's GPU,
//!                             resident cycles (super::cycle)
//!   sampling   -> GpuSampled  draws and acceptance on the GPU, a few words read back; resident
//!                             cycles with a draft model there (super::sampled)
//!
//!   cycle : a resident cycle (K draft steps + verify pass + acceptance, one read-back)
//!   chain : host-given drafts [id_last, x1..xK]
//!   tree  : a token tree (greedy, or the multi-candidate rule), its accepted path kept
//! ```
//!
//! Each returns what the pass decided ([`Checked`]): the loop commits it the same way whichever
//! verifier ran.

use super::cycle::{CycleAt, CycleOutcome, GreedyCycle};
use super::draft::DraftModel;
use super::generate::CycleTrace;
use super::sampled::SampledCycle;
use super::tree::TokenTree;
use super::verify::{verify_greedy, NextKind, Verdict};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::SamplingParams;

/// How a generation's verify passes run (see the module's doc).
pub(crate) enum Verifier {
    /// Greedy; the resident cycle's buffers when a draft model on the target's GPU may use them.
    Greedy(Option<GreedyCycle>),
    /// Sampling, drawn on the GPU (with the draft model's side when it may run resident cycles).
    GpuSampled(Box<SampledCycle>),
}

/// What one verify pass decided.
pub(crate) struct Checked {
    /// The drafted tokens whose first `verdict.accepted` are kept (a tree's accepted path).
    pub xs: Vec<u32>,
    pub verdict: Verdict,
    /// Draft tokens the pass verified.
    pub drafted: usize,
    /// The longest run of drafts it could have accepted.
    pub depth: usize,
    /// The rows of the pass that hold the kept positions (id_last and the accepted drafts): the
    /// last one's logits gave `verdict.next`.
    pub rows: Vec<usize>,
    /// The pass's tokens as a tree and its accepted path.
    pub trace: CycleTrace,
    /// Whether the GPU drew the pass's samples (a few words read back, not logits rows).
    pub drew_on_gpu: bool,
}

impl Checked {
    /// A chain's decision from a GPU verdict.
    pub fn from_outcome(id_last: u32, out: CycleOutcome, drew_on_gpu: bool) -> Checked {
        let k = out.drafts.len();
        let kind = if out.accepted == k { NextKind::Bonus } else { NextKind::Recovered };
        let verdict = Verdict { accepted: out.accepted, next: out.next, kind };
        let rows = (0..=out.accepted).collect();
        let trace = CycleTrace::chain(id_last, &out.drafts, out.accepted);
        Checked { xs: out.drafts, verdict, drafted: k, depth: k, rows, trace, drew_on_gpu }
    }
}

impl Verifier {
    /// The verifier for `params`; `resident` is the draft model that may run GPU-resident cycles
    /// (used only when it lives on the target's GPU).
    pub fn new(target: &Model, resident: Option<&DraftModel>, params: &SamplingParams) -> Result<Verifier> {
        let model = resident.map(|d| d.model()).filter(|m| std::sync::Arc::ptr_eq(m.gpu(), target.gpu()));
        Ok(if params.is_greedy() {
            Verifier::Greedy(model.map(|_| GreedyCycle::new(target)))
        } else {
            Verifier::GpuSampled(Box::new(SampledCycle::new(target, model, params)?))
        })
    }

    /// Whether cycles with the draft model may run GPU-resident ([`Verifier::cycle`]).
    pub fn resident(&self) -> bool {
        match self {
            Verifier::Greedy(cycle) => cycle.is_some(),
            Verifier::GpuSampled(sc) => sc.has_draft(),
        }
    }

    /// A GPU-resident cycle at `at` (the drafts, the target's verify pass and the acceptance in
    /// one submission); and whether the GPU drew (sampling).
    pub async fn cycle(&self, at: CycleAt<'_>) -> Result<(CycleOutcome, bool)> {
        match self {
            Verifier::Greedy(Some(cycle)) => Ok((cycle.run(at).await?, false)),
            Verifier::GpuSampled(sc) if sc.has_draft() => Ok((sc.run(at).await?, true)),
            _ => Err(Error::InvalidArgument("a resident cycle without its buffers".into())),
        }
    }

    /// One target pass over `[id_last, xs..]` at `n_past` and the chain's rule: greedy, or
    /// drafts kept while the GPU's draws are them.
    pub async fn chain(
        &self,
        target: &mut Model,
        id_last: u32,
        xs: Vec<u32>,
        n_past: usize,
    ) -> Result<Checked> {
        if let Verifier::GpuSampled(sc) = self {
            let out = sc.check(target, id_last, &xs, n_past).await?;
            return Ok(Checked::from_outcome(id_last, out, true));
        }
        let mut batch = Vec::with_capacity(xs.len() + 1);
        batch.push(id_last);
        batch.extend_from_slice(&xs);
        let ids = target.forward_argmax(&batch, n_past).await?;
        let verdict = verify_greedy(&xs, &ids)?;
        let k = xs.len();
        let rows = (0..=verdict.accepted).collect();
        let trace = CycleTrace::chain(id_last, &xs, verdict.accepted);
        Ok(Checked { xs, verdict, drafted: k, depth: k, rows, trace, drew_on_gpu: false })
    }

    /// One tree pass over `tree` at `n_past`, the greedy or multi-candidate rule down the tree
    /// (drawn on the GPU), and the accepted path kept in the target's cache.
    pub async fn tree(&self, target: &mut Model, tree: &TokenTree, n_past: usize) -> Result<Checked> {
        let ancestors = tree.ancestors();
        let (v, drew_on_gpu) = match self {
            Verifier::Greedy(_) => {
                let ids = target.forward_tree_argmax(tree.tokens(), &ancestors, n_past).await?;
                (tree.verify_greedy(&ids)?, false)
            }
            Verifier::GpuSampled(sc) => (sc.check_tree(target, tree, n_past).await?, true),
        };
        target.keep_path(n_past, &v.path)?;
        let xs: Vec<u32> = v.path[1..].iter().map(|&i| tree.tokens()[i]).collect();
        let leaf = v.path.last().is_some_and(|&l| tree.children(l).next().is_none());
        let kind = if leaf { NextKind::Bonus } else { NextKind::Recovered };
        let verdict = Verdict { accepted: xs.len(), next: v.next, kind };
        let trace = CycleTrace {
            tokens: tree.tokens().to_vec(),
            parents: tree.parents().to_vec(),
            accepted: v.path.clone(),
            texts: Vec::new(),
        };
        let (drafted, depth) = (tree.len() - 1, tree.max_depth());
        Ok(Checked { xs, verdict, drafted, depth, rows: v.path, trace, drew_on_gpu })
    }
}
