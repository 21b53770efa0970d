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
//! overlap, and a dtype the loader reads: F32, F16 and BF16 weights, and I64, I32 and BOOL index
//! tensors (an EAGLE-3 head's vocabulary maps), which the host reads whole and never uploads.

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
    /// Integer and boolean tensors, by name.
    pub index: Vec<IndexTensor>,
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
        let mut index = Vec::new();
        for name in names {
            let entry = parsed
                .info(&name)
                .ok_or_else(|| Error::corrupt(FORMAT, format!("tensor {name} listed without an entry")))?;
            match IndexType::of(entry.dtype) {
                Some(dtype) => index.push(index_tensor(name, dtype, entry, data_offset, file_len)?),
                None => tensors.push(tensor_info(name, entry, data_offset, file_len)?),
            }
        }
        index.sort_by(|a, b| a.name.cmp(&b.name));
        // The crate's order, made deterministic for empty tensors that share an offset.
        tensors.sort_by(|a, b| (a.offset, a.n_bytes, &a.name).cmp(&(b.offset, b.n_bytes, &b.name)));
        check_no_overlap(&tensors, FORMAT)?;
        let mut metadata: Vec<(String, String)> =
            parsed.metadata().iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        metadata.sort();
        Ok(Safetensors { tensors, index, metadata })
    }

    /// The index tensor with this name.
    pub fn index_tensor(&self, name: &str) -> Option<&IndexTensor> {
        self.index.iter().find(|t| t.name == name)
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

/// The element type of an index tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexType {
    I64,
    I32,
    Bool,
}

impl IndexType {
    fn of(dtype: Dtype) -> Option<IndexType> {
        match dtype {
            Dtype::I64 => Some(IndexType::I64),
            Dtype::I32 => Some(IndexType::I32),
            Dtype::BOOL => Some(IndexType::Bool),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            IndexType::I64 => 8,
            IndexType::I32 => 4,
            IndexType::Bool => 1,
        }
    }

    /// The little-endian elements of `data` as i64 (a bool is 0 or 1).
    pub fn decode(self, data: &[u8]) -> Vec<i64> {
        match self {
            IndexType::I64 => {
                data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
            }
            IndexType::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            IndexType::Bool => data.iter().map(|&b| (b != 0) as i64).collect(),
        }
    }
}

/// An integer or boolean tensor; its offset is absolute in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexTensor {
    pub name: String,
    pub dtype: IndexType,
    pub shape: Vec<usize>,
    pub offset: u64,
    pub n_bytes: u64,
}

fn index_tensor(
    name: String,
    dtype: IndexType,
    entry: &HeaderEntry,
    data_offset: u64,
    file_len: u64,
) -> Result<IndexTensor> {
    let (begin, end) = (entry.data_offsets.0 as u64, entry.data_offsets.1 as u64);
    let n = entry.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let n_bytes = n.and_then(|n| n.checked_mul(dtype.bytes())).filter(|&b| Some(b) == end.checked_sub(begin));
    let offset = data_offset.checked_add(begin).filter(|&o| n_bytes.is_some_and(|b| o + b <= file_len));
    match (n_bytes, offset) {
        (Some(n_bytes), Some(offset)) => {
            Ok(IndexTensor { name, dtype, shape: entry.shape.clone(), offset, n_bytes })
        }
        _ => Err(Error::corrupt(
            FORMAT,
            format!("tensor {name}: shape {:?} of {dtype:?} does not fill data_offsets [{begin}, {end}] inside the file", entry.shape),
        )),
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
    write_safetensors_with_index(tensors, &[])
}

/// [`write_safetensors`], then I64 index tensors (`(name, shape, values)`).
pub fn write_safetensors_with_index(
    tensors: &[(&str, DType, &[usize], &[u8])],
    index: &[(&str, &[usize], &[i64])],
) -> Vec<u8> {
    let index_bytes: Vec<Vec<u8>> =
        index.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let mut header = Map::new();
    let mut begin = 0usize;
    let entries = tensors.iter().map(|&(name, dtype, shape, data)| (name, dtype.name(), shape, data)).chain(
        index.iter().zip(&index_bytes).map(|(&(name, shape, _), data)| (name, "I64", shape, data.as_slice())),
    );
    let entries: Vec<(&str, &str, &[usize], &[u8])> = entries.collect();
    for &(name, dtype, shape, data) in &entries {
        let end = begin + data.len();
        let entry = serde_json::json!({
            "dtype": dtype,
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
    for &(_, _, _, data) in &entries {
        out.extend_from_slice(data);
    }
    out
}
