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
//!   the best `budget.nodes` candidates, a subtree of the root. One submission and one read-back
//!   per depth (the choice of the next depth's nodes is made here, on the CPU).
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

use super::draft::{Draft, DraftBudget, LocalFuture, Proposal};
use super::tree::TokenTree;
use crate::error::Result;
use crate::gpu::MAX_TREE;
use crate::model::{EagleHead, Ranked, TreeRow, EAGLE_STORE_SLOTS, MAX_EAGLE_WIDTH};
use crate::sampling::{Rng, SamplingParams};

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
    /// The predicted accepted nodes of the last proposal, until its verify pass is seen.
    predicted: Option<f64>,
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

    /// The head, to draft with it in another way.
    pub fn into_head(self) -> EagleHead {
        self.head
    }
}

impl Draft for Eagle {
    fn name(&self) -> &str {
        "eagle"
    }

    fn prefill<'a>(&'a mut self, _prompt: &'a [u32]) -> LocalFuture<'a, Result<usize>> {
        // the prompt's features arrive through target_pass, one prefill chunk at a time
        self.predicted = None;
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
            if let Some(predicted) = self.predicted.take() {
                // the verify pass of the last proposal: its kept rows are the root and the
                // accepted nodes
                let (a, p) = self.calibration;
                let accepted = n.saturating_sub(1) as f64;
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
            let siblings = match self.shape {
                EagleTree::Dynamic { width } => return self.dynamic(root, depth, budget, width).await,
                EagleTree::Chain { siblings } => siblings,
            };
            let ranked = self.head.draft(depth - 1).await?;
            let chain: Vec<u32> = ranked.iter().map(|ids| ids[0]).collect();
            let siblings: Vec<Vec<u32>> =
                ranked.iter().map(|ids| ids[1..=siblings.min(ids.len() - 1)].to_vec()).collect();
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

impl Eagle {
    /// EAGLE-2's dynamic tree below `root`: at most `depth` deep, `budget.nodes` drafted nodes
    /// (or as many as its costs make worth it), expanding up to `width` nodes per depth (see the
    /// module's doc).
    async fn dynamic(
        &mut self,
        root: u32,
        depth: usize,
        budget: DraftBudget,
        width: usize,
    ) -> Result<Proposal> {
        let nodes = match budget.costs {
            Some(c) => c.max_nodes,
            None => budget.nodes.max(depth),
        }
        .clamp(1, MAX_TREE - 1);
        let calibration = self.calibration();
        // the nodes worth verifying after `passes` draft passes
        let size = |tree: &DraftTree, passes: usize| match &budget.costs {
            Some(c) => c.best_nodes(&tree.chances(calibration, nodes), passes),
            None => nodes,
        };
        let width = width.min(nodes);
        let mut tree = DraftTree::new(root);
        // the root's children, and (when deeper nodes are wanted) the expansion of the best
        // `width` of them: the root's first ids, expanded into store slots 1..=width
        let first = if depth >= 2 { width } else { 0 };
        let ranked = self.head.expand_root(first).await?;
        let mut steps = usize::from(first > 0);
        tree.add_children(0, &ranked.ids[0], &ranked.logp[0]);
        let expanded: Vec<usize> = ranked.ids[0][..first].iter().filter_map(|&t| tree.child(0, t)).collect();
        tree.take_ranks(
            &expanded,
            &Ranked { ids: ranked.ids[1..].to_vec(), logp: ranked.logp[1..].to_vec() },
            1,
        );
        let mut next_slot = 1 + first;
        for d in 2..depth {
            let front = tree.frontier(d, width, size(&tree, steps + 1));
            let rows = tree.pass_rows(&front);
            let room = self.head.context().saturating_sub(self.head.len());
            if front.is_empty()
                || rows.len() > room.min(MAX_TREE)
                || next_slot + front.len() > EAGLE_STORE_SLOTS
            {
                break;
            }
            let ranked = self.head.expand(&rows, front.len(), next_slot).await?;
            steps += 1;
            tree.take_ranks(&front, &ranked, next_slot);
            next_slot += front.len();
        }
        let chosen = size(&tree, steps);
        if budget.costs.is_some() {
            self.predicted = Some(tree.chances(1.0, chosen).iter().sum());
        }
        let (tree, tokens) = tree.select(chosen);
        Ok(Proposal { tokens, steps, tree: Some(tree).filter(|t| !t.is_chain()), q: None })
    }
}

/// A dynamic tree's candidates (node 0: the root) with their scores, as the head ranks them.
#[derive(Clone, Debug)]
struct DraftTree {
    nodes: Vec<Node>,
}

#[derive(Clone, Debug)]
struct Node {
    token: u32,
    parent: usize,
    depth: usize,
    /// The sum of the path's draft log-probabilities (0 at the root).
    score: f64,
    /// The store slot of its predicted feature, once expanded (the root's: 0).
    slot: Option<usize>,
}

impl DraftTree {
    fn new(root: u32) -> DraftTree {
        DraftTree { nodes: vec![Node { token: root, parent: 0, depth: 0, score: 0.0, slot: Some(0) }] }
    }

    /// The child of `parent` holding `token`, if it is a candidate.
    fn child(&self, parent: usize, token: u32) -> Option<usize> {
        (1..self.nodes.len()).find(|&i| self.nodes[i].parent == parent && self.nodes[i].token == token)
    }

    /// Adds `ids` (with their log-probabilities) as candidates below `parent`, once each.
    fn add_children(&mut self, parent: usize, ids: &[u32], logp: &[f32]) {
        for (&token, &lp) in ids.iter().zip(logp) {
            if self.child(parent, token).is_none() {
                let (depth, score) = (self.nodes[parent].depth + 1, self.nodes[parent].score + lp as f64);
                self.nodes.push(Node { token, parent, depth, score, slot: None });
            }
        }
    }

    /// Records that `expanded[i]` was expanded into store slot `first_slot + i` and ranked its
    /// children as `ranked`'s row i.
    fn take_ranks(&mut self, expanded: &[usize], ranked: &Ranked, first_slot: usize) {
        for (i, &v) in expanded.iter().enumerate() {
            self.nodes[v].slot = Some(first_slot + i);
            self.add_children(v, &ranked.ids[i], &ranked.logp[i]);
        }
    }

    /// The candidates, best first: a higher score, then a shallower node, then an older one (so a
    /// node always comes after its parent, whose score is at least its own).
    fn ranking(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (1..self.nodes.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&self.nodes[a], &self.nodes[b]);
            y.score.total_cmp(&x.score).then(x.depth.cmp(&y.depth)).then(a.cmp(&b))
        });
        order
    }

    /// The best `n` candidates' chances of acceptance, best first: `calibration * exp(score)`,
    /// at most 1.
    fn chances(&self, calibration: f64, n: usize) -> Vec<f64> {
        let ranked = self.ranking().into_iter().take(n);
        ranked.map(|v| (calibration * self.nodes[v].score.exp()).min(1.0)).collect()
    }

    /// The nodes to expand at `depth`: unexpanded candidates there that rank among the best
    /// `nodes` (a node ranked lower cannot be chosen, nor can its children), best first, at most
    /// `width`.
    fn frontier(&self, depth: usize, width: usize, nodes: usize) -> Vec<usize> {
        self.ranking()
            .into_iter()
            .take(nodes)
            .filter(|&v| self.nodes[v].depth == depth && self.nodes[v].slot.is_none())
            .take(width)
            .collect()
    }

    /// The rows of the pass expanding `front`: their ancestors below the root (by depth, then
    /// age), then `front` itself, last, where its rows are projected.
    fn pass_rows(&self, front: &[usize]) -> Vec<TreeRow> {
        let mut order: Vec<usize> = Vec::new();
        for &v in front {
            let mut a = self.nodes[v].parent;
            while a != 0 {
                if !order.contains(&a) {
                    order.push(a);
                }
                a = self.nodes[a].parent;
            }
        }
        order.sort_by_key(|&a| (self.nodes[a].depth, a));
        order.extend_from_slice(front);
        let mut bits: Vec<u32> = Vec::with_capacity(order.len());
        for (i, &v) in order.iter().enumerate() {
            let parent = self.nodes[v].parent;
            let above = order[..i].iter().position(|&a| a == parent).map_or(0, |j| bits[j]);
            bits.push(above | 1u32.checked_shl(i as u32).unwrap_or(0));
        }
        order
            .iter()
            .zip(bits)
            .map(|(&v, ancestors)| TreeRow {
                token: self.nodes[v].token,
                input: self.nodes[self.nodes[v].parent].slot.unwrap_or(0),
                ancestors,
            })
            .collect()
    }

    /// The best `nodes` candidates as a token tree (children best first), and its first branch
    /// (from the root, each node's best child).
    fn select(&self, nodes: usize) -> (TokenTree, Vec<u32>) {
        let mut chosen: Vec<usize> = self.ranking().into_iter().take(nodes).collect();
        chosen.sort_by_key(|&v| self.nodes[v].depth); // stable: best first within a depth
        let mut tree = TokenTree::new(self.nodes[0].token);
        let mut at = vec![None; self.nodes.len()];
        at[0] = Some(0);
        for v in chosen {
            if let Some(p) = at[self.nodes[v].parent] {
                at[v] = tree.child(p, self.nodes[v].token);
            }
        }
        let mut branch = Vec::new();
        let mut node = 0;
        while let Some(c) = tree.children(node).next() {
            branch.push(tree.tokens()[c]);
            node = c;
        }
        (tree, branch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(rows: &[&[(u32, f32)]]) -> Ranked {
        Ranked {
            ids: rows.iter().map(|r| r.iter().map(|x| x.0).collect()).collect(),
            logp: rows.iter().map(|r| r.iter().map(|x| x.1).collect()).collect(),
        }
    }

    #[test]
    fn the_dynamic_tree_keeps_the_best_scoring_paths() {
        let ln = |p: f64| p.ln() as f32;
        let mut t = DraftTree::new(100);
        // the root's children: 1 (0.5), 2 (0.3), 3 (0.1)
        t.add_children(0, &[1, 2, 3], &[ln(0.5), ln(0.3), ln(0.1)]);
        // expanding 1 and 2 (slots 1, 2): 1 -> 11 (0.9), 12 (0.05); 2 -> 21 (0.5), 22 (0.4)
        let (n1, n2) = (1, 2);
        let r = ranked(&[&[(11, ln(0.9)), (12, ln(0.05))], &[(21, ln(0.5)), (22, ln(0.4))]]);
        t.take_ranks(&[n1, n2], &r, 1);
        // scores: 11 0.45, 21 0.15, 22 0.12, 3 0.1, 12 0.025
        let names: Vec<u32> = t.ranking().iter().map(|&v| t.nodes[v].token).collect();
        assert_eq!(names, [1, 11, 2, 21, 22, 3, 12]);
        // with 4 nodes to fill, 22 (5th) is out: the frontier at depth 2 is 11 and 21
        let front = t.frontier(2, 4, 4);
        let tokens: Vec<u32> = front.iter().map(|&v| t.nodes[v].token).collect();
        assert_eq!(tokens, [11, 21]);
        assert_eq!(t.frontier(2, 1, 4).len(), 1, "the width caps it");
        // their pass: ancestors 1 and 2 first, then 11 (child of row 0) and 21 (child of row 1);
        // each reads its parent's feature
        let rows = t.pass_rows(&front);
        let got: Vec<(u32, usize, u32)> = rows.iter().map(|r| (r.token, r.input, r.ancestors)).collect();
        assert_eq!(got, [(1, 0, 0b1), (2, 0, 0b10), (11, 1, 0b101), (21, 2, 0b1010)]);
        // the best 5: 1, 11, 2, 21, 22 -> the tree 100 -> {1 -> 11, 2 -> {21, 22}}
        let (tree, branch) = t.select(5);
        assert_eq!(tree.tokens(), &[100, 1, 2, 11, 21, 22]);
        assert_eq!(tree.parents(), &[0, 0, 0, 1, 2, 2]);
        assert_eq!(branch, [1, 11]);
        // among equal scores the shallower node goes first
        let mut t = DraftTree::new(0);
        t.add_children(0, &[5, 6], &[0.0, 0.0]);
        t.take_ranks(&[1], &ranked(&[&[(7, 0.0)]]), 1);
        let (tree, branch) = t.select(2);
        assert_eq!((tree.tokens(), branch.as_slice()), (&[0, 5, 6][..], &[5][..]));
    }
}
