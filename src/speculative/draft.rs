//! Drafts: cheap proposers of the next K tokens, behind one trait.
//!
//! - [`DraftModel`]: a smaller model with the same tokenizer and its own KV cache.
//! - [`NGram`](super::ngram::NGram): prompt lookup — match the last n tokens against the prompt
//!   and the generated text and propose what followed the latest match (no second model).
//! - [`Ensemble`](super::ngram::Ensemble): another draft's proposal and the n-gram
//!   continuations in one token tree.
//! - [`Medusa`](super::medusa::Medusa) and [`Eagle`](super::eagle::Eagle): heads that read the
//!   target's hidden states, which the loop hands them after every target pass
//!   ([`Draft::target_pass`]).
//!
//! The trait takes the whole token context and returns a [`Proposal`]: a chain (with, for
//! sampling, the draft distributions `q`) or a token tree. The loop takes a [`Drafter`]: whether
//! the draft is a draft model (whose cycles may run GPU-resident) is said by its caller.

use std::future::Future;
use std::pin::Pin;

use super::sampled::DraftDraws;
use super::spec::DraftKind;
use super::tree::TokenTree;
use crate::error::{Error, Result};
use crate::gpu::{SampleSeed, MAX_TOP_K, MAX_TREE};
use crate::model::{Config, Model, MAX_BATCH};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;

/// A boxed future that need not be `Send` (wasm futures are not).
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What a draft proposes for the positions after the context: a chain, or a token tree.
#[derive(Clone, Debug)]
pub enum Proposal {
    /// `tokens` x1..xk' (k' <= the budget's depth, possibly none), in order. Under sampling
    /// each is kept where the target's draw at its position is that token (a draft model draws
    /// them with the target's noise).
    Chain {
        tokens: Vec<u32>,
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
        Proposal::Chain { tokens: Vec::new(), steps: 0 }
    }
}

impl Proposal {
    /// `tokens`, proposed in `steps` draft passes.
    pub fn chain(tokens: Vec<u32>, steps: usize) -> Proposal {
        Proposal::Chain { tokens, steps }
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

/// What a draft is asked to propose from ([`Draft::propose`]).
pub struct Ask<'a> {
    /// The prompt and every token generated so far (the target has not yet run the last one).
    pub context: &'a [u32],
    /// How many tokens at most: a chain's depth, or a tree's nodes.
    pub budget: DraftBudget,
    /// The generation's sampling: a draft model draws its chain with the target's noise when it
    /// is not greedy (the draft kept where the target's row draws the same).
    pub sampling: &'a SamplingParams,
}

/// A target pass whose rows the loop keeps ([`Draft::target_pass`]): rows `rows` of it hold the
/// target's hidden states of positions `first..first + rows.len()`, whose next tokens are
/// `context[first + 1..]`.
#[derive(Clone, Copy, Debug)]
pub struct Kept<'a> {
    /// The prompt and every token known by then.
    pub context: &'a [u32],
    /// The position of the first kept row.
    pub first: usize,
    /// The pass's rows that were kept, in position order.
    pub rows: &'a [usize],
}

/// A proposer of draft tokens.
pub trait Draft {
    /// Which kind of draft this is (the stats carry it).
    fn kind(&self) -> DraftKind;

    /// Sees the prompt before generation starts (a draft model prefills its KV cache with all of
    /// it but the last token; drafts without a cache of their own do nothing). Returns the
    /// forward passes it ran.
    fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        Box::pin(async { Ok(0) })
    }

    /// Proposes up to `ask.budget.depth` tokens following `ask.context`, or a tree of up to
    /// `ask.budget.nodes` tokens no deeper than that. Under sampling any tokens are exact (each
    /// kept where the target's draw at its position is that token): a draft that has
    /// distributions does best to draw from them with the target's noise, as a draft model does.
    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>>;

    /// After every target pass whose tokens the loop keeps (prefill chunks, verify passes, before
    /// the next target pass), with its kept rows. Drafts that read hidden states (Medusa and
    /// EAGLE heads) take them now: the next target pass overwrites them. Returns the draft passes
    /// run.
    fn target_pass<'a>(&'a mut self, _pass: Kept<'a>) -> LocalFuture<'a, Result<usize>> {
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
    /// [`Ensemble`](super::Ensemble)).
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

/// Checks that two tokenizers are the same vocabulary: the same ids, each with the same entry
/// (ids one covers for its model's rows and the other lacks have no entry in either).
pub fn check_tokenizers(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let ids = target.vocab_size().max(draft.vocab_size()) as u32;
    if let Some(id) = (0..ids).find(|&id| target.token_text(id) != draft.token_text(id)) {
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
/// Cycles run on the GPU (see [`super::cycle`], [`super::sampled`]): each step feeds its own
/// argmax (or draw) to the next one and the verify pass reads the drafts from a GPU buffer, one
/// submission per cycle. Through [`Draft::propose`] (calibrating cycles, or with the GPU cycle
/// turned off) each step is its own submission with a small read-back: the argmax id; sampling,
/// the draw on its GPU with the target's noise at its position ([`DraftDraws`]: kept where the
/// target's row draws the same).
pub struct DraftModel {
    model: Model,
    /// The tokens in the model's KV cache, in order (`fed.len() == model.len()`).
    fed: Vec<u32>,
    /// Whether cycles (greedy or sampled) may run on the GPU.
    gpu_cycle: bool,
    /// Greedy drafts as a token tree: besides its argmax, each step's next `alternatives` most
    /// likely tokens become siblings of the chain's node at that depth (0: a chain).
    alternatives: usize,
    /// Its sampled steps' draws on its GPU (made with the first, remade for other parameters).
    draws: Option<StepDraws>,
}

/// A draft model's draws in its CPU-driven steps: the parameters they were made for, the seed
/// uniform, the ops.
struct StepDraws {
    params: SamplingParams,
    seed: wgpu::Buffer,
    ops: DraftDraws,
}

impl DraftModel {
    /// Wraps `model` as a draft for a target with config `target`; refuses a different vocabulary.
    pub fn new(model: Model, target: &Config) -> Result<DraftModel> {
        check_vocab(target, &model.config)?;
        Ok(DraftModel { model, fed: Vec::new(), gpu_cycle: true, alternatives: 0, draws: None })
    }

    /// Turns the GPU-resident cycles on (the default) or off (every draft step its own submission
    /// and read-back): the two give the same tokens.
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

    /// The draft model, mutably (a GPU cycle records its passes; the engine's batch runs passes
    /// over its pool, then [`DraftModel::forget`]s).
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// Forgets what the draft's cache holds (other passes wrote it): the next proposal feeds
    /// its context from the start.
    pub fn forget(&mut self) {
        self.fed.clear();
        self.model.truncate(0);
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

    /// Runs `tokens` at `pos` and returns the next token after them (sampling: drawn with the
    /// target's noise at its position), and (greedy, a tree draft) the next most likely tokens
    /// in `alternatives`.
    async fn step(
        &mut self,
        tokens: &[u32],
        sampling: &SamplingParams,
        alternatives: &mut Vec<u32>,
    ) -> Result<u32> {
        let pos = self.fed.len();
        alternatives.clear();
        let out = if sampling.is_greedy() && self.alternatives > 0 {
            // ranked on the GPU: 1 + alternatives ids come back
            let k = (1 + self.alternatives).min(MAX_TOP_K);
            let mut top = self.model.forward_top_k(tokens, pos, k).await?;
            let id = top.first().copied().ok_or_else(|| Error::Gpu("empty top-k read-back".into()))?;
            top.remove(0);
            *alternatives = top;
            id
        } else if sampling.is_greedy() {
            let ids = self.model.forward_argmax(tokens, pos).await?;
            ids.last().copied().ok_or_else(|| Error::Gpu("empty argmax read-back".into()))?
        } else {
            self.draw(tokens, pos, sampling).await?
        };
        self.fed.extend_from_slice(tokens);
        Ok(out)
    }

    /// Runs `tokens` at `pos` and draws the next token on the GPU from the last row's sampling
    /// distribution, with the noise the target's row at that position draws with.
    async fn draw(&mut self, tokens: &[u32], pos: usize, sampling: &SamplingParams) -> Result<u32> {
        let gpu = self.model.gpu().clone();
        let same = |d: &StepDraws| d.params.same_distribution(sampling);
        if !self.draws.as_ref().is_some_and(same) {
            let seed = gpu.uniform("draft step seed", bytemuck::bytes_of(&SampleSeed::new(sampling.seed)));
            let ops = DraftDraws::new(&self.model, &seed, sampling);
            self.draws = Some(StepDraws { params: *sampling, seed, ops });
        }
        let Some(d) = self.draws.as_ref() else {
            return Err(Error::Gpu("the draft's draws were not made".into()));
        };
        gpu.queue.write_buffer(&d.seed, 0, bytemuck::bytes_of(&SampleSeed::new(sampling.seed)));
        let mut enc = gpu.encoder();
        self.model.record(&mut enc, 0, tokens, tokens.len(), pos)?;
        d.ops.encode(&gpu, &mut enc, tokens.len());
        // (a draft's non-finite logits fail nothing: see DraftDraws)
        let raw = gpu.submit_and_read(enc, &d.ops.draw.raw, 0, 4).await?;
        let draw = bytemuck::pod_collect_to_vec::<u8, u32>(&raw).first().copied();
        let vocab = self.model.config.vocab_size;
        draw.filter(|&x| (x as usize) < vocab)
            .ok_or_else(|| Error::Gpu(format!("the draft's GPU drew {draw:?} from {vocab} tokens")))
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
    ) -> Result<Proposal> {
        let mut tokens = Vec::new();
        let (mut input, k, mut steps) = self.catch_up(context, budget.depth).await?;
        // (a tree draft) per depth, the tokens ranked after the chain's
        let mut siblings: Vec<Vec<u32>> = Vec::new();
        let mut alternatives = Vec::new();
        for _ in 0..k {
            let x = self.step(&input, sampling, &mut alternatives).await?;
            siblings.push(alternatives.clone());
            steps += 1;
            tokens.push(x);
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
        Ok(Proposal::Chain { tokens, steps })
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

    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
        let Ask { context, budget, sampling } = ask;
        Box::pin(self.propose_impl(context, budget, sampling))
    }
}
