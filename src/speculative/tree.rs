//! Token trees: several drafted continuations verified in one target pass.
//!
//! A tree's node 0 is the root, the last committed token (which the target has not run yet);
//! every other node is a drafted token whose parent comes before it. The nodes, in this order,
//! are the rows of one tree pass ([`Model::forward_tree`](crate::model::Model::forward_tree)):
//! each row sees only its ancestors, so its logits are those of its root-to-node path alone. A
//! chain is the tree where each node is its predecessor's only child.
//!
//! - **Greedy** ([`TokenTree::verify_greedy`]): follow the child holding the target's argmax,
//!   as SpecInfer and Medusa verify trees; the output is the target's greedy output.
//! - **Sampling** ([`TokenTree::verify_sampled`]), for deterministic drafts (one-hot q: n-gram
//!   continuations, greedy drafts): the multi-candidate rule of SpecInfer (Miao et al., arXiv
//!   2305.09781) and EAGLE. At a node with target distribution p, try its children in order:
//!   accept child x with probability p(x); on rejection p becomes norm(p without x) and the next
//!   child is tried; when none is accepted, the next token is drawn from what is left of p. This
//!   is sampling from p one question at a time ("x1? else x2? ..."), so every emitted token has
//!   exactly the target's distribution; for a chain it is [`verify_sampled`](super::verify_sampled)
//!   with one-hot q, using the same uniforms. The decode loop runs it on the GPU:
//!   [`SampledCycle::check_tree`](super::SampledCycle::check_tree) runs the same rule as one draw
//!   from p per node, followed down the tree by the greedy rule's walk.

use super::verify::Dist;
use crate::error::{Error, Result};
use crate::gpu::MAX_TREE;
use crate::sampling::Rng;

/// A token tree (see the module's doc). Children of one parent hold distinct tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    /// `parent[i]` for i >= 1; `parent[0] = 0` (the root).
    parent: Vec<usize>,
    depth: Vec<usize>,
}

/// What an acceptance rule keeps of a verified tree (the greedy rule's, or the sampled one's:
/// [`TokenTree::verify_sampled`]): the accepted path and the target's token after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeVerdict {
    /// The accepted root-to-node path, as node indices (`path[0] = 0`, the root).
    pub path: Vec<usize>,
    /// The target's token after the path (its argmax at the path's last node).
    pub next: u32,
}

impl TokenTree {
    /// A tree of the root alone.
    pub fn new(root: u32) -> TokenTree {
        TokenTree { tokens: vec![root], parent: vec![0], depth: vec![0] }
    }

    /// The root followed by `chain`, each token the child of the one before.
    pub fn chain(root: u32, chain: &[u32]) -> TokenTree {
        let mut tree = TokenTree::new(root);
        let mut at = 0;
        for &t in chain {
            at = tree.child(at, t).unwrap_or(at);
        }
        tree
    }

    /// The root followed by `chain`, and below the chain's node at depth d (the root for d = 0)
    /// the tokens `siblings[d]` as leaves (a draft's next most likely tokens at each depth),
    /// shallow first, up to `budget` nodes in all.
    pub fn chain_with_siblings(root: u32, chain: &[u32], siblings: &[Vec<u32>], budget: usize) -> TokenTree {
        let mut tree = TokenTree::chain(root, chain);
        for (depth, alts) in siblings.iter().enumerate().take(chain.len()) {
            for &alt in alts {
                let path: Vec<u32> = chain[..depth].iter().copied().chain([alt]).collect();
                tree.insert(&path, budget);
            }
        }
        tree
    }

    /// The child of `parent` holding `token`: the existing one, else a new node; `None` when the
    /// tree is full ([`MAX_TREE`] nodes) or `parent` is not a node.
    pub fn child(&mut self, parent: usize, token: u32) -> Option<usize> {
        if parent >= self.tokens.len() {
            return None;
        }
        if let Some(c) = self.children(parent).find(|&c| self.tokens[c] == token) {
            return Some(c);
        }
        if self.tokens.len() >= MAX_TREE {
            return None;
        }
        self.tokens.push(token);
        self.parent.push(parent);
        self.depth.push(self.depth[parent] + 1);
        Some(self.tokens.len() - 1)
    }

    /// Adds `path` below the root, sharing the nodes it has in common with the tree, up to
    /// `budget` nodes in all. Returns how many of its tokens are in the tree.
    pub fn insert(&mut self, path: &[u32], budget: usize) -> usize {
        let mut at = 0;
        for (i, &t) in path.iter().enumerate() {
            let existing = self.children(at).find(|&c| self.tokens[c] == t);
            match existing {
                Some(c) => at = c,
                None if self.len() < budget.min(MAX_TREE) => at = self.child(at, t).unwrap_or(at),
                None => return i,
            }
        }
        path.len()
    }

    /// Node `node`'s depth (the root's 0; 0 for no node).
    pub fn depth(&self, node: usize) -> usize {
        self.depth.get(node).copied().unwrap_or(0)
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the tree is the root alone.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 1
    }

    /// Every node's token, the root first: the rows of the tree pass.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Every node's parent (the root's is 0, itself).
    pub fn parents(&self) -> &[usize] {
        &self.parent
    }

    /// The children of `node`, in the order they were added.
    pub fn children(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        (1..self.tokens.len()).filter(move |&c| self.parent[c] == node)
    }

    /// The deepest node's depth (the longest path a verify pass can accept).
    pub fn max_depth(&self) -> usize {
        self.depth.iter().copied().max().unwrap_or(0)
    }

    /// Whether every node has at most one child.
    pub fn is_chain(&self) -> bool {
        (1..self.len()).all(|c| self.parent[c] == c - 1)
    }

    /// The first branch: from the root, each node's first child (a draft's most likely chain).
    pub fn first_branch(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut node = 0;
        while let Some(c) = self.children(node).next() {
            out.push(self.tokens[c]);
            node = c;
        }
        out
    }

    /// How many of `tokens` follow a path down the tree from the root (each the token of a child
    /// of the node before).
    pub fn follow(&self, tokens: &[u32]) -> usize {
        let mut at = 0;
        for (i, &t) in tokens.iter().enumerate() {
            match self.children(at).find(|&c| self.tokens[c] == t) {
                Some(c) => at = c,
                None => return i,
            }
        }
        tokens.len()
    }

    /// Per node, its rank path: the position of each node on its root-to-node path among its
    /// parent's children, in the order they were added (a draft adds them most likely first).
    /// The root's is empty; `[0, 1]` is the second child of the first child. Nodes of one rank
    /// path play the same part in every tree a draft proposes, so the schedule measures their
    /// acceptance by it ([`super::Schedule::size_tree`]).
    pub fn rank_paths(&self) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(self.len());
        out.push(Vec::new());
        for i in 1..self.len() {
            let p = self.parent[i];
            let rank = (1..i).filter(|&c| self.parent[c] == p).count();
            let mut path = out[p].clone();
            path.push(u8::try_from(rank).unwrap_or(u8::MAX));
            out.push(path);
        }
        out
    }

    /// The nodes with `keep[i]` (the root always), in their order: a tree when every kept node's
    /// parent is kept (a node whose parent is not is dropped with it).
    pub fn subtree(&self, keep: &[bool]) -> TokenTree {
        let mut tree = TokenTree::new(self.tokens[0]);
        let mut at: Vec<Option<usize>> = vec![Some(0); self.len()];
        for i in 1..self.len() {
            at[i] = match (keep.get(i), at[self.parent[i]]) {
                (Some(true), Some(p)) => tree.child(p, self.tokens[i]),
                _ => None,
            };
        }
        tree
    }

    /// Per node, its ancestors as bits (bit j: node j is it or an ancestor): the tree pass's mask.
    pub fn ancestors(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let own = 1u32 << i;
            out.push(if i == 0 { own } else { out[self.parent[i]] | own });
        }
        out
    }

    /// The greedy rule: from the root, follow the child holding the target's argmax at the
    /// current node while there is one. `argmax[i]` is the target's argmax at node i. Given
    /// instead one independent draw from the target's distribution at each node, it is the
    /// sampling rule ([`SampledCycle::check_tree`](super::SampledCycle::check_tree)'s way).
    pub fn verify_greedy(&self, argmax: &[u32]) -> Result<TreeVerdict> {
        if argmax.len() != self.len() {
            return Err(Error::InvalidArgument(format!(
                "a tree of {} nodes verified with {} rows",
                self.len(),
                argmax.len()
            )));
        }
        let mut path = vec![0];
        let mut at = 0;
        while let Some(c) = self.children(at).find(|&c| self.tokens[c] == argmax[at]) {
            path.push(c);
            at = c;
        }
        Ok(TreeVerdict { path, next: argmax[at] })
    }

    /// The sampling rule (see the module's doc). `p[i]` is the target's distribution at node i
    /// (after temperature / top-k / top-p). One uniform per child tried, one for the last draw.
    pub fn verify_sampled(&self, p: &[Dist], rng: &mut Rng) -> Result<TreeVerdict> {
        if p.len() != self.len() {
            return Err(Error::InvalidArgument(format!(
                "a tree of {} nodes verified with {} distributions",
                self.len(),
                p.len()
            )));
        }
        let mut path = vec![0];
        let mut at = 0;
        'down: loop {
            let mut left = p[at].clone();
            for c in self.children(at) {
                let x = self.tokens[c];
                if rng.next_f64() < left.prob(x) {
                    path.push(c);
                    at = c;
                    continue 'down;
                }
                left = left.residual(&Dist::one_hot(x));
            }
            return Ok(TreeVerdict { path, next: left.draw(rng) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_are_one_branch_and_the_mask_follows_parents() {
        let mut t = TokenTree::chain(7, &[1, 2, 3]);
        assert!(t.is_chain());
        assert_eq!(t.insert(&[1, 2, 9], 16), 3); // shares 1, 2; adds 9 under 2
        assert_eq!(t.insert(&[4], 16), 1);
        assert_eq!(t.tokens(), &[7, 1, 2, 3, 9, 4]);
        assert_eq!(t.ancestors(), vec![0b1, 0b11, 0b111, 0b1111, 0b10111, 0b100001]);
        assert_eq!(t.max_depth(), 3);
        assert!(!t.is_chain());
        // the budget counts nodes, the root included
        assert_eq!(t.insert(&[5, 6], 7), 1);
        assert_eq!(t.len(), 7);
    }

    #[test]
    fn rank_paths_and_subtrees_follow_the_order_children_came_in() {
        let mut t = TokenTree::chain(7, &[1, 2]);
        t.insert(&[4], 16); // node 3: the root's second child
        t.insert(&[1, 5], 16); // node 4: node 1's second child
        t.insert(&[4, 6], 16); // node 5: below node 3
        let ranks: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0, 0], vec![1], vec![0, 1], vec![1, 0]];
        assert_eq!(t.rank_paths(), ranks);
        let kept = t.subtree(&[true, true, false, true, true, true]);
        assert_eq!(kept.tokens(), &[7, 1, 4, 5, 6]);
        assert_eq!(kept.parents(), &[0, 0, 0, 1, 2]);
        assert_eq!(kept.rank_paths()[3], vec![0, 0], "node 1's only child now");
        // a node whose parent goes, goes too
        let kept = t.subtree(&[true, false, true, true, false, true]);
        assert_eq!(kept.tokens(), &[7, 4, 6]);
        assert_eq!(t.subtree(&[true; 6]), t);
        // the tokens a path follows down from the root
        assert_eq!((t.follow(&[4, 6, 9]), t.follow(&[1, 5]), t.follow(&[2]), t.follow(&[])), (2, 2, 0, 0));
        assert_eq!(t.first_branch(), [1, 2]);
    }

    #[test]
    fn the_greedy_rule_follows_the_argmax_down_the_tree() {
        let mut t = TokenTree::chain(7, &[1, 2, 3]);
        t.insert(&[1, 5, 6], 16); // nodes 4 (5 under 1), 5 (6 under 5)
                                  // argmax at root 1, at node 1 -> 5 (the branch), at node 4 -> 6, at node 5 -> 8
        let argmax = [1, 5, 0, 0, 6, 8];
        let v = t.verify_greedy(&argmax).expect("verdict");
        assert_eq!(v, TreeVerdict { path: vec![0, 1, 4, 5], next: 8 });
        // the root's argmax matches no child: nothing accepted
        let v = t.verify_greedy(&[9, 0, 0, 0, 0, 0]).expect("verdict");
        assert_eq!(v, TreeVerdict { path: vec![0], next: 9 });
        assert!(t.verify_greedy(&[1]).is_err());
    }
}
