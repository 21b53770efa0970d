//! Tiny random-weight models that the tests write themselves, as GGUF and as safetensors.
#![allow(dead_code)]

use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wgspec::loader::gguf::Value;
use wgspec::loader::gguf_writer::GgufWriter;
use wgspec::loader::safetensors::write_safetensors;
use wgspec::loader::DType;
use wgspec::model::synthetic::{QuantMix, SyntheticShape};
use wgspec::model::{Arch, Config, TensorRole, TensorTable};

/// The sliding window of a tiny Gemma's local layers.
pub const GEMMA_WINDOW: usize = 5;

/// Shape of a tiny model.
#[derive(Clone, Copy, Debug)]
pub struct TinySpec {
    pub qwen2: bool,
    /// Qwen3: no qkv biases, each q and k head RMS-normalised before RoPE.
    pub qwen3: bool,
    /// Phi-3: q|k|v and gate|up stored fused, rotary in halves.
    pub phi3: bool,
    /// Gemma 3: post-norms, GeGLU, scaled embeddings, per-head norms, local layers with a window
    /// of `GEMMA_WINDOW` keys (every sixth layer global).
    pub gemma3: bool,
    pub vocab: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub context: usize,
    pub tied: bool,
}

impl TinySpec {
    pub fn llama() -> Self {
        TinySpec {
            qwen2: false,
            qwen3: false,
            phi3: false,
            gemma3: false,
            vocab: 300,
            dim: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 96,
            context: 64,
            tied: true,
        }
    }
    pub fn qwen2() -> Self {
        TinySpec {
            qwen2: true,
            qwen3: false,
            phi3: false,
            gemma3: false,
            vocab: 280,
            dim: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 160,
            context: 64,
            tied: false,
        }
    }
    /// A Qwen3 model: no biases, per-head q and k norms, tied.
    pub fn qwen3() -> Self {
        TinySpec {
            qwen2: false,
            qwen3: true,
            phi3: false,
            gemma3: false,
            vocab: 290,
            dim: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            context: 64,
            tied: true,
        }
    }
    /// A Phi-3 model: fused q|k|v and gate|up, untied.
    pub fn phi3() -> Self {
        TinySpec {
            qwen2: false,
            qwen3: false,
            phi3: true,
            gemma3: false,
            vocab: 310,
            dim: 64,
            layers: 2,
            heads: 4,
            kv_heads: 4,
            ffn: 96,
            context: 64,
            tied: false,
        }
    }
    /// A Gemma 3 model: 6 layers (5 local, then a global one), tied.
    pub fn gemma3() -> Self {
        TinySpec {
            qwen2: false,
            qwen3: false,
            phi3: false,
            gemma3: true,
            vocab: 320,
            dim: 64,
            layers: 6,
            heads: 4,
            kv_heads: 1,
            ffn: 96,
            context: 64,
            tied: true,
        }
    }
    pub fn arch_of(&self) -> Arch {
        match (self.qwen2, self.qwen3, self.phi3, self.gemma3) {
            (true, ..) => Arch::Qwen2,
            (_, true, ..) => Arch::Qwen3,
            (_, _, true, _) => Arch::Phi3,
            (.., true) => Arch::Gemma3,
            _ => Arch::Llama,
        }
    }
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }
    /// The config a GGUF of this model declares.
    pub fn config(&self) -> Config {
        let shape = SyntheticShape {
            name: "tiny",
            arch: self.arch_of(),
            vocab: self.vocab,
            dim: self.dim,
            layers: self.layers,
            heads: self.heads,
            kv_heads: self.kv_heads,
            ffn: self.ffn,
            tied: self.tied,
            rope_theta: 10000.0,
            context: self.context,
            // (the tests write their own weights)
            mix: QuantMix::Q8_0,
            head_dim: 0,
            llama3_rope: false,
        };
        Config { rms_eps: 1e-5, ..shape.config() }
    }
    fn arch(&self) -> &'static str {
        self.arch_of().gguf_name()
    }
}

/// One tensor in Hugging Face orientation (rows = output features), f32 values.
#[derive(Clone)]
pub struct TinyTensor {
    /// GGUF name.
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// A tiny model's weights (HF orientation and rotary layout).
pub struct TinyModel {
    pub spec: TinySpec,
    pub tensors: Vec<TinyTensor>,
}

impl TinyModel {
    pub fn random(spec: TinySpec, rng: &mut SmallRng) -> TinyModel {
        let tensors = TensorTable::new(&spec.config())
            .iter()
            .map(|t| {
                let (scale, offset) = match t.role {
                    TensorRole::Embedding => (1.0, 0.0),
                    TensorRole::Norm => (0.2, 1.0),
                    TensorRole::QkvWeight => (0.3, 0.0),
                    TensorRole::QkvBias | TensorRole::Output => (0.5, 0.0),
                    TensorRole::Weight => (0.2, 0.0),
                };
                let n: usize = t.shape.iter().product();
                let values = (0..n).map(|_| offset + rng.gen_range(-scale..scale)).collect();
                TinyTensor { name: t.name.clone(), shape: t.shape.clone(), values }
            })
            .collect();
        TinyModel { spec, tensors }
    }

    /// The tensors as the files store them: Phi-3's q|k|v as one `attn_qkv` and gate|up as one
    /// `ffn_gate_up` (written `ffn_up` in GGUF: [`TinyModel::to_gguf_with`]), gate first.
    fn stored_tensors(&self) -> Vec<TinyTensor> {
        if !self.spec.phi3 {
            return self.tensors.clone();
        }
        let find = |name: &str| self.tensors.iter().find(|t| t.name == name).expect("tensor").clone();
        let fuse = |name: String, parts: Vec<TinyTensor>| TinyTensor {
            name,
            shape: vec![parts.iter().map(|p| p.shape[0]).sum(), parts[0].shape[1]],
            values: parts.iter().flat_map(|p| p.values.clone()).collect(),
        };
        let mut out = Vec::new();
        for t in &self.tensors {
            let Some((layer, part)) = t.name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
                out.push(t.clone());
                continue;
            };
            let b = |s: &str| format!("blk.{layer}.{s}");
            match part {
                "attn_q.weight" => out.push(fuse(
                    b("attn_qkv.weight"),
                    vec![find(&b("attn_q.weight")), find(&b("attn_k.weight")), find(&b("attn_v.weight"))],
                )),
                "ffn_gate.weight" => out.push(fuse(
                    b("ffn_gate_up.weight"),
                    vec![find(&b("ffn_gate.weight")), find(&b("ffn_up.weight"))],
                )),
                "attn_k.weight" | "attn_v.weight" | "ffn_up.weight" => {}
                _ => out.push(t.clone()),
            }
        }
        out
    }

    /// llama.cpp's converter permutes llama q/k rows per head from halves to interleaved pairs.
    fn gguf_rows(&self, t: &TinyTensor) -> Vec<f32> {
        // (Gemma's norms multiply by 1 + w: its converter writes 1 + w into GGUF)
        if self.spec.gemma3 && t.name.ends_with("norm.weight") {
            return t.values.iter().map(|v| v + 1.0).collect();
        }
        let heads = if t.name.ends_with("attn_q.weight") {
            self.spec.heads
        } else if t.name.ends_with("attn_k.weight") {
            self.spec.kv_heads
        } else {
            return t.values.clone();
        };
        if self.spec.arch_of() != Arch::Llama {
            return t.values.clone();
        }
        let cols = t.shape[1];
        let hd = t.shape[0] / heads;
        let mut out = vec![0f32; t.values.len()];
        for h in 0..heads {
            for i in 0..hd / 2 {
                for (dst, src) in [(2 * i, i), (2 * i + 1, i + hd / 2)] {
                    let (d, s) = ((h * hd + dst) * cols, (h * hd + src) * cols);
                    out[d..d + cols].copy_from_slice(&t.values[s..s + cols]);
                }
            }
        }
        out
    }

    /// GGUF v3 bytes. Matrices are stored as `matrix_type` (F32, F16, or a quantized type whose
    /// blocks are random valid bytes; the model's values then are those blocks' dequantization).
    pub fn to_gguf(&self, matrix_type: DType, rng: &mut SmallRng) -> Vec<u8> {
        self.to_gguf_with(matrix_type, rng, &[])
    }

    /// [`TinyModel::to_gguf`] with metadata keys replaced or added (`overrides`: full key names).
    pub fn to_gguf_with(
        &self,
        matrix_type: DType,
        rng: &mut SmallRng,
        overrides: &[(&str, Value)],
    ) -> Vec<u8> {
        let s = &self.spec;
        let a = s.arch();
        let mut meta: Vec<(String, Value)> = Vec::new();
        let mut add = |k: &str, v: Value| meta.push((k.to_string(), v));
        add("general.architecture", Value::String(a.into()));
        add("general.name", Value::String(format!("tiny-{a}")));
        add(&format!("{a}.context_length"), Value::U32(s.context as u32));
        add(&format!("{a}.embedding_length"), Value::U32(s.dim as u32));
        add(&format!("{a}.block_count"), Value::U32(s.layers as u32));
        add(&format!("{a}.feed_forward_length"), Value::U32(s.ffn as u32));
        add(&format!("{a}.attention.head_count"), Value::U32(s.heads as u32));
        add(&format!("{a}.attention.head_count_kv"), Value::U32(s.kv_heads as u32));
        add(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
        // (Gemma: a global base far from its local layers' 10000, and a window the tests' 14
        // positions run past)
        add(&format!("{a}.rope.freq_base"), Value::F32(if s.gemma3 { 1e6 } else { 10000.0 }));
        if s.gemma3 {
            add(&format!("{a}.attention.sliding_window"), Value::U32(GEMMA_WINDOW as u32));
        }
        // A byte-level vocabulary: the 256 GPT-2 byte symbols, then plain filler tokens; the last
        // token is the end-of-sequence control token.
        let mut tokens: Vec<Value> = gpt2_byte_symbols().into_iter().map(Value::String).collect();
        while tokens.len() < s.vocab - 1 {
            tokens.push(Value::String(format!("<filler_{}>", tokens.len())));
        }
        tokens.push(Value::String("<|eos|>".into()));
        let mut types = vec![Value::I32(1); s.vocab - 1];
        types.push(Value::I32(3));
        if s.phi3 {
            // (llama.cpp looks these up by their text in a vocabulary whose model is named Phi-3)
            for (i, t) in ["<|end|>", "<s>", "</s>", "<unk>", "<|endoftext|>"].into_iter().enumerate() {
                tokens[s.vocab - 2 - i] = Value::String(t.into());
                types[s.vocab - 2 - i] = Value::I32(3);
            }
        }
        add("tokenizer.ggml.model", Value::String("gpt2".into()));
        // (llama.cpp's name: its golden runs load these files)
        add("tokenizer.ggml.pre", Value::String("gpt-2".into()));
        add("tokenizer.ggml.tokens", Value::Array(tokens));
        add("tokenizer.ggml.token_type", Value::Array(types));
        add("tokenizer.ggml.merges", Value::Array(vec![]));
        add("tokenizer.ggml.eos_token_id", Value::U32(s.vocab as u32 - 1));
        add("tokenizer.ggml.add_bos_token", Value::Bool(false));
        let mut w = GgufWriter::new();
        for (k, v) in overrides.iter().filter(|(o, _)| !meta.iter().any(|(k, _)| k == o)) {
            w.add(k, v.clone());
        }
        for (k, v) in meta {
            let v = overrides.iter().find(|(o, _)| *o == k).map_or(v, |(_, o)| o.clone());
            w.add(&k, v);
        }
        for t in &self.stored_tensors() {
            let values = self.gguf_rows(t);
            let (dtype, bytes) = if t.shape.len() == 1 {
                (DType::F32, f32_bytes(&values))
            } else {
                match matrix_type {
                    DType::F32 => (DType::F32, f32_bytes(&values)),
                    DType::F16 => (DType::F16, f16_bytes(&values)),
                    q => (q, random_blocks(q, values.len(), rng)),
                }
            };
            // (GGUF's fused gate|up is named ffn_up, as llama.cpp's Phi-3 converter writes it)
            let name = t.name.replace("ffn_gate_up.weight", "ffn_up.weight");
            w.add_tensor(&name, dtype, &t.shape, bytes);
        }
        w.to_bytes()
    }

    /// Hugging Face `config.json` and one `model.safetensors` (F32 or F16 or BF16 matrices).
    pub fn to_safetensors(&self, matrix_type: DType) -> (Vec<u8>, Vec<u8>) {
        let (config, mut shards) = self.to_safetensors_shards(matrix_type, 1);
        (config, shards.pop().expect("one shard"))
    }

    /// `config.json` and the tensors dealt round-robin over `n` safetensors shards (so a matrix
    /// built from several tensors, q|k|v or gate|up, reads from several files).
    pub fn to_safetensors_shards(&self, matrix_type: DType, n: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let s = &self.spec;
        let config = serde_json::json!({
            "architectures": [match s.arch_of() {
                Arch::Qwen2 => "Qwen2ForCausalLM",
                Arch::Qwen3 => "Qwen3ForCausalLM",
                Arch::Phi3 => "Phi3ForCausalLM",
                Arch::Gemma3 => "Gemma3ForCausalLM",
                Arch::Llama => "LlamaForCausalLM",
            }],
            "hidden_size": s.dim,
            "intermediate_size": s.ffn,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "num_hidden_layers": s.layers,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "vocab_size": s.vocab,
            "max_position_embeddings": s.context,
            "tie_word_embeddings": s.tied,
        });
        let mut config = config;
        if s.gemma3 {
            config["rope_theta"] = 1e6.into();
            config["sliding_window"] = GEMMA_WINDOW.into();
            config["sliding_window_pattern"] = 6.into();
            config["rope_local_base_freq"] = 10000.0.into();
            config["query_pre_attn_scalar"] = self.spec.head_dim().into();
        }
        let mut owned = Vec::new();
        for t in &self.stored_tensors() {
            let name = wgspec::model::checkpoint::hf_name_of(s.arch_of(), &t.name).expect("hf name");
            let (dtype, bytes) = if t.shape.len() == 1 {
                (DType::F32, f32_bytes(&t.values))
            } else {
                match matrix_type {
                    DType::F16 => (DType::F16, f16_bytes(&t.values)),
                    DType::BF16 => (DType::BF16, bf16_bytes(&t.values)),
                    _ => (DType::F32, f32_bytes(&t.values)),
                }
            };
            owned.push((name, dtype, t.shape.clone(), bytes));
        }
        let shards = (0..n)
            .map(|i| {
                let refs: Vec<(&str, DType, &[usize], &[u8])> = owned
                    .iter()
                    .skip(i)
                    .step_by(n)
                    .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
                    .collect();
                write_safetensors(&refs)
            })
            .collect();
        (serde_json::to_vec(&config).expect("json"), shards)
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
}

pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect()
}

/// Blocks of a quantized type for `n` values with edge-case scales: random quant bytes, and in
/// turn f16 scales of +-0, +-2^-24, the largest subnormal, +-65504 and negative normals (the
/// second scale, Q4_1's m and the K-quants' dmin, in another turn); Q6_K's scale bytes -128,
/// 127 and 0. For bit-for-bit checks of a kernel's dequantisation against the CPU's.
pub fn edge_scale_blocks(dtype: DType, n: usize, rng: &mut SmallRng) -> Vec<u8> {
    const EDGE: [u16; 9] = [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x7bff, 0xfbff, 0xba00, 0x2400];
    let size = dtype.block_bytes();
    let mut bytes = vec![0u8; n / dtype.block_len() * size];
    rng.fill(&mut bytes[..]);
    for (i, b) in bytes.chunks_mut(size).enumerate() {
        let d = EDGE[i % EDGE.len()].to_le_bytes();
        let m = EDGE[(5 * i + 3) % EDGE.len()].to_le_bytes();
        match dtype {
            DType::Q6_K => {
                b[208..210].copy_from_slice(&d);
                b[192..195].copy_from_slice(&[0x80, 0x7f, 0x00]);
            }
            DType::Q4_1 | DType::Q4_K | DType::Q5_K => {
                b[0..2].copy_from_slice(&d);
                b[2..4].copy_from_slice(&m);
            }
            _ => b[0..2].copy_from_slice(&d),
        }
    }
    bytes
}

/// Random but valid blocks of a quantized type: random quant bits, sane f16 scales.
pub fn random_blocks(dtype: DType, n: usize, rng: &mut SmallRng) -> Vec<u8> {
    let blocks = n / dtype.block_len();
    let size = dtype.block_bytes();
    let mut out = vec![0u8; blocks * size];
    rng.fill(&mut out[..]);
    let scale = |rng: &mut SmallRng, lo: f32, hi: f32| f16::from_f32(rng.gen_range(lo..hi)).to_le_bytes();
    for b in out.chunks_mut(size) {
        // Offsets of the f16 scale fields in each block layout (ggml-common.h).
        match dtype {
            DType::Q8_0 => b[0..2].copy_from_slice(&scale(rng, 0.001, 0.01)),
            DType::Q4_0 | DType::Q5_0 => b[0..2].copy_from_slice(&scale(rng, 0.01, 0.05)),
            DType::Q4_1 => {
                b[0..2].copy_from_slice(&scale(rng, 0.01, 0.05));
                b[2..4].copy_from_slice(&scale(rng, -0.3, 0.0));
            }
            DType::Q4_K => {
                b[0..2].copy_from_slice(&scale(rng, 0.0002, 0.0005));
                b[2..4].copy_from_slice(&scale(rng, 0.0002, 0.0005));
            }
            DType::Q5_K => {
                // Quants reach 31, twice Q4_K's: half its scales keep the weights alike in size.
                b[0..2].copy_from_slice(&scale(rng, 0.0001, 0.00025));
                b[2..4].copy_from_slice(&scale(rng, 0.0001, 0.00025));
            }
            DType::Q6_K => b[208..210].copy_from_slice(&scale(rng, 0.00002, 0.0001)),
            other => panic!("not a quantized type: {other:?}"),
        }
    }
    out
}

/// GPT-2's byte-to-symbol table: printable bytes map to themselves, the rest to U+0100 upwards.
pub fn gpt2_byte_symbols() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).map(String::from).unwrap_or_default()
        })
        .collect()
}

/// What [`medusa_heads`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MedusaKind {
    /// Random blocks and projections.
    Random,
    /// Zero blocks and the model's own output matrix as every projection: every head then ranks
    /// what the model's output ranks at the row it reads (its own next token), a guess that is
    /// right wherever the text repeats a token.
    Echo,
    /// Random blocks and no projections: the heads project with the target's output matrix.
    Shared,
}

/// Medusa heads for a tiny model in the public Medusa-1 layout (`{h}.{l}.linear.weight` /
/// `.bias`, `{h}.{L}.weight` but with [`MedusaKind::Shared`]): the `medusa_lm_head.safetensors`
/// bytes (matrices as `dtype`: F32, F16 or BF16) and its `config.json`.
pub fn medusa_heads(
    model: &TinyModel,
    heads: usize,
    layers: usize,
    dtype: DType,
    kind: MedusaKind,
    rng: &mut SmallRng,
) -> (Vec<u8>, Vec<u8>) {
    let s = &model.spec;
    let output_name = if s.tied { "token_embd.weight" } else { "output.weight" };
    let output = model.tensors.iter().find(|t| t.name == output_name).expect("output matrix");
    let copy_output = kind == MedusaKind::Echo;
    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| if copy_output { 0.0 } else { rng.gen_range(-scale..scale) }).collect()
    };
    let matrix = |v: &[f32]| match dtype {
        DType::F16 => f16_bytes(v),
        DType::BF16 => bf16_bytes(v),
        _ => f32_bytes(v),
    };
    let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let stored = if matches!(dtype, DType::F16 | DType::BF16) { dtype } else { DType::F32 };
    for h in 0..heads {
        for l in 0..layers {
            let w = random(s.dim * s.dim, 0.3);
            owned.push((format!("{h}.{l}.linear.weight"), stored, vec![s.dim, s.dim], matrix(&w)));
            let b = random(s.dim, 0.3);
            owned.push((format!("{h}.{l}.linear.bias"), DType::F32, vec![s.dim], f32_bytes(&b)));
        }
        if kind == MedusaKind::Shared {
            continue;
        }
        let out = if copy_output { output.values.clone() } else { random(s.vocab * s.dim, 0.5) };
        owned.push((format!("{h}.{layers}.weight"), stored, vec![s.vocab, s.dim], matrix(&out)));
    }
    let refs: Vec<(&str, DType, &[usize], &[u8])> =
        owned.iter().map(|(n, d, sh, b)| (n.as_str(), *d, sh.as_slice(), b.as_slice())).collect();
    let config = serde_json::json!({ "medusa_num_heads": heads, "medusa_num_layers": layers });
    (write_safetensors(&refs), serde_json::to_vec(&config).expect("json"))
}

/// An EAGLE-1 head for a model of shape `s` in the public layout (`fc.weight`, `fc.bias`,
/// `layers.0.self_attn.*`, `layers.0.post_attention_layernorm.weight`, `layers.0.mlp.*`, and an
/// `layers.0.input_layernorm.weight` only with `input_norm`): its `model.safetensors` bytes
/// (matrices as `dtype`: F32, F16 or BF16) and `config.json`. Random weights, or with
/// `copy_feature` a head whose fc passes the target's feature through and whose layer adds
/// nothing: it predicts the next feature to be the current one, so it guesses the token the
/// target has just produced (right wherever the text repeats a token).
pub fn eagle_head(
    s: &TinySpec,
    dtype: DType,
    input_norm: bool,
    copy_feature: bool,
    rng: &mut SmallRng,
) -> (Vec<u8>, Vec<u8>) {
    let (dim, hd) = (s.dim, s.head_dim());
    let mut r2 = SmallRng::seed_from_u64(rng.gen());
    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| if copy_feature { 0.0 } else { rng.gen_range(-scale..scale) }).collect()
    };
    let matrix = |v: &[f32]| match dtype {
        DType::F16 => f16_bytes(v),
        DType::BF16 => bf16_bytes(v),
        _ => f32_bytes(v),
    };
    let stored = if matches!(dtype, DType::F16 | DType::BF16) { dtype } else { DType::F32 };
    let mut fc = random(dim * 2 * dim, 0.2);
    if copy_feature {
        for i in 0..dim {
            fc[i * 2 * dim + dim + i] = 1.0;
        }
    }
    let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = vec![
        ("fc.weight".into(), stored, vec![dim, 2 * dim], matrix(&fc)),
        ("fc.bias".into(), DType::F32, vec![dim], f32_bytes(&random(dim, 0.2))),
    ];
    let norm = |name: &str, owned: &mut Vec<(String, DType, Vec<usize>, Vec<u8>)>, rng: &mut SmallRng| {
        let v: Vec<f32> =
            (0..dim).map(|_| if copy_feature { 1.0 } else { 1.0 + rng.gen_range(-0.2..0.2) }).collect();
        owned.push((format!("layers.0.{name}.weight"), DType::F32, vec![dim], f32_bytes(&v)));
    };
    if input_norm {
        norm("input_layernorm", &mut owned, &mut r2);
    }
    norm("post_attention_layernorm", &mut owned, &mut r2);
    let (q, kv, ffn) = (s.heads * hd, s.kv_heads * hd, s.ffn);
    for (name, rows, cols, scale) in [
        ("self_attn.q_proj", q, dim, 0.3),
        ("self_attn.k_proj", kv, dim, 0.3),
        ("self_attn.v_proj", kv, dim, 0.3),
        ("self_attn.o_proj", dim, q, 0.2),
        ("mlp.gate_proj", ffn, dim, 0.2),
        ("mlp.up_proj", ffn, dim, 0.2),
        ("mlp.down_proj", dim, ffn, 0.2),
    ] {
        let w = random(rows * cols, scale);
        owned.push((format!("layers.0.{name}.weight"), stored, vec![rows, cols], matrix(&w)));
    }
    let refs: Vec<(&str, DType, &[usize], &[u8])> =
        owned.iter().map(|(n, d, sh, b)| (n.as_str(), *d, sh.as_slice(), b.as_slice())).collect();
    let mut config = head_config(s, "LlamaForCausalLM");
    config["rope_theta"] = 10000.0.into();
    config["tie_word_embeddings"] = true.into();
    (write_safetensors(&refs), serde_json::to_vec(&config).expect("json"))
}

/// The `config.json` of a one-layer EAGLE head of `spec`'s shape, with this architecture name.
fn head_config(s: &TinySpec, arch: &str) -> serde_json::Value {
    serde_json::json!({
        "architectures": [arch],
        "hidden_size": s.dim,
        "intermediate_size": s.ffn,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": s.vocab,
        "max_position_embeddings": s.context,
    })
}

/// An EAGLE-3 head for `model` in the public layout (random weights): `fc` over its residual
/// stream's 3 taps `[dim, 3 dim]`, `midlayer.*` whose q/k/v read `2 dim`, `midlayer.hidden_norm`,
/// `norm`, and `lm_head` over `draft_vocab` ids: target ids chosen at random (ascending), each
/// draft id d standing for `d + d2t[d]` (an I64 `d2t`). With `taps`, config.json names them
/// (`eagle_config.eagle_aux_hidden_state_layer_ids`). With `copy` (a full draft vocabulary, the
/// first tap after the target's last layer), the head passes its first tap through (fc picks it,
/// the layer adds nothing) and projects it as the target does (its output norm and projection):
/// its first guess at a row is the target's own next token there. Returns (file bytes,
/// config.json bytes).
pub fn eagle3_head(
    model: &TinyModel,
    dtype: DType,
    draft_vocab: usize,
    taps: Option<[usize; 3]>,
    copy: bool,
    rng: &mut SmallRng,
) -> (Vec<u8>, Vec<u8>) {
    let s = &model.spec;
    let (dim, hd) = (s.dim, s.head_dim());
    let matrix = |v: &[f32]| match dtype {
        DType::F16 => f16_bytes(v),
        DType::BF16 => bf16_bytes(v),
        _ => f32_bytes(v),
    };
    let stored = if matches!(dtype, DType::F16 | DType::BF16) { dtype } else { DType::F32 };
    let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let weight = |name: &str, rows: usize, cols: usize, scale: f32, rng: &mut SmallRng| {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-scale..scale)).collect();
        (name.to_string(), stored, vec![rows, cols], matrix(&w))
    };
    let (q, kv, ffn) = (s.heads * hd, s.kv_heads * hd, s.ffn);
    owned.push(weight("fc.weight", dim, 3 * dim, 0.2, rng));
    for (name, rows, cols, scale) in [
        ("midlayer.self_attn.q_proj.weight", q, 2 * dim, 0.3),
        ("midlayer.self_attn.k_proj.weight", kv, 2 * dim, 0.3),
        ("midlayer.self_attn.v_proj.weight", kv, 2 * dim, 0.3),
        ("midlayer.self_attn.o_proj.weight", dim, q, 0.2),
        ("midlayer.mlp.gate_proj.weight", ffn, dim, 0.2),
        ("midlayer.mlp.up_proj.weight", ffn, dim, 0.2),
        ("midlayer.mlp.down_proj.weight", dim, ffn, 0.2),
        ("lm_head.weight", draft_vocab, dim, 0.5),
    ] {
        owned.push(weight(name, rows, cols, scale, rng));
    }
    for name in
        ["midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"]
    {
        let v: Vec<f32> = (0..dim).map(|_| 1.0 + rng.gen_range(-0.2..0.2)).collect();
        owned.push((format!("{name}.weight"), DType::F32, vec![dim], f32_bytes(&v)));
    }
    if copy {
        let tensor = |name: &str| model.tensors.iter().find(|t| t.name == name).map(|t| t.values.clone());
        let output = tensor("output.weight").or_else(|| tensor("token_embd.weight")).expect("output");
        let mut fc = vec![0.0; dim * 3 * dim];
        for i in 0..dim {
            fc[i * 3 * dim + i] = 1.0;
        }
        let zeros = |n: usize| vec![0.0; n];
        for (name, v) in [
            ("fc.weight", fc),
            ("midlayer.self_attn.o_proj.weight", zeros(dim * q)),
            ("midlayer.mlp.down_proj.weight", zeros(dim * ffn)),
            ("lm_head.weight", output),
        ] {
            let at = owned.iter().position(|o| o.0 == name).expect("tensor");
            owned[at].3 = matrix(&v);
        }
        let at = owned.iter().position(|o| o.0 == "norm.weight").expect("norm");
        owned[at].3 = f32_bytes(&tensor("output_norm.weight").expect("output norm"));
    }
    // the draft vocabulary: draft_vocab of the target's ids, ascending
    let mut ids: Vec<usize> = (0..s.vocab).collect();
    while ids.len() > draft_vocab {
        ids.remove(rng.gen_range(0..ids.len()));
    }
    let d2t: Vec<i64> = ids.iter().enumerate().map(|(d, &t)| t as i64 - d as i64).collect();
    let refs: Vec<(&str, DType, &[usize], &[u8])> =
        owned.iter().map(|(n, d, sh, b)| (n.as_str(), *d, sh.as_slice(), b.as_slice())).collect();
    let shape = [draft_vocab];
    let file = wgspec::loader::safetensors::write_safetensors_with_index(&refs, &[("d2t", &shape, &d2t)]);
    let mut config = head_config(s, "LlamaForCausalLMEagle3");
    config["draft_vocab_size"] = draft_vocab.into();
    if let Some(taps) = taps {
        config["eagle_config"] = serde_json::json!({ "eagle_aux_hidden_state_layer_ids": taps });
    }
    (file, serde_json::to_vec(&config).expect("json"))
}
