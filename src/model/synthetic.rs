//! Random-weight models of real models' exact shapes ([`SYNTHETIC_SHAPES`]), for benchmarks on
//! adapters without model files (`wgspec bench --synthetic`) and for tests' configs.

use crate::error::{Error, Result};
use crate::gpu::RopeLayout;
use crate::loader::gguf::Value;
use crate::loader::gguf_writer::GgufWriter;
use crate::loader::DType;
use crate::model::{Arch, Config, TensorRole, TensorTable};

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

#[cfg(test)]
mod tests {
    use super::*;

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
