//! EAGLE drafting: an EAGLE head ([`EagleHead`]) runs on the target's features of every kept
//! position as soon as the target's pass has produced them, so its last row already ranks the
//! first draft token; each further draft step feeds the head its own predicted feature and most
//! likely token (EAGLE-1, Li et al., arXiv 2401.15077). A proposal is shaped one of two ways
//! ([`EagleTree`]):
//!
//! - **Dynamic** (the default; EAGLE-2, Li et al., arXiv 2406.16858): a node's score is the sum
//!   of its path's draft log-probabilities. Depth by depth the head expands the best-scoring
//!   nodes of the newest depth (at most `width`, and only those still among the best
//!   `budget.nodes`, since a child never scores above its parent), in one tree pass over them and
//!   their ancestors; each expanded node's `top_k` children join the candidates. The proposal is
//!   the best `budget.nodes` candidates, a subtree of the root. The tree grows on the GPU
//!   ([`EagleHead::draft_tree`], `shaders/eagle_tree.wgsl` choosing each pass's rows between the
//!   head's passes): one submission and one read-back per proposal, as for a chain.
//!
//!   Under an adaptive K the budget carries measured costs ([`super::TreeCosts`]), and the number of
//!   nodes is chosen rather than filled: each candidate's chance of acceptance is estimated as
//!   `c * exp(score)` (its path's draft probability, times a calibration `c` = accepted over
//!   predicted nodes in recent verify passes), and N maximises expected tokens per second,
//!   `(1 + sum of the best N chances) / (draft passes + verify pass of N + 1 rows)`, recomputed
//!   before each depth (only nodes within that N are expanded) and for the final tree.
//! - **Chain**: the chain of most likely tokens in one submission, with each depth's next most
//!   likely ones beside it as leaves, in the budget's nodes.
//!
//! Proposals are deterministic (one-hot q): greedy decoding follows the target's argmax down the
//! tree, sampled decoding uses the multi-candidate rule, and the output is the target's.

use super::draft::{Ask, Draft, DraftBudget, Kept, LocalFuture, Proposal};
use super::spec::DraftKind;
use super::tree::TokenTree;
use crate::error::Result;
use crate::gpu::MAX_TREE;
use crate::model::{EagleHead, TreeShape, MAX_EAGLE_DEPTH, MAX_EAGLE_WIDTH};

/// The next most likely tokens an EAGLE proposal puts beside its chain at each depth by default
/// (in the nodes the verify pass's budget leaves).
pub const EAGLE_SIBLINGS: usize = 3;

/// The nodes a dynamic EAGLE tree expands per depth by default.
pub const EAGLE_WIDTH: usize = 4;

/// The shape of an EAGLE proposal (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EagleTree {
    /// The chain of most likely tokens with up to `siblings` of each depth's next most likely
    /// ones beside it.
    Chain { siblings: usize },
    /// EAGLE-2's tree, expanding up to `width` nodes per depth.
    Dynamic { width: usize },
}

/// An EAGLE head as a draft.
pub struct Eagle {
    head: EagleHead,
    /// Target positions whose features the head has run (its cache holds them first).
    synced: usize,
    /// Whether the head's last pass ran over target features (drafting continues from its last
    /// row; false once a proposal has run past it, or when the head missed a pass).
    ready: bool,
    /// How proposals are shaped.
    shape: EagleTree,
    /// Decayed sums of accepted nodes and of their predicted number (the chosen nodes' path
    /// probabilities) over recent dynamic trees sized by costs: the calibration of the chances.
    calibration: (f64, f64),
    /// The predicted accepted nodes of the last proposal and its tree, until its verify pass is
    /// seen (the tree says which accepted nodes were the head's: an ensemble adds others).
    predicted: Option<(f64, TokenTree)>,
}

/// Decay of the calibration sums per verify pass, and their prior (as if `PRIOR` nodes were
/// predicted and accepted).
const CALIBRATION_DECAY: f64 = 0.95;
const CALIBRATION_PRIOR: f64 = 2.0;

impl Eagle {
    /// A draft from `head` proposing chains with up to `siblings` (< the head's top-k) of each
    /// depth's next most likely tokens beside them.
    pub fn new(head: EagleHead, siblings: usize) -> Eagle {
        Eagle::with_tree(head, EagleTree::Chain { siblings })
    }

    /// A draft from `head` proposing trees of `shape` (a chain's siblings are capped below the
    /// head's top-k; a dynamic tree's width at the head's top-k and [`MAX_EAGLE_WIDTH`]).
    pub fn with_tree(head: EagleHead, shape: EagleTree) -> Eagle {
        let mut eagle =
            Eagle { head, synced: 0, ready: false, shape, calibration: (0.0, 0.0), predicted: None };
        eagle.set_tree(shape);
        eagle
    }

    /// Changes how proposals are shaped (see [`Eagle::with_tree`]).
    pub fn set_tree(&mut self, shape: EagleTree) {
        let k = self.head.top_k();
        self.shape = match shape {
            EagleTree::Chain { siblings } => EagleTree::Chain { siblings: siblings.min(k.saturating_sub(1)) },
            EagleTree::Dynamic { width } => {
                EagleTree::Dynamic { width: width.clamp(1, k.min(MAX_EAGLE_WIDTH)) }
            }
        };
    }

    /// How proposals are shaped.
    pub fn tree(&self) -> EagleTree {
        self.shape
    }

    /// The siblings beside each depth's chain token that a batch's trees hold: the chain's
    /// ([`EagleTree::Chain`]), or a dynamic tree's width less one (where a request alone grows
    /// EAGLE-2's tree, in the batch the head drafts its chain with siblings).
    pub fn batch_siblings(&self) -> usize {
        match self.shape {
            EagleTree::Chain { siblings } => siblings,
            EagleTree::Dynamic { width } => width.saturating_sub(1).min(self.head.top_k().saturating_sub(1)),
        }
    }

    /// The factor on a node's path probability that estimates its chance of acceptance: accepted
    /// over predicted nodes in recent verify passes (1 before any), within 0.05..=2.
    pub fn calibration(&self) -> f64 {
        let (accepted, predicted) = self.calibration;
        ((accepted + CALIBRATION_PRIOR) / (predicted + CALIBRATION_PRIOR)).clamp(0.05, 2.0)
    }

    /// The head.
    pub fn head(&self) -> &EagleHead {
        &self.head
    }

    /// The head, mutably (reading its last row's ranks projects the row first).
    pub fn head_mut(&mut self) -> &mut EagleHead {
        &mut self.head
    }

    /// Forgets what the head's cache holds (other passes wrote it): it follows the next
    /// generation from its start.
    pub fn forget(&mut self) {
        (self.synced, self.ready, self.predicted) = (0, false, None);
        self.head.truncate(0);
    }

    /// The head, to draft with it in another way.
    pub fn into_head(self) -> EagleHead {
        self.head
    }
}

impl Draft for Eagle {
    fn kind(&self) -> DraftKind {
        DraftKind::Eagle
    }

    fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        // the prompt's features arrive through target_pass, one prefill chunk at a time
        self.predicted = None;
        Box::pin(async { Ok(0) })
    }

    fn target_pass<'a>(&'a mut self, pass: Kept<'a>) -> LocalFuture<'a, Result<usize>> {
        let Kept { context, first, rows } = pass;
        Box::pin(async move {
            let n = rows.len();
            if let Some((predicted, tree)) = self.predicted.take() {
                // the verify pass of the last proposal: its kept rows are the root and the
                // accepted nodes, of which the head's are those down its own tree
                let (a, p) = self.calibration;
                let kept = context.get(first + 1..first + n).unwrap_or_default();
                let accepted = tree.follow(kept) as f64;
                self.calibration = (a * CALIBRATION_DECAY + accepted, p * CALIBRATION_DECAY + predicted);
            }
            // position p's input is (f_p, t_{p+1}): every next token must be known
            let next = context.get(first + 1..first + 1 + n);
            match next {
                Some(next) if first <= self.synced && n > 0 => {
                    // a gap-free continuation (or a new generation from its start)
                    self.head.truncate(first);
                    self.head.run_target_rows(rows, next, first)?;
                    self.synced = first + n;
                    self.ready = true;
                    Ok(1)
                }
                _ => {
                    // a pass the head cannot follow: it drafts nothing until the next generation
                    self.ready = false;
                    Ok(0)
                }
            }
        })
    }

    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
        let Ask { context, budget, .. } = ask;
        Box::pin(async move {
            let n_past = context.len().saturating_sub(1);
            let (true, Some(&root)) = (std::mem::take(&mut self.ready), context.last()) else {
                return Ok(Proposal::default());
            };
            // depth d's token comes from the pass at position n_past + d - 1 (the first from the
            // features' pass itself)
            let room = self.head.context().saturating_sub(n_past) + 1;
            let depth = budget.depth.min(room);
            if self.synced != n_past || depth == 0 {
                return Ok(Proposal::default());
            }
            let siblings = match self.shape {
                EagleTree::Dynamic { width } => return self.dynamic(root, depth, budget, width).await,
                EagleTree::Chain { siblings } => siblings,
            };
            let ranked = self.head.draft(depth - 1).await?;
            let chain: Vec<u32> = ranked.iter().map(|ids| ids[0]).collect();
            let siblings: Vec<Vec<u32>> =
                ranked.iter().map(|ids| ids[1..=siblings.min(ids.len() - 1)].to_vec()).collect();
            let tree = TokenTree::chain_with_siblings(root, &chain, &siblings, budget.nodes + 1);
            Ok(match tree.is_chain() {
                true => Proposal::chain(chain, depth - 1),
                false => Proposal::tree(tree, false, depth - 1),
            })
        })
    }
}

impl Eagle {
    /// EAGLE-2's dynamic tree below `root`: at most `depth` deep, `budget.nodes` drafted nodes
    /// (or as many as its costs make worth it), expanding up to `width` nodes per depth (see the
    /// module's doc), grown on the GPU in one submission.
    async fn dynamic(
        &mut self,
        root: u32,
        depth: usize,
        budget: DraftBudget,
        width: usize,
    ) -> Result<Proposal> {
        let max_nodes = match budget.costs {
            Some(c) => c.max_nodes,
            None => budget.nodes.max(depth),
        }
        .clamp(1, MAX_TREE - 1);
        let shape = TreeShape {
            depth: depth.min(MAX_EAGLE_DEPTH),
            width: width.min(max_nodes),
            max_nodes,
            costs: budget.costs.map(|c| (c.verify, c.draft_pass)),
            calibration: self.calibration() as f32,
        };
        let drafted = self.head.draft_tree(root, shape).await?;
        // the nodes come by depth, each after its parent
        let mut tree = TokenTree::new(root);
        let mut at = Vec::with_capacity(drafted.tokens.len());
        for (&token, parent) in drafted.tokens.iter().zip(&drafted.parents) {
            let p = match parent {
                Some(i) => at.get(*i).copied().flatten(),
                None => Some(0),
            };
            at.push(p.and_then(|p| tree.child(p, token)));
        }
        if budget.costs.is_some() {
            self.predicted = Some((drafted.predicted as f64, tree.clone()));
        }
        // (its first branch: from the root, each node's best child)
        Ok(Proposal::tree(tree, budget.costs.is_some(), drafted.passes))
    }
}
