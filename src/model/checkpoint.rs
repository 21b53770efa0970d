//! A checkpoint: the model's config plus access to its tensors by GGUF name, from a GGUF file or
//! from Hugging Face safetensors + `config.json`. Converts tensors to the precision the GPU keeps.

use super::config::{Config, RopeScaling};
use crate::error::{Error, Result};
use crate::loader::gguf::{Gguf, TensorInfo};
use crate::loader::quant;
use crate::loader::safetensors::Safetensors;
use crate::loader::source::{self, Source};
use crate::loader::DType;

/// The GGUF tensor of per-pair RoPE frequency divisors (Llama 3.1's scaling).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// How tensors (and the KV cache) are kept on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Matrices stay as the file stores them (F32, F16, BF16, quantized blocks) and are
    /// dequantised inside the kernels; vectors (norms, biases) are F32; the KV cache holds f16
    /// (as llama.cpp's), when the head and rotary dimensions are multiples of 4.
    #[default]
    Auto,
    /// Everything expanded to F32 on the CPU (the same values as `Auto`, several times the
    /// memory), and an f32 KV cache: the exact reference path.
    F32,
}

/// Host-side tensor values, in the form the GPU will hold.
#[derive(Clone, Debug)]
pub enum HostData {
    F32(Vec<f32>),
    /// The file's own bytes, in a stored type the kernels read directly (F16, BF16, quantized).
    Stored {
        dtype: DType,
        bytes: Vec<u8>,
    },
}

/// One tensor on the host: name, shape (outermost first) and values.
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    /// The values as f32 (exactly what the GPU computes with).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match &self.data {
            HostData::F32(v) => Ok(v.clone()),
            HostData::Stored { dtype, bytes } => {
                quant::dequantize(*dtype, bytes, self.shape.iter().product())
            }
        }
    }
}

enum Format {
    Gguf(Gguf),
    /// One or more safetensors shards, in the order of `files`.
    Safetensors(Vec<Safetensors>),
    /// Safetensors shards whose tensors go by their own names (a draft head's file).
    Named(Vec<Safetensors>),
}

/// A parsed checkpoint: its headers, and its files to read tensors from (by ranges: a model
/// need not be whole in memory; see [`Source`]).
pub struct Checkpoint {
    pub config: Config,
    format: Format,
    files: Vec<Box<dyn Source>>,
}

/// Where a tensor is: its file, its stored type and shape, and its bytes there.
struct Located<'a> {
    file: &'a dyn Source,
    /// The tensor's entry, or (a tensor the file stores fused with others) a view of its rows.
    info: std::borrow::Cow<'a, TensorInfo>,
}

/// The largest GGUF header read (metadata and tensor table; a 256k-token vocabulary takes about
/// 10 MB): a file claiming more is refused instead of read into memory.
pub const MAX_GGUF_HEADER: u64 = 256 << 20;

/// The first bytes of a GGUF file that hold its whole header, read in growing prefixes.
fn gguf_header(file: &dyn Source) -> Result<Gguf> {
    let mut want = (1u64 << 20).min(file.len());
    loop {
        let prefix = source::read(file, 0, want, "gguf header")?;
        match Gguf::parse(&prefix, file.len()) {
            Err(Error::Truncated { offset, needed, .. }) if want < file.len() => {
                let end = offset.saturating_add(needed);
                if end > MAX_GGUF_HEADER {
                    return Err(Error::corrupt(
                        "gguf",
                        format!("the header runs past {MAX_GGUF_HEADER} bytes (needs {end})"),
                    ));
                }
                want = end.max(want.saturating_mul(2)).min(file.len()).min(MAX_GGUF_HEADER);
            }
            parsed => return parsed,
        }
    }
}

/// A safetensors file's header (8 bytes of length, then the JSON).
fn safetensors_header(file: &dyn Source) -> Result<Safetensors> {
    // The safetensors crate keeps offsets in usize: 32 bits in the browser.
    if usize::BITS < 64 && file.len() > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument(format!(
            "a safetensors shard of {} bytes: shards of 4 GiB or more cannot be read in 32-bit \
             WebAssembly (save the model in smaller shards, or use a GGUF file)",
            file.len()
        )));
    }
    let len_bytes = source::read(file, 0, 8.min(file.len()), "safetensors header length")?;
    let header_len = len_bytes.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    // Safetensors::parse checks the length against its limit and the file before it is used.
    let want =
        header_len.map_or(8, |n| 8u64.saturating_add(n.min(crate::loader::safetensors::MAX_HEADER_LEN)));
    let prefix = source::read(file, 0, want.min(file.len()), "safetensors header")?;
    Safetensors::parse(&prefix, file.len())
}

/// Rows `rows` of the matrix `at` as a tensor of their own (its bytes a contiguous span: rows
/// are whole blocks); `None` when they are not inside it.
fn view(at: Located<'_>, rows: std::ops::Range<usize>) -> Option<Located<'_>> {
    let info = at.info.as_ref();
    let (&total, &cols) = (info.shape.first()?, info.shape.get(1)?);
    if info.shape.len() != 2 || rows.end > total {
        return None;
    }
    let row_bytes = info.dtype.bytes_for(cols as u64)?;
    let part = TensorInfo {
        name: info.name.clone(),
        dtype: info.dtype,
        shape: vec![rows.len(), cols],
        offset: info.offset + row_bytes * rows.start as u64,
        n_bytes: row_bytes * rows.len() as u64,
    };
    Some(Located { file: at.file, info: std::borrow::Cow::Owned(part) })
}

/// [`hf_name`] for a model of `arch`: Gemma's files name its norms after their place (its
/// `post_attention_layernorm` is the norm after attention; the feed-forward's input norm is
/// `pre_feedforward_layernorm`).
pub fn hf_name_of(arch: super::config::Arch, gguf_name: &str) -> Option<String> {
    if arch.gemma() {
        let gemma = [
            (".ffn_norm.weight", ".pre_feedforward_layernorm.weight"),
            (".post_attention_norm.weight", ".post_attention_layernorm.weight"),
            (".post_ffw_norm.weight", ".post_feedforward_layernorm.weight"),
        ];
        for (gguf, hf) in gemma {
            if let Some(layer) = gguf_name.strip_prefix("blk.").and_then(|r| r.strip_suffix(gguf)) {
                return Some(format!("model.layers.{layer}{hf}"));
            }
        }
    }
    hf_name(gguf_name)
}

/// Hugging Face name of a GGUF tensor name (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`).
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, kind) = rest.rsplit_once('.')?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "ffn_gate_up" => "mlp.gate_up_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

impl Checkpoint {
    /// A GGUF file's bytes.
    pub fn from_gguf(file: Vec<u8>) -> Result<Checkpoint> {
        Checkpoint::from_gguf_source(Box::new(file))
    }

    /// A GGUF file, of which only the header is read here.
    pub fn from_gguf_source(file: Box<dyn Source>) -> Result<Checkpoint> {
        let header = gguf_header(file.as_ref())?;
        let embd = header
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::MissingTensor { name: "token_embd.weight".into() })?;
        let vocab_rows = embd.shape.first().copied().unwrap_or(0);
        let tied = header.tensor("output.weight").is_none();
        let has_freqs = header.tensor(ROPE_FREQS).is_some();
        if let Some(t) = ["rope_factors_long.weight", "rope_factors_short.weight"]
            .iter()
            .find(|t| header.tensor(t).is_some())
        {
            return Err(Error::Metadata {
                key: t.to_string(),
                message: "Phi-3's longrope scaling (long and short factors) is not supported".into(),
            });
        }
        let config = Config::from_gguf(&header, vocab_rows, tied, has_freqs)?;
        Ok(Checkpoint { config, format: Format::Gguf(header), files: vec![file] })
    }

    /// A Hugging Face checkpoint: `config.json` bytes and the bytes of each `*.safetensors` shard.
    pub fn from_safetensors(config_json: &[u8], shards: Vec<Vec<u8>>) -> Result<Checkpoint> {
        let shards = shards.into_iter().map(|s| Box::new(s) as Box<dyn Source>).collect();
        Checkpoint::from_safetensors_sources(config_json, shards)
    }

    /// A Hugging Face checkpoint whose shards are read by ranges (only their headers here).
    pub fn from_safetensors_sources(config_json: &[u8], shards: Vec<Box<dyn Source>>) -> Result<Checkpoint> {
        let mut config = Config::from_hf_json(config_json)?;
        let mut headers = Vec::with_capacity(shards.len());
        for file in &shards {
            headers.push(safetensors_header(file.as_ref())?);
        }
        let has_lm_head = headers.iter().any(|h| h.tensor("lm_head.weight").is_some());
        config.tied_embeddings = config.tied_embeddings || !has_lm_head;
        Ok(Checkpoint { config, format: Format::Safetensors(headers), files: shards })
    }

    /// Safetensors shards whose tensors are looked up by the names they have there (not mapped
    /// from GGUF names): the file of heads that draft for a model (Medusa's
    /// `medusa_lm_head.safetensors`), with `config` the model they serve. Only headers are read.
    pub fn from_named_safetensors(config: Config, shards: Vec<Box<dyn Source>>) -> Result<Checkpoint> {
        let mut headers = Vec::with_capacity(shards.len());
        for file in &shards {
            headers.push(safetensors_header(file.as_ref())?);
        }
        Ok(Checkpoint { config, format: Format::Named(headers), files: shards })
    }

    /// Every tensor's name and shape, in file order (a GGUF's names; a Hugging Face checkpoint's
    /// own names).
    pub fn tensor_shapes(&self) -> Vec<(&str, &[usize])> {
        let infos: Vec<&TensorInfo> = match &self.format {
            Format::Gguf(g) => g.tensors.iter().collect(),
            Format::Safetensors(h) | Format::Named(h) => h.iter().flat_map(|h| &h.tensors).collect(),
        };
        infos.into_iter().map(|t| (t.name.as_str(), t.shape.as_slice())).collect()
    }

    /// The tensor `name` as the file stores it, or as rows of a tensor it is fused into.
    fn locate(&self, name: &str) -> Option<Located<'_>> {
        let direct = self.stored(name);
        let gguf_gate_up = name.ends_with(".ffn_up.weight");
        match (direct, self.fused(name)) {
            // (GGUF's fused gate|up is named ffn_up: twice the rows; up is its second half)
            (Some(at), Some((_, rows)))
                if gguf_gate_up && at.info.shape.first() == Some(&(2 * rows.len())) =>
            {
                let second = rows.len()..2 * rows.len();
                view(at, second)
            }
            (Some(at), _) => Some(at),
            (None, Some((fused, rows))) => {
                let at = self.stored(&fused).or_else(|| {
                    // GGUF's gate|up: ffn_up, gate first
                    let gguf = fused.replace("ffn_gate_up.weight", "ffn_up.weight");
                    self.stored(&gguf).filter(|at| at.info.shape.first() == Some(&(2 * rows.len())))
                })?;
                view(at, rows)
            }
            (None, None) => None,
        }
    }

    /// Where a tensor that some files store fused with others lies (Phi-3's q | k | v, as
    /// `attn_qkv` / `qkv_proj`, and gate | up, as a GGUF `ffn_up` of twice the rows or a Hugging
    /// Face `gate_up_proj`): the fused tensor's (GGUF) name and this tensor's rows in it.
    fn fused(&self, name: &str) -> Option<(String, std::ops::Range<usize>)> {
        let c = &self.config;
        let (layer, part) = name.strip_prefix("blk.")?.split_once('.')?;
        let (q, kv, f) = (c.q_dim(), c.kv_dim(), c.ffn_dim);
        let (fused, rows) = match part {
            "attn_q.weight" => ("attn_qkv.weight", 0..q),
            "attn_k.weight" => ("attn_qkv.weight", q..q + kv),
            "attn_v.weight" => ("attn_qkv.weight", q + kv..q + 2 * kv),
            "ffn_gate.weight" => ("ffn_gate_up.weight", 0..f),
            "ffn_up.weight" => ("ffn_gate_up.weight", f..2 * f),
            _ => return None,
        };
        Some((format!("blk.{layer}.{fused}"), rows))
    }

    /// The tensor `name` as the file stores it (a GGUF name, mapped for Hugging Face files).
    fn stored(&self, name: &str) -> Option<Located<'_>> {
        fn found<'a>(h: &'a Safetensors, file: &'a dyn Source, name: &str) -> Option<Located<'a>> {
            Some(Located { file, info: std::borrow::Cow::Borrowed(h.tensor(name)?) })
        }
        match &self.format {
            Format::Named(headers) => {
                headers.iter().zip(&self.files).find_map(|(h, file)| found(h, file.as_ref(), name))
            }
            Format::Gguf(g) => {
                let info = std::borrow::Cow::Borrowed(g.tensor(name)?);
                Some(Located { file: self.files.first()?.as_ref(), info })
            }
            Format::Safetensors(headers) => {
                let hf = hf_name_of(self.config.arch, name)?;
                headers.iter().zip(&self.files).find_map(|(h, file)| found(h, file.as_ref(), &hf))
            }
        }
    }

    /// The tensor `name`, checked against the `expected` shape.
    fn located(&self, name: &str, expected: &[usize]) -> Result<Located<'_>> {
        let at = self.locate(name).ok_or_else(|| Error::MissingTensor { name: name.to_string() })?;
        if at.info.shape != expected {
            return Err(Error::TensorShape {
                name: name.into(),
                expected: expected.to_vec(),
                found: at.info.shape.clone(),
            });
        }
        Ok(at)
    }

    /// The stored type of tensor `name` (checked against the `expected` shape).
    pub fn dtype(&self, name: &str, expected: &[usize]) -> Result<DType> {
        Ok(self.located(name, expected)?.info.dtype)
    }

    /// Waits until rows `rows` of the tensor `name` (shape `expected`) can be read from its file
    /// (at once unless the file is still arriving: see [`Source::ready`]).
    pub async fn rows_ready(
        &self,
        name: &str,
        expected: &[usize],
        rows: std::ops::Range<usize>,
    ) -> Result<()> {
        let at = self.located(name, expected)?;
        let cols = expected.get(1).copied().unwrap_or(1);
        let end = at
            .info
            .dtype
            .bytes_for(rows.end as u64 * cols as u64)
            .unwrap_or(at.info.n_bytes)
            .min(at.info.n_bytes);
        match at.file.ready(at.info.offset + end) {
            Some(wait) => wait.await,
            None => Ok(()),
        }
    }

    /// The stored bytes of rows `rows` of the tensor `name` (shape `expected`: `[rows, cols]`, or
    /// `[len]` read as rows of one element), read from its file; a NaN or an infinity among them fails, naming the element.
    pub fn read_rows(&self, name: &str, expected: &[usize], rows: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let at = self.located(name, expected)?;
        let (dtype, cols) = (at.info.dtype, expected.get(1).copied().unwrap_or(1));
        // u64: on wasm32 a row's offset in a tensor of 2^32 elements must not wrap
        let bytes = |row: usize| dtype.bytes_for(row as u64 * cols as u64);
        let span = bytes(rows.start).zip(bytes(rows.end)).filter(|(a, b)| {
            a <= b && *b <= at.info.n_bytes && rows.end <= expected.first().copied().unwrap_or(0)
        });
        let (start, end) = span.ok_or_else(|| {
            Error::InvalidArgument(format!("{name}: rows {rows:?} of a {expected:?} {dtype} tensor"))
        })?;
        let data =
            source::read(at.file, at.info.offset + start, end - start, &format!("data of tensor {name}"))?;
        // A NaN or an infinity in a weight poisons every logit downstream: refuse the file.
        if let Some(i) = quant::first_non_finite(dtype, &data) {
            return Err(Error::corrupt(
                "tensor",
                format!(
                    "{name}: element {} is not finite (NaN or infinity)",
                    rows.start as u64 * cols as u64 + i as u64
                ),
            ));
        }
        Ok(data)
    }

    /// What the forward adds to an RMSNorm weight as stored: Gemma's Hugging Face files store
    /// `w` for a norm that multiplies by `1 + w` (its GGUF converter writes `1 + w`); 0 otherwise.
    pub fn norm_offset(&self) -> f32 {
        match (&self.format, self.config.arch.gemma()) {
            (Format::Safetensors(_), true) => 1.0,
            _ => 0.0,
        }
    }

    /// The divisor of each RoPE frequency ([`RopeScaling::divisors`]), reading the file's
    /// `rope_freqs.weight` where the scaling is stored there.
    pub fn rope_divisors(&self) -> Result<Vec<f64>> {
        let c = &self.config;
        let stored = match c.rope_scaling {
            RopeScaling::Stored => {
                let shape = [c.rope_dim / 2];
                let data = self.read_rows(ROPE_FREQS, &shape, 0..shape[0])?;
                Some(quant::dequantize(self.dtype(ROPE_FREQS, &shape)?, &data, shape[0])?)
            }
            _ => None,
        };
        c.rope_scaling.divisors(c.rope_theta, c.rope_dim, stored.as_deref())
    }

    /// Bytes the tensor `name` takes in the file (as stored: blocks, f16, ...), if present.
    pub fn stored_bytes(&self, name: &str) -> Option<u64> {
        self.locate(name).map(|at| at.info.n_bytes)
    }

    /// The integer (or boolean) tensor `name` of a safetensors file by its own name, flattened:
    /// `[expected_len]` values. Such tensors are maps, never weights (an EAGLE-3 head's `d2t`).
    pub fn index_tensor(&self, name: &str, expected_len: usize) -> Result<Vec<i64>> {
        let headers = match &self.format {
            Format::Named(h) | Format::Safetensors(h) => h,
            Format::Gguf(_) => return Err(Error::MissingTensor { name: name.to_string() }),
        };
        let (file, t) = headers
            .iter()
            .zip(&self.files)
            .find_map(|(h, file)| Some((file.as_ref(), h.index_tensor(name)?)))
            .ok_or_else(|| Error::MissingTensor { name: name.to_string() })?;
        let len: usize = t.shape.iter().product();
        if len != expected_len {
            return Err(Error::TensorShape {
                name: name.into(),
                expected: vec![expected_len],
                found: t.shape.clone(),
            });
        }
        let data = source::read(file, t.offset, t.n_bytes, &format!("data of tensor {name}"))?;
        Ok(t.dtype.decode(&data))
    }

    /// Whether the checkpoint has a tensor of this (GGUF) name.
    pub fn has(&self, name: &str) -> bool {
        self.locate(name).is_some()
    }

    /// The whole tensor `name` with the `expected` shape, read from its file and converted per
    /// `precision` (vectors — norms and biases — are always F32). Matrices are uploaded by row
    /// ranges instead ([`Checkpoint::read_rows`]).
    pub fn tensor(&self, name: &str, expected: &[usize], precision: Precision) -> Result<HostTensor> {
        let dtype = self.dtype(name, expected)?;
        let n: usize = expected.iter().product();
        let bytes = self.read_rows(name, expected, 0..expected.first().copied().unwrap_or(1))?;
        let keep_stored = precision == Precision::Auto && expected.len() > 1 && dtype != DType::F32;
        let data = if keep_stored {
            HostData::Stored { dtype, bytes }
        } else {
            HostData::F32(quant::dequantize(dtype, &bytes, n)?)
        };
        Ok(HostTensor { name: name.to_string(), shape: expected.to_vec(), data })
    }

    /// The GGUF header, when the checkpoint is a GGUF file (its vocabulary feeds the tokenizer).
    pub fn gguf(&self) -> Option<&Gguf> {
        match &self.format {
            Format::Gguf(g) => Some(g),
            Format::Safetensors(_) | Format::Named(_) => None,
        }
    }

    /// Drops a GGUF header's vocabulary arrays (`tokenizer.ggml.*`) once a tokenizer has been
    /// built from them.
    pub fn forget_vocabulary(&mut self) {
        if let Format::Gguf(g) = &mut self.format {
            g.metadata.retain(|(key, _)| !key.starts_with("tokenizer.ggml."));
            g.metadata.shrink_to_fit();
        }
    }

    /// Total bytes of the checkpoint's files.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len()).sum()
    }
}
