//! Acceptance rules: which drafted tokens the target keeps, and the token it adds after them.
//!
//! One verify pass of the target over `[last, x1..xK]` gives K+1 next-token distributions
//! `p1..pK+1` (`p_i` predicts the token at draft position i; `pK+1` follows `xK`). The rules here
//! are pure functions of those (slices in, [`Verdict`] out) and name three kinds of tokens, as
//! vLLM's rejection sampler does:
//!
//! - **accepted** tokens: the longest prefix `x1..xa` of the draft that the rule keeps;
//! - the **recovered** token: at the first rejection (position a+1 <= K), the target's own token
//!   for that position, drawn so that the output keeps the target's distribution;
//! - the **bonus** token: when all K drafts are accepted, a token drawn from `pK+1` (the verify
//!   pass computed it anyway).
//!
//! Either way every cycle yields `a + 1` tokens (1 <= a + 1 <= K + 1).
//!
//! **Greedy** ([`verify_greedy`]): keep `x_i` while `x_i == argmax p_i`; the recovered token is
//! `argmax p_{a+1}`, the bonus `argmax pK+1`. The output is token for token the target's greedy
//! output (the verify pass is batch-invariant: each row equals a one-token step bit for bit).
//!
//! **Sampling** ([`verify_sampled`]): speculative sampling of Leviathan, Kalman & Matias, "Fast
//! Inference from Transformers via Speculative Decoding" (arXiv 2211.17192), and Chen et al.,
//! "Accelerating Large Language Model Decoding with Speculative Sampling" (arXiv 2302.01318).
//! With `x_i ~ q_i` (the draft's distribution), accept `x_i` with probability
//! `min(1, p_i(x_i) / q_i(x_i))`; at the first rejection draw the recovered token from
//! `norm(max(0, p_i - q_i))`; if all K are accepted draw the bonus from `pK+1`. Each emitted
//! token then has exactly the distribution `p_i`. `p` and `q` must be the distributions AFTER
//! temperature / top-k / top-p ([`crate::sampling::distribution`]), so the output follows the
//! target's *sampling* distribution. A deterministic draft (n-gram lookup, greedy draft model)
//! has a one-hot `q` ([`Dist::one_hot`]); the rule then accepts `x` with probability `p(x)`.

use crate::error::{Error, Result};
use crate::sampling::{self, Rng, SamplingParams};

/// A probability distribution over token ids, kept sparse: `(token, probability)` pairs sorted by
/// token id, zero entries dropped.
#[derive(Clone, Debug, PartialEq)]
pub struct Dist(Vec<(u32, f64)>);

impl Dist {
    /// From `(token, probability)` pairs in any order (each token at most once); zeros are dropped.
    pub fn from_pairs(mut pairs: Vec<(u32, f64)>) -> Dist {
        pairs.retain(|&(_, p)| p > 0.0);
        pairs.sort_unstable_by_key(|&(t, _)| t);
        Dist(pairs)
    }

    /// The distribution that sampling with `params` draws from for this row of logits
    /// (one-hot on the argmax for greedy params).
    pub fn from_logits(logits: &[f32], params: &SamplingParams) -> Dist {
        Dist::from_pairs(sampling::distribution(logits, params))
    }

    /// All mass on `token`.
    pub fn one_hot(token: u32) -> Dist {
        Dist(vec![(token, 1.0)])
    }

    /// `P(token)`.
    pub fn prob(&self, token: u32) -> f64 {
        match self.0.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(i) => self.0[i].1,
            Err(_) => 0.0,
        }
    }

    /// The `(token, probability)` pairs, by ascending token id.
    pub fn pairs(&self) -> &[(u32, f64)] {
        &self.0
    }

    /// Draws one token (one uniform from `rng`).
    pub fn draw(&self, rng: &mut Rng) -> u32 {
        sampling::draw(&self.0, rng)
    }

    /// `norm(max(0, self - q))`: the recovered-token distribution after `q`'s token was
    /// rejected. Falls back to `self` when the difference has no mass (only possible through
    /// rounding, since a rejection needs `self(x) < q(x)` for the drafted x).
    pub fn residual(&self, q: &Dist) -> Dist {
        let mut out: Vec<(u32, f64)> =
            self.0.iter().map(|&(t, p)| (t, p - q.prob(t))).filter(|&(_, d)| d > 0.0).collect();
        let sum: f64 = out.iter().map(|&(_, d)| d).sum();
        if sum.is_nan() || sum <= 0.0 {
            return self.clone();
        }
        out.iter_mut().for_each(|(_, d)| *d /= sum);
        Dist(out)
    }
}

/// Whether the token after the accepted ones replaced a rejected draft or followed a full run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextKind {
    /// Drawn at the first rejected position (greedy: the target's argmax there).
    Recovered,
    /// Drawn from the last distribution after all drafts were accepted.
    Bonus,
}

/// The outcome of verifying one draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// How many draft tokens are kept (a prefix of the draft).
    pub accepted: usize,
    /// The target's token after them (recovered or bonus).
    pub next: u32,
    pub kind: NextKind,
}

fn shape_error(what: &str, drafts: usize, got: usize, want: usize) -> Error {
    Error::InvalidArgument(format!("verify: {got} {what} for {drafts} draft tokens, expected {want}"))
}

/// Greedy verification. `draft`: `[K]` proposed tokens; `target_argmax`: `[K+1]` argmax ids of
/// the verify pass over `[last, draft..]` (row i predicts draft position i).
pub fn verify_greedy(draft: &[u32], target_argmax: &[u32]) -> Result<Verdict> {
    let k = draft.len();
    if target_argmax.len() != k + 1 {
        return Err(shape_error("target rows", k, target_argmax.len(), k + 1));
    }
    let accepted = draft.iter().zip(target_argmax).take_while(|(x, t)| x == t).count();
    let kind = if accepted == k { NextKind::Bonus } else { NextKind::Recovered };
    Ok(Verdict { accepted, next: target_argmax[accepted], kind })
}

/// Speculative sampling (Leviathan et al. 2211.17192; Chen et al. 2302.01318).
///
/// `draft`: `[K]` tokens with `draft[i] ~ q[i]`; `q`: `[K]` draft distributions; `p`: `[K+1]`
/// target distributions (after temperature / top-k / top-p, like `q`). Uses one uniform per
/// examined draft position and one more for the recovered or bonus token.
pub fn verify_sampled(draft: &[u32], q: &[Dist], p: &[Dist], rng: &mut Rng) -> Result<Verdict> {
    let k = draft.len();
    if q.len() != k {
        return Err(shape_error("draft distributions", k, q.len(), k));
    }
    if p.len() != k + 1 {
        return Err(shape_error("target distributions", k, p.len(), k + 1));
    }
    for (i, &x) in draft.iter().enumerate() {
        let (pi, qi) = (p[i].prob(x), q[i].prob(x));
        if qi.is_nan() || qi <= 0.0 {
            return Err(Error::InvalidArgument(format!("verify: draft token {x} at {i} has q = {qi}")));
        }
        // Accept with probability min(1, p/q): u in [0, 1), so p >= q always accepts and p = 0 never does.
        if rng.next_f64() < pi / qi {
            continue;
        }
        let next = p[i].residual(&q[i]).draw(rng);
        return Ok(Verdict { accepted: i, next, kind: NextKind::Recovered });
    }
    Ok(Verdict { accepted: k, next: p[k].draw(rng), kind: NextKind::Bonus })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(v: &[f64]) -> Dist {
        Dist::from_pairs(v.iter().enumerate().map(|(i, &p)| (i as u32, p)).collect())
    }

    #[test]
    fn greedy_rules() {
        let v = verify_greedy(&[1, 2, 3], &[1, 2, 3, 4]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v, Verdict { accepted: 3, next: 4, kind: NextKind::Bonus });
        let v = verify_greedy(&[1, 2, 3], &[1, 5, 3, 4]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v, Verdict { accepted: 1, next: 5, kind: NextKind::Recovered });
        let v = verify_greedy(&[], &[7]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v, Verdict { accepted: 0, next: 7, kind: NextKind::Bonus });
        assert!(verify_greedy(&[1], &[1]).is_err());
    }

    #[test]
    fn residual_excludes_the_rejected_token() {
        let p = dist(&[0.5, 0.3, 0.2]);
        let q = dist(&[0.9, 0.1, 0.0]);
        let r = p.residual(&q);
        assert_eq!(r.prob(0), 0.0);
        assert!((r.prob(1) - 0.5).abs() < 1e-12 && (r.prob(2) - 0.5).abs() < 1e-12);
    }
}
