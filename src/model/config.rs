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
    /// Qwen3: as Llama (no biases), plus an RMSNorm of each q and k head before RoPE.
    Qwen3,
    /// Phi-3 / 3.5: as Llama, its q|k|v and gate|up matrices stored fused (read as row views:
    /// see [`crate::model::Checkpoint`]), rotary in halves.
    Phi3,
    /// Gemma 3: embeddings times sqrt(dim), per-head q and k norms, norms after attention and
    /// after the feed-forward too, GeGLU, and five local layers (a sliding window, their own RoPE
    /// base) to each global one.
    Gemma3,
}

impl Arch {
    /// Parses a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "phi3" => Ok(Arch::Phi3),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF `general.architecture` value.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// Parses a Hugging Face `architectures[0]` value.
    pub fn from_hf_name(name: &str) -> Result<Arch> {
        match name {
            "LlamaForCausalLM" => Ok(Arch::Llama),
            "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
            "Qwen3ForCausalLM" => Ok(Arch::Qwen3),
            "Phi3ForCausalLM" => Ok(Arch::Phi3),
            "Gemma3ForCausalLM" => Ok(Arch::Gemma3),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// Whether q/k/v projections carry biases.
    pub fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }

    /// Whether each q and k head is RMS-normalised before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }

    /// Gemma's block: embeddings times sqrt(dim), a norm after attention and after the
    /// feed-forward (before each residual add), GeGLU, local and global layers.
    pub fn gemma(self) -> bool {
        self == Arch::Gemma3
    }

    /// The rotary layout of q/k in a GGUF file: llama.cpp's converter permutes llama's into
    /// interleaved pairs; the Qwen families keep halves (its NEOX mode).
    pub fn gguf_rope_layout(self) -> RopeLayout {
        match self {
            Arch::Llama => RopeLayout::Interleaved,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Gemma3 => RopeLayout::Halves,
        }
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
    /// How RoPE's frequencies are stretched for long contexts ([`RopeScaling::None`] mostly).
    pub rope_scaling: RopeScaling,
    /// Keys a query attends to at most, its own included, or `None`: with a window, every
    /// layer's attention masks the keys before it. No architecture read from a file sets it yet:
    /// llama.cpp runs Phi-3 and Mistral with full attention whatever their files declare (its
    /// Phi SWA is disabled, llama.cpp PR 13676), and wgspec is exact against llama.cpp.
    pub sliding_window: Option<usize>,
    /// Gemma 3: every `n`-th layer is global (full attention, `rope_theta`); the others local
    /// (`sliding_window`, `local_rope_theta`). 0: every layer is global.
    pub global_every: usize,
    /// The RoPE base of local layers (Gemma 3: 10000).
    pub local_rope_theta: f32,
}

/// How RoPE's frequencies are stretched past the context a model was first trained for: each
/// dimension pair's frequency is divided by its factor ([`RopeScaling::divisors`]), as llama.cpp
/// and transformers do.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeScaling {
    #[default]
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear { factor: f32 },
    /// Llama 3.1's: wavelengths above `original_context / low_freq_factor` divided by
    /// `factor`, those below `original_context / high_freq_factor` kept, a smooth blend
    /// between (`rope_type: "llama3"` in config.json).
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_context: usize },
    /// Per-pair divisors stored in the GGUF file's `rope_freqs.weight` (how llama.cpp's
    /// converter writes Llama 3.1's scaling), read when the model loads.
    Stored,
}

impl RopeScaling {
    /// The divisor of each of the `rope_dim / 2` frequencies `theta^(-2i / rope_dim)`; `stored`:
    /// the file's `rope_freqs.weight` for [`RopeScaling::Stored`].
    pub fn divisors(&self, theta: f32, rope_dim: usize, stored: Option<&[f32]>) -> Result<Vec<f64>> {
        let half = rope_dim / 2;
        let bad = |message: String| Err(Error::Metadata { key: "rope scaling".into(), message });
        match *self {
            RopeScaling::None => Ok(vec![1.0; half]),
            RopeScaling::Linear { factor } => Ok(vec![factor as f64; half]),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                let (factor, low, high) = (factor as f64, low_freq_factor as f64, high_freq_factor as f64);
                let old = original_context as f64;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                let divisor = |i: usize| {
                    let freq = (theta as f64).powf(-2.0 * i as f64 / rope_dim as f64);
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    }
                };
                Ok((0..half).map(divisor).collect())
            }
            RopeScaling::Stored => match stored {
                Some(f) if f.len() == half && f.iter().all(|d| d.is_finite() && *d > 0.0) => {
                    Ok(f.iter().map(|&d| d as f64).collect())
                }
                Some(f) => bad(format!(
                    "rope_freqs.weight: {} factors for {half} frequencies, each finite and positive",
                    f.len()
                )),
                None => Err(Error::MissingTensor { name: "rope_freqs.weight".into() }),
            },
        }
    }

    /// Refuses parameters no model has (a zero or negative factor, a blend of no width).
    fn validate(&self) -> Result<()> {
        let ok = match *self {
            RopeScaling::None | RopeScaling::Stored => true,
            RopeScaling::Linear { factor } => factor.is_finite() && factor > 0.0,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_context,
            } => {
                [factor, low, high].iter().all(|v| v.is_finite() && *v > 0.0)
                    && high > low
                    && original_context > 0
            }
        };
        match ok {
            true => Ok(()),
            false => Err(Error::Metadata { key: "rope scaling".into(), message: format!("{self:?}") }),
        }
    }

    /// A config.json `rope_scaling` object: `linear` or `llama3` (`type` or `rope_type`);
    /// others (yarn, dynamic, longrope, ...) are refused, naming the type.
    fn from_hf(v: &serde_json::Value) -> Result<RopeScaling> {
        let key = "config.json rope_scaling";
        let bad = |message: String| Error::Metadata { key: key.into(), message };
        let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str());
        let number = |name: &str| {
            v.get(name)
                .and_then(|x| x.as_f64())
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("{name} missing or not a number in {v}")))
        };
        match kind {
            Some("default") => Ok(RopeScaling::None),
            Some("linear") => Ok(RopeScaling::Linear { factor: number("factor")? }),
            Some("llama3") => Ok(RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_context: number("original_max_position_embeddings")? as usize,
            }),
            Some(other) => {
                Err(bad(format!("rope scaling {other:?} is not supported (linear and llama3 are)")))
            }
            None => Err(bad(format!("no rope_type in {v}"))),
        }
    }

    /// GGUF's `{arch}.rope.scaling.type` (with `rope.scaling.factor`), and `rope_freqs.weight`
    /// when the file has it.
    fn from_gguf(g: &Gguf, arch: &str, has_freqs: bool) -> Result<RopeScaling> {
        let key = format!("{arch}.rope.scaling.type");
        let kind = g.get(&key).map(|_| g.get_str(&key)).transpose()?;
        let refuse = |message: String| Err(Error::Metadata { key: key.clone(), message });
        match (kind, has_freqs) {
            (None | Some("none"), false) => Ok(RopeScaling::None),
            (None | Some("none"), true) => Ok(RopeScaling::Stored),
            (Some("linear"), false) => {
                let factor = g.get_f32(&format!("{arch}.rope.scaling.factor"))?;
                Ok(RopeScaling::Linear { factor })
            }
            (Some("linear"), true) => {
                refuse("linear scaling beside rope_freqs.weight is not supported".into())
            }
            (Some(other), _) => {
                refuse(format!("rope scaling {other:?} is not supported (linear and llama3 are)"))
            }
        }
    }
}

/// Upper bounds that keep a corrupt header from asking for absurd allocations.
const MAX_DIM: usize = 1 << 16;
const MAX_LAYERS: usize = 1024;
/// The largest vocabulary a model or tokenizer may declare (real ones: up to 262,144).
pub const MAX_VOCAB: usize = 1 << 22;
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
            // (a layer's window: see BlockIo::shape)
            window: 0,
        }
    }

    /// The sliding window of layer `l`: Gemma 3's local layers have one; its every sixth layer
    /// (and every layer of the other architectures) attends to all keys.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        match self.global_every {
            0 => self.sliding_window,
            n if (l + 1).is_multiple_of(n) => None,
            _ => self.sliding_window,
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
    /// `has_freqs`: the file holds `rope_freqs.weight` (Llama 3.1's scaling).
    pub fn from_gguf(g: &Gguf, vocab_rows: usize, tied: bool, has_freqs: bool) -> Result<Config> {
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
            rope_layout: arch.gguf_rope_layout(),
            context_len: opt_usize("context_length")?.unwrap_or(2048),
            tied_embeddings: tied,
            rope_scaling: RopeScaling::from_gguf(g, arch_name, has_freqs)?,
            sliding_window: None,
            global_every: 0,
            local_rope_theta: 10000.0,
        };
        let cfg = if arch.gemma() {
            // (llama.cpp's Gemma 3: a window from the file, every sixth layer global, local
            // layers on a base of 10000)
            let window = opt_usize("attention.sliding_window")?.filter(|&w| w > 0);
            Config { sliding_window: window, global_every: 6, ..cfg }
        } else {
            cfg
        };
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
        let rope_scaling = match hf.rope_scaling.as_ref().filter(|v| !v.is_null()) {
            Some(v) => RopeScaling::from_hf(v)?,
            None => RopeScaling::None,
        };
        let n_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size.checked_div(hf.num_attention_heads).unwrap_or(0));
        // (a partial rotary factor rotates the first part of each head, an even number of dims)
        let rope_dim = match hf.partial_rotary_factor {
            Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
            Some(f) => {
                return Err(Error::Metadata {
                    key: "config.json partial_rotary_factor".into(),
                    message: format!("{f}: between 0 and 1"),
                })
            }
            None => head_dim,
        };
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
            rope_dim,
            rope_layout: RopeLayout::Halves,
            context_len: hf.max_position_embeddings.unwrap_or(2048),
            tied_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            rope_scaling,
            sliding_window: None,
            global_every: 0,
            local_rope_theta: hf.rope_local_base_freq.unwrap_or(10000.0),
        };
        let cfg = if arch.gemma() {
            if let Some(s) = hf.query_pre_attn_scalar.filter(|&s| s != head_dim) {
                return Err(Error::Metadata {
                    key: "config.json query_pre_attn_scalar".into(),
                    message: format!("{s}: only query_pre_attn_scalar = head_dim ({head_dim}) is supported"),
                });
            }
            Config {
                sliding_window: hf.sliding_window.filter(|&w| w > 0),
                global_every: hf.sliding_window_pattern.unwrap_or(6),
                ..cfg
            }
        } else {
            cfg
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
        if self.arch.qk_norm()
            && (self.head_dim > crate::gpu::MAX_NORMED_HEAD || !self.head_dim.is_multiple_of(2))
        {
            return bad(format!(
                "heads of {} normalised one by one (at most {})",
                self.head_dim,
                crate::gpu::MAX_NORMED_HEAD
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
        self.rope_scaling.validate()
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
    partial_rotary_factor: Option<f64>,
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f32>,
    query_pre_attn_scalar: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama31(scaling: serde_json::Value) -> Result<Config> {
        let json = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rope_scaling": scaling,
        });
        Config::from_hf_json(json.to_string().as_bytes())
    }

    #[test]
    fn llama_31s_rope_scaling_divides_low_frequencies_by_its_factor() {
        let c = llama31(serde_json::json!({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}))
        .expect("llama 3.1");
        let d = c.rope_scaling.divisors(c.rope_theta, c.rope_dim, None).expect("divisors");
        assert_eq!(d.len(), 64);
        // wavelengths under 8192 / 4 keep their frequency, over 8192 are divided by 8, and the
        // band between blends monotonically
        assert_eq!(&d[..20], &[1.0; 20][..]);
        assert_eq!(&d[50..], &[8.0; 14][..]);
        assert!(d.windows(2).all(|w| w[0] <= w[1]) && d.iter().any(|&x| x > 1.0 && x < 8.0), "{d:?}");
        let linear = llama31(serde_json::json!({"type": "linear", "factor": 2.0})).expect("linear");
        assert_eq!(linear.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(llama31(serde_json::Value::Null).expect("none").rope_scaling, RopeScaling::None);
        for (bad, says) in [
            (serde_json::json!({"rope_type": "yarn", "factor": 4.0}), "\"yarn\" is not supported"),
            (serde_json::json!({"rope_type": "llama3", "factor": 8.0}), "low_freq_factor missing"),
            (serde_json::json!({"factor": 8.0}), "no rope_type"),
            (serde_json::json!({"rope_type": "linear", "factor": -1.0}), "Linear"),
        ] {
            let err = llama31(bad.clone()).expect_err("refused");
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
        let stored = RopeScaling::Stored.divisors(1e4, 8, Some(&[1.0, 2.0, 0.0, 4.0]));
        assert!(stored.is_err(), "a zero divisor");
        assert!(matches!(RopeScaling::Stored.divisors(1e4, 8, None), Err(Error::MissingTensor { .. })));
    }
}
