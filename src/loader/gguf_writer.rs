//! GGUF v3 writer: tiny test models, synthetic benchmark models and tools write files the
//! reader in [`super::gguf`] (and llama.cpp) loads.

use super::gguf::{Value, ValueType, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use super::DType;
use crate::{Error, Result};

/// Writes GGUF v3 files (used by tests to make tiny models, and by tools).
///
/// Arrays must be homogeneous and each tensor's data must be exactly
/// `dtype.bytes_for(n_elements)` bytes: [`GgufWriter::try_to_bytes`] checks both,
/// [`GgufWriter::to_bytes`] writes what it was given (a bad input gives a file the parser rejects).
/// The alignment is `general.alignment` if it was added (a power of two), else 32.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key/value (a key added twice is written twice, which the parser rejects).
    pub fn add(&mut self, key: &str, v: Value) {
        self.metadata.push((key.to_string(), v));
    }

    /// Adds a tensor; `shape` is outermost first, `data` its raw bytes.
    pub fn add_tensor(&mut self, name: &str, dtype: DType, shape: &[usize], data: Vec<u8>) {
        self.tensors.push((name.to_string(), dtype, shape.to_vec(), data));
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Like [`GgufWriter::to_bytes`], but first checks that arrays are homogeneous and that
    /// every tensor's data length matches its shape and type.
    pub fn try_to_bytes(&self) -> Result<Vec<u8>> {
        fn homogeneous(v: &Value) -> bool {
            match v {
                Value::Array(items) => {
                    let first = items.first().map(Value::value_type);
                    items.iter().all(|i| Some(i.value_type()) == first && homogeneous(i))
                }
                _ => true,
            }
        }
        for (k, v) in &self.metadata {
            if !homogeneous(v) {
                return Err(Error::InvalidArgument(format!(
                    "GGUF metadata {k}: array elements differ in type"
                )));
            }
        }
        for (name, dtype, shape, data) in &self.tensors {
            let n = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
            if n.and_then(|n| dtype.bytes_for(n)) != Some(data.len() as u64) {
                return Err(Error::InvalidArgument(format!(
                    "GGUF tensor {name}: {} bytes of data for {dtype} shape {shape:?}",
                    data.len()
                )));
            }
        }
        Ok(self.to_bytes())
    }

    /// Serializes to a GGUF v3 file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let lens: Vec<u64> = self.tensors.iter().map(|(_, _, _, data)| data.len() as u64).collect();
        let (mut out, offsets, len) = self.header(&lens);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(off as usize, 0);
            out.extend_from_slice(data);
        }
        out.resize(len as usize, 0);
        out
    }

    /// The file's bytes before its tensor data (magic, metadata, tensor infos, padding) for
    /// tensors of `lens[i]` bytes of data each (whatever data they were given), each tensor's
    /// data offset in the file, and the file's length (the last tensor's end, rounded up to the
    /// alignment): what [`GgufWriter::to_bytes`] writes, without holding the data
    /// (`crate::model::synthetic` makes a model's tensors as they are read).
    pub fn header(&self, lens: &[u64]) -> (Vec<u8>, Vec<u64>, u64) {
        let alignment = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            write_value(&mut out, v);
        }
        let mut rel = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for ((name, dtype, shape, _), len) in
            self.tensors.iter().zip(lens.iter().chain(std::iter::repeat(&0)))
        {
            write_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&dtype.ggml_type().to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
            offsets.push(rel);
            rel = (rel + len).next_multiple_of(alignment);
        }
        out.resize((out.len() as u64).next_multiple_of(alignment) as usize, 0);
        let data_offset = out.len() as u64;
        (out, offsets.into_iter().map(|off| data_offset + off).collect(), data_offset + rel)
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            // (an empty array as strings: GGUF's empty arrays are vocabulary lists, such as a
            // byte vocabulary's `tokenizer.ggml.merges`, which llama.cpp reads as strings only)
            let elem_type = items.first().map_or(ValueType::String, Value::value_type);
            out.extend_from_slice(&elem_type.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                write_value(out, i);
            }
        }
    }
}
