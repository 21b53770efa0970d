//! Turning logits into a token: greedy, or temperature / top-k / top-p / min-p with a seeded RNG.
//! The same seed gives the same tokens on every platform (the RNG is implemented here).

use crate::error::{Error, Result};

/// Temperatures below this are greedy, as in vLLM: their 1 / T stays finite in f32 and clear of
/// subnormals (which a GPU may flush to 0), and they differ from the argmax only among logits
/// within about 1e-4 of the largest.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// How to pick the next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below [`MIN_TEMPERATURE`]) means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    /// Keep only the tokens at least `min_p` times as likely as the most likely one (0 = all);
    /// applied with the top-k, before the top-p (vLLM's order). See [`min_p_floor`].
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    /// Rejects values that cannot mean anything.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidArgument(format!("temperature {} must be >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!("top_p {} must be in (0, 1]", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::InvalidArgument(format!("min_p {} must be in [0, 1]", self.min_p)));
        }
        Ok(())
    }

    /// Whether `other` draws from the same distribution (every field but the seed).
    pub fn same_distribution(&self, other: &SamplingParams) -> bool {
        SamplingParams { seed: other.seed, ..*self } == *other
    }

    /// The min-p cut's offset from the row's largest logit, `T ln(min_p)` in f32 (the lowest
    /// finite f32 where that is lower), or `None` without a min-p: a token is kept when its
    /// logit is at least [`min_p_floor`]. One value for the CPU and the GPU (`shaders/sample.wgsl`
    /// gets it as a uniform), so both keep the same tokens.
    pub fn min_p_offset(&self) -> Option<f32> {
        if self.min_p <= 0.0 || self.is_greedy() {
            return None;
        }
        let offset = self.temperature as f64 * (self.min_p as f64).ln();
        Some(offset.max(f32::MIN as f64) as f32)
    }
}

/// The least logit a min-p keeps in a row whose largest logit is `max`: `max + offset` in f32
/// (one correctly rounded addition, on the CPU as in `shaders/sample.wgsl`). p_j >= min_p p_max
/// is (l_j - max) / T >= ln(min_p).
pub fn min_p_floor(max: f32, offset: f32) -> f32 {
    max + offset
}

/// A small, fast, portable RNG (SplitMix64): identical streams on native and wasm.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest value; the lowest index wins ties (as the GPU argmax kernel does).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Most likely first; equal logits by ascending index, -0.0 equal to +0.0 as the GPU's kernels
/// rank them (a strict total order, so the top k are one set whatever the algorithm that finds
/// them).
fn likelier(logits: &[f32]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    let at = |i: u32| {
        let l = logits[i as usize];
        if l == 0.0 {
            0.0
        } else {
            l
        }
    };
    move |&a, &b| at(b).total_cmp(&at(a)).then(a.cmp(&b))
}

/// The distribution that sampling with `params` draws from: softmax(logits / T) restricted to
/// the top-k and the min-p (both keep a most likely prefix: their intersection), then to the
/// top-p of what they keep, renormalised, as (token, probability) pairs. With a top-k or a top-p
/// the pairs kept come most likely first; with neither, the kept tokens in id order (no sort: a
/// 151,936-token row costs one pass). Greedy params give the one-hot distribution of the argmax.
///
/// Cost: O(n) to select the top k (then O(k log k)); for a top-p without a top-k, the most likely
/// tokens are selected in growing prefixes (64, 256, ...) until they hold the mass, so a peaked
/// row costs O(n) and only a flat one approaches a full sort.
pub fn distribution(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f64)> {
    if params.is_greedy() || logits.is_empty() {
        return vec![(argmax(logits), 1.0)];
    }
    let t = params.temperature as f64;
    let order = likelier(logits);
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    if params.top_k > 0 && params.top_k < idx.len() {
        idx.select_nth_unstable_by(params.top_k - 1, &order);
        idx.truncate(params.top_k);
        idx.sort_unstable_by(&order);
    } else if params.top_k > 0 {
        idx.sort_unstable_by(&order);
    }
    let max = idx.iter().map(|&i| logits[i as usize]).fold(f32::NEG_INFINITY, f32::max);
    if let Some(offset) = params.min_p_offset() {
        let floor = min_p_floor(max, offset);
        idx.retain(|&i| logits[i as usize] >= floor);
    }
    let max = max as f64;
    let mut probs: Vec<f64> = idx.iter().map(|&i| ((logits[i as usize] as f64 - max) / t).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    if params.top_p < 1.0 {
        if params.top_k == 0 {
            // The most likely first, in growing prefixes until one holds top_p of the mass.
            let mut pairs: Vec<(u32, f64)> = idx.into_iter().zip(probs).collect();
            let by_logit = |a: &(u32, f64), b: &(u32, f64)| order(&a.0, &b.0);
            let mut sorted = 0;
            let mut m = 64;
            loop {
                let m_now = m.min(pairs.len());
                if m_now < pairs.len() {
                    pairs[sorted..].select_nth_unstable_by(m_now - 1 - sorted, by_logit);
                }
                pairs[sorted..m_now].sort_unstable_by(by_logit);
                sorted = m_now;
                let mass: f64 = pairs[..sorted].iter().map(|p| p.1).sum();
                if mass >= params.top_p as f64 || sorted == pairs.len() {
                    break;
                }
                m *= 4;
            }
            pairs.truncate(sorted);
            (idx, probs) = pairs.into_iter().unzip();
        }
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= params.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        idx.truncate(keep);
        probs.truncate(keep);
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
    }
    idx.into_iter().zip(probs).collect()
}

/// Draws a token from a distribution made by [`distribution`].
pub fn draw(dist: &[(u32, f64)], rng: &mut Rng) -> u32 {
    let u = rng.next_f64();
    let mut acc = 0.0;
    for &(tok, p) in dist {
        acc += p;
        if u < acc {
            return tok;
        }
    }
    dist.last().map(|d| d.0).unwrap_or(0)
}

/// Picks the next token from one row of logits.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    if params.is_greedy() {
        return argmax(logits);
    }
    draw(&distribution(logits, params), rng)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(logits: &[f32], params: SamplingParams) -> Vec<(u32, f64)> {
        distribution(logits, &SamplingParams { seed: 0, ..params })
    }

    #[test]
    fn a_min_p_keeps_the_tokens_that_likely_relative_to_the_likeliest() {
        // relative to the largest logit: 1, 0.5, 0.09, 0.11, 0.2, 0.101 (p_j / p_max at T = 1)
        let logits: Vec<f32> =
            [1.0f64, 0.5, 0.09, 0.11, 0.2, 0.101].iter().map(|r| (r.ln() + 3.0) as f32).collect();
        let ids = |d: &[(u32, f64)]| d.iter().map(|p| p.0).collect::<Vec<_>>();
        let sampled = SamplingParams { temperature: 1.0, ..SamplingParams::greedy() };
        let d = kept(&logits, SamplingParams { min_p: 0.1, ..sampled });
        assert_eq!(ids(&d), [0, 1, 3, 4, 5], "id order without a top-k or a top-p");
        let mass: f64 = [1.0, 0.5, 0.11, 0.2, 0.101].iter().sum();
        for (&(_, p), r) in d.iter().zip([1.0, 0.5, 0.11, 0.2, 0.101]) {
            assert!((p - r / mass).abs() < 1e-6, "renormalised: {d:?}");
        }
        // a higher temperature flattens the ratios: 0.09^(1/2) = 0.3
        assert_eq!(
            ids(&kept(&logits, SamplingParams { temperature: 2.0, min_p: 0.25, ..sampled })),
            [0, 1, 2, 3, 4, 5]
        );
        assert_eq!(
            ids(&kept(&logits, SamplingParams { temperature: 2.0, min_p: 0.35, ..sampled })),
            [0, 1, 4]
        );
        // with a top-k: both cuts (the narrower); min_p 1: the largest logit only
        assert_eq!(ids(&kept(&logits, SamplingParams { top_k: 2, min_p: 0.1, ..sampled })), [0, 1]);
        assert_eq!(ids(&kept(&logits, SamplingParams { top_k: 5, min_p: 0.15, ..sampled })), [0, 1, 4]);
        assert_eq!(ids(&kept(&logits, SamplingParams { min_p: 1.0, ..sampled })), [0]);
        // the top-p after the min-p, of what it keeps (vLLM's order): 1 / 1.7 < 0.6 <= 1.5 / 1.7
        assert_eq!(ids(&kept(&logits, SamplingParams { min_p: 0.15, top_p: 0.6, ..sampled })), [0, 1]);
        assert_eq!(ids(&kept(&logits, SamplingParams { min_p: 0.15, top_p: 0.58, ..sampled })), [0]);
        // greedy and min_p 0 cut nothing
        assert_eq!(SamplingParams { min_p: 0.5, ..SamplingParams::greedy() }.min_p_offset(), None);
        assert_eq!(sampled.min_p_offset(), None);
        assert_eq!(kept(&logits, SamplingParams { min_p: 0.0, ..sampled }).len(), 6);
        // a floor below the lowest f32 is the lowest f32 (no -inf from the GPU's addition)
        let cold = SamplingParams { temperature: 1e38, min_p: 1e-30, ..sampled };
        assert_eq!(cold.min_p_offset(), Some(f32::MIN));
    }

    #[test]
    fn zeros_of_either_sign_rank_as_equals() {
        // (as sample.wgsl and top_k.wgsl rank them: equal logits by lower id)
        let logits = [-1.0f32, -0.0, 0.0, -0.0, 0.0, -2.0];
        let sampled = SamplingParams { temperature: 1.0, ..SamplingParams::greedy() };
        let ids = |p: SamplingParams| kept(&logits, p).iter().map(|d| d.0).collect::<Vec<_>>();
        assert_eq!(ids(SamplingParams { top_k: 2, ..sampled }), [1, 2]);
        assert_eq!(ids(SamplingParams { top_p: 0.4, ..sampled }), [1, 2]);
    }

    #[test]
    fn min_p_is_checked() {
        for (min_p, ok) in
            [(0.0, true), (1.0, true), (0.05, true), (1.5, false), (-0.1, false), (f32::NAN, false)]
        {
            let p = SamplingParams { temperature: 1.0, min_p, ..SamplingParams::greedy() };
            assert_eq!(p.validate().is_ok(), ok, "min_p {min_p}");
        }
        let a = SamplingParams { temperature: 1.0, min_p: 0.1, seed: 3, ..SamplingParams::greedy() };
        assert!(a.same_distribution(&SamplingParams { seed: 9, ..a }));
        assert!(!a.same_distribution(&SamplingParams { min_p: 0.2, ..a }));
    }
}
