//! The verify side of a cycle, chosen once per generation from the sampling parameters and the
//! draft:
//!
//! ```text
//!   greedy                     -> Greedy      argmax ids read back; with a draft model on the
//!                                             target's GPU, resident cycles (super::cycle)
//!   sampling, top-k <= 16      -> GpuSampled  draws and acceptance on the GPU, a few words read
//!                                             back; resident cycles with a draft model there
//!                                             (super::sampled)
//!   sampling, a wider top-k    -> Host        logits rows read back, the rules of super::verify
//!
//!   cycle : a resident cycle (K draft steps + verify pass + acceptance, one read-back)
//!   chain : host-given drafts [id_last, x1..xK] (with the draft's q when it sampled)
//!   tree  : a token tree (greedy, or the multi-candidate rule), its accepted path kept
//! ```
//!
//! Each returns what the pass decided ([`Checked`]): the loop commits it the same way whichever
//! verifier ran.

use super::cycle::{CycleAt, CycleOutcome, GreedyCycle};
use super::draft::DraftModel;
use super::generate::CycleTrace;
use super::sampled::{gpu_samples, SampledCycle};
use super::tree::TokenTree;
use super::verify::{verify_greedy, verify_sampled, Dist, NextKind, Verdict};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{Rng, SamplingParams};

/// How a generation's verify passes run (see the module's doc).
pub(crate) enum Verifier {
    /// Greedy; the resident cycle's buffers when a draft model on the target's GPU may use them.
    Greedy(Option<GreedyCycle>),
    /// Sampling the GPU draws from (with the draft model's side when it may run resident cycles).
    GpuSampled(Box<SampledCycle>),
    /// Sampling the host draws from.
    Host(SamplingParams),
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
        } else if gpu_samples(params) {
            Verifier::GpuSampled(Box::new(SampledCycle::new(target, model, params)?))
        } else {
            Verifier::Host(*params)
        })
    }

    /// Whether cycles with the draft model may run GPU-resident ([`Verifier::cycle`]).
    pub fn resident(&self) -> bool {
        match self {
            Verifier::Greedy(cycle) => cycle.is_some(),
            Verifier::GpuSampled(sc) => sc.has_draft(),
            Verifier::Host(_) => false,
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
    /// speculative sampling against the draft's `q` (one-hot when the draft gave none: drawn on
    /// the GPU where it draws).
    pub async fn chain(
        &self,
        target: &mut Model,
        id_last: u32,
        xs: Vec<u32>,
        q: Option<Vec<Dist>>,
        n_past: usize,
        rng: &mut Rng,
    ) -> Result<Checked> {
        let params = match self {
            Verifier::GpuSampled(sc) if q.is_none() => {
                let out = sc.check(target, id_last, &xs, n_past).await?;
                return Ok(Checked::from_outcome(id_last, out, true));
            }
            Verifier::GpuSampled(sc) => *sc.params(),
            Verifier::Host(params) => *params,
            Verifier::Greedy(_) => SamplingParams::greedy(),
        };
        let mut batch = Vec::with_capacity(xs.len() + 1);
        batch.push(id_last);
        batch.extend_from_slice(&xs);
        let verdict = if params.is_greedy() {
            let ids = target.forward_argmax(&batch, n_past).await?;
            verify_greedy(&xs, &ids)?
        } else {
            let logits = target.forward(&batch, n_past).await?;
            let p = distributions(&logits, target.config.vocab_size, &params, n_past)?;
            let q: Vec<Dist> = match q {
                Some(q) if q.len() >= xs.len() => q.into_iter().take(xs.len()).collect(),
                _ => xs.iter().map(|&x| Dist::one_hot(x)).collect(),
            };
            verify_sampled(&xs, &q, &p, rng)?
        };
        let k = xs.len();
        let rows = (0..=verdict.accepted).collect();
        let trace = CycleTrace::chain(id_last, &xs, verdict.accepted);
        Ok(Checked { xs, verdict, drafted: k, depth: k, rows, trace, drew_on_gpu: false })
    }

    /// One tree pass over `tree` at `n_past`, the greedy or multi-candidate rule down the tree
    /// (drawn on the GPU where it draws), and the accepted path kept in the target's cache.
    pub async fn tree(
        &self,
        target: &mut Model,
        tree: &TokenTree,
        n_past: usize,
        rng: &mut Rng,
    ) -> Result<Checked> {
        let ancestors = tree.ancestors();
        let (v, drew_on_gpu) = match self {
            Verifier::Greedy(_) => {
                let ids = target.forward_tree_argmax(tree.tokens(), &ancestors, n_past).await?;
                (tree.verify_greedy(&ids)?, false)
            }
            Verifier::GpuSampled(sc) => (sc.check_tree(target, tree, n_past).await?, true),
            Verifier::Host(params) => {
                let logits = target.forward_tree(tree.tokens(), &ancestors, n_past).await?;
                let p = distributions(&logits, target.config.vocab_size, params, n_past)?;
                (tree.verify_sampled(&p, rng)?, false)
            }
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

/// The target's sampling distribution of every row of `logits` (`[rows, vocab]`, a pass at
/// `n_past`); a non-finite logit is an error naming it.
fn distributions(logits: &[f32], vocab: usize, params: &SamplingParams, n_past: usize) -> Result<Vec<Dist>> {
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(Error::NonFinite(format!(
            "logit {} of row {} at position {n_past} is {}",
            i % vocab,
            i / vocab,
            logits[i]
        )));
    }
    Ok(logits.chunks_exact(vocab).map(|row| Dist::from_logits(row, params)).collect())
}
