//! Model hyper-parameters, read from GGUF metadata or a Hugging Face `config.json`.

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::gpu::RopeLayout;
use crate::loader::gguf::Gguf;

/// The architectures wgspec runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, ...: RMSNorm, RoPE, GQA, SwiGLU, no biases.
    Llama,
    /// Qwen2 / Qwen2.5: as Llama, plus biases on the q/k/v projections.
    Qwen2,
}

impl Arch {
    /// Parses a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF `general.architecture` value.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }

    /// Parses a Hugging Face `architectures[0]` value.
    pub fn from_hf_name(name: &str) -> Result<Arch> {
        match name {
            "LlamaForCausalLM" => Ok(Arch::Llama),
            "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// Whether q/k/v projections carry biases.
    pub fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }
}

/// Hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub vocab_size: usize,
    /// Residual stream width.
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward.
    pub ffn_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Rotated dimensions per head (usually `head_dim`).
    pub rope_dim: usize,
    /// Which dimension pairs rotate together, as the checkpoint stores q/k.
    pub rope_layout: RopeLayout,
    /// The context length the model was trained for.
    pub context_len: usize,
    /// Output projection shares the token embedding.
    pub tied_embeddings: bool,
}

/// Upper bounds that keep a corrupt header from asking for absurd allocations.
const MAX_DIM: usize = 1 << 16;
const MAX_LAYERS: usize = 1024;
const MAX_VOCAB: usize = 1 << 22;
/// The longest context a model may declare (real ones: up to 1 M).
const MAX_CONTEXT: usize = 1 << 24;

impl Config {
    /// The attention's shapes over a KV cache of `context` positions (f16 pairs or f32).
    pub fn attention_shape(&self, context: usize, kv_f16: bool) -> crate::gpu::AttentionShape {
        crate::gpu::AttentionShape {
            heads: self.n_heads as u32,
            kv_heads: self.n_kv_heads as u32,
            head_dim: self.head_dim as u32,
            ctx: context as u32,
            kv_f16,
        }
    }

    /// `q` projection width.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// `k` and `v` projection width.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Reads the config from GGUF metadata (`general.architecture` and `{arch}.*` keys).
    /// `vocab_size` falls back to the token embedding's rows; `tied` says whether `output.weight` is absent.
    pub fn from_gguf(g: &Gguf, vocab_rows: usize, tied: bool) -> Result<Config> {
        let arch_name = g.get_str("general.architecture")?;
        let arch = Arch::from_gguf_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let usize_key = |k: &str| -> Result<usize> { Ok(g.get_u32(&key(k))? as usize) };
        // Optional keys: absent gives the default; present, a wrong type or a negative value is an error.
        let opt_usize =
            |k: &str| -> Result<Option<usize>> { Ok(g.get_opt_u32(&key(k))?.map(|v| v as usize)) };
        let dim = usize_key("embedding_length")?;
        let n_heads = usize_key("attention.head_count")?;
        let n_kv_heads = opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
        let head_dim = opt_usize("attention.key_length")?.unwrap_or(dim.checked_div(n_heads).unwrap_or(0));
        let cfg = Config {
            arch,
            vocab_size: opt_usize("vocab_size")?.unwrap_or(vocab_rows),
            dim,
            n_layers: usize_key("block_count")?,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: usize_key("feed_forward_length")?,
            rms_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: g.get_opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_dim: opt_usize("rope.dimension_count")?.unwrap_or(head_dim),
            // llama.cpp's converter permutes llama q/k into interleaved pairs; qwen2 keeps halves.
            rope_layout: match arch {
                Arch::Llama => RopeLayout::Interleaved,
                Arch::Qwen2 => RopeLayout::Halves,
            },
            context_len: opt_usize("context_length")?.unwrap_or(2048),
            tied_embeddings: tied,
        };
        if let Some(v) =
            g.get(&key("rope.scaling.type")).map(|_| g.get_str(&key("rope.scaling.type"))).transpose()?
        {
            if v != "none" {
                return Err(Error::Metadata {
                    key: key("rope.scaling.type"),
                    message: format!("rope scaling {v:?} is not supported"),
                });
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a Hugging Face `config.json` (LlamaForCausalLM or Qwen2ForCausalLM).
    pub fn from_hf_json(json: &[u8]) -> Result<Config> {
        let hf: HfConfig = serde_json::from_slice(json)
            .map_err(|e| Error::Metadata { key: "config.json".into(), message: e.to_string() })?;
        let arch_name = hf.architectures.first().ok_or_else(|| Error::Metadata {
            key: "config.json architectures".into(),
            message: "empty".into(),
        })?;
        let arch = Arch::from_hf_name(arch_name)?;
        if let Some(s) = hf.rope_scaling.as_ref().filter(|v| !v.is_null()) {
            return Err(Error::Metadata {
                key: "config.json rope_scaling".into(),
                message: format!("rope scaling {s} is not supported"),
            });
        }
        let n_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size.checked_div(hf.num_attention_heads).unwrap_or(0));
        let cfg = Config {
            arch,
            vocab_size: hf.vocab_size,
            dim: hf.hidden_size,
            n_layers: hf.num_hidden_layers,
            n_heads: hf.num_attention_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: hf.intermediate_size,
            rms_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta.unwrap_or(10000.0),
            rope_dim: head_dim,
            rope_layout: RopeLayout::Halves,
            context_len: hf.max_position_embeddings.unwrap_or(2048),
            tied_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects shapes the kernels cannot run or that only a corrupt header would give.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(Error::Metadata { key: "model config".into(), message });
        let dims = [self.dim, self.n_heads, self.n_kv_heads, self.head_dim, self.ffn_dim, self.n_layers];
        if dims.contains(&0) || self.vocab_size == 0 {
            return bad(format!("zero dimension in {self:?}"));
        }
        if [self.dim, self.head_dim, self.ffn_dim, self.n_heads, self.n_kv_heads].iter().any(|&d| d > MAX_DIM)
            || self.n_layers > MAX_LAYERS
            || self.vocab_size > MAX_VOCAB
        {
            return bad(format!("absurd dimension in {self:?}"));
        }
        let q_width = self.n_heads.saturating_mul(self.head_dim);
        if q_width > MAX_DIM || self.context_len == 0 || self.context_len > MAX_CONTEXT {
            return bad(format!(
                "{} heads of {} (q width {}) with a context of {}",
                self.n_heads, self.head_dim, q_width, self.context_len
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} heads are not a multiple of {} kv heads", self.n_heads, self.n_kv_heads));
        }
        if [self.dim, self.head_dim, self.ffn_dim].iter().any(|d| !d.is_multiple_of(4)) {
            return bad("dim, head_dim and ffn_dim must be multiples of 4".into());
        }
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim > self.head_dim || self.rope_dim == 0 {
            return bad(format!("rope dimension {} with head_dim {}", self.rope_dim, self.head_dim));
        }
        if !(self.rms_eps.is_finite()
            && self.rms_eps > 0.0
            && self.rope_theta.is_finite()
            && self.rope_theta > 0.0)
        {
            return bad("rms epsilon and rope theta must be positive".into());
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct HfConfig {
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f32,
    rope_theta: Option<f32>,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
}
