//! Block formats -> f32, bit-exact with the PyPI `gguf` package's `gguf.quants.dequantize`
//! (and so with ggml's reference `dequantize_row_*`).
//!
//! Each block stores `DType::block_len()` elements in `DType::block_bytes()` bytes; scales are
//! little-endian f16. Products are formed in the same order as the reference so that rounding
//! matches: for example Q4_K and Q5_K compute `(d * sc) * q - (dmin * m)`, Q6_K `(d * sc) * q`.

use super::DType;
use crate::{Error, Result};
use half::{bf16, f16};

/// Dequantizes `n_elements` elements of type `dtype` stored in `data` to f32.
///
/// `data` must be exactly `dtype.bytes_for(n_elements)` bytes and `n_elements` a whole number of
/// blocks; otherwise [`Error::InvalidArgument`].
pub fn dequantize(dtype: DType, data: &[u8], n_elements: usize) -> Result<Vec<f32>> {
    // Checked before allocating: the output is then bounded by a small multiple of `data.len()`.
    check_len(dtype, data, n_elements)?;
    let mut out = vec![0f32; n_elements];
    dequantize_into(dtype, data, &mut out)?;
    Ok(out)
}

/// Dequantizes `data` into `out` (`out.len()` elements; `data` must be exactly
/// `dtype.bytes_for(out.len())` bytes). Lets callers dequantize row by row without allocating.
pub fn dequantize_into(dtype: DType, data: &[u8], out: &mut [f32]) -> Result<()> {
    check_len(dtype, data, out.len())?;
    let blocks = data.chunks_exact(dtype.block_bytes());
    let outs = out.chunks_exact_mut(dtype.block_len());
    let block_fn: fn(&[u8], &mut [f32]) = match dtype {
        DType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => |b, y| y[0] = f16_at(b, 0),
        DType::BF16 => |b, y| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        DType::Q4_0 => block_q4_0,
        DType::Q4_1 => block_q4_1,
        DType::Q5_0 => block_q5_0,
        DType::Q8_0 => block_q8_0,
        DType::Q4_K => block_q4_k,
        DType::Q5_K => block_q5_k,
        DType::Q6_K => block_q6_k,
    };
    // `check_len` guarantees both iterators have the same number of whole chunks, and each block
    // function indexes only inside its fixed-size block and output chunk.
    for (b, y) in blocks.zip(outs) {
        block_fn(b, y);
    }
    Ok(())
}

/// The first element of `data` (stored as `dtype`) whose value is not finite (NaN or ±inf), if
/// any. Block formats are checked through their f16 scales (and mins): the integer parts are
/// small, so a block's values are finite exactly when its scales are.
pub fn first_non_finite(dtype: DType, data: &[u8]) -> Option<usize> {
    let f16_bad = |b: &[u8], at: usize| !f16::from_le_bytes([b[at], b[at + 1]]).is_finite();
    let scales: &[usize] = match dtype {
        DType::F32 => {
            let bad = |b: &[u8]| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite();
            return data.chunks_exact(4).position(bad);
        }
        DType::F16 => return data.chunks_exact(2).position(|b| f16_bad(b, 0)),
        DType::BF16 => {
            return data.chunks_exact(2).position(|b| !bf16::from_le_bytes([b[0], b[1]]).is_finite())
        }
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q6_K => &[208],
    };
    let block =
        data.chunks_exact(dtype.block_bytes()).position(|b| scales.iter().any(|&at| f16_bad(b, at)))?;
    Some(block * dtype.block_len())
}

fn check_len(dtype: DType, data: &[u8], n_elements: usize) -> Result<()> {
    match dtype.bytes_for(n_elements as u64) {
        Some(n) if n == data.len() as u64 => Ok(()),
        Some(n) => Err(Error::InvalidArgument(format!(
            "dequantize {dtype}: {n_elements} elements need {n} bytes, got {}",
            data.len()
        ))),
        None => Err(Error::InvalidArgument(format!(
            "dequantize {dtype}: {n_elements} elements is not a multiple of the block length {}",
            dtype.block_len()
        ))),
    }
}

/// The little-endian f16 at byte `i` of `b`, as f32.
#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Q4_0: `d:f16, qs[16]`; element j < 16 is the low nibble of qs[j], element j + 16 the high one.
fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[2..18].iter().enumerate() {
        lo[j] = d * ((q & 0x0F) as i32 - 8) as f32;
        hi[j] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: `d:f16, m:f16, qs[16]`; x = d * q + m.
fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[4..20].iter().enumerate() {
        lo[j] = d * (q & 0x0F) as f32 + m;
        hi[j] = d * (q >> 4) as f32 + m;
    }
}

/// Q5_0: `d:f16, qh:u32, qs[16]`; bit j of qh is the fifth bit of element j; x = d * (q - 16).
fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) & 1) as i32;
        let h1 = ((qh >> (j + 16)) & 1) as i32;
        lo[j] = d * (((q & 0x0F) as i32 | (h0 << 4)) - 16) as f32;
        hi[j] = d * (((q >> 4) as i32 | (h1 << 4)) - 16) as f32;
    }
}

/// Q8_0: `d:f16, qs[32]:i8`; x = q * d.
fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = (q as i8) as f32 * d;
    }
}

/// The 6-bit scale and min of sub-block `sub` (0..8) of a Q4_K / Q5_K super-block, from its
/// twelve packed bytes (ggml's `get_scale_min_k4`): sub-blocks 0..3 keep theirs in the low six
/// bits of bytes `sub` and `sub + 4`; sub-blocks 4..7 take their low four bits from the nibbles of
/// byte `sub + 4` and their top two from the spare high bits of bytes `sub - 4` and `sub`.
fn scale_min_k4(s: &[u8], sub: usize) -> (u8, u8) {
    if sub < 4 {
        (s[sub] & 0x3F, s[sub + 4] & 0x3F)
    } else {
        ((s[sub + 4] & 0x0F) | ((s[sub - 4] >> 6) << 4), (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4))
    }
}

/// Q4_K: `d:f16, dmin:f16, scales[12], qs[128]`. Eight sub-blocks of 32 with 6-bit scale `sc`
/// and min `m` packed in `scales`; sub-block 2c + s uses nibble s of qs[32c..32c+32];
/// x = (d * sc) * q - dmin * m.
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    block_k(b, &b[16..144], None, y);
}

/// Q5_K: `d:f16, dmin:f16, scales[12], qh[32], qs[128]`. Eight sub-blocks of 32 with scales and
/// mins packed as in Q4_K; element l of sub-block 2c + s has its low four bits in nibble s of
/// qs[32c + l] and its fifth bit in bit 2c + s of qh[l]; x = (d * sc) * q - dmin * m, q in 0..32.
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    block_k(b, &b[48..176], Some(&b[16..48]), y);
}

/// A Q4_K or Q5_K super-block: `d`, `dmin` and the scales at the front of `b`, the nibbles `qs`,
/// and for Q5_K the fifth bits `qh`.
fn block_k(b: &[u8], qs: &[u8], qh: Option<&[u8]>, y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let s = &b[4..16];
    for (sub, ys) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, sub);
        let scale = d * sc as f32;
        let min = dmin * m as f32;
        let shift = 4 * (sub % 2);
        let q = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
        for (l, (yj, &qj)) in ys.iter_mut().zip(q).enumerate() {
            let fifth = qh.map_or(0, |qh| ((qh[l] >> sub) & 1) << 4);
            *yj = scale * (((qj >> shift) & 0x0F) | fifth) as f32 - min;
        }
    }
}

/// Q6_K: `ql[128], qh[64], scales[16]:i8, d:f16`. Two halves of 128; in half h, element r has
/// low 4 bits from ql[64h + r % 64] (nibble r / 64) and high 2 bits from qh[32h + r % 32]
/// (bits 2 * (r / 32)); element e uses scale e / 16; x = (d * scale) * (q - 32).
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for (e, ye) in y.iter_mut().enumerate() {
        let (h, r) = (e / 128, e % 128);
        let lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        let hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        let q = (lo | (hi << 4)) as i32 - 32;
        let scale = d * (scales[e / 16] as i8) as f32;
        *ye = scale * q as f32;
    }
}
