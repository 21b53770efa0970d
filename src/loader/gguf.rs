//! GGUF (v2 and v3, little-endian): metadata key/values and the tensor table (the writer is
//! [`super::gguf_writer`]).
//!
//! Layout (all integers little-endian):
//! ```text
//! "GGUF" u32:version u64:n_tensors u64:n_kv
//! n_kv      x { string:key  u32:value_type  value }
//! n_tensors x { string:name u32:n_dims u64:ne[n_dims] (innermost first) u32:ggml_type u64:offset }
//! padding to `general.alignment` (default 32)       <- data_offset
//! tensor data; each tensor's offset is relative to data_offset and a multiple of the alignment
//! ```
//! A string is `u64:len` + `len` bytes; an array is `u32:elem_type u64:count` + elements.
//!
//! Every count and length is checked against the bytes that could hold it before anything is
//! allocated, so a hostile header yields an error, never a panic or a huge allocation.

use std::collections::HashSet;

use super::DType;
use crate::{Error, Result};

const FORMAT: &str = "GGUF";
pub(crate) const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays accepted (real files use 1; this bounds the recursion).
const MAX_ARRAY_DEPTH: usize = 8;
/// The most array values one header may hold, all arrays together: 32 bytes each in memory
/// (256 MiB at most, a string's own bytes besides) for as little as 1 byte each in the file. A
/// 262,144-token vocabulary with its scores, types and merges holds about a million.
pub const MAX_ARRAY_VALUES: usize = 1 << 23;
/// The longest metadata key or tensor name (ggml's tensor names hold 64 bytes; keys are short).
const MAX_NAME_BYTES: usize = 1024;

/// A metadata value's type, as GGUF numbers them (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum ValueType {
    U8 = 0,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// Every type, in id order.
    const ALL: [ValueType; 13] = {
        use ValueType::*;
        [U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64]
    };

    fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.get(id as usize).copied()
    }

    pub(crate) fn id(self) -> u32 {
        self as u32
    }

    /// A short name of the type, for error messages.
    fn name(self) -> &'static str {
        ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"]
            [self as usize]
    }

    /// Fewest bytes one value of this type can take.
    fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// Smallest encoding of one key/value pair: empty key (8) + type (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    /// GGUF strings are bytes; invalid UTF-8 is replaced with U+FFFD.
    String(String),
    /// Elements all have the same type in a file.
    Array(Vec<Value>),
}

/// What a metadata value is, for error messages: numbers as themselves, other values by type
/// (a string or an array from the file is not quoted).
fn describe(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{} {x}", v.value_type().name()),
        None => v.value_type().name().to_string(),
    }
}

fn as_u32(key: &str, v: &Value) -> Result<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| Error::Metadata {
        key: key.to_string(),
        message: format!("expected an integer that fits in u32, found {}", describe(v)),
    })
}

fn as_f32(key: &str, v: &Value) -> Result<f32> {
    v.as_f64().map(|x| x as f32).ok_or_else(|| Error::Metadata {
        key: key.to_string(),
        message: format!("expected a number, found {}", describe(v)),
    })
}

impl Value {
    /// Any integer type holding a value >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any numeric type (integers and floats; not bool).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The GGUF value type of this value.
    pub(crate) fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }
}

/// One tensor's place in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Outermost first, like numpy: a matrix with ne0 = cols, ne1 = rows has shape [rows, cols].
    pub shape: Vec<usize>,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes of data (`dtype.bytes_for(n_elements)`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar). Saturates at `usize::MAX`
    /// (possible only on 32-bit targets), which no byte length matches.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).unwrap_or(usize::MAX)
    }
}

/// A parsed GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    /// Key/values in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian cursor over the header bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Length of the whole file: lengths beyond it are corrupt, lengths beyond `buf` are truncation.
    file_len: u64,
    /// Array values read so far (at most [`MAX_ARRAY_VALUES`]).
    values: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n);
        match end.and_then(|end| self.buf.get(self.pos..end)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(Error::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n as u64,
                len: self.buf.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Bytes of the file after the cursor (as far as the file length says).
    fn file_remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }

    /// Checks that `count` items of at least `min_bytes` each can fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<usize> {
        let fits = count.checked_mul(min_bytes).is_some_and(|b| b <= self.file_remaining());
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(Error::corrupt(
                FORMAT,
                format!(
                    "{what} {count} at offset {} cannot fit in the {} bytes left in the file",
                    self.pos,
                    self.file_remaining()
                ),
            )),
        }
    }

    /// A capacity to reserve for `n` items: never more than the header bytes could hold.
    fn capacity(&self, n: usize, min_bytes: u64) -> usize {
        let left = (self.buf.len().saturating_sub(self.pos)) as u64 / min_bytes.max(1);
        n.min(usize::try_from(left).unwrap_or(usize::MAX))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let n = self.check_count(len, 1, &format!("{what}: string length"))?;
        let bytes = self.take(n, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// A metadata key or tensor name: at most [`MAX_NAME_BYTES`], no control characters (a name
    /// reaches error messages and logs).
    fn name(&mut self, what: &str) -> Result<String> {
        let name = self.string(what)?;
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::corrupt(
                FORMAT,
                format!("{what} of {} bytes (at most {MAX_NAME_BYTES})", name.len()),
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(Error::corrupt(FORMAT, format!("{what} {name:?} holds control characters")));
        }
        Ok(name)
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<Value> {
        let Some(value_type) = ValueType::from_id(type_id) else {
            return Err(bad_value_type(key, type_id));
        };
        Ok(match value_type {
            ValueType::U8 => Value::U8(self.u8(key)?),
            ValueType::I8 => Value::I8(self.u8(key)? as i8),
            ValueType::U16 => Value::U16(self.u16(key)?),
            ValueType::I16 => Value::I16(self.u16(key)? as i16),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(self.u32(key)? as i32),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(self.u64(key)? as i64),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(key)?)),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(key)?)),
            ValueType::Bool => match self.u8(key)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(Error::corrupt(
                        FORMAT,
                        format!("metadata {key}: bool byte {b} is neither 0 nor 1"),
                    ))
                }
            },
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::corrupt(
                        FORMAT,
                        format!("metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    ));
                }
                let elem_type = self.u32(key)?;
                let min =
                    ValueType::from_id(elem_type).ok_or_else(|| bad_value_type(key, elem_type))?.min_bytes();
                let count = self.u64(key)?;
                let n = self.check_count(count, min, &format!("metadata {key}: array length"))?;
                self.values = self.values.saturating_add(n);
                if self.values > MAX_ARRAY_VALUES {
                    return Err(Error::corrupt(
                        FORMAT,
                        format!("metadata {key}: more than {MAX_ARRAY_VALUES} array values in the header"),
                    ));
                }
                let mut items = Vec::with_capacity(self.capacity(n, min));
                for _ in 0..n {
                    items.push(self.value(elem_type, key, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }
}

/// The first name that comes a second time (hashed: a header may hold millions of names).
fn first_repeat<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::with_capacity(names.len());
    names.into_iter().find(|name| !seen.insert(*name))
}

fn bad_value_type(key: &str, type_id: u32) -> Error {
    Error::corrupt(FORMAT, format!("metadata {key}: unknown value type {type_id}"))
}

/// Names of ggml types this crate knows of but does not read, for error messages.
fn ggml_type_name(id: u32) -> String {
    let known = match id {
        7 => "Q5_1",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "",
    };
    if known.is_empty() {
        format!("ggml type {id}")
    } else {
        format!("{known} (ggml type {id})")
    }
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    // `alignment` is a power of two.
    x.checked_add(alignment - 1).map(|v| v & !(alignment - 1))
}

impl Gguf {
    /// Parses the header from the first bytes of a file (the tensor data itself need not be
    /// present); `file_len` is the full file's length, used to check every tensor lies inside
    /// the file.
    ///
    /// A header that needs more bytes than `header` holds gives [`Error::Truncated`], whose
    /// `offset + needed` says how much more to read.
    pub fn parse(header: &[u8], file_len: u64) -> Result<Gguf> {
        // A file is at least as long as the part of it we were given.
        let file_len = file_len.max(header.len() as u64);
        let mut r = Reader { buf: header, pos: 0, file_len, values: 0 };
        let magic: [u8; 4] = r.array("magic")?;
        if magic != MAGIC {
            return Err(Error::BadMagic { expected: FORMAT, found: magic });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion { format: FORMAT, version });
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        let n_kv = r.check_count(n_kv, MIN_KV_BYTES, "metadata count")?;
        let n_tensors = r.check_count(
            n_tensors,
            MIN_TENSOR_INFO_BYTES,
            "tensor count (with the key/values still to come)",
        )?;

        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(r.capacity(n_kv, MIN_KV_BYTES));
        for _ in 0..n_kv {
            let key = r.name("metadata key")?;
            let type_id = r.u32(&key)?;
            let value = r.value(type_id, &key, 0)?;
            metadata.push((key, value));
        }
        if let Some(key) = first_repeat(metadata.iter().map(|(k, _)| k.as_str())) {
            return Err(Error::corrupt(FORMAT, format!("duplicate metadata key {key}")));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(Error::corrupt(
                        FORMAT,
                        format!("{ALIGNMENT_KEY} = {v:?} is not a power of two"),
                    ))
                }
            },
        };
        // Re-check the tensor count now that the key/values are consumed.
        r.check_count(n_tensors as u64, MIN_TENSOR_INFO_BYTES, "tensor count")?;

        // Tensor table: (name, dtype, shape, relative offset, bytes).
        let mut raw = Vec::with_capacity(r.capacity(n_tensors, MIN_TENSOR_INFO_BYTES));
        for _ in 0..n_tensors {
            raw.push(read_tensor_info(&mut r)?);
        }
        let header_end = r.pos as u64;
        let data_offset =
            align_up(header_end, alignment).ok_or_else(|| Error::corrupt(FORMAT, "data offset overflows"))?;

        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(raw.len());
        if let Some(name) = first_repeat(raw.iter().map(|(name, ..)| name.as_str())) {
            return Err(Error::corrupt(FORMAT, format!("duplicate tensor name {name}")));
        }
        for (name, dtype, shape, rel, n_bytes) in raw {
            if !rel.is_multiple_of(alignment) {
                return Err(Error::corrupt(
                    FORMAT,
                    format!("tensor {name}: offset {rel} is not a multiple of the alignment {alignment}"),
                ));
            }
            let offset = data_offset.checked_add(rel);
            let end = offset.and_then(|o| o.checked_add(n_bytes));
            let (offset, _) = match (offset, end) {
                (Some(o), Some(e)) if e <= file_len => (o, e),
                _ => {
                    return Err(Error::corrupt(
                        FORMAT,
                        format!(
                            "tensor {name}: {n_bytes} bytes at data offset {rel} (file offset \
                             {data_offset} + {rel}) end beyond the file of {file_len} bytes"
                        ),
                    ))
                }
            };
            tensors.push(TensorInfo { name, dtype, shape, offset, n_bytes });
        }
        check_no_overlap(&tensors, FORMAT)?;

        Ok(Gguf { version, alignment, data_offset, metadata, tensors })
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::Metadata { key: key.to_string(), message: "missing".into() })
    }

    /// An integer key whose value fits in `u32` (any integer type is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        as_u32(key, self.require(key)?)
    }

    /// As [`Gguf::get_u32`] for a key that may be absent (`None`); present, it must be valid: a
    /// string or a negative number where a count belongs is an error, never a silent default.
    pub fn get_opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| as_u32(key, v)).transpose()
    }

    /// A numeric key as `f32` (any numeric type is accepted).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        as_f32(key, self.require(key)?)
    }

    /// As [`Gguf::get_f32`] for a key that may be absent.
    pub fn get_opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key).map(|v| as_f32(key, v)).transpose()
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Error::Metadata {
            key: key.to_string(),
            message: format!("expected a string, found {}", v.value_type().name()),
        })
    }

    /// The tensor with this name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Bounds-checked slice of a tensor's bytes in the whole file.
    pub fn tensor_data<'a>(&self, file: &'a [u8], info: &TensorInfo) -> Result<&'a [u8]> {
        tensor_slice(file, info)
    }
}

/// `file[info.offset .. info.offset + info.n_bytes]`, or [`Error::Truncated`].
pub(crate) fn tensor_slice<'a>(file: &'a [u8], info: &TensorInfo) -> Result<&'a [u8]> {
    let range = usize::try_from(info.offset)
        .ok()
        .zip(usize::try_from(info.n_bytes).ok())
        .and_then(|(start, n)| Some(start..start.checked_add(n)?));
    range.and_then(|r| file.get(r)).ok_or_else(|| Error::Truncated {
        what: format!("data of tensor {}", info.name),
        offset: info.offset,
        needed: info.n_bytes,
        len: file.len() as u64,
    })
}

/// Errors if two tensors' byte ranges overlap (empty tensors overlap nothing).
pub(crate) fn check_no_overlap(tensors: &[TensorInfo], format: &'static str) -> Result<()> {
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.n_bytes > 0)
        .map(|t| (t.offset, t.offset.saturating_add(t.n_bytes), t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if let [a, b] = w {
            if b.0 < a.1 {
                return Err(Error::corrupt(
                    format,
                    format!(
                        "tensors {} and {} overlap (bytes {}..{} and {}..{})",
                        a.2, b.2, a.0, a.1, b.0, b.1
                    ),
                ));
            }
        }
    }
    Ok(())
}

type RawTensorInfo = (String, DType, Vec<usize>, u64, u64);

fn read_tensor_info(r: &mut Reader<'_>) -> Result<RawTensorInfo> {
    let name = r.name("tensor name")?;
    let n_dims = r.u32(&name)? as usize;
    if n_dims > MAX_DIMS {
        return Err(Error::corrupt(
            FORMAT,
            format!("tensor {name}: {n_dims} dimensions (at most {MAX_DIMS})"),
        ));
    }
    let mut ne = [1u64; MAX_DIMS];
    for d in ne.iter_mut().take(n_dims) {
        *d = r.u64(&name)?;
    }
    let type_id = r.u32(&name)?;
    let rel = r.u64(&name)?;

    let ne = ne.get(..n_dims).unwrap_or(&[]);
    let dims_err = |why: &str| Error::corrupt(FORMAT, format!("tensor {name}: dimensions {ne:?} {why}"));
    if ne.contains(&0) {
        return Err(dims_err("include a zero"));
    }
    let n_elements = ne
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| dims_err("overflow the element count"))?;
    let dtype = DType::from_ggml_type(type_id).ok_or_else(|| Error::UnsupportedTensorType {
        tensor: name.clone(),
        type_name: ggml_type_name(type_id),
    })?;
    let ne0 = ne.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(dtype.block_len() as u64) {
        return Err(dims_err(&format!(
            "have a first dimension that is not a multiple of the {} block length {}",
            dtype.name(),
            dtype.block_len()
        )));
    }
    let n_bytes = dtype.bytes_for(n_elements).ok_or_else(|| dims_err("overflow the byte count"))?;
    if n_bytes > r.file_len {
        return Err(dims_err(&format!("need {n_bytes} bytes, more than the whole file")));
    }
    let shape = ne
        .iter()
        .rev()
        .map(|&d| usize::try_from(d).map_err(|_| dims_err("do not fit in usize")))
        .collect::<Result<Vec<usize>>>()?;
    Ok((name, dtype, shape, rel, n_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_to_powers_of_two() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(1, 32), Some(32));
        assert_eq!(align_up(64, 32), Some(64));
        assert_eq!(align_up(65, 1), Some(65));
        assert_eq!(align_up(u64::MAX - 3, 32), None);
    }

    #[test]
    fn value_accessors() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I64(5).as_u64(), Some(5));
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::U8(3).as_f64(), Some(3.0));
        assert_eq!(Value::Bool(true).as_f64(), None);
        assert_eq!(Value::String("x".into()).as_str(), Some("x"));
        assert_eq!(Value::U8(1).as_bool(), None);
        assert_eq!(Value::Array(vec![Value::U8(1)]).as_array().map(<[Value]>::len), Some(1));
    }

    #[test]
    fn value_types_are_numbered_as_gguf_numbers_them() {
        for t in 0..=12 {
            assert_eq!(ValueType::from_id(t).map(ValueType::id), Some(t));
        }
        assert_eq!(ValueType::from_id(13), None);
        let ids = [ValueType::Bool, ValueType::String, ValueType::Array, ValueType::U64, ValueType::F64];
        assert_eq!(ids.map(ValueType::id), [7, 8, 9, 10, 12]);
        assert_eq!(Value::String("x".into()).value_type().min_bytes(), 8);
        assert_eq!(ggml_type_name(7), "Q5_1 (ggml type 7)");
        assert_eq!(ggml_type_name(1000), "ggml type 1000");
    }
}
