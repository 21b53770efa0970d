//! Random-weight models of real models' exact shapes ([`SYNTHETIC_SHAPES`]), each with the stored
//! types of the real files of its shape ([`QuantMix`]: Q4_K_M's Q4_K and Q6_K, the Qwen 0.5B
//! file's Q5_0 and Q8_0, ...), so that a benchmark times the kernels the real models run, on
//! adapters without model files (`wgspec bench --synthetic`), and for tests' configs.

use crate::error::{Error, Result};
use crate::loader::gguf::Value;
use crate::loader::gguf_writer::GgufWriter;
use crate::loader::source::Source;
use crate::loader::DType;
use crate::model::{Arch, Config, RopeScaling, TensorRole, TensorTable};
use crate::tokenizer::{byte_to_char, GgufVocab, Tokenizer};

/// The stored types of a synthetic model's matrices (norms and biases are F32): those of the
/// real files of its shape. A matrix whose row length is no multiple of its type's block takes
/// Q8_0 instead (as llama.cpp falls back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    /// Every matrix Q8_0.
    Q8_0,
    /// llama.cpp's Q4_K_M: Q4_K; Q6_K for `attn_v` and `ffn_down` on half the layers (its
    /// `use_more_bits`: the first and last eighth, and every third between) and for the output
    /// (a tied model's embedding, which is its output).
    Q4KM,
    /// Qwen2.5-Coder-0.5B-Instruct's file: Q5_0; on half the layers (as above) `attn_v` Q8_0 and
    /// `ffn_down` Q6_K (Q4_K on the others); the output Q8_0.
    Q5_0Mix,
    /// SmolLM2-135M-Instruct's file: Q4_1, its (tied) embedding Q8_0.
    Q4_1,
}

impl QuantMix {
    /// The type of the matrix `name` (`blk.{i}.attn_v.weight`, `output.weight`, ...) of a model of
    /// `layers` layers (`tied`: its embedding is its output).
    fn dtype(self, name: &str, layers: usize, tied: bool) -> DType {
        let name = if tied && name == "token_embd.weight" && self == QuantMix::Q4KM {
            "output.weight"
        } else {
            name
        };
        let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse().ok());
        let more_bits = layer.is_some_and(|i: usize| {
            i < layers / 8 || i >= 7 * layers / 8 || (i + 3 * layers - layers / 8) % 3 == 2
        });
        let (v, down) = (name.ends_with("attn_v.weight"), name.ends_with("ffn_down.weight"));
        match self {
            QuantMix::Q8_0 => DType::Q8_0,
            QuantMix::Q4KM if name == "output.weight" || ((v || down) && more_bits) => DType::Q6_K,
            QuantMix::Q4KM => DType::Q4_K,
            QuantMix::Q5_0Mix if name == "output.weight" || (v && more_bits) => DType::Q8_0,
            QuantMix::Q5_0Mix if down => {
                if more_bits {
                    DType::Q6_K
                } else {
                    DType::Q4_K
                }
            }
            QuantMix::Q5_0Mix => DType::Q5_0,
            QuantMix::Q4_1 if name == "token_embd.weight" => DType::Q8_0,
            QuantMix::Q4_1 => DType::Q4_1,
        }
    }
}

/// The sliding window of a synthetic Gemma 3's local layers (Gemma 3 1B's).
const GEMMA_WINDOW: u32 = 512;

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
    pub mix: QuantMix,
    /// Width of a head (0: dim / heads; Qwen3's are wider than that).
    pub head_dim: usize,
    /// Llama 3.1's rope scaling (factor 8, bands 1 and 4, original context 8192), written as
    /// llama.cpp's converter writes it: `rope_freqs.weight`.
    pub llama3_rope: bool,
}

/// Shapes `--synthetic` knows: those of the models in MODELS.md, Llama 3.2 1B, Qwen2.5 7B,
/// Llama 3.1 8B (the model EAGLE-3's published figures are measured on, with its rope scaling),
/// Qwen3 0.6B and 8B, Gemma 3 1B.
pub const SYNTHETIC_SHAPES: &[SyntheticShape] = &[
    //                   name          arch         vocab   [dim, layers, heads, kv_heads, ffn]  rope θ  context
    SyntheticShape::new("qwen2-1.5b", Arch::Qwen2, 151936, [1536, 28, 12, 2, 8960], 1e6, 32768),
    SyntheticShape::new("qwen2-0.5b", Arch::Qwen2, 151936, [896, 24, 14, 2, 4864], 1e6, 32768)
        .mix(QuantMix::Q5_0Mix),
    SyntheticShape::new("llama-1b", Arch::Llama, 128256, [2048, 16, 32, 8, 8192], 5e5, 131072).tied(),
    SyntheticShape::new("smollm2-135m", Arch::Llama, 49152, [576, 30, 9, 3, 1536], 1e5, 8192)
        .tied()
        .mix(QuantMix::Q4_1),
    SyntheticShape::new("qwen2-7b", Arch::Qwen2, 152064, [3584, 28, 28, 4, 18944], 1e6, 32768),
    SyntheticShape::new("llama-8b", Arch::Llama, 128256, [4096, 32, 32, 8, 14336], 5e5, 131072).llama3_rope(),
    SyntheticShape::new("qwen3-0.6b", Arch::Qwen3, 151936, [1024, 28, 16, 8, 3072], 1e6, 40960)
        .tied()
        .head_dim(128),
    SyntheticShape::new("gemma3-1b", Arch::Gemma3, 262144, [1152, 26, 4, 1, 6912], 1e6, 32768)
        .tied()
        .head_dim(256),
    SyntheticShape::new("qwen3-8b", Arch::Qwen3, 151936, [4096, 36, 32, 8, 12288], 1e6, 40960).head_dim(128),
];

impl SyntheticShape {
    /// A shape of the Q4_K_M mix with an untied output, heads of dim / heads and no rope scaling.
    const fn new(
        name: &'static str,
        arch: Arch,
        vocab: usize,
        [dim, layers, heads, kv_heads, ffn]: [usize; 5],
        rope_theta: f32,
        context: usize,
    ) -> SyntheticShape {
        SyntheticShape {
            name,
            arch,
            vocab,
            dim,
            layers,
            heads,
            kv_heads,
            ffn,
            tied: false,
            rope_theta,
            context,
            mix: QuantMix::Q4KM,
            head_dim: 0,
            llama3_rope: false,
        }
    }

    const fn tied(self) -> SyntheticShape {
        SyntheticShape { tied: true, ..self }
    }

    const fn mix(self, mix: QuantMix) -> SyntheticShape {
        SyntheticShape { mix, ..self }
    }

    const fn head_dim(self, head_dim: usize) -> SyntheticShape {
        SyntheticShape { head_dim, ..self }
    }

    const fn llama3_rope(self) -> SyntheticShape {
        SyntheticShape { llama3_rope: true, ..self }
    }
}

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

/// The types [`fill_blocks`] writes (it sets each one's scales).
const SYNTHETIC_TYPES: [DType; 5] = [DType::Q8_0, DType::Q5_0, DType::Q4_1, DType::Q4_K, DType::Q6_K];

/// `out` (whole blocks of `dtype`, one of [`SYNTHETIC_TYPES`]) filled with random blocks, weights of standard
/// deviation about 0.02 in every type: uniform quants, and each type's scales (ggml's block
/// layouts) set so that its dequantised values spread alike.
fn fill_blocks(dtype: DType, out: &mut [u8], mix: &mut Mix) {
    let size = dtype.block_bytes();
    for chunk in out.chunks_mut(8) {
        let bytes = mix.next().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for b in out.chunks_mut(size) {
        match dtype {
            // d * q, q in -128..127
            DType::Q8_0 => b[0..2].copy_from_slice(&f16(3e-4)),
            // d * (q - 16), q in 0..31
            DType::Q5_0 => b[0..2].copy_from_slice(&f16(2.2e-3)),
            // d * q + m, q in 0..15
            DType::Q4_1 => {
                b[0..2].copy_from_slice(&f16(4.3e-3));
                b[2..4].copy_from_slice(&f16(-7.5 * 4.3e-3));
            }
            // d * sc * q - dmin * m, 6-bit sc and m
            DType::Q4_K => {
                b[0..2].copy_from_slice(&f16(7.7e-5));
                b[2..4].copy_from_slice(&f16(7.5 * 7.7e-5));
            }
            // d * sc * (q - 32), 8-bit signed sc, d last
            DType::Q6_K => b[208..210].copy_from_slice(&f16(1.5e-5)),
            _ => {}
        }
    }
}

impl SyntheticShape {
    /// The model config these shapes give (GGUF conventions: llama q/k rows in interleaved pairs).
    pub fn config(&self) -> Config {
        let head_dim = if self.head_dim > 0 { self.head_dim } else { self.dim / self.heads.max(1) };
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
            rope_layout: self.arch.gguf_rope_layout(),
            context_len: self.context,
            tied_embeddings: self.tied,
            rope_scaling: if self.llama3_rope { RopeScaling::Stored } else { RopeScaling::None },
            sliding_window: None,
            global_every: 0,
            local_rope_theta: 10000.0,
        }
    }
}

impl SyntheticShape {
    /// Each matrix's stored type, by tensor name ([`QuantMix`], and Q8_0 where a row is no whole
    /// number of the type's blocks); norms and biases are F32.
    pub fn dtype_of(&self, spec: &crate::model::TensorSpec) -> DType {
        match spec.role {
            TensorRole::Norm | TensorRole::QkvBias => DType::F32,
            _ => {
                let row = spec.shape.last().copied().unwrap_or(0);
                Some(self.mix.dtype(&spec.name, self.layers, self.tied))
                    .filter(|d| SYNTHETIC_TYPES.contains(d) && row % d.block_len() == 0)
                    .unwrap_or(DType::Q8_0)
            }
        }
    }

    /// Bytes of the model's tensors as stored.
    pub fn weight_bytes(&self) -> u64 {
        TensorTable::new(&self.config())
            .iter()
            .map(|t| {
                let n: usize = t.shape.iter().product();
                let d = self.dtype_of(t);
                (n / d.block_len() * d.block_bytes()) as u64
            })
            .sum()
    }
}

/// The vocabulary of a random-weight model of `vocab_size` tokens: each byte its own token (ids
/// 0..256, written as byte-level BPE writes bytes), the others unused, no merges, no BOS and no
/// end-of-text token (a bench's generations run to their length), so a prompt's ids are its bytes.
pub fn byte_tokenizer(vocab_size: usize) -> Result<Tokenizer> {
    if vocab_size < 256 {
        return Err(Error::InvalidArgument(format!("a byte vocabulary needs 256 tokens, not {vocab_size}")));
    }
    let bytes = byte_to_char();
    let tokens: Vec<String> = (0..vocab_size)
        .map(|i| if i < 256 { bytes[i].to_string() } else { format!("<unused_{i}>") })
        .collect();
    // (the unused ones as llama.cpp's type 5, never produced by encoding)
    let token_types = (0..vocab_size).map(|i| if i < 256 { 1 } else { 5 }).collect();
    Tokenizer::from_vocab(GgufVocab {
        model: "gpt2".into(),
        pre: None,
        tokens,
        token_types,
        merges: Vec::new(),
        bos: None,
        eos: None,
        eot: None,
        add_bos: false,
        add_eos: false,
        ..GgufVocab::default()
    })
}

/// A GGUF file of random weights with `shape`'s exact tensor shapes (the tensors of
/// [`TensorTable`]): matrices of its [`QuantMix`], F32 norms (ones) and biases; all of
/// [`SyntheticFile`]'s bytes.
pub fn synthetic_gguf(shape: &SyntheticShape, seed: u64) -> Vec<u8> {
    let file = SyntheticFile::new(shape, seed);
    let mut bytes = vec![0u8; file.len as usize];
    file.fill(0, &mut bytes);
    bytes
}

/// A synthetic model's GGUF file ([`synthetic_gguf`]) as a [`Source`] whose tensors' bytes are
/// made as they are read: a checkpoint of any shape without its weights in memory (llama-8b's
/// 4.9 GB), and with [`LoadOptions::skip_weight_data`](crate::model::LoadOptions) a model whose
/// shape facts read only its header, norms and biases. The same bytes for every read of a range: each block of a
/// matrix comes from its own seed (the model's, the tensor's index, the block's).
pub struct SyntheticFile {
    /// Everything before the tensor data (metadata, tensor infos, padding).
    header: Vec<u8>,
    /// Each tensor's bytes, in file order.
    tensors: Vec<Region>,
    len: u64,
    seed: u64,
}

/// One tensor's place in a [`SyntheticFile`] and what it holds.
struct Region {
    start: u64,
    len: u64,
    fill: Fill,
}

enum Fill {
    /// Every value this one (norms: 1, biases: 0.01).
    F32(f32),
    /// These bytes (rope_freqs.weight).
    Values(Vec<u8>),
    /// Random blocks of this type ([`fill_blocks`]).
    Blocks(DType),
}

/// The GGUF writer of a synthetic model: its metadata and its tensors (whose data `data` gives,
/// from each one's index, fill and length), with each tensor's fill and length.
fn synthetic_writer(
    shape: &SyntheticShape,
    mut data: impl FnMut(usize, &Fill, u64) -> Vec<u8>,
) -> (GgufWriter, Vec<Fill>, Vec<u64>) {
    let c = shape.config();
    let a = c.arch.gguf_name();
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
    if c.arch.gemma() {
        // (Gemma 3's local layers: 512 keys)
        w.add(&format!("{a}.attention.sliding_window"), Value::U32(GEMMA_WINDOW));
    }
    if c.head_dim != c.dim / c.n_heads {
        w.add(&format!("{a}.attention.key_length"), Value::U32(c.head_dim as u32));
        w.add(&format!("{a}.attention.value_length"), Value::U32(c.head_dim as u32));
    }
    let mut fills = Vec::new();
    let mut lens = Vec::new();
    if shape.llama3_rope {
        // Llama 3.1's divisors, as llama.cpp's converter writes them
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 8192,
        };
        let divisors = llama3.divisors(c.rope_theta, c.rope_dim, None).unwrap_or_default();
        let values: Vec<f32> = divisors.iter().map(|&d| d as f32).collect();
        let fill = Fill::Values(values.iter().flat_map(|v| v.to_le_bytes()).collect());
        let len = 4 * values.len() as u64;
        w.add_tensor("rope_freqs.weight", DType::F32, &[values.len()], data(fills.len(), &fill, len));
        fills.push(fill);
        lens.push(len);
    }
    for t in TensorTable::new(&c).iter() {
        let n: usize = t.shape.iter().product();
        let dtype = shape.dtype_of(t);
        let fill = match t.role {
            TensorRole::Norm => Fill::F32(1.0),
            TensorRole::QkvBias => Fill::F32(0.01),
            _ => Fill::Blocks(dtype),
        };
        let len = dtype.bytes_for(n as u64).unwrap_or(0);
        w.add_tensor(&t.name, dtype, &t.shape, data(fills.len(), &fill, len));
        fills.push(fill);
        lens.push(len);
    }
    (w, fills, lens)
}

impl SyntheticFile {
    pub fn new(shape: &SyntheticShape, seed: u64) -> SyntheticFile {
        let (w, fills, lens) = synthetic_writer(shape, |_, _, _| Vec::new());
        let (header, offsets, len) = w.header(&lens);
        let tensors: Vec<Region> = offsets
            .into_iter()
            .zip(lens)
            .zip(fills)
            .map(|((start, len), fill)| Region { start, len, fill })
            .collect();
        SyntheticFile { header, tensors, len, seed }
    }

    /// `buf` filled with the file's bytes from `offset` (zeros past its end).
    fn fill(&self, offset: u64, buf: &mut [u8]) {
        buf.fill(0);
        let end = offset + buf.len() as u64;
        if offset < self.header.len() as u64 {
            let n = (self.header.len() as u64).min(end) - offset;
            buf[..n as usize].copy_from_slice(&self.header[offset as usize..(offset + n) as usize]);
        }
        // the tensors that overlap the read: from the first that ends after its start
        let first = self.tensors.partition_point(|t| t.start + t.len <= offset);
        for (i, t) in self.tensors.iter().enumerate().skip(first) {
            if t.start >= end {
                break;
            }
            let (lo, hi) = (t.start.max(offset), (t.start + t.len).min(end));
            if lo >= hi {
                continue;
            }
            let out = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            self.tensor_bytes(i as u64, t, lo - t.start, out);
        }
    }

    /// Bytes `at ..` of tensor `index` (its region `t`) into `out`.
    fn tensor_bytes(&self, index: u64, t: &Region, at: u64, out: &mut [u8]) {
        match &t.fill {
            Fill::Values(bytes) => {
                // (fill() asks for bytes within the tensor only)
                if let Some(src) = bytes.get(at as usize..at as usize + out.len()) {
                    out.copy_from_slice(src);
                }
            }
            &Fill::F32(v) => {
                let bytes = v.to_le_bytes();
                for (j, b) in out.iter_mut().enumerate() {
                    *b = bytes[((at + j as u64) % 4) as usize];
                }
            }
            &Fill::Blocks(dtype) => {
                let size = dtype.block_bytes() as u64;
                let mut block = vec![0u8; size as usize];
                let mut pos = at;
                let mut done = 0usize;
                while done < out.len() {
                    let b = pos / size;
                    // (SplitMix64 seeded by the model, the tensor and the block: any block alone)
                    let mut mix = Mix(self.seed
                        ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)
                        ^ b.wrapping_mul(0x9E37_79B9));
                    mix.0 = mix.next();
                    fill_blocks(dtype, &mut block, &mut mix);
                    let from = (pos - b * size) as usize;
                    let n = (size as usize - from).min(out.len() - done);
                    out[done..done + n].copy_from_slice(&block[from..from + n]);
                    done += n;
                    pos += n as u64;
                }
            }
        }
    }
}

impl Source for SyntheticFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.len) {
            return Err(Error::Truncated {
                what: "a synthetic model".into(),
                offset,
                needed: buf.len() as u64,
                len: self.len,
            });
        }
        self.fill(offset, buf);
        Ok(())
    }
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
        // Qwen3: heads wider than dim / heads, and their norms
        let qwen3 = synthetic_shape("qwen3-0.6b").unwrap_or_else(|e| panic!("{e}"));
        let small = SyntheticShape { vocab: 512, layers: 2, ..qwen3 };
        let ckpt =
            crate::model::Checkpoint::from_gguf(synthetic_gguf(&small, 1)).unwrap_or_else(|e| panic!("{e}"));
        let c = &ckpt.config;
        assert_eq!((c.arch, c.dim, c.head_dim, c.q_dim(), c.kv_dim()), (Arch::Qwen3, 1024, 128, 2048, 1024));
        assert!(ckpt.has("blk.1.attn_k_norm.weight") && !ckpt.has("blk.1.attn_q.bias"));
        // Gemma 3 1B: local layers with a window of 512, post-norms
        let gemma = synthetic_shape("gemma3-1b").unwrap_or_else(|e| panic!("{e}"));
        let small = SyntheticShape { vocab: 512, layers: 6, ..gemma };
        let ckpt =
            crate::model::Checkpoint::from_gguf(synthetic_gguf(&small, 1)).unwrap_or_else(|e| panic!("{e}"));
        let c = &ckpt.config;
        assert_eq!(
            (c.arch, c.head_dim, c.sliding_window, c.layer_window(5)),
            (Arch::Gemma3, 256, Some(512), None)
        );
        assert!(ckpt.has("blk.5.post_ffw_norm.weight") && ckpt.has("blk.0.attn_q_norm.weight"));
        // Llama 3.1 8B: its rope scaling as rope_freqs.weight
        let llama = synthetic_shape("llama-8b").unwrap_or_else(|e| panic!("{e}"));
        let small = SyntheticShape { vocab: 512, layers: 2, ..llama };
        let ckpt =
            crate::model::Checkpoint::from_gguf(synthetic_gguf(&small, 1)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ckpt.config.rope_scaling, RopeScaling::Stored);
        let d = ckpt.rope_divisors().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((d.len(), d[0], d[63]), (64, 1.0, 8.0));
    }

    #[test]
    fn a_synthetic_file_gives_the_same_bytes_for_every_read() {
        // reads at any offsets and lengths (inside the header, across tensors' edges, inside a
        // block) give the whole file's bytes there; the weights are random, not zeros; a read past
        // the end is refused
        let small = SyntheticShape { vocab: 512, layers: 2, ..SYNTHETIC_SHAPES[1] };
        let whole = synthetic_gguf(&small, 7);
        let file = SyntheticFile::new(&small, 7);
        assert_eq!(file.len(), whole.len() as u64);
        let mut mix = Mix(3);
        for _ in 0..400 {
            let at = (mix.next() % whole.len() as u64) as usize;
            let n = ((mix.next() % 700) as usize).min(whole.len() - at);
            let mut buf = vec![0xAA; n];
            file.read_at(at as u64, &mut buf).unwrap_or_else(|e| panic!("{e}"));
            assert!(buf == whole[at..at + n], "{n} bytes at {at}");
        }
        // at every region's edges (the header's end, each tensor's start and end), across them
        let mut edges = vec![0u64, file.header.len() as u64];
        for t in &file.tensors {
            edges.extend([t.start, t.start + t.len]);
        }
        for &e in &edges {
            for (at, n) in [(e.saturating_sub(3), 7u64), (e.saturating_sub(1), 2), (e, 1)] {
                let n = n.min(file.len() - at.min(file.len())) as usize;
                let mut buf = vec![0xAA; n];
                file.read_at(at, &mut buf).unwrap_or_else(|e| panic!("{e}"));
                assert!(buf == whole[at as usize..at as usize + n], "{n} bytes at edge {e}");
            }
        }
        // the file GgufWriter::to_bytes writes from the same tensors' bytes
        let (writer, _, _) = synthetic_writer(&small, |i, _, len| {
            let t = &file.tensors[i];
            assert_eq!(t.len, len);
            whole[t.start as usize..(t.start + t.len) as usize].to_vec()
        });
        assert!(writer.to_bytes() == whole, "the writer's file");
        let tail = &whole[whole.len() / 2..];
        assert!(tail.iter().filter(|b| **b != 0).count() > tail.len() / 2, "random weights");
        assert_ne!(synthetic_gguf(&small, 8), whole, "another seed, other weights");
        let mut past = [0u8; 4];
        assert!(file.read_at(whole.len() as u64 - 2, &mut past).is_err());
    }

    #[test]
    fn the_mixes_are_the_real_files() {
        // as Qwen2.5-Coder-1.5B's Q4_K_M file: 14 of 28 layers' attn_v and ffn_down in Q6_K (the
        // real file's 14 are other layers than use_more_bits picks: the bytes are the same)
        let layers = 28;
        let q6 = |t: &str| {
            (0..layers)
                .filter(|i| QuantMix::Q4KM.dtype(&format!("blk.{i}.{t}"), layers, false) == DType::Q6_K)
                .count()
        };
        assert_eq!((q6("attn_v.weight"), q6("ffn_down.weight"), q6("attn_q.weight")), (14, 14, 0));
        assert_eq!(QuantMix::Q4KM.dtype("output.weight", layers, false), DType::Q6_K);
        assert_eq!(QuantMix::Q4KM.dtype("token_embd.weight", layers, false), DType::Q4_K);
        assert_eq!(QuantMix::Q4KM.dtype("token_embd.weight", layers, true), DType::Q6_K, "tied: the output");
        // as the 0.5B file: 12 of 24 layers' attn_v Q8_0 and ffn_down Q6_K, the rest Q5_0 and Q4_K
        let m = QuantMix::Q5_0Mix;
        assert_eq!(m.dtype("blk.0.attn_v.weight", 24, false), DType::Q8_0);
        assert_eq!(m.dtype("blk.2.ffn_down.weight", 24, false), DType::Q6_K);
        assert_eq!(m.dtype("blk.3.ffn_down.weight", 24, false), DType::Q4_K);
        let q8 =
            (0..24).filter(|i| m.dtype(&format!("blk.{i}.attn_v.weight"), 24, false) == DType::Q8_0).count();
        assert_eq!(q8, 12);
        assert_eq!(m.dtype("blk.2.ffn_gate.weight", 24, false), DType::Q5_0);
        assert_eq!(m.dtype("output.weight", 24, false), DType::Q8_0);
        // the bytes of the real files' tensors: their sizes less their metadata (tokenizers of
        // 2-7 MB), within 3%
        for (name, file_bytes) in
            [("qwen2-1.5b", 1_117_320_768u64), ("qwen2-0.5b", 491_400_064), ("smollm2-135m", 98_362_432)]
        {
            let shape = synthetic_shape(name).unwrap_or_else(|e| panic!("{e}"));
            let (bytes, file) = (shape.weight_bytes() as f64, file_bytes as f64);
            assert!(bytes < file && bytes > 0.97 * file, "{name}: {bytes} bytes of tensors, the file {file}");
        }
        // every matrix of every shape is a whole number of blocks
        for shape in SYNTHETIC_SHAPES {
            let small = SyntheticShape { vocab: 256, layers: 2, ..*shape };
            let ckpt = crate::model::Checkpoint::from_gguf(synthetic_gguf(&small, 1))
                .unwrap_or_else(|e| panic!("{}: {e}", shape.name));
            assert_eq!(ckpt.config.dim, shape.dim, "{}", shape.name);
        }
    }
}
