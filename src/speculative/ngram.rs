//! Drafts without a model of their own: prompt lookup ([`NGram`]) and SpecInfer's ensemble of
//! another draft's proposal with the n-gram continuations ([`Ensemble`]), one token tree.

use super::draft::{Ask, Draft, DraftBudget, Kept, LocalFuture, Proposal};
use super::spec::DraftKind;
use super::tree::TokenTree;
use crate::error::Result;

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
        let Some((start, _)) = self.latest_match(context).filter(|_| k > 0) else { return Vec::new() };
        let len = context.len();
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let idx = start + i;
            let tok = if idx < len { context[idx] } else { out[idx - len] };
            out.push(tok);
        }
        out
    }

    /// The words of the match [`NGram::lookup`] continues (0: none). Its drafts are kept far
    /// more often after a longer match: on SmolLM2-135M's greedy text for the bench prompts, a
    /// first draft after a match of 1, 2 and 3 words was the target's 24 %, 41 % and 84 % of
    /// the time (207, 81 and 226 positions).
    pub fn matched(&self, context: &[u32]) -> usize {
        self.latest_match(context).map_or(0, |(_, n)| n)
    }

    /// Where the continuation of the context's latest earlier match of its last n tokens
    /// starts, and n: the longest n from `max_n` down to `min_n` that has a match.
    fn latest_match(&self, context: &[u32]) -> Option<(usize, usize)> {
        let len = context.len();
        (self.min_n.max(1)..=self.max_n).rev().filter(|&n| len > n).find_map(|n| {
            let pattern = &context[len - n..];
            // (the latest start j < len - n with context[j..j + n] == pattern)
            (0..len - n).rev().find(|&j| &context[j..j + n] == pattern).map(|j| (j + n, n))
        })
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
pub(crate) fn add_breadth_first(tree: &mut TokenTree, paths: &[Vec<u32>], budget: usize) {
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
/// sized by the loop. A draft model's sampled chain (drawn with the target's noise) merges as a
/// greedy one does.
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

    fn target_pass<'a>(&'a mut self, pass: Kept<'a>) -> LocalFuture<'a, Result<usize>> {
        self.draft.target_pass(pass)
    }

    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
        let Ask { context, budget, sampling } = ask;
        Box::pin(async move {
            let proposal = self.draft.propose(Ask { context, budget, sampling }).await?;
            let root = context.last().copied().unwrap_or(0);
            let (mut tree, sized, steps) = match proposal {
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

    fn propose<'a>(&'a mut self, ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
        let Ask { context, budget, .. } = ask;
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
    use crate::sampling::SamplingParams;

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
        // the words matched: the longest n-gram with an earlier match
        let matched = |c: &[u32]| g.matched(c);
        assert_eq!((matched(&[1, 2, 3, 9, 1, 2, 3]), matched(&[4, 5, 4, 5])), (3, 2));
        assert_eq!((matched(&[7, 1, 6, 1, 8, 9, 1]), matched(&[1, 2, 3, 4]), matched(&[])), (1, 0, 0));
        assert_eq!(NGram { max_n: 2, ..g }.matched(&[1, 2, 3, 9, 1, 2, 3]), 2);
    }

    /// A draft proposing a fixed chain, or a fixed tree it says it sized.
    struct Fixed(Vec<u32>, Option<TokenTree>);

    impl Draft for Fixed {
        fn kind(&self) -> DraftKind {
            DraftKind::Eagle
        }

        fn propose<'a>(&'a mut self, _ask: Ask<'a>) -> LocalFuture<'a, Result<Proposal>> {
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
            let params = SamplingParams::greedy();
            pollster::block_on(ensemble.propose(Ask { context: &context, budget, sampling: &params }))
                .expect("propose")
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
