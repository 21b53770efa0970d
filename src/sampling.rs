//! Turning logits into a token: greedy, or temperature / top-k / top-p with a seeded RNG.
//! The same seed gives the same tokens on every platform (the RNG is implemented here).

use crate::error::{Error, Result};

/// How to pick the next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Rejects values that cannot mean anything.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidArgument(format!("temperature {} must be >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!("top_p {} must be in (0, 1]", self.top_p)));
        }
        Ok(())
    }
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

/// The distribution that sampling with `params` draws from: softmax(logits / T) restricted to
/// top-k and top-p, renormalised. Returned as (token, probability) pairs, most likely first.
/// Greedy params give the one-hot distribution of the argmax.
pub fn distribution(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f64)> {
    if params.is_greedy() || logits.is_empty() {
        return vec![(argmax(logits), 1.0)];
    }
    let t = params.temperature as f64;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    // Most likely first; equal logits by ascending index (deterministic).
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    if params.top_k > 0 {
        idx.truncate(params.top_k);
    }
    let max = logits[idx[0] as usize] as f64;
    let mut probs: Vec<f64> = idx.iter().map(|&i| ((logits[i as usize] as f64 - max) / t).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    if params.top_p < 1.0 {
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
