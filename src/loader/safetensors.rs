//! safetensors: `u64:header_len`, a JSON header of `header_len` bytes, then the data.
//!
//! ```text
//! { "__metadata__": { "key": "value", ... },
//!   "name": { "dtype": "F32" | "F16" | "BF16", "shape": [outermost, ..., innermost],
//!             "data_offsets": [begin, end] },  // relative to the end of the header
//!   ... }
//! ```

use super::gguf::{check_no_overlap, tensor_slice, TensorInfo};
use super::DType;
use crate::{Error, Result};
use serde_json::{Map, Value as Json};

const FORMAT: &str = "safetensors";
/// Largest header accepted (the reference implementation's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
const METADATA_KEY: &str = "__metadata__";

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
        let json_bytes = header
            .get(8..8 + header_len as usize)
            .ok_or_else(|| truncated("JSON header", 8, header_len, header.len()))?;
        let json: Map<String, Json> = serde_json::from_slice(json_bytes)
            .map_err(|e| Error::corrupt(FORMAT, format!("header is not a JSON object: {e}")))?;
        let data_offset = 8 + header_len;

        let mut metadata = Vec::new();
        let mut tensors = Vec::with_capacity(json.len());
        for (name, entry) in &json {
            if name == METADATA_KEY {
                metadata = parse_metadata(entry)?;
            } else {
                tensors.push(parse_tensor(name, entry, data_offset, file_len)?);
            }
        }
        tensors.sort_by_key(|t| t.offset);
        check_no_overlap(&tensors, FORMAT)?;
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

fn parse_metadata(entry: &Json) -> Result<Vec<(String, String)>> {
    let obj = entry.as_object().ok_or_else(|| Error::corrupt(FORMAT, "__metadata__ is not an object"))?;
    obj.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(Error::corrupt(FORMAT, format!("__metadata__ {k} is not a string"))),
        })
        .collect()
}

fn parse_dtype(name: &str, s: &str) -> Result<DType> {
    match s {
        "F32" => Ok(DType::F32),
        "F16" => Ok(DType::F16),
        "BF16" => Ok(DType::BF16),
        other => Err(Error::UnsupportedTensorType { tensor: name.to_string(), type_name: other.to_string() }),
    }
}

fn parse_tensor(name: &str, entry: &Json, data_offset: u64, file_len: u64) -> Result<TensorInfo> {
    let bad = |why: String| Error::corrupt(FORMAT, format!("tensor {name}: {why}"));
    let obj = entry.as_object().ok_or_else(|| bad("entry is not an object".into()))?;
    let dtype =
        obj.get("dtype").and_then(Json::as_str).ok_or_else(|| bad("missing string field dtype".into()))?;
    let dtype = parse_dtype(name, dtype)?;
    let shape = obj
        .get("shape")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("missing array field shape".into()))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("shape has a non-integer or negative dimension".into()))?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Json::as_array)
        .map(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>());
    let (begin, end) = match offsets {
        Some(Some(o)) => match o[..] {
            [b, e] if b <= e => (b, e),
            _ => return Err(bad(format!("data_offsets {o:?} is not [begin, end] with begin <= end"))),
        },
        _ => return Err(bad("missing data_offsets [begin, end]".into())),
    };
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows the element count")))?;
    let n_bytes = dtype
        .bytes_for(n_elements)
        .ok_or_else(|| bad(format!("shape {shape:?} overflows the byte count")))?;
    if n_bytes != end - begin {
        return Err(bad(format!(
            "shape {shape:?} of {dtype} needs {n_bytes} bytes, data_offsets [{begin}, {end}] hold {}",
            end - begin
        )));
    }
    let offset = data_offset
        .checked_add(begin)
        .filter(|&o| o.checked_add(n_bytes).is_some_and(|e| e <= file_len))
        .ok_or_else(|| {
            bad(format!("data_offsets [{begin}, {end}] lie beyond the file of {file_len} bytes"))
        })?;
    Ok(TensorInfo { name: name.to_string(), dtype, shape, offset, n_bytes })
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
