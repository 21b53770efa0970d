//! EAGLE drafting: an EAGLE head ([`EagleHead`]) runs on the target's features of every kept
//! position as soon as the target's pass has produced them, so its last row already ranks the
//! first draft token; each further draft step feeds the head its own predicted feature and most
//! likely token (EAGLE-1, Li et al., arXiv 2401.15077). A proposal is the chain of most likely
//! tokens with each depth's next most likely ones beside it as leaves, in the budget's nodes.
//! Proposals are deterministic (one-hot q): greedy decoding follows the target's argmax down the
//! tree, sampled decoding uses the multi-candidate rule, and the output is the target's.

use super::draft::{Draft, DraftBudget, LocalFuture, Proposal};
use super::tree::TokenTree;
use crate::error::Result;
use crate::model::EagleHead;
use crate::sampling::{Rng, SamplingParams};

/// The next most likely tokens an EAGLE proposal puts beside its chain at each depth by default
/// (in the nodes the verify pass's budget leaves).
pub const EAGLE_SIBLINGS: usize = 3;

/// An EAGLE head as a draft.
pub struct Eagle {
    head: EagleHead,
    /// Target positions whose features the head has run (its cache holds them first).
    synced: usize,
    /// Whether the head's last pass ran over target features (drafting continues from its last
    /// row; false once a proposal has run past it, or when the head missed a pass).
    ready: bool,
    /// Tokens beside the chain at each depth (the head's next most likely ones).
    siblings: usize,
}

impl Eagle {
    /// A draft from `head`, with up to `siblings` (< the head's top-k) of each depth's next most
    /// likely tokens beside the chain.
    pub fn new(head: EagleHead, siblings: usize) -> Eagle {
        let siblings = siblings.min(head.top_k().saturating_sub(1));
        Eagle { head, synced: 0, ready: false, siblings }
    }

    /// The head.
    pub fn head(&self) -> &EagleHead {
        &self.head
    }
}

impl Draft for Eagle {
    fn name(&self) -> &str {
        "eagle"
    }

    fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        // the prompt's features arrive through target_pass, one prefill chunk at a time
        Box::pin(async { Ok(0) })
    }

    fn target_pass<'a>(
        &'a mut self,
        context: &'a [u32],
        first: usize,
        rows: &'a [usize],
    ) -> LocalFuture<'a, Result<usize>> {
        Box::pin(async move {
            let n = rows.len();
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

    fn propose<'a>(
        &'a mut self,
        context: &'a [u32],
        budget: DraftBudget,
        _sampling: &'a SamplingParams,
        _rng: &'a mut Rng,
    ) -> LocalFuture<'a, Result<Proposal>> {
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
            let ranked = self.head.draft(depth - 1).await?;
            let chain: Vec<u32> = ranked.iter().map(|ids| ids[0]).collect();
            let siblings: Vec<Vec<u32>> =
                ranked.iter().map(|ids| ids[1..=self.siblings.min(ids.len() - 1)].to_vec()).collect();
            let tree = TokenTree::chain_with_siblings(root, &chain, &siblings, budget.nodes + 1);
            Ok(Proposal {
                tokens: chain,
                steps: depth - 1,
                tree: Some(tree).filter(|t| !t.is_chain()),
                q: None,
            })
        })
    }
}
