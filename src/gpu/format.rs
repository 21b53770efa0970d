//! Weight formats on the GPU: how the rows of a weight matrix are laid out in a buffer, one
//! variant per format file in `shaders/formats/` (`k_scales.wgsl`, `span_one.wgsl` and `bytes.wgsl`
//! are parts shared by several). Quantized GGUF blocks stay quantized: they are only
//! repacked so that every load in a kernel is aligned, and dequantised inside the kernel in f32,
//! exactly as `loader::quant::dequantize` does on the CPU.
//!
//! Every format reads a matrix row (an output column of a matmul) in units of 32 weights; rows of
//! the float formats are padded with zeros to a multiple of 32. A span is the run of units that
//! read the same words (a K-quant block's scale words), and a part the run within it that reads
//! the same quant bytes; the matmul loads each once on CPU adapters. Each file of `shaders/formats/`
//! documents its layout; [`pack_rows`] writes it. On CPU adapters every format interleaves the
//! blocks of each run of [`row_group`](super::kernel::row_group) rows (`interleave.wgsl`).

use super::Gpu;
use crate::error::{Error, Result};
use crate::loader::DType;

/// Weights per unit: the granularity at which kernels load a row.
pub const UNIT: usize = 32;

/// Units of 32 weights in a row of `k` (float rows are padded up to a whole unit).
pub fn units(k: usize) -> usize {
    k.div_ceil(UNIT)
}

/// Every stored type is a weight format of the kernels: its `shaders/formats/*.wgsl` file, and the
/// layout [`pack_rows`] writes.
impl DType {
    /// The format's WGSL (`unit_head`, `unit_group`, and the spans and parts `span_load`,
    /// `part_load`, `part_unit`: units that read the same words, loaded once for all of them),
    /// placed ahead of the op that reads it. Formats whose units share nothing get spans and parts
    /// of one unit (`span_one.wgsl`).
    pub fn format_source(self) -> &'static str {
        macro_rules! unit_spans {
            ($($file:literal),+) => {
                concat!(
                    include_str!("../../shaders/formats/interleave.wgsl"),
                    $(include_str!($file),)+
                    include_str!("../../shaders/formats/span_one.wgsl")
                )
            };
        }
        match self {
            DType::F32 => unit_spans!("../../shaders/formats/f32.wgsl"),
            DType::F16 => unit_spans!("../../shaders/formats/f16.wgsl"),
            DType::BF16 => unit_spans!("../../shaders/formats/bf16.wgsl"),
            DType::Q4_0 => unit_spans!("../../shaders/formats/bytes.wgsl", "../../shaders/formats/q4_0.wgsl"),
            DType::Q4_1 => unit_spans!("../../shaders/formats/bytes.wgsl", "../../shaders/formats/q4_1.wgsl"),
            DType::Q5_0 => unit_spans!("../../shaders/formats/bytes.wgsl", "../../shaders/formats/q5_0.wgsl"),
            DType::Q8_0 => unit_spans!("../../shaders/formats/q8_0.wgsl"),
            DType::Q4_K => {
                concat!(
                    include_str!("../../shaders/formats/interleave.wgsl"),
                    include_str!("../../shaders/formats/bytes.wgsl"),
                    include_str!("../../shaders/formats/k_scales.wgsl"),
                    include_str!("../../shaders/formats/q4_k.wgsl")
                )
            }
            DType::Q5_K => {
                concat!(
                    include_str!("../../shaders/formats/interleave.wgsl"),
                    include_str!("../../shaders/formats/bytes.wgsl"),
                    include_str!("../../shaders/formats/k_scales.wgsl"),
                    include_str!("../../shaders/formats/q5_k.wgsl")
                )
            }
            DType::Q6_K => {
                concat!(
                    include_str!("../../shaders/formats/interleave.wgsl"),
                    include_str!("../../shaders/formats/q6_k.wgsl")
                )
            }
        }
    }

    /// u32 words of the quants section per block, and f16 scales per block in the scale section
    /// (0, 1 or 2), for `blocks` blocks of this type (float formats: one block = one unit).
    fn section_sizes(self, blocks: usize) -> (usize, usize) {
        match self {
            DType::F32 => (blocks * 32, 0),
            DType::F16 | DType::BF16 => (blocks * 16, 0),
            DType::Q8_0 => (blocks * 8, blocks),
            DType::Q4_0 => (blocks * 4, blocks),
            DType::Q4_1 => (blocks * 4, blocks * 2),
            DType::Q5_0 => (blocks * 5, blocks),
            DType::Q4_K => (blocks * 36, 0),
            DType::Q5_K => (blocks * 44, 0),
            DType::Q6_K => (blocks * 52, blocks),
        }
    }

    /// Blocks in `rows` rows of `k` (float formats count 32-element units).
    fn blocks(self, rows: usize, k: usize) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => rows * units(k),
            _ => rows * k / self.block_len(),
        }
    }

    /// GPU bytes of `rows` rows of `k` weights in this format (both sections, padded to 16).
    pub fn gpu_bytes(self, rows: usize, k: usize) -> u64 {
        let (quants, halves) = self.section_sizes(self.blocks(rows, k));
        ((quants + halves.div_ceil(2)) as u64 * 4).next_multiple_of(16)
    }

    /// u32 words of the quants section and f16 halves of the scale section in one row of `k`:
    /// the scale section holds a buffer's rows in order (row r's scales start at half
    /// `r * halves`); the quants section holds whole runs of rows in order, so a run starting at
    /// row r starts at word `r * words` (its blocks interleaved, see [`pack_rows`]).
    pub fn row_sections(self, k: usize) -> (usize, usize) {
        self.section_sizes(self.blocks(1, k))
    }

    /// GPU bytes one row adds (at most; the f16 scale section rounds up by one word per buffer).
    pub fn gpu_row_bytes(self, k: usize) -> u64 {
        let (quants, halves) = self.section_sizes(self.blocks(1, k));
        quants as u64 * 4 + halves as u64 * 2
    }
}

/// Rows of a weight matrix laid out for one buffer: the quants section, then the scale section.
#[derive(Clone, Debug)]
pub struct PackedRows {
    pub dtype: DType,
    pub rows: usize,
    pub k: usize,
    /// u32 word where the scale section starts.
    pub scale_base: u32,
    /// Both sections, padded to a multiple of 4 words.
    pub words: Vec<u32>,
    /// The runs of rows whose blocks are interleaved (1: rows in order; see [`pack_rows`]).
    pub group: usize,
}

fn le16(b: &[u8], i: usize) -> u32 {
    u16::from_le_bytes([b[i], b[i + 1]]) as u32
}

fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Lays out `rows` rows of `k` f32 values (row-major) in the F32 format, for a buffer whose rows
/// start at a multiple of `group` (as [`pack_rows`]).
pub fn pack_f32_rows(values: &[f32], rows: usize, k: usize, group: usize) -> Result<PackedRows> {
    check_shape(DType::F32, values.len() * 4, rows, k)?;
    let f = DType::F32;
    let stride = units(k) * UNIT;
    let mut words = vec![0u32; f.gpu_bytes(rows, k) as usize / 4];
    for (r, row) in values.chunks_exact(k.max(1)).take(rows).enumerate() {
        for (i, v) in row.iter().enumerate() {
            words[r * stride + i] = v.to_bits();
        }
    }
    let group = group.max(1);
    if group > 1 {
        interleave_rows(&mut words, rows, units(k), UNIT, group);
    }
    Ok(PackedRows { dtype: f, rows, k, scale_base: 0, words, group })
}

fn check_shape(dtype: DType, bytes: usize, rows: usize, k: usize) -> Result<()> {
    if k == 0 || !k.is_multiple_of(4) {
        return Err(Error::InvalidArgument(format!(
            "weight rows of {k} elements: the kernels need a positive multiple of 4"
        )));
    }
    if !k.is_multiple_of(dtype.block_len()) {
        return Err(Error::InvalidArgument(format!(
            "{dtype} rows of {k} elements are not whole blocks of {}",
            dtype.block_len()
        )));
    }
    let need = rows.checked_mul(k).and_then(|n| dtype.bytes_for(n as u64));
    if need != Some(bytes as u64) {
        return Err(Error::InvalidArgument(format!(
            "{rows} x {k} {dtype} weights need {need:?} bytes, got {bytes}"
        )));
    }
    Ok(())
}

/// Lays out `rows` rows of `k` elements stored as `dtype` (row-major, the file's own bytes) in
/// the format of that dtype, for a buffer whose rows start at a multiple of `group` (the
/// adapter's [`row_group`](super::kernel::row_group)): the quants section interleaves the blocks
/// (32-element units, the K-quants' 256-element blocks) of each run of `group` rows. The values
/// are not changed: only moved so that loads are aligned (and,
/// on CPU adapters, in the order the matmul walks them).
pub fn pack_rows(dtype: DType, bytes: &[u8], rows: usize, k: usize, group: usize) -> Result<PackedRows> {
    let f = dtype;
    if dtype == DType::F32 {
        check_shape(f, bytes.len(), rows, k)?;
        let values: Vec<f32> =
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        return pack_f32_rows(&values, rows, k, group);
    }
    check_shape(f, bytes.len(), rows, k)?;
    let blocks = f.blocks(rows, k);
    let (quants, halves) = f.section_sizes(blocks);
    let mut words = vec![0u32; f.gpu_bytes(rows, k) as usize / 4];
    let scale_base = quants;
    let set_half = |words: &mut [u32], h: usize, v: u32| {
        words[scale_base + h / 2] |= v << (16 * (h % 2));
    };
    match f {
        DType::F16 | DType::BF16 => {
            // Each row padded to whole units of 32 halves, two per word.
            let stride = units(k) * UNIT / 2;
            for (r, row) in bytes.chunks_exact(k * 2).enumerate() {
                for (i, pair) in row.chunks(4).enumerate() {
                    let lo = le16(pair, 0);
                    let hi = if pair.len() == 4 { le16(pair, 2) } else { 0 };
                    words[r * stride + i] = lo | (hi << 16);
                }
            }
        }
        DType::Q8_0 | DType::Q4_0 => {
            let qwords = if f == DType::Q8_0 { 8 } else { 4 }; // quant words per block
            for (b, blk) in bytes.chunks_exact(dtype.block_bytes()).enumerate() {
                set_half(&mut words, b, le16(blk, 0));
                for i in 0..qwords {
                    words[b * qwords + i] = le32(blk, 2 + 4 * i);
                }
            }
        }
        DType::Q4_1 => {
            for (b, blk) in bytes.chunks_exact(dtype.block_bytes()).enumerate() {
                words[scale_base + b] = le16(blk, 0) | (le16(blk, 2) << 16);
                for i in 0..4 {
                    words[b * 4 + i] = le32(blk, 4 + 4 * i);
                }
            }
        }
        DType::Q5_0 => {
            for (b, blk) in bytes.chunks_exact(dtype.block_bytes()).enumerate() {
                set_half(&mut words, b, le16(blk, 0));
                for i in 0..4 {
                    words[b * 5 + i] = le32(blk, 6 + 4 * i);
                }
                words[b * 5 + 4] = le32(blk, 2);
            }
        }
        DType::Q4_K | DType::Q5_K => {
            // Kept as stored: 144 and 176 bytes are whole vec4<u32>s (9 and 11).
            for (i, w) in bytes.chunks_exact(4).enumerate() {
                words[i] = le32(w, 0);
            }
        }
        DType::Q6_K => {
            for (b, blk) in bytes.chunks_exact(dtype.block_bytes()).enumerate() {
                for i in 0..52 {
                    words[b * 52 + i] = le32(blk, 4 * i);
                }
                set_half(&mut words, b, le16(blk, 208));
            }
        }
        DType::F32 => unreachable!("handled above"),
    }
    let group = group.max(1);
    if group > 1 {
        let block_words = f.section_sizes(1).0;
        interleave_rows(&mut words[..quants], rows, f.blocks(1, k), block_words, group);
    }
    debug_assert!(halves.div_ceil(2) + quants <= words.len());
    Ok(PackedRows { dtype: f, rows, k, scale_base: scale_base as u32, words, group })
}

/// Reorders the quants section `words` of `rows` rows of `per_row` blocks of `block` words
/// (row-major) so that each run of `group` rows holds its rows' block 0s, then their block 1s,
/// ...: block j of row r goes to `stored_block(r, j, per_row)` of
/// `shaders/formats/interleave.wgsl`.
fn interleave_rows(words: &mut [u32], rows: usize, per_row: usize, block: usize, group: usize) {
    let mut run_words = Vec::new(); // one run's rows in row order (a copy of at most `group` rows)
    for first in (0..rows).step_by(group.max(1)) {
        let run = group.min(rows - first);
        let section = &mut words[first * per_row * block..(first + run) * per_row * block];
        run_words.clear();
        run_words.extend_from_slice(section);
        for r in 0..run {
            for j in 0..per_row {
                let from = (r * per_row + j) * block;
                let to = (j * run + r) * block;
                section[to..to + block].copy_from_slice(&run_words[from..from + block]);
            }
        }
    }
}

/// Rows of a weight matrix in one GPU buffer, in a format the matmul and embedding kernels read.
pub struct WeightBuffer {
    /// The stored type, which is the format the kernels read.
    pub dtype: DType,
    /// Rows held (output columns of a matmul, vocabulary entries of an embedding).
    pub rows: usize,
    /// Elements per row.
    pub k: usize,
    /// u32 word where the scale section starts.
    pub scale_base: u32,
    // [rows, units] blocks of `format` (interleaved by runs of rows on CPU adapters), then its
    // scale section
    pub raw: wgpu::Buffer,
}

impl WeightBuffer {
    /// Uploads packed rows (packed with the adapter's [`Gpu::row_group`]).
    fn upload(gpu: &Gpu, label: &str, p: &PackedRows) -> WeightBuffer {
        debug_assert!(p.group == gpu.row_group(), "rows packed for another adapter");
        let raw = gpu.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (p.words.len() as u64 * 4).max(16),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        gpu.queue.write_buffer(&raw, 0, bytemuck::cast_slice(&p.words));
        WeightBuffer { dtype: p.dtype, rows: p.rows, k: p.k, scale_base: p.scale_base, raw }
    }

    /// A buffer for `rows` rows of `k` elements in the `dtype` format, filled later by
    /// [`WeightBuffer::write_rows`].
    pub fn empty(gpu: &Gpu, label: &str, dtype: DType, rows: usize, k: usize) -> WeightBuffer {
        let raw = gpu.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: dtype.gpu_bytes(rows, k).max(16),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let scale_base = (dtype.row_sections(k).0 * rows) as u32;
        WeightBuffer { dtype, rows, k, scale_base, raw }
    }

    /// Writes packed rows `first .. first + p.rows` of this buffer (`first` even, so that the
    /// rows' f16 scales start on a word of the scale section; for interleaved rows, packed with
    /// the adapter's group, starting a run, and whole runs but at the buffer's end).
    pub fn write_rows(&self, gpu: &Gpu, first: usize, p: &PackedRows) -> Result<()> {
        let (words, halves) = self.dtype.row_sections(self.k);
        let g = p.group;
        let runs = g == gpu.row_group()
            && first.is_multiple_of(g)
            && (p.rows.is_multiple_of(g) || first + p.rows == self.rows);
        let fits = p.dtype == self.dtype
            && p.k == self.k
            && first.is_multiple_of(2)
            && first + p.rows <= self.rows
            && runs;
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "{} rows of {} x {} at row {first} of a buffer of {} rows of {} x {}",
                p.rows, p.dtype, p.k, self.rows, self.dtype, self.k
            )));
        }
        let quants = &p.words[..p.rows * words];
        gpu.queue.write_buffer(&self.raw, (first * words * 4) as u64, bytemuck::cast_slice(quants));
        if halves > 0 {
            let base = p.scale_base as usize;
            let scales = &p.words[base..base + (p.rows * halves).div_ceil(2)];
            let at = (self.scale_base as usize + first * halves / 2) * 4;
            gpu.queue.write_buffer(&self.raw, at as u64, bytemuck::cast_slice(scales));
        }
        Ok(())
    }

    /// `rows` rows of `k` f32 values, in the F32 format.
    pub fn from_f32(gpu: &Gpu, label: &str, values: &[f32], rows: usize, k: usize) -> Result<WeightBuffer> {
        Ok(Self::upload(gpu, label, &pack_f32_rows(values, rows, k, gpu.row_group())?))
    }

    /// `rows` rows of `k` elements stored as `dtype` (the file's bytes), kept in that format.
    pub fn from_blocks(
        gpu: &Gpu,
        label: &str,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        k: usize,
    ) -> Result<WeightBuffer> {
        Ok(Self::upload(gpu, label, &pack_rows(dtype, bytes, rows, k, gpu.row_group())?))
    }

    /// Bytes of GPU memory this buffer takes.
    pub fn bytes(&self) -> u64 {
        self.raw.size()
    }

    /// Units of 32 weights per row.
    pub fn units(&self) -> usize {
        units(self.k)
    }
}
