//! The speculative-decoding benchmark: target-only decoding and speculation over a prompt set,
//! alternating them, plus `verify_cost = t(forward of K+1 tokens) / t(forward of 1 token)`, and
//! random-weight models of real models' exact shapes for adapters without model files.

use serde::{Deserialize, Serialize};
use web_time::Instant;

use super::draft::Draft;
use super::generate::{generate as spec_generate, SpecStats};
use super::schedule::KPolicy;
use crate::error::{Error, Result};
use crate::gpu::RopeLayout;
use crate::loader::gguf::Value;
use crate::loader::gguf_writer::GgufWriter;
use crate::loader::DType;
use crate::model::{Arch, Config, Model, TensorRole, TensorTable, MAX_BATCH};
use crate::session::GenerateOptions;

/// The prompt set kept in the repository (`benches/prompts.json`): code and prose.
pub const DEFAULT_PROMPTS: &str = include_str!("../../benches/prompts.json");

/// One benchmark prompt.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BenchPrompt {
    pub name: String,
    /// `"code"` or `"prose"`.
    pub kind: String,
    pub prompt: String,
}

/// Parses a prompt set (a JSON array of [`BenchPrompt`]).
pub fn parse_prompts(json: &str) -> Result<Vec<BenchPrompt>> {
    serde_json::from_str(json).map_err(|e| Error::InvalidArgument(format!("prompt set: {e}")))
}

/// The outcome of one prompt: target-only and speculative runs of the same request.
#[derive(Clone, Debug, Serialize)]
pub struct PromptResult {
    pub name: String,
    pub kind: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub target_only_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub speedup: f64,
    pub tokens_per_target_forward: f64,
    pub acceptance_rate: f64,
    pub mean_k: f64,
    /// Whether the speculative tokens equal the target-only tokens (always expected when greedy).
    pub identical: bool,
    /// Which run went first (they alternate from prompt to prompt).
    pub speculative_first: bool,
    pub stats: SpecStats,
}

/// Runs `bench` (tokenized: `prompt`) with the target alone and with speculation (in the order `spec_first` says).
pub async fn run_prompt(
    target: &mut Model,
    draft: &mut dyn Draft,
    bench: &BenchPrompt,
    prompt: &[u32],
    opts: &GenerateOptions,
    k: KPolicy,
    spec_first: bool,
) -> Result<PromptResult> {
    let mut plain = None;
    let mut spec = None;
    for spec_turn in [spec_first, !spec_first] {
        if spec_turn {
            spec = Some(spec_generate(target, Some(&mut *draft), prompt, opts, k, &mut |_, _| true).await?);
        } else {
            plain = Some(spec_generate(target, None, prompt, opts, k, &mut |_, _| true).await?);
        }
    }
    let (Some(plain), Some(spec)) = (plain, spec) else {
        return Err(Error::InvalidArgument("benchmark run missing".into()));
    };
    let s = spec.stats;
    let speedup = if plain.stats.base.tokens_per_second > 0.0 {
        s.base.tokens_per_second / plain.stats.base.tokens_per_second
    } else {
        0.0
    };
    Ok(PromptResult {
        name: bench.name.clone(),
        kind: bench.kind.clone(),
        prompt_tokens: prompt.len(),
        generated_tokens: s.base.generated_tokens,
        target_only_tokens_per_second: plain.stats.base.tokens_per_second,
        speculative_tokens_per_second: s.base.tokens_per_second,
        speedup,
        tokens_per_target_forward: s.tokens_per_target_forward,
        acceptance_rate: s.acceptance_rate,
        mean_k: s.mean_k,
        identical: spec.tokens == plain.tokens,
        speculative_first: spec_first,
        stats: s,
    })
}

/// Totals over a set of prompt results.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub prompts: usize,
    pub generated_tokens: usize,
    /// Generated tokens over the summed decode times of each mode.
    pub target_only_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub speedup: f64,
    /// τ: generated tokens per verify pass.
    pub tokens_per_target_forward: f64,
    pub acceptance_rate: f64,
    pub all_identical: bool,
}

impl Summary {
    pub fn of(rs: &[&PromptResult]) -> Summary {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let tokens: usize = rs.iter().map(|r| r.generated_tokens).sum();
        let plain_s: f64 =
            rs.iter().map(|r| ratio(r.generated_tokens as f64, r.target_only_tokens_per_second)).sum();
        let spec_s: f64 = rs.iter().map(|r| r.stats.base.decode_seconds).sum();
        let drafted: usize = rs.iter().map(|r| r.stats.drafted).sum();
        let accepted: usize = rs.iter().map(|r| r.stats.accepted).sum();
        let verifies: usize = rs.iter().map(|r| r.stats.verify_forwards).sum();
        let (plain_tps, spec_tps) = (ratio(tokens as f64, plain_s), ratio(tokens as f64, spec_s));
        Summary {
            prompts: rs.len(),
            generated_tokens: tokens,
            target_only_tokens_per_second: plain_tps,
            speculative_tokens_per_second: spec_tps,
            speedup: ratio(spec_tps, plain_tps),
            tokens_per_target_forward: ratio(tokens as f64, verifies as f64),
            acceptance_rate: ratio(accepted as f64, drafted as f64),
            all_identical: rs.iter().all(|r| r.identical),
        }
    }
}

/// What `wgspec bench` writes.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub adapter: String,
    pub target: String,
    pub target_gpu_weight_bytes: u64,
    pub target_file_weight_bytes: u64,
    pub draft: String,
    /// `"4"` or `"adaptive (max 16)"`.
    pub k: String,
    pub max_tokens: usize,
    /// Over all prompts, with verify_cost at `verify_cost_k` (the fixed K or the runs' mean K).
    pub summary: Summary,
    pub verify_cost: f64,
    pub verify_cost_k: usize,
    /// `"code"` and `"prose"`.
    pub by_kind: std::collections::BTreeMap<String, Summary>,
    pub verify_cost_by_k: std::collections::BTreeMap<usize, f64>,
    pub prompts: Vec<PromptResult>,
}

/// Median time of a forward pass of `rows` tokens at position `pos` (argmax read-back, as a
/// greedy verify pass), over `reps` runs after one warm-up. The cache is rolled back to `pos`.
pub async fn forward_seconds(model: &mut Model, pos: usize, rows: usize, reps: usize) -> Result<f64> {
    if rows == 0 || rows > MAX_BATCH || pos + rows > model.context() || pos > model.len() {
        return Err(Error::InvalidArgument(format!(
            "timing {rows} rows at {pos} with {} cached of {}",
            model.len(),
            model.context()
        )));
    }
    let vocab = model.config.vocab_size as u32;
    let tokens: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut times = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let t = Instant::now();
        model.forward_argmax(&tokens, pos).await?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
        model.truncate(pos);
    }
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(0.0))
}

/// `verify_cost` for each K in `ks`: t(forward of K+1 tokens) / t(forward of 1 token) at `pos`
/// (the model must hold at least `pos` positions).
pub async fn verify_costs(
    model: &mut Model,
    pos: usize,
    ks: &[usize],
    reps: usize,
) -> Result<Vec<(usize, f64)>> {
    let one = forward_seconds(model, pos, 1, reps).await?;
    let mut out = Vec::with_capacity(ks.len());
    for &k in ks {
        let t = forward_seconds(model, pos, k + 1, reps).await?;
        out.push((k, if one > 0.0 { t / one } else { 0.0 }));
    }
    Ok(out)
}

/// A real model's exact shape, for random-weight benchmark models.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticShape {
    pub name: &'static str,
    pub arch: Arch,
    pub vocab: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub tied: bool,
    pub rope_theta: f32,
    pub context: usize,
}

/// Shapes `--synthetic` knows (those of the models in MODELS.md, plus Llama 3.2 1B).
pub const SYNTHETIC_SHAPES: &[SyntheticShape] = &[
    SyntheticShape {
        name: "qwen2-1.5b",
        arch: Arch::Qwen2,
        vocab: 151936,
        dim: 1536,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        ffn: 8960,
        tied: false,
        rope_theta: 1e6,
        context: 32768,
    },
    SyntheticShape {
        name: "qwen2-0.5b",
        arch: Arch::Qwen2,
        vocab: 151936,
        dim: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        ffn: 4864,
        tied: false,
        rope_theta: 1e6,
        context: 32768,
    },
    SyntheticShape {
        name: "llama-1b",
        arch: Arch::Llama,
        vocab: 128256,
        dim: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        ffn: 8192,
        tied: true,
        rope_theta: 500000.0,
        context: 131072,
    },
    SyntheticShape {
        name: "smollm2-135m",
        arch: Arch::Llama,
        vocab: 49152,
        dim: 576,
        layers: 30,
        heads: 9,
        kv_heads: 3,
        ffn: 1536,
        tied: true,
        rope_theta: 100000.0,
        context: 8192,
    },
];

/// The synthetic shape called `name`.
pub fn synthetic_shape(name: &str) -> Result<SyntheticShape> {
    SYNTHETIC_SHAPES.iter().copied().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = SYNTHETIC_SHAPES.iter().map(|s| s.name).collect();
        Error::InvalidArgument(format!("unknown synthetic shape {name:?}; known: {}", names.join(", ")))
    })
}

/// SplitMix64, for reproducible random weights.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Random Q8_0 blocks for `n` values (scale 3e-4: weights of standard deviation about 0.02).
fn random_q8_0(n: usize, mix: &mut Mix) -> Vec<u8> {
    let blocks = n / 32;
    let mut out = Vec::with_capacity(blocks * 34);
    let scale = half::f16::from_f32(3e-4).to_le_bytes();
    for _ in 0..blocks {
        out.extend_from_slice(&scale);
        for _ in 0..4 {
            out.extend_from_slice(&mix.next().to_le_bytes());
        }
    }
    out
}

impl SyntheticShape {
    /// The model config these shapes give (GGUF conventions: llama q/k rows in interleaved pairs).
    pub fn config(&self) -> Config {
        let head_dim = self.dim / self.heads.max(1);
        Config {
            arch: self.arch,
            vocab_size: self.vocab,
            dim: self.dim,
            n_layers: self.layers,
            n_heads: self.heads,
            n_kv_heads: self.kv_heads,
            head_dim,
            ffn_dim: self.ffn,
            rms_eps: 1e-6,
            rope_theta: self.rope_theta,
            rope_dim: head_dim,
            rope_layout: match self.arch {
                Arch::Llama => RopeLayout::Interleaved,
                Arch::Qwen2 => RopeLayout::Halves,
            },
            context_len: self.context,
            tied_embeddings: self.tied,
        }
    }
}

/// A GGUF file of random weights with `shape`'s exact tensor shapes (the tensors of
/// [`TensorTable`]): Q8_0 matrices (every matrix dimension of these shapes is a multiple of 32),
/// F32 norms (ones) and biases.
pub fn synthetic_gguf(shape: &SyntheticShape, seed: u64) -> Vec<u8> {
    let c = shape.config();
    let a = c.arch.gguf_name();
    let mut mix = Mix(seed);
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String(a.into()));
    w.add("general.name", Value::String(format!("synthetic-{}", shape.name)));
    w.add(&format!("{a}.context_length"), Value::U32(c.context_len as u32));
    w.add(&format!("{a}.embedding_length"), Value::U32(c.dim as u32));
    w.add(&format!("{a}.block_count"), Value::U32(c.n_layers as u32));
    w.add(&format!("{a}.feed_forward_length"), Value::U32(c.ffn_dim as u32));
    w.add(&format!("{a}.attention.head_count"), Value::U32(c.n_heads as u32));
    w.add(&format!("{a}.attention.head_count_kv"), Value::U32(c.n_kv_heads as u32));
    w.add(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(c.rms_eps));
    w.add(&format!("{a}.rope.freq_base"), Value::F32(c.rope_theta));
    let f32_bytes = |v: f32, n: usize| (0..n).flat_map(|_| v.to_le_bytes()).collect::<Vec<u8>>();
    for t in TensorTable::new(&c).iter() {
        let n: usize = t.shape.iter().product();
        let (dtype, bytes) = match t.role {
            TensorRole::Norm => (DType::F32, f32_bytes(1.0, n)),
            TensorRole::QkvBias => (DType::F32, f32_bytes(0.01, n)),
            _ => (DType::Q8_0, random_q8_0(n, &mut mix)),
        };
        w.add_tensor(&t.name, dtype, &t.shape, bytes);
    }
    w.to_bytes()
}

/// Token ids for a prompt without a tokenizer (synthetic models): its bytes, offset into the vocabulary.
pub fn byte_tokens(text: &str, vocab: usize) -> Vec<u32> {
    text.bytes().map(|b| (b as u32 + 1000) % vocab.max(1) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_set_parses_and_has_code_and_prose() {
        let p = parse_prompts(DEFAULT_PROMPTS).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.iter().any(|x| x.kind == "code") && p.iter().any(|x| x.kind == "prose"));
    }

    #[test]
    fn synthetic_models_have_the_real_shapes() {
        let small = SyntheticShape { vocab: 512, layers: 2, ..SYNTHETIC_SHAPES[1] };
        let ckpt =
            crate::model::Checkpoint::from_gguf(synthetic_gguf(&small, 1)).unwrap_or_else(|e| panic!("{e}"));
        let c = &ckpt.config;
        assert_eq!((c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim), (896, 14, 2, 64, 4864));
        assert!(ckpt.has("blk.1.attn_q.bias") && ckpt.has("output.weight"));
    }
}
