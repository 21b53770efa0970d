//! The choice of K, the number of draft tokens per verify pass.
//!
//! [`KPolicy::Fixed`] always asks for K. [`KPolicy::Adaptive`] (the default) picks, before each
//! cycle, the K that maximises expected tokens per second on this adapter with this draft:
//!
//! ```text
//!   E(K) = 1 + sum_{i=1..K} prod_{j<=i} a_j        expected tokens per cycle
//!   T(K) = K * t_draft + t_verify(K + 1)            seconds per cycle
//!   K*   = argmax_{1 <= K <= max} E(K) / T(K)
//! ```
//!
//! where `a_j` is the measured acceptance rate at draft position j (given position j was
//! reached), `t_draft` the measured time of one draft token and `t_verify(n)` the measured time
//! of a verify pass over n rows. All three are running averages that follow drift; nothing comes
//! from a fixed table. Before a quantity is measured a mild prior stands in (acceptance 0.7, a
//! verify pass growing 10% per row), which the first cycles replace. K >= 1 always, so
//! acceptance keeps being measured.

use super::draft::TreeCosts;
use crate::gpu::{MATMUL_ROWS, MAX_TREE};
use crate::model::MAX_BATCH;

/// How K is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KPolicy {
    /// Always K (capped by the context and the tokens still wanted).
    Fixed(usize),
    /// From measured acceptance and costs, between 1 and `max`.
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
        }
    }

    /// The drafted nodes a token tree may hold when the schedule picked `k`: the rows of the
    /// verify pass's last matmul row tile ([`MATMUL_ROWS`] rows share each weight load, and a
    /// partial tile costs what a full one does), so K + 1 rows round up to a multiple of it.
    /// A chain uses K of them; a tree fills the rest at about no cost.
    pub fn tree_nodes(&self, k: usize) -> usize {
        let rows = (k + 1).next_multiple_of(MATMUL_ROWS as usize).min(MAX_TREE);
        rows - 1
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

    /// The K to draft next, at most `cap` (room left in the context, tokens still wanted).
    pub fn pick(&self, cap: usize) -> usize {
        let cap = cap.min(MAX_BATCH - 1);
        match self.policy {
            KPolicy::Fixed(k) => k.min(cap),
            KPolicy::Adaptive { max } => {
                let max = max.min(cap);
                let mut best = (max.min(1), 0.0);
                let mut expected = 1.0;
                let mut reach = 1.0;
                for k in 1..=max {
                    reach *= self.acceptance(k - 1);
                    expected += reach;
                    let t = k as f64 * self.draft_seconds() + self.verify_seconds(k + 1);
                    let rate = if t > 0.0 { expected / t } else { expected };
                    if rate > best.1 {
                        best = (k, rate);
                    }
                }
                best.0
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_k_is_capped() {
        let s = Schedule::new(KPolicy::Fixed(5));
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
        // Nothing accepted and a draft token costs a tenth of a verify pass: draft one (the minimum).
        for _ in 0..50 {
            s.observe_draft(1, 0.1);
        }
        for _ in 0..300 {
            s.observe_acceptance(4, 0);
        }
        assert_eq!(s.pick(100), 1);
        // Verify cost proportional to rows (compute-bound adapter), good acceptance: small K.
        let mut s = Schedule::new(KPolicy::Adaptive { max: 16 });
        for rows in 1..=17 {
            s.observe_verify(rows, rows as f64);
        }
        for _ in 0..50 {
            s.observe_acceptance(8, 6);
        }
        assert!(s.pick(100) <= 2, "{}", s.pick(100));
    }
}
