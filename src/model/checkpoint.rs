//! A checkpoint: the model's config plus access to its tensors by GGUF name, from a GGUF file or
//! from Hugging Face safetensors + `config.json`. Converts tensors to the precision the GPU keeps.

use std::borrow::Cow;

use super::config::Config;
use crate::error::{Error, Result};
use crate::loader::gguf::Gguf;
use crate::loader::quant;
use crate::loader::safetensors::Safetensors;
use crate::loader::DType;

/// How tensors are kept on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Matrices stay as the file stores them (F32, F16, BF16, quantized blocks) and are
    /// dequantised inside the kernels; vectors (norms, biases) are F32.
    #[default]
    Auto,
    /// Everything expanded to F32 on the CPU (the same values as `Auto`, several times the memory).
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
    /// One or more safetensors shards, each with the index of its bytes in `files`.
    Safetensors(Vec<Safetensors>),
}

/// A parsed checkpoint that owns its file bytes.
pub struct Checkpoint {
    pub config: Config,
    format: Format,
    files: Vec<Vec<u8>>,
}

/// A tensor's raw stored form.
struct Raw<'a> {
    dtype: DType,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
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
        let header = Gguf::parse(&file, file.len() as u64)?;
        let embd = header
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::MissingTensor { name: "token_embd.weight".into() })?;
        let vocab_rows = embd.shape.first().copied().unwrap_or(0);
        let tied = header.tensor("output.weight").is_none();
        if header.tensor("rope_freqs.weight").is_some() {
            return Err(Error::Metadata {
                key: "rope_freqs.weight".into(),
                message: "per-dimension rope frequency factors (Llama 3.1 scaling) are not supported".into(),
            });
        }
        let config = Config::from_gguf(&header, vocab_rows, tied)?;
        Ok(Checkpoint { config, format: Format::Gguf(header), files: vec![file] })
    }

    /// A Hugging Face checkpoint: `config.json` bytes and the bytes of each `*.safetensors` shard.
    pub fn from_safetensors(config_json: &[u8], shards: Vec<Vec<u8>>) -> Result<Checkpoint> {
        let mut config = Config::from_hf_json(config_json)?;
        let mut headers = Vec::with_capacity(shards.len());
        for file in &shards {
            headers.push(Safetensors::parse(file, file.len() as u64)?);
        }
        let has_lm_head = headers.iter().any(|h| h.tensor("lm_head.weight").is_some());
        config.tied_embeddings = config.tied_embeddings || !has_lm_head;
        Ok(Checkpoint { config, format: Format::Safetensors(headers), files: shards })
    }

    fn raw(&self, name: &str) -> Result<Option<Raw<'_>>> {
        match &self.format {
            Format::Gguf(g) => {
                let Some(info) = g.tensor(name) else { return Ok(None) };
                let file = self.files.first().map(|f| f.as_slice()).unwrap_or(&[]);
                let data = g.tensor_data(file, info)?;
                Ok(Some(Raw { dtype: info.dtype, shape: info.shape.clone(), data: Cow::Borrowed(data) }))
            }
            Format::Safetensors(headers) => {
                let Some(hf) = hf_name(name) else { return Ok(None) };
                for (h, file) in headers.iter().zip(&self.files) {
                    if let Some(info) = h.tensor(&hf) {
                        let data = h.tensor_data(file, info)?;
                        return Ok(Some(Raw {
                            dtype: info.dtype,
                            shape: info.shape.clone(),
                            data: Cow::Borrowed(data),
                        }));
                    }
                }
                Ok(None)
            }
        }
    }

    /// Bytes the tensor `name` takes in the file (as stored: blocks, f16, ...), if present.
    pub fn stored_bytes(&self, name: &str) -> Option<u64> {
        self.raw(name).ok().flatten().map(|r| r.data.len() as u64)
    }

    /// Whether the checkpoint has a tensor of this (GGUF) name.
    pub fn has(&self, name: &str) -> bool {
        matches!(self.raw(name), Ok(Some(_)))
    }

    /// The tensor `name` with the `expected` shape, converted per `precision`
    /// (vectors — norms and biases — are always F32).
    pub fn tensor(&self, name: &str, expected: &[usize], precision: Precision) -> Result<HostTensor> {
        let raw = self.raw(name)?.ok_or_else(|| Error::MissingTensor { name: name.to_string() })?;
        if raw.shape != expected {
            return Err(Error::TensorShape {
                name: name.into(),
                expected: expected.to_vec(),
                found: raw.shape,
            });
        }
        let n: usize = raw.shape.iter().product();
        // A NaN or an infinity in a weight poisons every logit downstream: refuse the file.
        if let Some(i) = quant::first_non_finite(raw.dtype, &raw.data) {
            return Err(Error::corrupt(
                "tensor",
                format!("{name}: element {i} is not finite (NaN or infinity)"),
            ));
        }
        let keep_stored = precision == Precision::Auto && expected.len() > 1 && raw.dtype != DType::F32;
        let data = if keep_stored {
            if raw.dtype.bytes_for(n as u64) != Some(raw.data.len() as u64) {
                return Err(Error::corrupt(
                    "tensor",
                    format!("{name}: {} bytes for {n} {}", raw.data.len(), raw.dtype),
                ));
            }
            HostData::Stored { dtype: raw.dtype, bytes: raw.data.into_owned() }
        } else {
            HostData::F32(quant::dequantize(raw.dtype, &raw.data, n)?)
        };
        Ok(HostTensor { name: name.to_string(), shape: raw.shape, data })
    }

    /// The GGUF header, when the checkpoint is a GGUF file (its vocabulary feeds the tokenizer).
    pub fn gguf(&self) -> Option<&Gguf> {
        match &self.format {
            Format::Gguf(g) => Some(g),
            Format::Safetensors(_) => None,
        }
    }

    /// Total bytes of the checkpoint's files.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len() as u64).sum()
    }
}
