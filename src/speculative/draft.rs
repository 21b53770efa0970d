//! Drafts: cheap proposers of the next K tokens, behind one trait.
//!
//! - [`DraftModel`]: a smaller model with the same tokenizer and its own KV cache.
//! - [`NGram`]: prompt lookup — match the last n tokens against the prompt and the generated
//!   text and propose what followed the latest match (no second model).
//! - [`Ensemble`]: the draft model's chain and the n-gram continuations in one token tree.
//! - [`Medusa`](super::medusa::Medusa) and [`Eagle`](super::eagle::Eagle): heads that read the
//!   target's hidden states, which the loop hands them after every target pass
//!   ([`Draft::target_pass`]).
//!
//! The trait takes the whole token context and returns a [`Proposal`]: a chain (with, for
//! sampling, the draft distributions `q`) or a token tree. The loop takes a [`Drafter`]: whether
//! the draft is a draft model (whose cycles may run GPU-resident) is said by its caller.

use std::future::Future;
use std::pin::Pin;

use super::spec::DraftKind;
use super::tree::TokenTree;
use super::verify::Dist;
use crate::error::{Error, Result};
use crate::gpu::{MAX_TOP_K, MAX_TREE};
use crate::model::{Config, Model, MAX_BATCH};
use crate::sampling::{Rng, SamplingParams};
use crate::tokenizer::Tokenizer;

/// A boxed future that need not be `Send` (wasm futures are not).
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What a draft proposes for the positions after the context: a chain, or a token tree.
#[derive(Clone, Debug)]
pub enum Proposal {
    /// `tokens` x1..xk' (k' <= the budget's depth, possibly none), in order.
    Chain {
        tokens: Vec<u32>,
        /// `[k']` distributions the tokens were drawn from (after temperature / top-k / top-p);
        /// `None` when the proposals are deterministic (one-hot q: n-gram, greedy draft model).
        q: Option<Vec<Dist>>,
        /// Draft forward passes this proposal ran (0 for drafts without a model).
        steps: usize,
    },
    /// Several continuations as a token tree rooted at the context's last token (never a chain:
    /// [`Proposal::tree`] turns one into [`Proposal::Chain`]), verified in one tree pass. Its
    /// drafts are deterministic (sampling verifies them with the multi-candidate rule).
    Tree {
        tree: TokenTree,
        /// Whether the draft chose the tree's nodes from [`DraftBudget::costs`] itself (EAGLE's
        /// scores); else, under an adaptive K, the loop keeps the part of it the measured costs
        /// and acceptance make worth verifying ([`super::Schedule::size_tree`]).
        sized: bool,
        steps: usize,
    },
}

impl Default for Proposal {
    fn default() -> Self {
        Proposal::Chain { tokens: Vec::new(), q: None, steps: 0 }
    }
}

impl Proposal {
    /// Deterministic `tokens`, proposed in `steps` draft passes.
    pub fn chain(tokens: Vec<u32>, steps: usize) -> Proposal {
        Proposal::Chain { tokens, q: None, steps }
    }

    /// `tree` proposed in `steps` draft passes: a [`Proposal::Chain`] of its tokens below the root
    /// when that is all it is.
    pub fn tree(tree: TokenTree, sized: bool, steps: usize) -> Proposal {
        match tree.is_chain() {
            true => Proposal::chain(tree.tokens()[1..].to_vec(), steps),
            false => Proposal::Tree { tree, sized, steps },
        }
    }

    /// The draft forward passes the proposal ran.
    pub fn steps(&self) -> usize {
        match self {
            Proposal::Chain { steps, .. } | Proposal::Tree { steps, .. } => *steps,
        }
    }

    /// The chain, or the tree's first branch (each node's first child from the root).
    pub fn tokens(&self) -> Vec<u32> {
        match self {
            Proposal::Chain { tokens, .. } => tokens.clone(),
            Proposal::Tree { tree, .. } => tree.first_branch(),
        }
    }

    /// The tree, when the proposal is one.
    pub fn as_tree(&self) -> Option<&TokenTree> {
        match self {
            Proposal::Tree { tree, .. } => Some(tree),
            Proposal::Chain { .. } => None,
        }
    }
}

/// How much one proposal may draft: at most `depth` tokens along any path (a chain's K) and
/// `nodes` tokens in all (a tree; `nodes >= depth`). Under an adaptive K, `nodes` is all the
/// context has room for (at most [`MAX_TREE`] - 1) and the loop sizes the tree after.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftBudget {
    pub depth: usize,
    pub nodes: usize,
    /// Measured costs, under an adaptive K: a draft that can estimate each node's chance of
    /// acceptance (EAGLE's scores) may size its tree with them, up to `costs.max_nodes` nodes
    /// (and say so: [`Proposal::Tree`]'s `sized`).
    pub costs: Option<TreeCosts>,
}

impl DraftBudget {
    /// A chain of `k` tokens (a tree of `k` nodes).
    pub fn chain(k: usize) -> DraftBudget {
        DraftBudget::tree(k, k)
    }

    /// Up to `depth` deep and `nodes` nodes, without costs.
    pub fn tree(depth: usize, nodes: usize) -> DraftBudget {
        DraftBudget { depth, nodes, costs: None }
    }
}

/// What a cycle costs, as the schedule measures it ([`super::Schedule::tree_costs`]): a draft
/// that scores its nodes verifies the N that maximise expected tokens per second,
/// `(1 + sum of the best N chances of acceptance) / (draft passes * draft_pass + verify[N])`
/// (EAGLE's dynamic tree does it on the GPU: `shaders/eagle_tree.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeCosts {
    /// `verify[n - 1]`: seconds of a verify pass over n rows (the root and n - 1 drafted nodes).
    pub verify: [f32; MAX_TREE],
    /// Seconds of one draft pass.
    pub draft_pass: f32,
    /// The most drafted nodes the context has room for (at most [`MAX_TREE`] - 1).
    pub max_nodes: usize,
}

/// A proposer of draft tokens.
pub trait Draft {
    /// Which kind of draft this is (the stats carry it).
    fn kind(&self) -> DraftKind;

    /// Sees the prompt before generation starts (a draft model prefills its KV cache with all of
    /// it but the last token). Returns the forward passes it ran.
    fn prefill<'a>(&'a mut self, prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>>;

    /// Proposes up to `budget.depth` tokens following `context` (the prompt and every token
    /// generated so far; the target has not yet run the last one), or a tree of up to
    /// `budget.nodes` tokens no deeper than that. With non-greedy `sampling`, a draft that has
    /// distributions samples from them with `rng` and returns them with the chain
    /// ([`Proposal::Chain`]'s `q`).
    fn propose<'a>(
        &'a mut self,
        context: &'a [u32],
        budget: DraftBudget,
        sampling: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalFuture<'a, Result<Proposal>>;

    /// After every target pass whose tokens the loop keeps (prefill chunks, verify passes, before
    /// the next target pass): rows `rows` of that pass hold the target's hidden states of
    /// positions `first..first + rows.len()`, whose next tokens are `context[first + 1..]` (all
    /// known by then). Drafts that read hidden states (Medusa and EAGLE heads) take them now:
    /// the next target pass overwrites them. Returns the draft passes run.
    fn target_pass<'a>(
        &'a mut self,
        _context: &'a [u32],
        _first: usize,
        _rows: &'a [usize],
    ) -> LocalFuture<'a, Result<usize>> {
        Box::pin(async { Ok(0) })
    }
}

/// The draft of one generation, as the loop needs to know it: none, a draft model (whose cycles
/// may run GPU-resident: its K steps and the target's verify pass in one submission,
/// [`super::cycle`] when greedy, [`super::sampled`] when the GPU draws), or any other draft
/// (proposed on the CPU, or by heads on the target's GPU, one proposal at a time).
pub enum Drafter<'a> {
    None,
    Model(&'a mut DraftModel),
    Other(&'a mut dyn Draft),
}

impl<'a> Drafter<'a> {
    /// The draft behind the trait (`None`: plain decoding).
    pub fn draft(&mut self) -> Option<&mut dyn Draft> {
        match self {
            Drafter::None => None,
            Drafter::Model(d) => Some(&mut **d),
            Drafter::Other(d) => Some(&mut **d),
        }
    }

    /// The draft behind the trait, for as long as the drafter borrowed it (to wrap it: an
    /// [`Ensemble`]).
    pub fn into_draft(self) -> Option<&'a mut dyn Draft> {
        match self {
            Drafter::None => None,
            Drafter::Model(d) => Some(d),
            Drafter::Other(d) => Some(d),
        }
    }

    /// The draft model, when it may run GPU-resident cycles (its GPU cycle on, no top-k trees).
    pub fn resident(&mut self) -> Option<&mut DraftModel> {
        match self {
            Drafter::Model(d) if d.gpu_cycle && d.alternatives == 0 => Some(&mut **d),
            _ => None,
        }
    }

    /// Which kind of draft proposes.
    pub fn kind(&self) -> DraftKind {
        match self {
            Drafter::None => DraftKind::None,
            Drafter::Model(d) => d.kind(),
            Drafter::Other(d) => d.kind(),
        }
    }
}

impl<'a> From<&'a mut DraftModel> for Drafter<'a> {
    fn from(d: &'a mut DraftModel) -> Drafter<'a> {
        Drafter::Model(d)
    }
}

impl<'a> From<&'a mut dyn Draft> for Drafter<'a> {
    fn from(d: &'a mut dyn Draft) -> Drafter<'a> {
        Drafter::Other(d)
    }
}

/// Checks that a draft model can propose tokens for a target: the same vocabulary size (the
/// draft's ids are the target's ids). Tokenizer identity is checked by the caller that has them.
pub fn check_vocab(target: &Config, draft: &Config) -> Result<()> {
    if target.vocab_size != draft.vocab_size {
        return Err(Error::InvalidArgument(format!(
            "the draft model's vocabulary has {} entries and the target's {}: a draft must share the \
             target's tokenizer",
            draft.vocab_size, target.vocab_size
        )));
    }
    Ok(())
}

/// Checks that two tokenizers are the same vocabulary: the same ids, each with the same entry.
pub fn check_tokenizers(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(Error::InvalidArgument(format!(
            "the draft's tokenizer has {} ids and the target's {}: a draft must share the target's tokenizer",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    if let Some(id) =
        (0..target.vocab_size() as u32).find(|&id| target.token_text(id) != draft.token_text(id))
    {
        return Err(Error::InvalidArgument(format!(
            "the draft's tokenizer differs from the target's at id {id} ({:?} vs {:?}): a draft must \
             share the target's tokenizer",
            draft.token_text(id),
            target.token_text(id)
        )));
    }
    Ok(())
}

/// Checks a draft model against its target, both as (config, tokenizer): the same vocabulary
/// size and the same tokenizer entries. Front ends call it before uploading the draft's weights.
pub fn check_draft(target: (&Config, &Tokenizer), draft: (&Config, &Tokenizer)) -> Result<()> {
    check_vocab(target.0, draft.0)?;
    check_tokenizers(target.1, draft.1)
}

/// A smaller model as the draft. It keeps the tokens its KV cache holds (`fed`); each proposal
/// rolls the cache back to the longest prefix shared with the new context (the rejected drafts
/// go), catches up on the tokens it has not seen in the same pass as its first draft step, then
/// runs one step per further draft token.
///
/// Greedy cycles run on the GPU (see [`super::cycle`]): each step feeds its own argmax to the next
/// one and the verify pass reads the drafts from a GPU buffer, one submission per cycle. Through
/// [`Draft::propose`] (sampling, or with the GPU cycle turned off) each step is its own submission
/// with a small read-back: the argmax id, or one row of logits when sampling.
pub struct DraftModel {
    model: Model,
    /// The tokens in the model's KV cache, in order (`fed.len() == model.len()`).
    fed: Vec<u32>,
    /// Whether cycles (greedy, or sampled where the GPU draws) may run on the GPU.
    gpu_cycle: bool,
    /// Greedy drafts as a token tree: besides its argmax, each step's next `alternatives` most
    /// likely tokens become siblings of the chain's node at that depth (0: a chain).
    alternatives: usize,
}

impl DraftModel {
    /// Wraps `model` as a draft for a target with config `target`; refuses a different vocabulary.
    pub fn new(model: Model, target: &Config) -> Result<DraftModel> {
        check_vocab(target, &model.config)?;
        Ok(DraftModel { model, fed: Vec::new(), gpu_cycle: true, alternatives: 0 })
    }

    /// Turns the GPU-resident cycles on (the default) or off (every draft step its own submission
    /// and read-back): greedy, the two give the same tokens; sampling, the same distribution
    /// (the GPU draws with noise of its own).
    pub fn set_gpu_cycle(&mut self, on: bool) {
        self.gpu_cycle = on;
    }

    /// Greedy proposals as top-k trees: the chain of argmaxes, and at each depth the step's next
    /// `alternatives` most likely tokens as siblings (in the budget's nodes, shallow first). Each
    /// step then reads back its `1 + alternatives` best ids (ranked on the GPU, at most
    /// [`MAX_TOP_K`]); the cycle is CPU-driven. 0 (the default): chains.
    pub fn set_tree(&mut self, alternatives: usize) {
        self.alternatives = alternatives;
    }

    /// The draft model, mutably (a GPU cycle records its passes).
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// Readies the cache for drafting up to `k` tokens after `context`: rolls back to the longest
    /// prefix it holds and feeds all but the last [`MAX_BATCH`] unseen tokens (their own passes).
    /// Returns the tokens the first draft step runs (its last row yields x1), the K that fits the
    /// draft's context (0: none), and the passes fed.
    pub(crate) async fn catch_up(&mut self, context: &[u32], k: usize) -> Result<(Vec<u32>, usize, usize)> {
        if context.is_empty() || k == 0 {
            return Ok((Vec::new(), 0, 0));
        }
        self.rollback_to(context);
        // Draft tokens x1..x_{k-1} are fed (xk is not): positions up to context.len() + k - 1.
        let room = (self.model.context() + 1).saturating_sub(context.len());
        let k = k.min(room);
        if k == 0 {
            return Ok((Vec::new(), 0, 0));
        }
        let unseen = &context[self.fed.len()..];
        let split = unseen.len().saturating_sub(MAX_BATCH);
        let steps = self.feed(&unseen[..split]).await?;
        Ok((unseen[split..].to_vec(), k, steps))
    }

    /// After a GPU cycle: the draft's cache now holds `first` and the drafts x1..x_{K-1}.
    pub(crate) fn commit_drafts(&mut self, first: &[u32], drafts: &[u32]) {
        self.fed.extend_from_slice(first);
        self.fed.extend_from_slice(&drafts[..drafts.len().saturating_sub(1)]);
        debug_assert_eq!(self.fed.len(), self.model.len());
    }

    /// The draft model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Runs `tokens` at `pos` and returns the next token after them, with its distribution when
    /// sampling, and (greedy, a tree draft) the next most likely tokens in `alternatives`.
    async fn step(
        &mut self,
        tokens: &[u32],
        sampling: &SamplingParams,
        rng: &mut Rng,
        alternatives: &mut Vec<u32>,
    ) -> Result<(u32, Option<Dist>)> {
        let pos = self.fed.len();
        alternatives.clear();
        let out = if sampling.is_greedy() && self.alternatives > 0 {
            // ranked on the GPU: 1 + alternatives ids come back
            let k = (1 + self.alternatives).min(MAX_TOP_K);
            let mut top = self.model.forward_top_k(tokens, pos, k).await?;
            let id = top.first().copied().ok_or_else(|| Error::Gpu("empty top-k read-back".into()))?;
            top.remove(0);
            *alternatives = top;
            (id, None)
        } else if sampling.is_greedy() {
            let ids = self.model.forward_argmax(tokens, pos).await?;
            let id = ids.last().copied().ok_or_else(|| Error::Gpu("empty argmax read-back".into()))?;
            (id, None)
        } else {
            let logits = self.model.forward_last(tokens, pos).await?;
            let q = Dist::from_logits(&logits, sampling);
            (q.draw(rng), Some(q))
        };
        self.fed.extend_from_slice(tokens);
        Ok(out)
    }

    /// Feeds `tokens` without using their outputs (no output projection, no read-back), in
    /// passes of at most [`MAX_BATCH`].
    async fn feed(&mut self, tokens: &[u32]) -> Result<usize> {
        let mut passes = 0;
        for chunk in tokens.chunks(MAX_BATCH) {
            self.model.prefill(chunk, self.fed.len())?;
            self.fed.extend_from_slice(chunk);
            passes += 1;
        }
        Ok(passes)
    }

    /// Rolls the KV cache back to the longest prefix of `context` it holds, keeping at least one
    /// token of `context` unfed (its row gives the first draft).
    fn rollback_to(&mut self, context: &[u32]) {
        let common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count();
        let keep = common.min(context.len().saturating_sub(1));
        self.fed.truncate(keep);
        self.model.truncate(keep);
    }

    async fn propose_impl(
        &mut self,
        context: &[u32],
        budget: DraftBudget,
        sampling: &SamplingParams,
        rng: &mut Rng,
    ) -> Result<Proposal> {
        let (mut tokens, mut qs) = (Vec::new(), (!sampling.is_greedy()).then(Vec::new));
        let (mut input, k, mut steps) = self.catch_up(context, budget.depth).await?;
        // (a tree draft) per depth, the tokens ranked after the chain's
        let mut siblings: Vec<Vec<u32>> = Vec::new();
        let mut alternatives = Vec::new();
        for _ in 0..k {
            let (x, q) = self.step(&input, sampling, rng, &mut alternatives).await?;
            siblings.push(alternatives.clone());
            steps += 1;
            tokens.push(x);
            if let (Some(qs), Some(q)) = (qs.as_mut(), q) {
                qs.push(q);
            }
            if tokens.len() == k {
                break;
            }
            input = vec![x];
        }
        if siblings.iter().any(|s| !s.is_empty()) {
            let root = context.last().copied().unwrap_or(0);
            let tree = TokenTree::chain_with_siblings(root, &tokens, &siblings, budget.nodes + 1);
            return Ok(Proposal::tree(tree, false, steps));
        }
        Ok(Proposal::Chain { tokens, q: qs, steps })
    }
}

impl Draft for DraftModel {
    fn kind(&self) -> DraftKind {
        DraftKind::Model
    }

    fn prefill<'a>(&'a mut self, prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        Box::pin(async move {
            self.rollback_to(prompt);
            let start = self.fed.len();
            let end = prompt.len().saturating_sub(1).min(self.model.context());
            if start >= end {
                return Ok(0);
            }
            self.feed(&prompt[start..end]).await
        })
    }

    fn propose<'a>(
        &'a mut self,
        context: &'a [u32],
        budget: DraftBudget,
        sampling: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalFuture<'a, Result<Proposal>> {
        Box::pin(self.propose_impl(context, budget, sampling, rng))
    }
}

/// Prompt lookup decoding: find the latest earlier occurrence of the context's last n tokens
/// (n from `max_n` down to `min_n`) and propose the tokens that followed it. The continuation
/// may run into the tokens it proposes itself, so a repeating pattern is proposed in full.
/// Proposals are deterministic (one-hot q). With `branches` > 1 the continuations of several
/// earlier matches go into one token tree ([`NGram::lookup_tree`]).
#[derive(Clone, Debug)]
pub struct NGram {
    pub max_n: usize,
    pub min_n: usize,
    /// Distinct continuations in a proposal's tree (1: the latest match's chain alone).
    pub branches: usize,
}

impl Default for NGram {
    fn default() -> Self {
        NGram { max_n: 3, min_n: 1, branches: 1 }
    }
}

impl NGram {
    /// Up to `k` tokens continuing `context` after its latest earlier n-gram match.
    pub fn lookup(&self, context: &[u32], k: usize) -> Vec<u32> {
        let len = context.len();
        let mut out = Vec::new();
        if k == 0 {
            return out;
        }
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let pattern = &context[len - n..];
            // Latest start j < len - n with context[j..j+n] == pattern.
            let Some(j) = (0..len - n).rev().find(|&j| &context[j..j + n] == pattern) else { continue };
            let start = j + n;
            for i in 0..k {
                let idx = start + i;
                let tok = if idx < len { context[idx] } else { out[idx - len] };
                out.push(tok);
            }
            return out;
        }
        out
    }

    /// The continuations of up to `branches` earlier matches — [`NGram::lookup`]'s first, then
    /// other matches, latest first, longer n-grams before shorter — merged into a tree below the
    /// context's last token breadth first (every continuation's first token, then the second
    /// ones, ...), `budget.depth` deep and up to `budget.nodes` drafted nodes.
    pub fn lookup_tree(&self, context: &[u32], budget: DraftBudget) -> TokenTree {
        let mut tree = TokenTree::new(context.last().copied().unwrap_or(0));
        add_breadth_first(&mut tree, &self.continuations(context, budget.depth), budget.nodes + 1);
        tree
    }

    /// Up to `branches` distinct continuations of up to `k` tokens (see [`NGram::lookup_tree`]).
    pub fn continuations(&self, context: &[u32], k: usize) -> Vec<Vec<u32>> {
        let mut branches: Vec<Vec<u32>> = Vec::new();
        let latest = self.lookup(context, k);
        if !latest.is_empty() {
            branches.push(latest);
        }
        let len = context.len();
        'found: for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let pattern = &context[len - n..];
            for j in (0..len - n).rev() {
                if branches.len() >= self.branches {
                    break 'found;
                }
                if &context[j..j + n] != pattern {
                    continue;
                }
                let next: Vec<u32> = context[j + n..].iter().take(k).copied().collect();
                if !next.is_empty() && !branches.iter().any(|b| b.starts_with(&next)) {
                    branches.push(next);
                }
            }
        }
        branches
    }
}

/// The n-gram continuations a tree draft merges by default (the ensemble, `bench --tree`). On
/// lavapipe with SmolLM2 the older matches' continuations rarely beat the latest one's (τ 1.34
/// vs 1.33, BENCHMARKS.md), so plain n-gram drafts stay chains.
pub const TREE_BRANCHES: usize = 4;

/// Inserts `paths` below `tree`'s root breadth first (every path's first token, then the second
/// ones, ...) until the tree holds `budget` nodes.
fn add_breadth_first(tree: &mut TokenTree, paths: &[Vec<u32>], budget: usize) {
    let longest = paths.iter().map(Vec::len).max().unwrap_or(0);
    for depth in 1..=longest {
        for p in paths.iter().filter(|p| p.len() >= depth) {
            tree.insert(&p[..depth], budget);
        }
    }
}

/// SpecInfer's ensemble of drafts: another draft's proposal (a draft model's chain, an EAGLE or
/// Medusa tree) and the n-gram continuations merged into one token tree (shared prefixes once),
/// verified in one tree pass. The n-gram takes up to K nodes more than the draft's proposal
/// holds (or the budget's other nodes, if more). A draft that sized its tree from the measured
/// costs (EAGLE's) keeps it as sized, with the n-gram's nodes beside it; other merged trees are
/// sized by the loop. With a draft that samples (its proposal carries q), its proposal alone
/// (its tokens are drawn from its q, which a merged tree would not keep).
pub struct Ensemble<'a> {
    pub draft: &'a mut dyn Draft,
    pub ngram: NGram,
}

impl Draft for Ensemble<'_> {
    fn kind(&self) -> DraftKind {
        self.draft.kind().with_ngram()
    }

    fn prefill<'a>(&'a mut self, prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        self.draft.prefill(prompt)
    }

    fn target_pass<'a>(
        &'a mut self,
        context: &'a [u32],
        first: usize,
        rows: &'a [usize],
    ) -> LocalFuture<'a, Result<usize>> {
        self.draft.target_pass(context, first, rows)
    }

    fn propose<'a>(
        &'a mut self,
        context: &'a [u32],
        budget: DraftBudget,
        sampling: &'a SamplingParams,
        rng: &'a mut Rng,
    ) -> LocalFuture<'a, Result<Proposal>> {
        Box::pin(async move {
            let proposal = self.draft.propose(context, budget, sampling, rng).await?;
            let root = context.last().copied().unwrap_or(0);
            let (mut tree, sized, steps) = match proposal {
                Proposal::Chain { q: Some(_), .. } => return Ok(proposal),
                Proposal::Chain { tokens, steps, .. } => (TokenTree::chain(root, &tokens), false, steps),
                Proposal::Tree { tree, sized, steps } => (tree, sized, steps),
            };
            let nodes = match sized {
                true => tree.len() + budget.depth,
                false => (tree.len() + budget.depth).max(budget.nodes + 1),
            };
            add_breadth_first(&mut tree, &self.ngram.continuations(context, budget.depth), nodes);
            // (its first branch: the draft's chain, or where it has none the n-gram's first
            // continuation)
            Ok(Proposal::tree(tree, sized, steps))
        })
    }
}

impl Draft for NGram {
    fn kind(&self) -> DraftKind {
        DraftKind::Ngram
    }

    fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        Box::pin(async { Ok(0) })
    }

    fn propose<'a>(
        &'a mut self,
        context: &'a [u32],
        budget: DraftBudget,
        _sampling: &'a SamplingParams,
        _rng: &'a mut Rng,
    ) -> LocalFuture<'a, Result<Proposal>> {
        let proposal = match (self.branches > 1).then(|| self.lookup_tree(context, budget)) {
            Some(tree) if !tree.is_chain() => Proposal::Tree { tree, sized: false, steps: 0 },
            _ => Proposal::chain(self.lookup(context, budget.depth), 0),
        };
        Box::pin(async move { Ok(proposal) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_the_continuation_of_the_latest_match() {
        let g = NGram::default();
        // "1 2 3 9 ... 1 2 3" -> "9 ..."
        assert_eq!(g.lookup(&[1, 2, 3, 9, 8, 7, 5, 1, 2, 3], 3), vec![9, 8, 7]);
        // A repeating pattern continues through its own proposals.
        assert_eq!(g.lookup(&[4, 5, 4, 5], 5), vec![4, 5, 4, 5, 4]);
        // No match: nothing.
        assert_eq!(g.lookup(&[1, 2, 3, 4], 4), Vec::<u32>::new());
        // The shorter n-gram is used when the longer has no match; the latest match wins.
        assert_eq!(g.lookup(&[7, 1, 6, 1, 8, 9, 1], 2), vec![8, 9]);
    }

    /// A draft proposing a fixed chain, or a fixed tree it says it sized.
    struct Fixed(Vec<u32>, Option<TokenTree>);

    impl Draft for Fixed {
        fn kind(&self) -> DraftKind {
            DraftKind::Eagle
        }

        fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
            Box::pin(async { Ok(0) })
        }

        fn propose<'a>(
            &'a mut self,
            _context: &'a [u32],
            _budget: DraftBudget,
            _sampling: &'a SamplingParams,
            _rng: &'a mut Rng,
        ) -> LocalFuture<'a, Result<Proposal>> {
            let proposal = match self.1.clone() {
                Some(tree) => Proposal::tree(tree, true, 0),
                None => Proposal::chain(self.0.clone(), 0),
            };
            Box::pin(async move { Ok(proposal) })
        }
    }

    #[test]
    fn an_ensemble_merges_the_drafts_proposal_with_the_ngram_continuations() {
        // "1" was followed by "8 9 1" and "6 1 8": K = 3 of their nodes (breadth first) beside
        // the draft's chain 4 5 6
        let context = [1, 6, 1, 8, 9, 1];
        let propose = |draft: &mut dyn Draft, budget| {
            let mut ensemble = Ensemble { draft, ngram: NGram { branches: 4, ..NGram::default() } };
            assert_eq!(ensemble.kind(), DraftKind::EagleNgram);
            let (params, mut rng) = (SamplingParams::greedy(), Rng::new(0));
            pollster::block_on(ensemble.propose(&context, budget, &params, &mut rng)).expect("propose")
        };
        let p = propose(&mut Fixed(vec![4, 5, 6], None), DraftBudget::chain(3));
        assert_eq!(p.tokens(), [4, 5, 6], "the draft's chain is the first branch");
        let Proposal::Tree { tree, sized, .. } = p else { panic!("a tree: {p:?}") };
        assert_eq!(tree.tokens(), &[1, 4, 5, 6, 8, 6, 9]);
        assert_eq!(tree.parents(), &[0, 0, 1, 2, 0, 0, 4]);
        assert!(!sized, "the loop sizes a merged tree");
        // a tree the draft sized keeps its nodes and gets at most K n-gram nodes beside them
        let sized = TokenTree::chain_with_siblings(1, &[4, 5], &[vec![7]], 32);
        let p = propose(&mut Fixed(vec![4, 5], Some(sized.clone())), DraftBudget::tree(2, 31));
        let Proposal::Tree { tree, sized: true, .. } = p else { panic!("a sized tree: {p:?}") };
        assert_eq!(tree.len(), sized.len() + 2, "{tree:?}");
        assert_eq!(&tree.tokens()[..sized.len()], sized.tokens());
        // a draft with nothing to propose: the n-gram's continuations, the first as the chain
        let p = propose(&mut Fixed(vec![], None), DraftBudget::chain(3));
        assert_eq!(p.tokens(), [8, 9]);
        assert_eq!(p.as_tree().expect("a tree").tokens(), &[1, 8, 6, 9]);
    }

    #[test]
    fn ngram_trees_merge_the_continuations_of_several_matches() {
        let g = NGram { branches: 3, ..NGram::default() };
        // "1" was followed by "8 9 1" (latest, then itself: "8"), "6 1 8 9" and "5 7 1 6": three
        // branches below the root 1, breadth first, until k = 4 drafted nodes
        let t = g.lookup_tree(&[1, 5, 7, 1, 6, 1, 8, 9, 1], DraftBudget::chain(4));
        assert_eq!(t.tokens(), &[1, 8, 6, 5, 9]);
        assert_eq!(t.ancestors(), vec![0b1, 0b11, 0b101, 0b1001, 0b10011]);
        // more nodes than depth: the branches grow, no path deeper than 4
        let t = g.lookup_tree(&[1, 5, 7, 1, 6, 1, 8, 9, 1], DraftBudget::tree(4, 7));
        assert_eq!(t.tokens(), &[1, 8, 6, 5, 9, 1, 7, 1]);
        assert_eq!(t.max_depth(), 3);
        // one match: a chain (proposed as the chain alone)
        assert!(g.lookup_tree(&[1, 2, 3, 1, 2], DraftBudget::chain(3)).is_chain());
    }
}
