//! safetensors: `u64:header_len`, a JSON header of `header_len` bytes, then the data.
//!
//! ```text
//! { "__metadata__": { "key": "value", ... },
//!   "name": { "dtype": "F32" | "F16" | "BF16", "shape": [outermost, ..., innermost],
//!             "data_offsets": [begin, end] },  // relative to the end of the header
//!   ... }
//! ```
//!
//! The JSON header is read by the `safetensors` crate (its [`Metadata`]: field types, dtype names,
//! `data_offsets` contiguous from 0 and matching each shape). The crate's `read_metadata` wants the
//! whole file, so the framing around the JSON is read here, and so are the checks that need the
//! file's length or this crate's types: the header length limit, every tensor inside the file, no
//! overlap, and a dtype the loader reads.

use super::gguf::{check_no_overlap, tensor_slice, TensorInfo};
use super::DType;
use crate::{Error, Result};
use safetensors::tensor::{Metadata, TensorInfo as HeaderEntry};
use safetensors::Dtype;
use serde_json::{Map, Value as Json};

const FORMAT: &str = "safetensors";
/// Largest header accepted (the reference implementation's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// A parsed safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Safetensors {
    /// Tensors in file (offset) order; offsets are absolute in the file.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` string pairs, sorted by key.
    pub metadata: Vec<(String, String)>,
}

impl Safetensors {
    /// Parses the header from the first bytes of a file (the data need not be present);
    /// `file_len` is the full file's length, used to check every tensor lies inside the file.
    pub fn parse(header: &[u8], file_len: u64) -> Result<Safetensors> {
        let file_len = file_len.max(header.len() as u64);
        let len_bytes: [u8; 8] = header
            .get(..8)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| truncated("header length", 0, 8, header.len()))?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER_LEN || header_len > file_len - 8 {
            return Err(Error::corrupt(
                FORMAT,
                format!(
                    "header length {header_len} exceeds the limit of {MAX_HEADER_LEN} or the file of {file_len} bytes"
                ),
            ));
        }
        // header_len <= 100 MB, so this fits in usize even on 32-bit targets.
        let json = header
            .get(8..8 + header_len as usize)
            .ok_or_else(|| truncated("JSON header", 8, header_len, header.len()))?;
        let parsed: Metadata = serde_json::from_slice(json).map_err(|e| {
            let what = if e.is_data() { "is not a valid safetensors header" } else { "is not valid JSON" };
            Error::corrupt(FORMAT, format!("header {what}: {e}"))
        })?;
        let data_offset = 8 + header_len;

        let names = parsed.offset_keys();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let entry = parsed
                .info(&name)
                .ok_or_else(|| Error::corrupt(FORMAT, format!("tensor {name} listed without an entry")))?;
            tensors.push(tensor_info(name, entry, data_offset, file_len)?);
        }
        // The crate's order, made deterministic for empty tensors that share an offset.
        tensors.sort_by(|a, b| (a.offset, a.n_bytes, &a.name).cmp(&(b.offset, b.n_bytes, &b.name)));
        check_no_overlap(&tensors, FORMAT)?;
        let mut metadata: Vec<(String, String)> =
            parsed.metadata().iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        metadata.sort();
        Ok(Safetensors { tensors, metadata })
    }

    /// The tensor with this name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Bounds-checked slice of a tensor's bytes in the whole file.
    pub fn tensor_data<'a>(&self, file: &'a [u8], info: &TensorInfo) -> Result<&'a [u8]> {
        tensor_slice(file, info)
    }

    /// The value of a `__metadata__` key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn truncated(what: &str, offset: u64, needed: u64, len: usize) -> Error {
    Error::Truncated { what: what.to_string(), offset, needed, len: len as u64 }
}

fn dtype(name: &str, dtype: Dtype) -> Result<DType> {
    match dtype {
        Dtype::F32 => Ok(DType::F32),
        Dtype::F16 => Ok(DType::F16),
        Dtype::BF16 => Ok(DType::BF16),
        other => Err(Error::UnsupportedTensorType { tensor: name.to_string(), type_name: other.to_string() }),
    }
}

/// One header entry, checked by the crate, as this crate's [`TensorInfo`] at its place in the file.
fn tensor_info(name: String, entry: &HeaderEntry, data_offset: u64, file_len: u64) -> Result<TensorInfo> {
    let dtype = dtype(&name, entry.dtype)?;
    let bad = |why: String| Error::corrupt(FORMAT, format!("tensor {name}: {why}"));
    let shape = entry.shape.clone();
    let (begin, end) = (entry.data_offsets.0 as u64, entry.data_offsets.1 as u64);
    // The crate has matched the byte count to the shape; again here, in u64 and this crate's DType.
    let n_bytes = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .and_then(|n| dtype.bytes_for(n))
        .filter(|&n| Some(n) == end.checked_sub(begin))
        .ok_or_else(|| {
            bad(format!("shape {shape:?} of {dtype} does not fill data_offsets [{begin}, {end}]"))
        })?;
    let offset = data_offset
        .checked_add(begin)
        .filter(|&o| o.checked_add(n_bytes).is_some_and(|e| e <= file_len))
        .ok_or_else(|| {
            bad(format!("data_offsets [{begin}, {end}] lie beyond the file of {file_len} bytes"))
        })?;
    Ok(TensorInfo { name, dtype, shape, offset, n_bytes })
}

/// Writes a safetensors file (for tests): the JSON header padded with spaces to a multiple of
/// 8 bytes, then the tensors' data back to back in the order given. A dtype other than
/// F32/F16/BF16 is written by its name (and rejected by [`Safetensors::parse`]).
pub fn write_safetensors(tensors: &[(&str, DType, &[usize], &[u8])]) -> Vec<u8> {
    let mut header = Map::new();
    let mut begin = 0usize;
    for &(name, dtype, shape, data) in tensors {
        let end = begin + data.len();
        let entry = serde_json::json!({
            "dtype": dtype.name(),
            "shape": shape,
            "data_offsets": [begin, end],
        });
        header.insert(name.to_string(), entry);
        begin = end;
    }
    let mut json = Json::Object(header).to_string().into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len() + begin);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for &(_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}
