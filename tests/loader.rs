//! Loader tests: GGUF and safetensors parsing (round trips and hostile input) and bit-exact
//! dequantization against vectors made by the PyPI `gguf` package (scripts/quant_vectors.py).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use wgspec::loader::gguf::{Gguf, Value};
use wgspec::loader::gguf_writer::GgufWriter;
use wgspec::loader::quant::{dequantize, dequantize_into, first_non_finite};
use wgspec::loader::safetensors::{write_safetensors, Safetensors};
use wgspec::loader::DType;
use wgspec::Error;

// ---------------------------------------------------------------------------------------------
// helpers

/// A tensor written to a test file: (name, dtype, shape outermost first, bytes).
type Tensor = (String, DType, Vec<usize>, Vec<u8>);

/// Random valid bytes for `n_elements` of `dtype`: finite f16 scales, random quant bits.
fn random_tensor_bytes(rng: &mut SmallRng, dtype: DType, n_elements: usize) -> Vec<u8> {
    let n = dtype.bytes_for(n_elements as u64).unwrap() as usize;
    let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
    let scale = |rng: &mut SmallRng| half::f16::from_f32(rng.gen_range(-0.1f32..0.1)).to_le_bytes();
    let block = dtype.block_bytes();
    for b in v.chunks_exact_mut(block) {
        match dtype {
            DType::F32 => b.copy_from_slice(&rng.gen_range(-1f32..1.0).to_le_bytes()),
            DType::F16 | DType::BF16 => {
                let x = rng.gen_range(-1f32..1.0);
                let bits = if dtype == DType::F16 {
                    half::f16::from_f32(x).to_bits()
                } else {
                    half::bf16::from_f32(x).to_bits()
                };
                b.copy_from_slice(&bits.to_le_bytes());
            }
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => b[0..2].copy_from_slice(&scale(rng)),
            DType::Q4_1 | DType::Q4_K | DType::Q5_K => {
                b[0..2].copy_from_slice(&scale(rng));
                b[2..4].copy_from_slice(&scale(rng));
            }
            DType::Q6_K => b[208..210].copy_from_slice(&scale(rng)),
        }
    }
    v
}

/// A little-endian byte builder for hand-made (often broken) headers.
#[derive(Default)]
struct B(Vec<u8>);
impl B {
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, x: u32) -> Self {
        self.bytes(&x.to_le_bytes())
    }
    fn u64(self, x: u64) -> Self {
        self.bytes(&x.to_le_bytes())
    }
    fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// GGUF header start: magic, version, tensor count, kv count.
    fn gguf(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        B::default().bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)
    }
    /// A tensor info with dims given innermost first (as stored).
    fn tensor(self, name: &str, ne: &[u64], ggml_type: u32, offset: u64) -> Self {
        let mut b = self.str(name).u32(ne.len() as u32);
        for &d in ne {
            b = b.u64(d);
        }
        b.u32(ggml_type).u64(offset)
    }
    /// Pads to `align` and appends `data_len` zero bytes of tensor data.
    fn data(mut self, align: usize, data_len: usize) -> Vec<u8> {
        self.0.resize(self.0.len().next_multiple_of(align), 0);
        self.0.resize(self.0.len() + data_len, 0);
        self.0
    }
}

fn corrupt_msg(r: wgspec::Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::Corrupt { message, .. }) => message,
        other => panic!("expected Error::Corrupt, got {other:?}"),
    }
}

fn all_value_types() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool_t", Value::Bool(true)),
        ("t.bool_f", Value::Bool(false)),
        ("t.str", Value::String("héllo ▁wörld \u{1F600}".into())),
        ("t.empty_str", Value::String(String::new())),
        ("t.arr_i32", Value::Array(vec![Value::I32(1), Value::I32(-2), Value::I32(3)])),
        ("t.arr_f32", Value::Array(vec![Value::F32(0.5), Value::F32(-0.25)])),
        (
            "t.arr_str",
            Value::Array(vec![
                Value::String("a".into()),
                Value::String("".into()),
                Value::String("ĠHello".into()),
            ]),
        ),
        ("t.arr_bool", Value::Array(vec![Value::Bool(true), Value::Bool(false)])),
        (
            "t.arr_nested",
            Value::Array(vec![
                Value::Array(vec![Value::U64(1), Value::U64(2)]),
                Value::Array(vec![Value::U64(3)]),
            ]),
        ),
    ]
}

/// A GGUF with every value type and one tensor of every dtype; returns (file, tensors).
fn sample_gguf(alignment: Option<u32>) -> (Vec<u8>, Vec<Tensor>) {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    if let Some(a) = alignment {
        w.add("general.alignment", Value::U32(a));
    }
    for (k, v) in all_value_types() {
        w.add(k, v);
    }
    let mut tensors = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        // rows x cols, cols a multiple of the block length; odd sizes so padding matters.
        let shape = vec![3 + i, dtype.block_len() * if dtype.block_len() == 1 { 5 } else { 2 }];
        let data = random_tensor_bytes(&mut rng, dtype, shape.iter().product());
        let name = format!("blk.{i}.{}", dtype.name().to_lowercase());
        w.add_tensor(&name, dtype, &shape, data.clone());
        tensors.push((name, dtype, shape, data));
    }
    // A 1-D and a 3-D tensor.
    let d1 = random_tensor_bytes(&mut rng, DType::F32, 7);
    w.add_tensor("norm", DType::F32, &[7], d1.clone());
    tensors.push(("norm".into(), DType::F32, vec![7], d1));
    let d3 = random_tensor_bytes(&mut rng, DType::F16, 2 * 3 * 5);
    w.add_tensor("cube", DType::F16, &[2, 3, 5], d3.clone());
    tensors.push(("cube".into(), DType::F16, vec![2, 3, 5], d3));
    (w.try_to_bytes().unwrap(), tensors)
}

/// Bytes up to the end of the tensor table (where `data_offset` rounds up from).
fn header_end(file: &[u8]) -> usize {
    let g = Gguf::parse(file, file.len() as u64).unwrap();
    // The smallest prefix that parses is the header.
    (0..=g.data_offset as usize).find(|&n| Gguf::parse(&file[..n], file.len() as u64).is_ok()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// DType and dequantization

#[test]
fn dtype_sizes_and_ids() {
    let expect = [
        (DType::F32, 1, 4, 0),
        (DType::F16, 1, 2, 1),
        (DType::Q4_0, 32, 18, 2),
        (DType::Q4_1, 32, 20, 3),
        (DType::Q5_0, 32, 22, 6),
        (DType::Q8_0, 32, 34, 8),
        (DType::Q4_K, 256, 144, 12),
        (DType::Q5_K, 256, 176, 13),
        (DType::Q6_K, 256, 210, 14),
        (DType::BF16, 1, 2, 30),
    ];
    for (d, len, bytes, id) in expect {
        assert_eq!((d.block_len(), d.block_bytes(), d.ggml_type()), (len, bytes, id), "{d:?}");
        assert_eq!(DType::from_ggml_type(id), Some(d));
        assert_eq!(d.is_quantized(), len > 1);
        assert_eq!(d.bytes_for(len as u64 * 3), Some(bytes as u64 * 3));
        assert_eq!(d.bytes_for(0), Some(0));
        if len > 1 {
            assert_eq!(d.bytes_for(len as u64 + 1), None, "{d:?}");
        }
        // The most elements a u64 can count: their bytes overflow iff a block is bigger in bytes
        // than in elements.
        let max = u64::MAX - u64::MAX % len as u64;
        assert_eq!(d.bytes_for(max).is_none(), bytes > len, "{d:?} overflow");
    }
    assert_eq!(DType::from_ggml_type(7), None);
    assert_eq!(DType::Q4_K.name(), "Q4_K");
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant")
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::F16,
        DType::BF16,
    ];
    for dtype in types {
        let raw = std::fs::read(data_dir().join(format!("{}.bin", dtype.name()))).unwrap();
        let expected: Vec<u32> = std::fs::read(data_dir().join(format!("{}.f32", dtype.name())))
            .unwrap()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(expected.len() >= 256, "{dtype:?}: too few vectors");
        assert!(expected.iter().any(|&b| f32::from_bits(b) != 0.0), "{dtype:?}: all zero");
        let got = dequantize(dtype, &raw, expected.len()).unwrap();
        let mismatches: Vec<_> = got
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (g, e))| g.to_bits() != **e)
            .map(|(i, (g, e))| (i, *g, f32::from_bits(*e)))
            .take(5)
            .collect();
        assert!(mismatches.is_empty(), "{dtype:?}: (index, got, expected) {mismatches:?}");

        // Row by row into a caller's buffer gives the same values.
        let per_row = dtype.block_len() * 8.min(expected.len() / dtype.block_len());
        let row_bytes = dtype.bytes_for(per_row as u64).unwrap() as usize;
        let mut row = vec![f32::NAN; per_row];
        dequantize_into(dtype, &raw[..row_bytes], &mut row).unwrap();
        assert!(row.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype:?}");
    }
}

#[test]
fn dequantize_f32_is_identity() {
    let x = [1.0f32, -0.0, f32::INFINITY, 1e-40, -123.456];
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let y = dequantize(DType::F32, &bytes, x.len()).unwrap();
    assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn dequantize_hand_checked_blocks() {
    // Q8_0: d = 0.5, q = -128..-97 -> x = q / 2.
    let mut b = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    b.extend((0..32).map(|i| (i * 7 - 100) as i8 as u8));
    let y = dequantize(DType::Q8_0, &b, 32).unwrap();
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, (i as f32 * 7.0 - 100.0) * 0.5);
    }
    // Q4_0: d = 2, byte j = (hi << 4) | lo with lo = j, hi = 15 - j -> x_j = 2 (j - 8), x_{j+16} = 2 (7 - j).
    let mut b = half::f16::from_f32(2.0).to_le_bytes().to_vec();
    b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
    let y = dequantize(DType::Q4_0, &b, 32).unwrap();
    for j in 0..16 {
        assert_eq!(y[j], 2.0 * (j as f32 - 8.0));
        assert_eq!(y[j + 16], 2.0 * (7.0 - j as f32));
    }
}

#[test]
fn dequantize_hand_checked_q5_k_block() {
    // d = 0.5, dmin = 0.25 (every product below is exact). Scales and mins of the eight
    // sub-blocks, chosen so that sub-blocks 4..7 use the spare high bits of bytes 0..7:
    //   sc = [1, 2, 3, 63, 17, 33, 48, 5], m = [0, 4, 7, 62, 20, 35, 63, 9]
    let sc = [1.0f32, 2.0, 3.0, 63.0, 17.0, 33.0, 48.0, 5.0];
    let m = [0.0f32, 4.0, 7.0, 62.0, 20.0, 35.0, 63.0, 9.0];
    let scales: [u8; 12] = [
        0x41, 0x82, 0xC3, 0x3F, // sc[0..4] | (sc[4..8] >> 4) << 6: 1|1<<6, 2|2<<6, 3|3<<6, 63|0
        0x40, 0x84, 0xC7, 0x3E, // m[0..4] | (m[4..8] >> 4) << 6: 0|1<<6, 4|2<<6, 7|3<<6, 62|0
        0x41, 0x31, 0xF0, 0x95, // (sc[4..8] & 15) | (m[4..8] & 15) << 4: 1|4, 1|3, 0|15, 5|9
    ];
    // Quant of element l of sub-block j: (7j + 3l) mod 32, every value 0..31 in every sub-block,
    // so the fifth bit is both set and clear in each. Encoded here: low four bits in nibble j % 2
    // of qs[32 (j / 2) + l], the fifth in bit j of qh[l].
    let q = |j: usize, l: usize| (7 * j + 3 * l) % 32;
    let mut qh = [0u8; 32];
    let mut qs = [0u8; 128];
    for j in 0..8 {
        for l in 0..32 {
            qs[32 * (j / 2) + l] |= ((q(j, l) & 15) as u8) << (4 * (j % 2));
            qh[l] |= ((q(j, l) >> 4) as u8) << j;
        }
    }
    let mut b = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    b.extend(half::f16::from_f32(0.25).to_le_bytes());
    b.extend(scales);
    b.extend(qh);
    b.extend(qs);
    assert_eq!(b.len(), DType::Q5_K.block_bytes());
    let y = dequantize(DType::Q5_K, &b, 256).unwrap();
    for j in 0..8 {
        for l in 0..32 {
            let want = 0.5 * sc[j] * q(j, l) as f32 - 0.25 * m[j];
            assert_eq!(y[32 * j + l], want, "sub-block {j} element {l}");
        }
    }
    // A few by hand: (j, l) -> q -> 0.5 sc q - 0.25 m.
    assert_eq!(y[0], 0.0); // (0, 0): q 0
    assert_eq!(y[32 + 2], 12.0); // (1, 2): q 13, 0.5*2*13 - 0.25*4
    assert_eq!(y[3 * 32 + 5], 110.5); // (3, 5): q 4, 0.5*63*4 - 0.25*62
    assert_eq!(y[4 * 32 + 1], 258.5); // (4, 1): q 31 (fifth bit), 0.5*17*31 - 0.25*20
    assert_eq!(y[5 * 32], 40.75); // (5, 0): q 3, 0.5*33*3 - 0.25*35
    assert_eq!(y[6 * 32 + 10], 176.25); // (6, 10): q 8, 0.5*48*8 - 0.25*63
    assert_eq!(y[7 * 32 + 31], 32.75); // (7, 31): q 14, 0.5*5*14 - 0.25*9
                                       // The fifth bit alone: clearing bit 4 of qh[1] takes 16 off element (4, 1): 0.5*17*15 - 5.
    b[16 + 1] &= !(1 << 4);
    let y2 = dequantize(DType::Q5_K, &b, 256).unwrap();
    assert_eq!(y2[4 * 32 + 1], 122.5);
    let changed: Vec<usize> = (0..256).filter(|&i| y[i] != y2[i]).collect();
    assert_eq!(changed, vec![4 * 32 + 1]);
}

#[test]
fn non_finite_values_are_found_in_every_stored_type() {
    let mut rng = SmallRng::seed_from_u64(17);
    for dtype in DType::ALL {
        let n = 4 * dtype.block_len().max(64);
        let mut bytes = random_tensor_bytes(&mut rng, dtype, n);
        assert_eq!(first_non_finite(dtype, &bytes), None, "{dtype}: random valid bytes");
        assert!(dequantize(dtype, &bytes, n).expect("dequantize").iter().all(|v| v.is_finite()), "{dtype}");
        // Poison the third block's scale (or the third element of a plain type).
        let at = 2 * dtype.block_bytes() + if dtype == DType::Q6_K { 208 } else { 0 };
        match dtype {
            DType::F32 => bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes()),
            DType::BF16 => bytes[at..at + 2].copy_from_slice(&half::bf16::INFINITY.to_le_bytes()),
            _ => bytes[at..at + 2].copy_from_slice(&half::f16::NAN.to_le_bytes()),
        }
        let first = 2 * dtype.block_len();
        assert_eq!(first_non_finite(dtype, &bytes), Some(first), "{dtype}");
        let values = dequantize(dtype, &bytes, n).expect("dequantize");
        assert!(!values[first].is_finite(), "{dtype}: the element reported is the poisoned one");
    }
}

#[test]
fn dequantize_rejects_wrong_lengths() {
    let mut rng = SmallRng::seed_from_u64(1);
    for dtype in DType::ALL {
        let n = dtype.block_len() * 2;
        let data = random_tensor_bytes(&mut rng, dtype, n);
        assert!(dequantize(dtype, &data, n).is_ok());
        for (bytes, elems) in [
            (&data[..data.len() - 1], n),
            (&data[..], n + dtype.block_len()),
            (&data[..], n - dtype.block_len()),
            (&data[..0], n),
        ] {
            let r = dequantize(dtype, bytes, elems);
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{dtype:?} {} {elems}: {r:?}", bytes.len());
        }
        if dtype.is_quantized() {
            assert!(dequantize(dtype, &data, n - 1).is_err());
            let mut out = vec![0f32; n + 1];
            assert!(dequantize_into(dtype, &data, &mut out).is_err());
        }
        assert_eq!(dequantize(dtype, &[], 0).unwrap(), Vec::<f32>::new());
    }
}

// ---------------------------------------------------------------------------------------------
// GGUF: round trips

#[test]
fn gguf_round_trip_all_values_and_tensors() {
    let (file, tensors) = sample_gguf(None);
    let g = Gguf::parse(&file, file.len() as u64).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset % 32, 0);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    let vals = all_value_types();
    assert_eq!(g.metadata.len(), vals.len() + 1);
    for (k, v) in &vals {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    // Keys come back in file order.
    let keys: Vec<&str> = g.metadata.iter().skip(1).map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, vals.iter().map(|(k, _)| *k).collect::<Vec<_>>());

    assert_eq!(g.tensors.len(), tensors.len());
    for ((name, dtype, shape, data), info) in tensors.iter().zip(&g.tensors) {
        assert_eq!(&info.name, name);
        assert_eq!(info.dtype, *dtype);
        assert_eq!(&info.shape, shape);
        assert_eq!(info.n_bytes, data.len() as u64);
        assert_eq!(info.offset % g.alignment, 0, "{name}");
        assert!(info.offset >= g.data_offset);
        assert_eq!(g.tensor(name), Some(info));
        assert_eq!(g.tensor_data(&file, info).unwrap(), &data[..], "{name}");
        let vals = dequantize(info.dtype, g.tensor_data(&file, info).unwrap(), info.n_elements()).unwrap();
        assert_eq!(vals.len(), shape.iter().product::<usize>());
    }
    assert!(g.tensor("nope").is_none());
}

#[test]
fn gguf_shape_is_outermost_first_on_disk_innermost_first() {
    let mut w = GgufWriter::new();
    w.add_tensor("m", DType::Q8_0, &[3, 64], vec![0; 3 * 2 * 34]);
    let file = w.to_bytes();
    // The tensor info stores ne0 = 64 (cols) first, then ne1 = 3 (rows).
    // magic, version, two counts (24 bytes); name length and "m" (9); n_dims (4).
    let ne_at = 24 + 9 + 4;
    assert_eq!(&file[ne_at..ne_at + 16], &B::default().u64(64).u64(3).0[..]);
    let g = Gguf::parse(&file, file.len() as u64).unwrap();
    assert_eq!(g.tensors[0].shape, vec![3, 64]);
}

#[test]
fn gguf_custom_alignment_and_getters() {
    let (file, tensors) = sample_gguf(Some(256));
    let g = Gguf::parse(&file, file.len() as u64).unwrap();
    assert_eq!(g.alignment, 256);
    assert_eq!(g.data_offset % 256, 0);
    for t in &g.tensors {
        assert_eq!(t.offset % 256, 0, "{}", t.name);
    }
    assert_eq!(g.tensor_data(&file, &g.tensors[3]).unwrap(), &tensors[3].3[..]);

    assert_eq!(g.get_u32("general.alignment").unwrap(), 256);
    assert_eq!(g.get_u32("t.u8").unwrap(), 200);
    assert_eq!(g.get_u32("t.u16").unwrap(), 60000);
    assert_eq!(g.get_f32("t.f32").unwrap(), -1.5e-7);
    assert_eq!(g.get_f32("t.f64").unwrap(), std::f64::consts::PI as f32);
    assert_eq!(g.get_f32("t.i32").unwrap(), -2e9);
    assert_eq!(g.get("t.arr_str").unwrap().as_array().unwrap()[2].as_str(), Some("ĠHello"));
    assert_eq!(g.get("t.bool_t").unwrap().as_bool(), Some(true));
    assert_eq!(g.get("t.i8").unwrap().as_u64(), None);
    assert_eq!(g.get("t.i64").unwrap().as_f64(), Some((i64::MIN + 1) as f64));
    for (key, r) in [
        ("missing.key", g.get_u32("missing.key").map(|_| ())),
        ("t.i32", g.get_u32("t.i32").map(|_| ())),       // negative
        ("t.u64", g.get_u32("t.u64").map(|_| ())),       // too big
        ("t.str", g.get_u32("t.str").map(|_| ())),       // wrong type
        ("t.str", g.get_f32("t.str").map(|_| ())),       // wrong type
        ("t.bool_t", g.get_f32("t.bool_t").map(|_| ())), // bool is not a number
        ("t.u32", g.get_str("t.u32").map(|_| ())),
        ("nope", g.get_str("nope").map(|_| ())),
    ] {
        match r {
            Err(Error::Metadata { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{key}: expected Error::Metadata, got {other:?}"),
        }
    }
}

#[test]
fn gguf_bad_alignment_is_corrupt() {
    for a in [0u32, 3, 48] {
        let file = B::gguf(3, 0, 1).str("general.alignment").u32(4).u32(a).0;
        let msg = corrupt_msg(Gguf::parse(&file, file.len() as u64));
        assert!(msg.contains("alignment"), "{msg}");
    }
}

#[test]
fn gguf_v2_hand_built_header() {
    let file = B::gguf(2, 2, 2)
        .str("general.architecture")
        .u32(8)
        .str("qwen2")
        .str("qwen2.block_count")
        .u32(4)
        .u32(24)
        .tensor("a", &[32, 2], 8, 0) // Q8_0, 2 rows of one block: 68 bytes
        .tensor("b", &[4], 0, 96) // F32 at the next multiple of 32 after 68
        .data(32, 96 + 16);
    let g = Gguf::parse(&file, file.len() as u64).unwrap();
    assert_eq!(g.version, 2);
    assert_eq!(g.get_str("general.architecture").unwrap(), "qwen2");
    assert_eq!(g.get_u32("qwen2.block_count").unwrap(), 24);
    let a = g.tensor("a").unwrap();
    assert_eq!(
        (a.dtype, a.shape.clone(), a.n_bytes, a.offset),
        (DType::Q8_0, vec![2, 32], 68, g.data_offset)
    );
    let b = g.tensor("b").unwrap();
    assert_eq!(
        (b.dtype, b.shape.clone(), b.n_bytes, b.offset),
        (DType::F32, vec![4], 16, g.data_offset + 96)
    );
    assert_eq!(b.offset + b.n_bytes, file.len() as u64);
    // One byte less and the last tensor sticks out of the file.
    assert!(corrupt_msg(Gguf::parse(&file[..file.len() - 1], file.len() as u64 - 1)).contains("beyond"));
}

#[test]
fn gguf_header_alone_with_the_full_file_length() {
    let (file, _) = sample_gguf(None);
    let end = header_end(&file);
    let g_full = Gguf::parse(&file, file.len() as u64).unwrap();
    let g = Gguf::parse(&file[..end], file.len() as u64).unwrap();
    assert_eq!(g, g_full);
    // ...but the data is not there: tensor_data says so instead of panicking.
    let last = g.tensors.last().unwrap();
    assert!(matches!(g.tensor_data(&file[..end], last), Err(Error::Truncated { .. })));
}

// ---------------------------------------------------------------------------------------------
// GGUF: hostile input

#[test]
fn gguf_every_truncation_is_an_error() {
    let (file, _) = sample_gguf(None);
    let end = header_end(&file);
    let full = file.len() as u64;
    for cut in 0..end {
        // A header prefix: the caller must read more.
        match Gguf::parse(&file[..cut], full) {
            Err(Error::Truncated { offset, needed, .. }) => {
                assert!(offset + needed > cut as u64, "cut {cut}: offset {offset} needed {needed}")
            }
            other => panic!("cut {cut}: expected Truncated, got {other:?}"),
        }
        // A truncated file.
        assert!(Gguf::parse(&file[..cut], cut as u64).is_err(), "file cut at {cut}");
    }
    // Cut inside the data: the header parses only if told the real length.
    let last = Gguf::parse(&file, full).unwrap().tensors.last().unwrap().clone();
    for cut in (end..file.len()).step_by(7) {
        let r = Gguf::parse(&file[..cut], cut as u64);
        if (cut as u64) < last.offset + last.n_bytes {
            assert!(matches!(r, Err(Error::Corrupt { .. })), "cut {cut}: {r:?}");
        }
    }
}

#[test]
fn gguf_bad_magic() {
    let (mut file, _) = sample_gguf(None);
    file[0..4].copy_from_slice(b"GGML");
    match Gguf::parse(&file, file.len() as u64) {
        Err(Error::BadMagic { found, .. }) => assert_eq!(&found, b"GGML"),
        other => panic!("{other:?}"),
    }
    let st = write_safetensors(&[]);
    assert!(matches!(Gguf::parse(&st, st.len() as u64), Err(Error::BadMagic { .. })));
}

#[test]
fn gguf_unsupported_versions() {
    for v in [0u32, 1, 4, 99, u32::MAX] {
        let file = B::gguf(v, 0, 0).0;
        match Gguf::parse(&file, file.len() as u64) {
            Err(Error::UnsupportedVersion { version, .. }) => assert_eq!(version, v),
            other => panic!("version {v}: {other:?}"),
        }
    }
    for v in [2, 3] {
        let file = B::gguf(v, 0, 0).0;
        assert!(Gguf::parse(&file, file.len() as u64).is_ok());
    }
}

#[test]
fn gguf_absurd_counts() {
    for (n_tensors, n_kv) in [(u64::MAX, 0), (1 << 40, 0), (0, u64::MAX), (0, 1 << 40), (2, 0)] {
        let file = B::gguf(3, n_tensors, n_kv).bytes(&[0; 40]).0;
        let msg = corrupt_msg(Gguf::parse(&file, file.len() as u64));
        assert!(msg.contains("count"), "{n_tensors} {n_kv}: {msg}");
    }
}

#[test]
fn gguf_absurd_dims() {
    let cases: [(&str, Vec<u64>, u32, &str); 6] = [
        ("five dims", vec![1, 1, 1, 1, 1], 0, "dimensions"),
        ("zero dim", vec![4, 0], 0, "zero"),
        ("overflow", vec![1 << 32, 1 << 32, 1 << 32], 0, "overflow"),
        ("huge", vec![1 << 40, 1 << 20], 0, "bytes"),
        ("byte overflow", vec![1 << 62], 0, "overflow"),
        ("partial block", vec![48, 2], 2, "block"),
    ];
    for (what, ne, ty, needle) in cases {
        let file = B::gguf(3, 1, 0).tensor("w", &ne, ty, 0).data(32, 4096);
        let msg = corrupt_msg(Gguf::parse(&file, file.len() as u64));
        assert!(msg.contains(needle) && msg.contains('w'), "{what}: {msg}");
    }
}

#[test]
fn gguf_offsets_beyond_file_unaligned_or_overlapping() {
    let ok = B::gguf(3, 1, 0).tensor("w", &[8], 0, 0).data(32, 32);
    assert!(Gguf::parse(&ok, ok.len() as u64).is_ok());
    let cases = [
        ("beyond", B::gguf(3, 1, 0).tensor("w", &[8], 0, 32).data(32, 32), "beyond"),
        ("far beyond", B::gguf(3, 1, 0).tensor("w", &[8], 0, u64::MAX - 31).data(32, 32), "beyond"),
        ("unaligned", B::gguf(3, 1, 0).tensor("w", &[4], 0, 4).data(32, 32), "multiple"),
        (
            "overlap",
            B::gguf(3, 2, 0).tensor("w", &[16], 0, 0).tensor("v", &[8], 0, 32).data(32, 64),
            "overlap",
        ),
        (
            "duplicate",
            B::gguf(3, 2, 0).tensor("w", &[8], 0, 0).tensor("w", &[8], 0, 32).data(32, 64),
            "duplicate",
        ),
    ];
    for (what, file, needle) in cases {
        let msg = corrupt_msg(Gguf::parse(&file, file.len() as u64));
        assert!(msg.contains(needle), "{what}: {msg}");
    }
}

#[test]
fn gguf_unknown_tensor_type() {
    for (id, needle) in [(99u32, "99"), (7, "Q5_1"), (u32::MAX, "4294967295")] {
        let file = B::gguf(3, 1, 0).tensor("blk.0.ffn_up.weight", &[32], id, 0).data(32, 64);
        match Gguf::parse(&file, file.len() as u64) {
            Err(Error::UnsupportedTensorType { tensor, type_name }) => {
                assert_eq!(tensor, "blk.0.ffn_up.weight");
                assert!(type_name.contains(needle), "{type_name}");
            }
            other => panic!("type {id}: {other:?}"),
        }
    }
}

#[test]
fn gguf_string_and_array_lengths_beyond_the_file() {
    let pad = [0u8; 64];
    let cases = [
        ("key length", B::gguf(3, 0, 1).u64(u64::MAX).bytes(&pad).0, "string length"),
        ("key length", B::gguf(3, 0, 1).u64(1000).bytes(&pad).0, "string length"),
        ("value length", B::gguf(3, 0, 1).str("k").u32(8).u64(1 << 50).bytes(&pad).0, "string length"),
        ("name length", B::gguf(3, 1, 0).u64(u64::MAX / 2).bytes(&pad).0, "string length"),
        (
            "array length",
            B::gguf(3, 0, 1).str("k").u32(9).u32(4).u64(u64::MAX / 2).bytes(&pad).0,
            "array length",
        ),
        ("array of strings", B::gguf(3, 0, 1).str("k").u32(9).u32(8).u64(9).bytes(&pad).0, "array length"),
        ("array elem type", B::gguf(3, 0, 1).str("k").u32(9).u32(13).u64(1).bytes(&pad).0, "value type"),
        ("value type", B::gguf(3, 0, 1).str("k").u32(77).bytes(&pad).0, "value type"),
        ("bool", B::gguf(3, 0, 1).str("k").u32(7).bytes(&[2]).0, "bool"),
        (
            "duplicate key",
            B::gguf(3, 0, 2).str("k").u32(0).bytes(&[1]).str("k").u32(0).bytes(&[2]).0,
            "duplicate",
        ),
    ];
    for (what, file, needle) in cases {
        let msg = corrupt_msg(Gguf::parse(&file, file.len() as u64));
        assert!(msg.contains(needle), "{what}: {msg}");
    }
    // Nested arrays, deeper than any real file: an error, not a stack overflow.
    let mut b = B::gguf(3, 0, 1).str("k").u32(9);
    for _ in 0..10_000 {
        b = b.u32(9).u64(1);
    }
    let file = b.u32(0).u64(0).0;
    assert!(corrupt_msg(Gguf::parse(&file, file.len() as u64)).contains("nested"));
}

#[test]
fn gguf_invalid_utf8_strings_are_replaced() {
    let file = B::gguf(3, 0, 1).str("k").u32(8).u64(2).bytes(&[0xFF, b'a']).0;
    let g = Gguf::parse(&file, file.len() as u64).unwrap();
    assert_eq!(g.get_str("k").unwrap(), "\u{FFFD}a");
}

#[test]
fn gguf_random_corruption_never_panics() {
    let (file, _) = sample_gguf(None);
    let end = header_end(&file);
    let mut rng = SmallRng::seed_from_u64(42);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut f = file[..end + 64].to_vec();
        for _ in 0..rng.gen_range(1..4) {
            let i = rng.gen_range(0..end);
            f[i] = if rng.gen_bool(0.5) { rng.gen() } else { [0, 0xFF, 0x7F, 0x80][rng.gen_range(0..4)] };
        }
        match Gguf::parse(&f, file.len() as u64) {
            Ok(g) => {
                ok += 1;
                for t in &g.tensors {
                    let _ = g.tensor_data(&file, t);
                }
            }
            Err(_) => err += 1,
        }
    }
    assert!(ok > 0 && err > 0, "ok {ok} err {err}");
}

#[test]
fn gguf_writer_checks_its_input() {
    let mut w = GgufWriter::new();
    w.add("k", Value::Array(vec![Value::U8(1), Value::I8(1)]));
    assert!(matches!(w.try_to_bytes(), Err(Error::InvalidArgument(_))));
    let mut w = GgufWriter::new();
    w.add_tensor("t", DType::Q4_0, &[32], vec![0; 17]);
    assert!(matches!(w.try_to_bytes(), Err(Error::InvalidArgument(_))));
    let mut w = GgufWriter::new();
    w.add("empty", Value::Array(vec![]));
    let f = w.try_to_bytes().unwrap();
    assert_eq!(Gguf::parse(&f, f.len() as u64).unwrap().get("empty"), Some(&Value::Array(vec![])));
}

// ---------------------------------------------------------------------------------------------
// safetensors

fn sample_safetensors() -> (Vec<u8>, Vec<Tensor>) {
    let mut rng = SmallRng::seed_from_u64(3);
    let specs: [(&str, DType, Vec<usize>); 4] = [
        ("model.embed_tokens.weight", DType::BF16, vec![16, 8]),
        ("model.layers.0.input_layernorm.weight", DType::F32, vec![8]),
        ("model.layers.0.self_attn.q_proj.weight", DType::F16, vec![8, 8]),
        ("scalar", DType::F32, vec![]),
    ];
    let tensors: Vec<_> = specs
        .into_iter()
        .map(|(n, d, s)| {
            let data = random_tensor_bytes(&mut rng, d, s.iter().product());
            (n.to_string(), d, s, data)
        })
        .collect();
    let refs: Vec<(&str, DType, &[usize], &[u8])> =
        tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
    (write_safetensors(&refs), tensors)
}

#[test]
fn safetensors_round_trip() {
    let (file, tensors) = sample_safetensors();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0);
    let st = Safetensors::parse(&file, file.len() as u64).unwrap();
    assert_eq!(st.tensors.len(), tensors.len());
    assert!(st.metadata.is_empty());
    for (name, dtype, shape, data) in &tensors {
        let t = st.tensor(name).unwrap();
        assert_eq!((t.dtype, &t.shape, t.n_bytes), (*dtype, shape, data.len() as u64), "{name}");
        assert!(t.offset >= 8 + header_len);
        assert_eq!(st.tensor_data(&file, t).unwrap(), &data[..], "{name}");
    }
    // Tensors come back in file order.
    assert!(st.tensors.windows(2).all(|w| w[0].offset < w[1].offset));
    // Header alone with the full file length.
    let st2 = Safetensors::parse(&file[..8 + header_len as usize], file.len() as u64).unwrap();
    assert_eq!(st2, st);
    assert!(matches!(
        st2.tensor_data(&file[..8 + header_len as usize], &st.tensors[0]),
        Err(Error::Truncated { .. })
    ));
}

/// A safetensors file from a JSON header and `data_len` zero bytes.
fn st_file(json: &str, data_len: usize) -> Vec<u8> {
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f.resize(f.len() + data_len, 0);
    f
}

#[test]
fn safetensors_metadata() {
    let f = st_file(
        r#"{"__metadata__":{"format":"pt","b":"2"},"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}}  "#,
        8,
    );
    let st = Safetensors::parse(&f, f.len() as u64).unwrap();
    assert_eq!(st.get("format"), Some("pt"));
    assert_eq!(st.metadata.len(), 2);
    assert_eq!(st.tensor("w").unwrap().shape, vec![2, 2]);
}

#[test]
fn safetensors_bad_headers() {
    let w = |dtype: &str, shape: &str, offs: &str| {
        format!(r#"{{"w":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offs}}}}}"#)
    };
    // The JSON and its entries are read by the `safetensors` crate (its messages, with the position
    // in the header where it has one); the framing and the file length are checked here.
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not json", st_file("{nope", 0), "not valid JSON"),
        ("not an object", st_file("[1,2]", 0), "invalid type: sequence"),
        (
            "entry not object",
            st_file(r#"{"w":3}"#, 0),
            "invalid type: integer `3`, expected struct TensorInfo",
        ),
        ("no dtype", st_file(r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, 4), "missing field `dtype`"),
        ("no shape", st_file(r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#, 4), "missing field `shape`"),
        ("negative dim", st_file(&w("F32", "[-1]", "[0,4]"), 4), "invalid value: integer `-1`"),
        ("no offsets", st_file(r#"{"w":{"dtype":"F32","shape":[1]}}"#, 4), "missing field `data_offsets`"),
        ("three offsets", st_file(&w("F32", "[1]", "[0,4,8]"), 8), "invalid length 3"),
        ("begin > end", st_file(&w("F32", "[1]", "[8,4]"), 8), "invalid offset for tensor `w`"),
        ("size mismatch", st_file(&w("F32", "[2]", "[0,4]"), 8), "invalid shape, data type, or offset"),
        ("gap before", st_file(&w("F32", "[2]", "[4,12]"), 12), "invalid offset for tensor `w`"),
        ("beyond file", st_file(&w("F32", "[2]", "[0,8]"), 4), "data_offsets [0, 8] lie beyond the file"),
        (
            "huge offsets",
            st_file(&w("F32", "[1]", "[18446744073709551611,18446744073709551615]"), 8),
            "invalid offset for tensor `w`",
        ),
        ("dim overflow", st_file(&w("F32", "[4294967296,4294967296,4294967296]", "[0,4]"), 8), "overflow"),
        (
            "overlap",
            st_file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                8,
            ),
            "invalid offset for tensor `b`",
        ),
        ("metadata not strings", st_file(r#"{"__metadata__":{"a":1}}"#, 0), "expected a string"),
        ("unknown dtype", st_file(&w("Q4_0", "[1]", "[0,8]"), 8), "unknown variant `Q4_0`"),
        (
            "header past file",
            {
                let mut f = st_file("{}", 0);
                f[..8].copy_from_slice(&100u64.to_le_bytes());
                f
            },
            "header length",
        ),
        (
            "header over limit",
            {
                let mut f = st_file("{}", 0);
                f[..8].copy_from_slice(&(200_000_000u64).to_le_bytes());
                f
            },
            "header length",
        ),
    ];
    for (what, file, needle) in cases {
        let msg = corrupt_msg(Safetensors::parse(&file, file.len() as u64));
        assert!(msg.contains(needle), "{what}: {msg}");
    }
    // A valid safetensors dtype the loader does not read.
    for (dt, shape) in [("F64", "[1]"), ("U8", "[8]"), ("I8", "[8]"), ("F8_E4M3", "[8]")] {
        let f = st_file(&w(dt, shape, "[0,8]"), 8);
        match Safetensors::parse(&f, f.len() as u64) {
            Err(Error::UnsupportedTensorType { tensor, type_name }) => {
                assert_eq!((tensor.as_str(), type_name.as_str()), ("w", dt))
            }
            other => panic!("{dt}: {other:?}"),
        }
    }
    // Integer and boolean tensors are index tensors, read whole by the host (never weights)
    for (dt, shape, want) in [
        ("I64", "[1]", vec![-2i64]),
        ("I32", "[2]", vec![-2, -1]),
        ("BOOL", "[8]", vec![0, 1, 1, 1, 1, 1, 1, 1]),
    ] {
        let mut f = st_file(&w(dt, shape, "[0,8]"), 8);
        let data_at = f.len() - 8;
        f[data_at..].copy_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        f[data_at + 1..].iter_mut().filter(|_| dt == "BOOL").for_each(|b| *b = 1);
        f[data_at] = if dt == "BOOL" { 0 } else { 0xfe };
        let st = Safetensors::parse(&f, f.len() as u64).expect(dt);
        assert!(st.tensors.is_empty() && st.index.len() == 1, "{dt}");
        let t = st.index_tensor("w").expect("index tensor");
        assert_eq!(t.dtype.decode(&f[t.offset as usize..(t.offset + t.n_bytes) as usize]), want, "{dt}");
    }
    // an index tensor whose bytes do not match its shape
    let f = st_file(&w("I64", "[2]", "[0,8]"), 8);
    assert!(Safetensors::parse(&f, f.len() as u64).is_err());
    // Header over the 100 MB limit even though the file claims to be that long.
    let mut f = st_file("{}", 0);
    f[..8].copy_from_slice(&(100_000_001u64).to_le_bytes());
    assert!(corrupt_msg(Safetensors::parse(&f, 1 << 40)).contains("limit"));
}

#[test]
fn safetensors_tensor_order_is_the_files_and_deterministic() {
    // Empty tensors share an offset with the next one; they come first, by name, every time
    // (the crate's tables are hash maps, whose order varies from one parse to the next).
    let json = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
        "e1":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},
        "v":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},
        "e0":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]},
        "e2":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}"#;
    let f = st_file(json, 8);
    for _ in 0..20 {
        let st = Safetensors::parse(&f, f.len() as u64).unwrap();
        let names: Vec<&str> = st.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["e0", "e1", "w", "v", "e2"]);
        let header_end = 8 + json.len() as u64;
        let offsets: Vec<u64> = st.tensors.iter().map(|t| t.offset - header_end).collect();
        assert_eq!(offsets, [0, 0, 0, 4, 8]);
    }
}

#[test]
fn safetensors_every_truncation_is_an_error() {
    let (file, _) = sample_safetensors();
    let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    for cut in 0..header_end {
        match Safetensors::parse(&file[..cut], file.len() as u64) {
            Err(Error::Truncated { .. }) => {}
            other => panic!("cut {cut}: expected Truncated, got {other:?}"),
        }
        assert!(Safetensors::parse(&file[..cut], cut as u64).is_err(), "file cut at {cut}");
    }
    for cut in header_end..file.len() {
        assert!(Safetensors::parse(&file[..cut], cut as u64).is_err(), "data cut at {cut}");
    }
    assert!(Safetensors::parse(&file, file.len() as u64).is_ok());
}
