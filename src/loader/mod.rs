//! File formats: bytes -> metadata + typed tensors. No GPU knowledge here.
//!
//! - [`gguf`]: GGUF v2/v3 headers (metadata + tensor table); [`gguf_writer`]: GGUF v3 files for
//!   tests, synthetic benchmark models and tools.
//! - [`safetensors`]: safetensors headers (F32 / F16 / BF16), read with the `safetensors` crate,
//!   and a writer for tests.
//! - [`quant`]: the block formats ([`DType`]) and their dequantization to f32.
//! - [`source`]: random access to a file's bytes (memory, disk, the browser's storage).
//!
//! Parsers take the first bytes of a file plus the file's full length, so that a caller can
//! read only the header (a browser fetch, a partial read) and still have every tensor's
//! location checked against the real file.

pub mod gguf;
pub mod gguf_writer;
pub mod quant;
pub mod safetensors;
pub mod source;

/// Element type of a stored tensor.
///
/// Quantized types store `block_len()` elements in `block_bytes()` bytes, with the layouts of
/// ggml (`ggml-common.h`); the first dimension (`ne0`, the innermost) of a quantized tensor is
/// always a whole number of blocks.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top 16 bits of an f32).
    BF16,
    /// 32 elements: f16 scale `d`, 16 bytes of 4-bit quants; x = d * (q - 8).
    Q4_0,
    /// 32 elements: f16 `d`, f16 `m`, 16 bytes of 4-bit quants; x = d * q + m.
    Q4_1,
    /// 32 elements: f16 `d`, 32 high bits, 16 bytes of low nibbles; x = d * (q - 16).
    Q5_0,
    /// 32 elements: f16 `d`, 32 signed bytes; x = d * q.
    Q8_0,
    /// 256 elements: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
    Q4_K,
    /// 256 elements: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales/mins (as Q4_K), 32 bytes of
    /// fifth bits, 128 bytes of nibbles.
    Q5_K,
    /// 256 elements: 128 bytes low nibbles, 64 bytes high 2 bits, 16 i8 scales, f16 `d`.
    Q6_K,
}

impl DType {
    /// Every supported type, in ggml type-id order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::BF16,
    ];

    /// Elements per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 2 + 16,
            DType::Q4_1 => 2 + 2 + 16,
            DType::Q5_0 => 2 + 4 + 16,
            DType::Q8_0 => 2 + 32,
            DType::Q4_K => 2 + 2 + 12 + 128,
            DType::Q5_K => 2 + 2 + 12 + 32 + 128,
            DType::Q6_K => 128 + 64 + 16 + 2,
        }
    }

    /// Bytes needed for `n_elements` elements; `None` if `n_elements` is not a whole number of
    /// blocks or the byte count overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block_len = self.block_len() as u64;
        if !n_elements.is_multiple_of(block_len) {
            return None;
        }
        (n_elements / block_len).checked_mul(self.block_bytes() as u64)
    }

    /// The ggml / safetensors spelling: `"F32"`, `"Q4_K"`, ...
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q8_0 => "Q8_0",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
        }
    }

    /// True for the block-quantized types (everything but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The `ggml_type` id stored in GGUF tensor infos.
    pub fn ggml_type(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The supported type with this `ggml_type` id, if any.
    pub fn from_ggml_type(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_type() == id)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
