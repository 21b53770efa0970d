//! Medusa drafting: the heads' top-k guesses for the next positions combined into one token
//! tree by a list of paths, verified in one tree pass (Cai et al., arXiv 2401.10774).
//!
//! Path `[i0, i1, i2]` is the token tree's branch "head 0's (i0 + 1)-th most likely id, then
//! head 1's (i1 + 1)-th, then head 2's (i2 + 1)-th". Head d reads the target's hidden state at
//! the row that produced the context's last token and guesses the token d + 1 places after it,
//! so a branch of depth D proposes the D tokens that follow the context. Proposals are
//! deterministic (one-hot q): greedy decoding follows the target's argmax down the tree, sampled
//! decoding uses the multi-candidate rule ([`super::tree`]), and the output is the target's.

use super::draft::{Ask, Draft, DraftBudget, Kept, LocalFuture, Proposal};
use super::spec::DraftKind;
use super::tree::TokenTree;
use crate::error::{Error, Result};
use crate::model::MedusaHeads;

/// The first 31 paths of Medusa's published 63-node tree (`mc_sim_7b_63` in the Medusa
/// repository's `medusa_choices.py`), which is ordered so that every prefix of the list is a tree
/// and earlier paths are the likelier to be accepted: 31 nodes and the root fill a tree pass of
/// [`crate::gpu::MAX_TREE`] rows. Depth 3, ranks up to 10.
pub const MEDUSA_CHOICES: [&[usize]; 31] = [
    &[0],
    &[0, 0],
    &[1],
    &[0, 1],
    &[2],
    &[0, 0, 0],
    &[1, 0],
    &[0, 2],
    &[3],
    &[0, 3],
    &[4],
    &[0, 4],
    &[2, 0],
    &[0, 5],
    &[0, 0, 1],
    &[5],
    &[0, 6],
    &[6],
    &[0, 7],
    &[0, 1, 0],
    &[1, 1],
    &[7],
    &[0, 8],
    &[0, 0, 2],
    &[3, 0],
    &[0, 9],
    &[8],
    &[9],
    &[1, 0, 0],
    &[0, 2, 0],
    &[1, 2],
];

/// The ids each head must rank for `choices` (the largest rank a path uses, plus one).
pub fn ranks_needed(choices: &[Vec<usize>]) -> usize {
    choices.iter().flatten().map(|&i| i + 1).max().unwrap_or(1)
}

/// [`MEDUSA_CHOICES`] as owned paths.
pub fn default_choices() -> Vec<Vec<usize>> {
    MEDUSA_CHOICES.iter().map(|p| p.to_vec()).collect()
}

/// Medusa heads as a draft.
pub struct Medusa {
    heads: MedusaHeads,
    /// The tree's paths, in the order they fill a budget (each path's prefixes before it).
    choices: Vec<Vec<usize>>,
    /// The row of the target's last pass that produced the context's last token.
    row: Option<usize>,
}

impl Medusa {
    /// A draft from `heads` and the tree paths `choices` (see the module's doc): every path
    /// non-empty, no deeper than the heads, each rank below what the heads rank, and each path's
    /// parent listed before it. Paths deeper than the heads are refused, not cut.
    pub fn new(heads: MedusaHeads, choices: Vec<Vec<usize>>) -> Result<Medusa> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("Medusa tree paths: {why}")));
        for (i, path) in choices.iter().enumerate() {
            if path.is_empty() || path.len() > heads.config.heads {
                return bad(format!(
                    "path {path:?} must hold 1..={} ranks (one per head)",
                    heads.config.heads
                ));
            }
            if let Some(&r) = path.iter().find(|&&r| r >= heads.top_k()) {
                return bad(format!("path {path:?} asks for rank {r}; the heads rank {}", heads.top_k()));
            }
            let parent = &path[..path.len() - 1];
            if !parent.is_empty() && !choices[..i].iter().any(|p| p == parent) {
                return bad(format!("path {path:?} comes before its parent {parent:?}"));
            }
        }
        Ok(Medusa { heads, choices, row: None })
    }

    /// The heads.
    pub fn heads(&self) -> &MedusaHeads {
        &self.heads
    }

    /// The tree's paths, in the order they fill a budget.
    pub fn choices(&self) -> &[Vec<usize>] {
        &self.choices
    }

    /// The tree for `context` from the heads' ranked ids `top[head][rank]`: the paths no deeper
    /// than `budget.depth`, in order, until `budget.nodes` drafted nodes.
    pub fn tree(&self, root: u32, top: &[Vec<u32>], budget: DraftBudget) -> TokenTree {
        Medusa::tree_of(&self.choices, root, top, budget)
    }

    /// [`Medusa::tree`] of the paths `choices`.
    pub fn tree_of(choices: &[Vec<usize>], root: u32, top: &[Vec<u32>], budget: DraftBudget) -> TokenTree {
        let mut tree = TokenTree::new(root);
        for path in choices.iter().filter(|p| p.len() <= budget.depth) {
            let tokens: Vec<u32> = path.iter().zip(top).map(|(&rank, ids)| ids[rank]).collect();
            if tree.len() > budget.nodes {
                break;
            }
            tree.insert(&tokens, budget.nodes + 1);
        }
        tree
    }
}

impl Draft for Medusa {
    fn kind(&self) -> DraftKind {
        DraftKind::Medusa
    }

    fn target_pass<'a>(&'a mut self, pass: Kept<'a>) -> LocalFuture<'a, Result<usize>> {
        // the heads read the row that produced the last token when they propose
        self.row = pass.rows.last().copied();
        Box::pin(async { Ok(0) })
    }

    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
        let Ask { context, budget, .. } = ask;
        Box::pin(async move {
            let (Some(row), Some(&root)) = (self.row, context.last()) else {
                return Ok(Proposal::default());
            };
            if budget.depth == 0 {
                return Ok(Proposal::default());
            }
            let top = self.heads.top(row).await?;
            let tree = self.tree(root, &top, budget);
            // (a chain: every head's first choice, as deep as the tree goes)
            Ok(Proposal::tree(tree, false, 1))
        })
    }
}
