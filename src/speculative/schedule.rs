//! The choice of K, the number of draft tokens per verify pass.
//!
//! [`KPolicy::Fixed`] always asks for K. [`KPolicy::Adaptive`] (the default) picks, before each
//! cycle, the K that maximises expected tokens per second on this adapter with this draft:
//!
//! ```text
//!   E(K) = 1 + sum_{i=1..K} prod_{j<=i} a_j        expected tokens per cycle
//!   T(K) = K * t_draft + t_verify(K + 1)            seconds per cycle
//!   K*   = argmax_{1 <= K <= max} E(K) / T(K),  or 0 (a plain step) when 1 / t_verify(1) is more
//! ```
//!
//! where `a_j` is the measured acceptance rate at draft position j (given position j was
//! reached), `t_draft` the measured time of one draft token and `t_verify(n)` the measured time
//! of a verify pass over n rows. All three are running averages that follow drift; nothing comes
//! from a fixed table. Before a quantity is measured a mild prior stands in (acceptance 0.7, a
//! verify pass growing 10% per row), which the first cycles replace.
//!
//! K = 0 is a plain step (one row, no draft): the choice when even the best K's expected rate
//! is below a plain step's `1 / t_verify(1)`. A draft that is rarely right, or an adapter where
//! a second row costs nearly a whole step (a CPU adapter), then costs the run little instead of
//! slowing every cycle. Acceptance is only measured by drafting, so a plain run still drafts
//! the best K every few cycles (a probe): first after [`PROBE_FIRST`] plain cycles, then after
//! twice as many each time drafting still does not pay, up to [`PROBE_MAX`]; a cycle that
//! drafts because it pays starts over. The plain step's own cost is measured once, by one
//! plain cycle, as soon as some verify pass has been timed.
//!
//! Token trees are sized the same way ([`Schedule::size_tree`]). A draft proposes its whole
//! tree (up to [`MAX_TREE`] rows); each node has a rank path ([`TokenTree::rank_paths`]: which
//! of its parent's candidates it is, down from the root), and the schedule measures how often a
//! node of each rank path was accepted when verified. The tree keeps the N nodes of highest
//! estimated chance `c` that maximise
//!
//! ```text
//!   (1 + sum of the N chances) / (t_draft + t_verify(N + 1))
//! ```
//!
//! (the expected accepted length is the sum of the nodes' chances of lying on the accepted path).
//! A rank path not yet measured starts from a prior: the product over its depths of
//! `a_d (1 - a_d)^rank`, the chance that the rank-th candidate is the first right one when each
//! is right with the depth's measured acceptance `a_d`. EAGLE's dynamic trees size themselves
//! from the head's scores ([`super::Eagle`]).

use std::collections::BTreeMap;

use super::draft::TreeCosts;
use super::tree::TokenTree;
use crate::gpu::{MATMUL_ROW_STEP, MAX_TREE};
use crate::model::MAX_BATCH;

/// How K is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KPolicy {
    /// Always K (capped by the context and the tokens still wanted).
    Fixed(usize),
    /// From measured acceptance and costs, between 1 and `max`, or 0 (a plain step) where
    /// drafting is not expected to pay.
    Adaptive { max: usize },
}

/// The largest K the adaptive choice takes unless told otherwise.
pub const DEFAULT_MAX_DRAFT_K: usize = 16;

impl KPolicy {
    /// `Fixed(k)` when a K is given, else adaptive up to `max`: what every front end's
    /// `draft_k` / `max_draft_k` pair means.
    pub fn new(draft_k: Option<usize>, max: usize) -> KPolicy {
        match draft_k {
            Some(k) => KPolicy::Fixed(k),
            None => KPolicy::Adaptive { max },
        }
    }
}

impl Default for KPolicy {
    fn default() -> Self {
        KPolicy::Adaptive { max: DEFAULT_MAX_DRAFT_K }
    }
}

/// Weight of the newest measurement in a running average.
const EMA: f64 = 0.2;
/// Decay of acceptance counts per observation (about the last 50 cycles count).
const DECAY: f64 = 0.98;
/// Prior acceptance rate and its weight in pseudo-observations.
const PRIOR_ACCEPT: f64 = 0.7;
const PRIOR_WEIGHT: f64 = 2.0;
/// Prior growth of a verify pass per extra row, relative to one row.
const PRIOR_ROW_COST: f64 = 0.1;
/// A rank path whose decayed count falls below this is forgotten (back to its prior).
const FORGET: f64 = 0.01;
/// The weight acceptance counts keep from one generation to the next.
const CARRY: f64 = 0.5;
/// Plain cycles before the first probe of a plain run, and the most between two probes.
pub const PROBE_FIRST: usize = 4;
pub const PROBE_MAX: usize = 64;

#[derive(Clone, Copy, Debug, Default)]
struct Avg {
    value: f64,
    seen: bool,
}

impl Avg {
    fn add(&mut self, x: f64) {
        self.value = if self.seen { self.value + EMA * (x - self.value) } else { x };
        self.seen = true;
    }
}

/// Measurements and the K they imply.
#[derive(Clone, Debug)]
pub struct Schedule {
    policy: KPolicy,
    /// Per draft position (0-based): decayed (reached, accepted) counts.
    accept: Vec<(f64, f64)>,
    /// Seconds per draft token.
    draft_token: Avg,
    /// Seconds per verify pass, by rows (index = rows - 1).
    verify: Vec<Avg>,
    /// Per tree node rank path: decayed (verified, accepted) counts.
    slots: BTreeMap<Vec<u8>, (f64, f64)>,
    /// Plain cycles since the last cycle that drafted, and the plain cycles the next probe waits
    /// for (see the module's doc).
    plain_run: usize,
    probe_after: usize,
}

impl Schedule {
    pub fn new(policy: KPolicy) -> Schedule {
        let max = match policy {
            KPolicy::Fixed(k) | KPolicy::Adaptive { max: k } => k.min(MAX_BATCH - 1),
        };
        Schedule {
            policy,
            accept: vec![(0.0, 0.0); max.max(1)],
            draft_token: Avg::default(),
            verify: vec![Avg::default(); MAX_BATCH],
            slots: BTreeMap::new(),
            plain_run: 0,
            probe_after: PROBE_FIRST,
        }
    }

    /// Starts the next generation under `policy`. The costs stay (a front end keeps one schedule
    /// per draft across requests, so a request starts from what the earlier ones measured); the
    /// acceptance counts weigh half as much (a new prompt may suit the draft better or worse),
    /// and a plain run probes again after [`PROBE_FIRST`] cycles.
    pub fn start(&mut self, policy: KPolicy) {
        let max = match policy {
            KPolicy::Fixed(k) | KPolicy::Adaptive { max: k } => k.min(MAX_BATCH - 1),
        };
        if self.accept.len() < max {
            self.accept.resize(max, (0.0, 0.0));
        }
        for (reached, accepted) in self.accept.iter_mut().chain(self.slots.values_mut()) {
            *reached *= CARRY;
            *accepted *= CARRY;
        }
        self.plain_run = 0;
        self.probe_after = PROBE_FIRST;
        self.policy = policy;
    }

    /// The policy K is chosen by.
    pub fn policy(&self) -> KPolicy {
        self.policy
    }

    /// The drafted nodes a token tree may hold when the schedule picked `k`: K + 1 rows rounded up
    /// to a multiple of [`MATMUL_ROW_STEP`] (a GPU's pass of up to 16 rows reads each weight once;
    /// each row it computes costs its arithmetic). A chain uses K of them; a tree fills the rest,
    /// at about no cost where the pass is bound by the weights' bytes (on CPU adapters each row
    /// costs its arithmetic; under an adaptive K trees are sized by the measured costs instead,
    /// [`Schedule::tree_costs`]).
    pub fn tree_nodes(&self, k: usize) -> usize {
        tree_nodes(k)
    }

    /// Under an adaptive K, the measured costs a draft that scores its nodes sizes its tree with
    /// ([`TreeCosts`]), for up to `max_nodes` drafted nodes; `None` under a fixed K
    /// (whose trees fill the node budget, the same on every run).
    pub fn tree_costs(&self, max_nodes: usize) -> Option<TreeCosts> {
        let KPolicy::Adaptive { .. } = self.policy else {
            return None;
        };
        let mut verify = [0f32; MAX_TREE];
        for (n, v) in verify.iter_mut().enumerate() {
            *v = self.verify_seconds(n + 1) as f32;
        }
        Some(TreeCosts {
            verify,
            draft_pass: self.draft_seconds() as f32,
            max_nodes: max_nodes.min(MAX_TREE - 1),
        })
    }

    /// Under an adaptive K, the part of `tree` worth verifying after a proposal that took
    /// `draft_seconds` (see the module's doc): the nodes of highest estimated chance, at least
    /// one, as many as maximise expected tokens per second (a chance never rises down a path,
    /// so they form a subtree). Returns it with each of its nodes' rank paths in `tree`, the
    /// slots [`Schedule::observe_tree`] records the verdict under (a node keeps its slot when an
    /// earlier candidate beside it is cut). Under a fixed K the tree is kept whole (the same on
    /// every run).
    pub fn size_tree(&self, tree: &TokenTree, draft_seconds: f64) -> (TokenTree, Vec<Vec<u8>>) {
        let slots = tree.rank_paths();
        let KPolicy::Adaptive { .. } = self.policy else {
            return (tree.clone(), slots);
        };
        let parents = tree.parents();
        let mut chance = vec![1.0f64; tree.len()];
        for i in 1..tree.len() {
            chance[i] = self.rank_path_chance(&slots[i]).min(chance[parents[i]]);
        }
        // parents come before their children in this order (never less likely, lower index)
        let mut order: Vec<usize> = (1..tree.len()).collect();
        order.sort_by(|&a, &b| chance[b].total_cmp(&chance[a]).then(a.cmp(&b)));
        let (mut best, mut best_rate, mut expected) = (1, f64::MIN, 1.0);
        for (n, &i) in order.iter().enumerate() {
            expected += chance[i];
            let t = draft_seconds + self.verify_seconds(n + 2);
            let rate = if t > 0.0 { expected / t } else { expected };
            if rate > best_rate {
                (best, best_rate) = (n + 1, rate);
            }
        }
        let mut keep = vec![false; tree.len()];
        keep[0] = true;
        for &i in order.iter().take(best) {
            keep[i] = true;
        }
        let kept = slots.into_iter().zip(&keep).filter(|(_, &k)| k).map(|(s, _)| s).collect();
        (tree.subtree(&keep), kept)
    }

    /// Estimated chance that a tree node of rank path `slot` ([`TokenTree::rank_paths`]) lies
    /// on the accepted path: measured, blended with the prior of the module's doc.
    pub fn rank_path_chance(&self, slot: &[u8]) -> f64 {
        let prior: f64 = slot
            .iter()
            .enumerate()
            .map(|(d, &rank)| {
                let a = self.acceptance(d);
                a * (1.0 - a).powi(i32::from(rank))
            })
            .product();
        let (seen, accepted) = self.slots.get(slot).copied().unwrap_or((0.0, 0.0));
        (accepted + prior * PRIOR_WEIGHT) / (seen + PRIOR_WEIGHT)
    }

    /// Records a verified tree: `slots[i]` is node i's rank path (from [`Schedule::size_tree`])
    /// and `path` the node indices of the accepted path.
    pub fn observe_tree(&mut self, slots: &[Vec<u8>], path: &[usize]) {
        for (seen, accepted) in self.slots.values_mut() {
            *seen *= DECAY;
            *accepted *= DECAY;
        }
        self.slots.retain(|_, (seen, _)| *seen >= FORGET);
        for (i, slot) in slots.iter().enumerate().skip(1) {
            let counts = self.slots.entry(slot.clone()).or_default();
            counts.0 += 1.0;
            if path.contains(&i) {
                counts.1 += 1.0;
            }
        }
    }

    /// The K to draft next, at most `cap` (room left in the context, tokens still wanted); under
    /// an adaptive K, 0 (a plain step) when drafting is not expected to pay (see the module's doc).
    pub fn pick(&mut self, cap: usize) -> usize {
        let cap = cap.min(MAX_BATCH - 1);
        let max = match self.policy {
            KPolicy::Fixed(k) => return k.min(cap),
            KPolicy::Adaptive { max } => max,
        };
        let (k, rate) = self.best_k(max.min(cap));
        if k == 0 {
            return 0;
        }
        // the plain step's cost, measured once as soon as some pass has been timed
        let timed = self.verify.iter().any(|v| v.seen);
        if timed && !self.verify[0].seen {
            return 0;
        }
        let plain = 1.0 / self.verify_seconds(1).max(f64::MIN_POSITIVE);
        if rate >= plain {
            self.plain_run = 0;
            self.probe_after = PROBE_FIRST;
            return k;
        }
        if self.plain_run >= self.probe_after {
            self.plain_run = 0;
            self.probe_after = (2 * self.probe_after).min(PROBE_MAX);
            return k;
        }
        self.plain_run += 1;
        0
    }

    /// The K in 1..=max of highest expected tokens per second, and that rate ((0, 0) when max is 0).
    fn best_k(&self, max: usize) -> (usize, f64) {
        let mut best = (0, 0.0);
        let mut expected = 1.0;
        let mut reach = 1.0;
        for k in 1..=max {
            reach *= self.acceptance(k - 1);
            expected += reach;
            let t = k as f64 * self.draft_seconds() + self.verify_seconds(k + 1);
            let rate = if t > 0.0 { expected / t } else { expected };
            if best.0 == 0 || rate > best.1 {
                best = (k, rate);
            }
        }
        best
    }

    /// Estimated acceptance rate at draft position `i` (0-based), given it was reached.
    pub fn acceptance(&self, i: usize) -> f64 {
        let (reached, accepted) = self.accept.get(i).copied().unwrap_or((0.0, 0.0));
        (accepted + PRIOR_ACCEPT * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
    }

    /// Estimated seconds per draft token.
    pub fn draft_seconds(&self) -> f64 {
        if self.draft_token.seen {
            self.draft_token.value
        } else {
            0.0
        }
    }

    /// Estimated seconds of a verify pass over `rows` rows: the measurement for that size, else a
    /// line through the nearest measured sizes, else the prior slope from the one measured size.
    pub fn verify_seconds(&self, rows: usize) -> f64 {
        let i = rows.clamp(1, MAX_BATCH) - 1;
        if self.verify[i].seen {
            return self.verify[i].value;
        }
        let below = (0..i).rev().find(|&j| self.verify[j].seen);
        let above = (i + 1..MAX_BATCH).find(|&j| self.verify[j].seen);
        let at = |j: usize| self.verify[j].value;
        let line =
            |a: usize, b: usize| at(a) + (at(b) - at(a)) * (i as f64 - a as f64) / (b as f64 - a as f64);
        match (below, above) {
            (Some(a), Some(b)) => line(a, b),
            (Some(b), None) => match (0..b).rev().find(|&j| self.verify[j].seen) {
                Some(a) => line(a, b).max(at(b)),
                None => at(b) * (1.0 + PRIOR_ROW_COST * (i - b) as f64),
            },
            (None, Some(a)) => at(a) / (1.0 + PRIOR_ROW_COST * (a - i) as f64),
            (None, None) => 1.0 + PRIOR_ROW_COST * i as f64,
        }
    }

    /// Records a verify pass over `rows` rows that took `seconds`.
    pub fn observe_verify(&mut self, rows: usize, seconds: f64) {
        if (1..=MAX_BATCH).contains(&rows) && seconds.is_finite() {
            self.verify[rows - 1].add(seconds);
        }
    }

    /// Records a proposal of `tokens` tokens that took `seconds`.
    pub fn observe_draft(&mut self, tokens: usize, seconds: f64) {
        if tokens > 0 && seconds.is_finite() {
            self.draft_token.add(seconds / tokens as f64);
        }
    }

    /// Records a GPU-resident cycle (the draft's `tokens` steps and the verify pass of
    /// `tokens + 1` rows in one submission) that took `seconds`: its draft share is what is left
    /// after the verify pass's estimated cost ([`Schedule::verify_seconds`], from CPU-driven
    /// passes, each one submission and one read-back as the cycle is), per token. So the draft's
    /// cost is the GPU-resident one, not that of CPU-driven steps with a read-back each. Nothing
    /// is recorded before some verify pass was timed, nor when the pass alone is estimated to take
    /// the whole cycle.
    pub fn observe_cycle(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !self.verify.iter().any(|v| v.seen) {
            return;
        }
        let draft = seconds - self.verify_seconds(tokens + 1);
        if draft > 0.0 {
            self.observe_draft(tokens, draft);
        }
    }

    /// Records that `accepted` of `drafted` tokens were accepted.
    pub fn observe_acceptance(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        for (i, slot) in self.accept.iter_mut().enumerate() {
            slot.0 *= DECAY;
            slot.1 *= DECAY;
            if i < drafted && i <= accepted {
                slot.0 += 1.0;
                if i < accepted {
                    slot.1 += 1.0;
                }
            }
        }
    }
}

/// [`Schedule::tree_nodes`]: the drafted nodes of a fixed K's token tree (the batch's too).
pub fn tree_nodes(k: usize) -> usize {
    let rows = (k + 1).next_multiple_of(MATMUL_ROW_STEP as usize).min(MAX_TREE);
    rows - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_k_is_capped() {
        let mut s = Schedule::new(KPolicy::Fixed(5));
        assert_eq!(s.pick(100), 5);
        assert_eq!(s.pick(2), 2);
        assert_eq!(s.pick(0), 0);
    }

    #[test]
    fn trees_fill_the_last_matmul_row_tile() {
        let s = Schedule::new(KPolicy::default());
        // K + 1 rows rounded up to a multiple of 4, less the root
        assert_eq!([1, 2, 3, 4, 7, 8, 31].map(|k| s.tree_nodes(k)), [3, 3, 3, 7, 7, 11, 31]);
    }

    /// The root 9, the chain 1 2 3 (nodes 1-3), and two next candidates at each depth: 4 5 below
    /// the root (nodes 4, 5), 6 7 below 1 (6, 7), 8 10 below 2 (8, 9).
    fn tree_with_siblings() -> TokenTree {
        TokenTree::chain_with_siblings(9, &[1, 2, 3], &[vec![4, 5], vec![6, 7], vec![8, 10]], 32)
    }

    #[test]
    fn trees_keep_the_nodes_worth_their_rows() {
        let tree = tree_with_siblings();
        let slots = tree.rank_paths();
        assert_eq!(tree.len(), 10);
        // Under a fixed K the whole tree.
        assert_eq!(Schedule::new(KPolicy::Fixed(3)).size_tree(&tree, 0.0).0, tree);
        // Rows cost: the chain always accepted, its siblings never: the chain alone.
        let mut s = Schedule::new(KPolicy::default());
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0 + 0.5 * rows as f64);
        }
        for _ in 0..100 {
            s.observe_tree(&slots, &[0, 1, 2, 3]);
        }
        assert_eq!(s.size_tree(&tree, 0.1).0, TokenTree::chain(9, &[1, 2, 3]));
        assert!(s.rank_path_chance(&[0, 0]) > 0.95 && s.rank_path_chance(&[1]) < 0.05);
        // Rows free: every node that may be accepted.
        let mut s = Schedule::new(KPolicy::default());
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0);
        }
        for _ in 0..100 {
            s.observe_tree(&slots, &[0, 1, 2, 3]);
        }
        assert_eq!(s.size_tree(&tree, 0.1).0, tree);
        // A costly draft makes the rows worth more than when drafting is free (each adds its
        // chance to a cycle whose fixed cost is larger): more nodes kept where each row costs a
        // tenth of a pass and a sibling is right one time in eight.
        let mut s = Schedule::new(KPolicy::default());
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0 + 0.1 * rows as f64);
        }
        for i in 0..160 {
            s.observe_tree(&slots, if i % 8 == 0 { &[0, 4] } else { &[0, 1, 2] });
        }
        let (free, costly) = (s.size_tree(&tree, 0.0).0, s.size_tree(&tree, 100.0).0);
        assert!(costly.len() > free.len(), "{} vs {}", costly.len(), free.len());
        assert!(free.tokens().contains(&2) && !free.tokens().contains(&10), "{free:?}");
    }

    #[test]
    fn a_node_keeps_its_rank_path_when_an_earlier_candidate_is_cut() {
        // The root's third candidate (token 5) is accepted two times in three, its second (4)
        // never: 5 is kept without 4, and its verdicts still count for rank path [2].
        let tree = tree_with_siblings();
        let slots = tree.rank_paths();
        let mut s = Schedule::new(KPolicy::default());
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0 + 0.3 * rows as f64);
        }
        for i in 0..100 {
            s.observe_tree(&slots, if i % 3 == 0 { &[0, 1, 7] } else { &[0, 5] });
        }
        let (kept, kept_slots) = s.size_tree(&tree, 0.0);
        assert!(kept.tokens().contains(&5) && !kept.tokens().contains(&4), "{kept:?}");
        assert_eq!(kept_slots.len(), kept.len());
        let at = kept.tokens().iter().position(|&t| t == 5).expect("kept");
        assert_eq!(kept_slots[at], vec![2]);
        assert_eq!(kept.rank_paths()[at], vec![1], "the second of the root's children in the cut tree");
        let before = s.rank_path_chance(&[2]);
        s.observe_tree(&kept_slots, &[0, at]);
        assert!(s.rank_path_chance(&[2]) > before && s.rank_path_chance(&[1]) < 0.05);
    }

    #[test]
    fn a_gpu_resident_cycle_times_the_draft_as_what_the_verify_pass_leaves() {
        let mut s = Schedule::new(KPolicy::Adaptive { max: 16 });
        // no verify pass timed yet: nothing to subtract, nothing recorded
        s.observe_cycle(4, 3.0);
        assert_eq!(s.draft_seconds(), 0.0);
        // CPU-driven calibration: a step 0.5 s (a read-back each), verify passes 1 s + 0.1 s a row
        s.observe_draft(2, 1.0);
        for rows in [1, 2, 5] {
            s.observe_verify(rows, 1.0 + 0.1 * (rows - 1) as f64);
        }
        // GPU-resident cycles of K = 4 taking 1.8 s: 0.4 s left for 4 steps, 0.1 s each
        for _ in 0..100 {
            s.observe_cycle(4, 1.8);
        }
        assert!((s.draft_seconds() - 0.1).abs() < 1e-6, "{}", s.draft_seconds());
        // K = 2 (3 rows, estimated between the 2- and 5-row passes: 1.2 s) taking 1.3 s
        for _ in 0..100 {
            s.observe_cycle(2, 1.3);
        }
        assert!((s.draft_seconds() - 0.05).abs() < 1e-6, "{}", s.draft_seconds());
        // a cycle faster than its verify pass's estimate leaves the draft's cost as it was
        s.observe_cycle(4, 1.0);
        s.observe_cycle(0, 5.0);
        assert!((s.draft_seconds() - 0.05).abs() < 1e-6, "{}", s.draft_seconds());
    }

    #[test]
    fn adaptive_k_follows_acceptance_and_cost() {
        let mut s = Schedule::new(KPolicy::Adaptive { max: 16 });
        // A cheap verify, a free draft, everything accepted: draft a lot.
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0 + 0.01 * rows as f64);
        }
        s.observe_draft(4, 0.0);
        for _ in 0..50 {
            s.observe_acceptance(16, 16);
        }
        assert!(s.pick(100) >= 12, "{}", s.pick(100));
        // Nothing accepted and a draft token costs a tenth of a verify pass: plain steps, but
        // the probes draft one (the best K) now and then.
        for _ in 0..50 {
            s.observe_draft(1, 0.1);
        }
        for _ in 0..300 {
            s.observe_acceptance(4, 0);
        }
        let picks: Vec<usize> = (0..=PROBE_FIRST).map(|_| s.pick(100)).collect();
        assert_eq!(picks[..PROBE_FIRST], [0; PROBE_FIRST]);
        assert_eq!(picks[PROBE_FIRST], 1);
        // Each row costs half a step (a compute-bound adapter), six drafts always right and the
        // seventh never: K = 6
        let mut s = Schedule::new(KPolicy::Adaptive { max: 16 });
        for rows in 1..=17 {
            s.observe_verify(rows, 1.0 + 0.5 * (rows - 1) as f64);
        }
        for _ in 0..50 {
            s.observe_acceptance(8, 6);
        }
        assert_eq!(s.pick(100), 6);
        // ... and when each row costs a whole step, drafting cannot pay: plain steps
        for rows in 1..=17 {
            for _ in 0..50 {
                s.observe_verify(rows, rows as f64);
            }
        }
        assert_eq!(s.pick(100), 0);
        // A fixed K is what was asked for, whatever the costs
        let mut s = Schedule::new(KPolicy::Fixed(3));
        for rows in 1..=17 {
            s.observe_verify(rows, rows as f64);
        }
        for _ in 0..50 {
            s.observe_acceptance(3, 0);
        }
        assert!((0..10).all(|_| s.pick(100) == 3));
        assert_eq!(s.pick(2), 2);
    }

    #[test]
    fn plain_steps_when_drafting_does_not_pay_with_probes_that_back_off() {
        let mut s = Schedule::new(KPolicy::Adaptive { max: 8 });
        // The first pass timed drafted (3 rows): the next cycle times a plain step once
        assert!(s.pick(100) >= 1, "untimed: the priors draft");
        s.observe_verify(3, 2.0);
        assert_eq!(s.pick(100), 0, "the plain step is timed first");
        // A CPU adapter (a second row costs most of a step) and a draft that is never right
        for rows in 1..=9 {
            s.observe_verify(rows, 1.0 + 0.9 * (rows - 1) as f64);
        }
        s.observe_draft(1, 0.01);
        for _ in 0..100 {
            s.observe_acceptance(2, 0);
        }
        let probes = |s: &mut Schedule, n: usize| -> Vec<usize> {
            (0..n).filter(|_| s.pick(100) > 0).collect::<Vec<_>>()
        };
        // probes after 4, 8, 16, 32, 64, 64 plain cycles
        let got = probes(&mut s, 200);
        let mut want = Vec::new();
        let (mut at, mut gap) = (0, PROBE_FIRST);
        while at + gap < 200 {
            at += gap;
            want.push(at);
            at += 1;
            gap = (2 * gap).min(PROBE_MAX);
        }
        assert_eq!(got, want);
        assert_eq!(got.len(), 6, "{got:?}");
        // The draft turns good: every cycle drafts again, and the probes start over when it fails
        for _ in 0..100 {
            s.observe_acceptance(2, 2);
        }
        assert!((0..20).all(|_| s.pick(100) >= 2));
        for _ in 0..100 {
            s.observe_acceptance(2, 0);
        }
        assert_eq!(probes(&mut s, PROBE_FIRST + 1), [PROBE_FIRST]);
        // No room to draft: no probe either
        assert!((0..200).all(|_| s.pick(0) == 0));
        // The next request (another policy) keeps the costs and, at half weight, the acceptance;
        // a plain run probes again after PROBE_FIRST cycles
        for _ in 0..3 {
            assert_eq!(s.pick(100), 0);
        }
        s.start(KPolicy::Fixed(12));
        assert_eq!(s.pick(100), 12);
        let before = s.accept[0];
        s.start(KPolicy::Adaptive { max: 16 });
        assert_eq!(s.accept[0], (before.0 * CARRY, before.1 * CARRY));
        assert_eq!(probes(&mut s, PROBE_FIRST + 1), [PROBE_FIRST], "still a draft that is never right");
        assert_eq!(
            (s.verify_seconds(1), s.acceptance(15)),
            (1.0, PRIOR_ACCEPT),
            "positions past 8 start at the prior"
        );
    }
}
