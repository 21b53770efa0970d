//! Weights on the GPU. A [`Matrix`] hides its storage type and its split into row chunks (for
//! tensors larger than the adapter's max storage binding) behind one matmul entry point, so the
//! forward pass never branches on dtype. [`Upload`] streams matrices from the checkpoint's files
//! a batch of rows at a time, so a load holds a batch in memory, never a tensor or a file.

use super::checkpoint::{Checkpoint, Precision};
use super::config::Config;
use super::transformer::LoadOptions;
use crate::error::{Error, Result};
use crate::gpu::{pack_f32_rows, pack_rows, Gpu, GpuBuffer, MatmulOut, Op, PackedRows, WeightBuffer};
use crate::loader::quant;
use crate::loader::DType;

/// Weight buffers and their write batches start at multiples of this many rows (see `stream`).
const ROW_RUN: usize = 8;
// (whole runs of the rows a CPU adapter interleaves, and of a matmul invocation's 4 columns)
const _: () = assert!(ROW_RUN.is_multiple_of(crate::gpu::row_group(1) as usize) && ROW_RUN.is_multiple_of(4));

/// Rows `[row_start, row_start + rows)` of a matrix in one buffer.
struct Chunk {
    row_start: usize,
    data: WeightBuffer, // [rows, cols] in the matrix's weight format
}

/// A `[rows, cols]` weight matrix on the GPU (rows = output features), split into row chunks.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    chunks: Vec<Chunk>,
}

/// How a matrix is streamed from the checkpoint to the GPU.
pub struct Upload<'a> {
    pub gpu: &'a Gpu,
    pub ckpt: &'a Checkpoint,
    pub precision: Precision,
    /// Largest buffer one chunk of a matrix may take (at most the adapter's max storage binding).
    pub max_bytes: u64,
    /// Largest read from a file at once (rows are read, packed and written in batches of about
    /// this many bytes: the host memory a load needs, whatever the model's size).
    pub read_bytes: u64,
    /// Matrices' buffers allocated, nothing read into them ([`LoadOptions::skip_weight_data`](crate::model::LoadOptions)).
    pub skip_data: bool,
    /// Progress, counted per batch (bytes) and per matrix (tensors).
    pub tally: std::cell::RefCell<Tally<'a>>,
}

/// One tensor feeding a matrix, and the format its rows are kept in on the GPU.
struct Part<'a> {
    spec: &'a TensorSpec,
    dtype: DType,
    format: DType,
}

impl<'a> Upload<'a> {
    /// An upload from `ckpt` to `gpu` as `opts` asks (precision, the largest buffer and read,
    /// whether weight data is read at all), counting its progress in `tally`.
    pub fn new(gpu: &'a Gpu, ckpt: &'a Checkpoint, opts: &LoadOptions, tally: Tally<'a>) -> Upload<'a> {
        Upload {
            gpu,
            ckpt,
            precision: opts.precision,
            max_bytes: opts.max_chunk_bytes.unwrap_or(u64::MAX).min(gpu.max_binding_bytes()),
            read_bytes: opts.read_bytes,
            skip_data: opts.skip_weight_data,
            tally: std::cell::RefCell::new(tally),
        }
    }
}

impl Upload<'_> {
    fn part<'s>(&self, spec: &'s TensorSpec) -> Result<Part<'s>> {
        let dtype = self.ckpt.dtype(&spec.name, &spec.shape)?;
        let keep = self.precision == Precision::Auto && dtype != DType::F32;
        Ok(Part { spec, dtype, format: if keep { dtype } else { DType::F32 } })
    }

    /// A vector (norm, bias) of the checkpoint, as f32, once its bytes can be read (a norm's
    /// weight as the forward multiplies by it: [`Checkpoint::norm_offset`] added).
    pub async fn vector(&self, t: &TensorSpec) -> Result<Vec<f32>> {
        let ckpt = self.ckpt;
        ckpt.rows_ready(&t.name, &t.shape, 0..t.shape.first().copied().unwrap_or(0)).await?;
        let mut values = ckpt.tensor(&t.name, &t.shape, Precision::Auto)?.to_f32()?;
        if t.role == TensorRole::Norm {
            let offset = ckpt.norm_offset();
            values.iter_mut().for_each(|v| *v += offset);
        }
        self.tally.borrow_mut().add(1, ckpt.stored_bytes(&t.name).unwrap_or(0));
        Ok(values)
    }

    /// The matrix `spec` (`[rows, cols]`), as stored.
    pub async fn matrix(&self, spec: &TensorSpec) -> Result<Matrix> {
        let rows = spec.shape.first().copied().unwrap_or(0);
        self.stream(&spec.name, vec![self.part(spec)?], &(0..rows).map(|r| (0, r)).collect::<Vec<_>>()).await
    }

    /// `gate` and `up` (both `[f, cols]`) as one `[2 f, cols]` matrix whose rows interleave them
    /// (g0, u0, g1, u1, ...): its matmul with `glu` writes silu(gate) * up. Two stored types
    /// that differ are both kept as F32 (exact values, more memory).
    pub async fn gate_up(&self, gate: &TensorSpec, up: &TensorSpec) -> Result<Matrix> {
        let (mut g, mut u) = (self.part(gate)?, self.part(up)?);
        if g.format != u.format {
            (g.format, u.format) = (DType::F32, DType::F32);
        }
        let f = gate.shape.first().copied().unwrap_or(0);
        let rows: Vec<(usize, usize)> = (0..f).flat_map(|r| [(0, r), (1, r)]).collect();
        self.stream(&format!("{} | {}", gate.name, up.name), vec![g, u], &rows).await
    }

    /// `parts` (each `[rows_i, cols]`, with an optional row order: entry j names the part's row
    /// that becomes its row j) stacked into one `[sum rows_i, cols]` matrix. Adjacent parts of
    /// one stored type share buffers; a part of another type starts new ones (its matmul is then
    /// one more dispatch, never a conversion).
    pub async fn stacked(&self, parts: &[(&TensorSpec, Option<&[usize]>)]) -> Result<Matrix> {
        let mut rows = Vec::new();
        let mut kept = Vec::with_capacity(parts.len());
        for (p, (spec, order)) in parts.iter().enumerate() {
            let n = spec.shape.first().copied().unwrap_or(0);
            match order {
                Some(order) if order.len() != n || order.iter().any(|&r| r >= n) => {
                    return Err(Error::InvalidArgument(format!(
                        "{}: a row order of {} rows for {:?}",
                        spec.name,
                        order.len(),
                        spec.shape
                    )))
                }
                Some(order) => rows.extend(order.iter().map(|&r| (p, r))),
                None => rows.extend((0..n).map(|r| (p, r))),
            }
            kept.push(self.part(spec)?);
        }
        let name = parts.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>().join(" | ");
        self.stream(&name, kept, &rows).await
    }

    /// Streams a matrix whose row j is row `rows[j].1` of `parts[rows[j].0]`: consecutive rows
    /// of one format share buffers (each at most `max_bytes`), and each buffer is filled in
    /// batches of about `read_bytes`: read from the file, packed, written.
    async fn stream(&self, name: &str, parts: Vec<Part<'_>>, rows: &[(usize, usize)]) -> Result<Matrix> {
        let gpu = self.gpu;
        let mut cols = None;
        for p in &parts {
            let [_, c] = p.spec.shape[..] else {
                return Err(Error::InvalidArgument(format!(
                    "{} is not a matrix: {:?}",
                    p.spec.name, p.spec.shape
                )));
            };
            if *cols.get_or_insert(c) != c {
                return Err(Error::InvalidArgument(format!("{} has {c} columns, not {cols:?}", p.spec.name)));
            }
        }
        let cols = cols.unwrap_or(0);
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < rows.len() {
            // A run of rows in one format.
            let format = parts[rows[start].0].format;
            let run = rows[start..].iter().take_while(|(p, _)| parts[*p].format == format).count();
            let row_bytes = format.gpu_row_bytes(cols);
            // 16 bytes of slack: a buffer rounds its scale section and its size up.
            let by_bytes =
                (self.max_bytes.min(gpu.max_binding_bytes()).saturating_sub(16) / row_bytes.max(1)) as usize;
            // Each matmul workgroup takes a few rows; the grid has at most 65535 column tiles along y.
            let by_groups =
                gpu.limits.max_compute_workgroups_per_dimension as usize * gpu.matmul_columns_per_group();
            // Chunks start at multiples of 8 rows: of 4, the columns of one matmul invocation (so
            // the (gate, up) pairs of an interleaved matrix stay together), and of the runs of
            // rows a CPU adapter's weight buffers interleave (Gpu::row_group, 1 or 8).
            let per_buffer = by_bytes.min(by_groups) / ROW_RUN * ROW_RUN;
            if per_buffer == 0 {
                return Err(Error::GpuLimit(format!(
                    "{name}: {ROW_RUN} rows of {row_bytes} bytes exceed the largest weight buffer of {} bytes",
                    self.max_bytes
                )));
            }
            // Rows per batch: what `read_bytes` holds of the file's rows and of their packed form.
            let widest = parts.iter().map(|p| p.dtype.bytes_for(cols as u64).unwrap_or(0)).max().unwrap_or(0);
            let per_batch =
                ((self.read_bytes / widest.max(row_bytes).max(1)) as usize / ROW_RUN * ROW_RUN).max(ROW_RUN);
            let mut first = start;
            while first < start + run {
                let n = per_buffer.min(start + run - first);
                let label = format!("{name} rows {}..{}", first - start, first - start + n);
                let buffer = WeightBuffer::empty(gpu, &label, format, n, cols);
                // the file's bytes of some of the matrix's rows
                let stored = |batch: &[(usize, usize)]| -> u64 {
                    batch.iter().map(|&(p, _)| parts[p].dtype.bytes_for(cols as u64).unwrap_or(0)).sum()
                };
                if self.skip_data {
                    // (counted as read: the progress still ends at the model's bytes)
                    self.tally.borrow_mut().add(0, stored(&rows[first..first + n]));
                }
                let mut r = if self.skip_data { n } else { 0 };
                while r < n {
                    let m = per_batch.min(n - r);
                    let batch = &rows[first + r..first + r + m];
                    let packed = self.batch(&parts, batch, format, cols).await?;
                    let read = stored(batch);
                    buffer
                        .write_rows(gpu, r, &packed)
                        .map_err(|e| Error::InvalidArgument(format!("{name}: {e}")))?;
                    // Natively, written data waits in staging memory until a submission: flush
                    // each batch, so the host holds one batch, not a matrix.
                    gpu.queue.submit(std::iter::empty());
                    self.tally.borrow_mut().add(0, read);
                    r += m;
                }
                chunks.push(Chunk { row_start: first, data: buffer });
                first += n;
            }
            start += run;
        }
        self.tally.borrow_mut().add(parts.len(), 0);
        Ok(Matrix { rows: rows.len(), cols, chunks })
    }

    /// Reads `batch`'s rows from the file (one read per part: the span of its rows there) and
    /// packs them in `format`.
    async fn batch(
        &self,
        parts: &[Part<'_>],
        batch: &[(usize, usize)],
        format: DType,
        cols: usize,
    ) -> Result<PackedRows> {
        let mut spans = Vec::with_capacity(parts.len());
        for (p, part) in parts.iter().enumerate() {
            let mut of_part = batch.iter().filter(|(q, _)| *q == p).map(|(_, r)| *r);
            let span = match of_part.next() {
                Some(r0) => {
                    let (lo, hi) = of_part.fold((r0, r0), |(lo, hi), r| (lo.min(r), hi.max(r)));
                    let (name, shape) = (&part.spec.name, &part.spec.shape);
                    self.ckpt.rows_ready(name, shape, lo..hi + 1).await?;
                    let bytes = self.ckpt.read_rows(name, shape, lo..hi + 1)?;
                    Some((lo, bytes))
                }
                None => None,
            };
            spans.push(span);
        }
        let row_of = |p: usize, r: usize| -> Result<&[u8]> {
            let row = parts[p].dtype.bytes_for(cols as u64).unwrap_or(0) as usize;
            let (lo, bytes) = spans[p].as_ref().ok_or_else(|| Error::InvalidArgument("no span".into()))?;
            bytes.get((r - lo) * row..(r - lo + 1) * row).ok_or_else(|| {
                Error::InvalidArgument(format!("{}: fewer bytes than its shape needs", parts[p].spec.name))
            })
        };
        let packed = if format == DType::F32 {
            let mut values = Vec::with_capacity(batch.len() * cols);
            for &(p, r) in batch {
                values.extend(quant::dequantize(parts[p].dtype, row_of(p, r)?, cols)?);
            }
            pack_f32_rows(&values, batch.len(), cols, self.gpu.row_group())
        } else if let Some(bytes) = in_order(batch, &spans) {
            // rows of one part in file order (a plain matrix): packed straight from the read
            pack_rows(format, bytes, batch.len(), cols, self.gpu.row_group())
        } else {
            let mut bytes = Vec::new();
            for &(p, r) in batch {
                bytes.extend_from_slice(row_of(p, r)?);
            }
            pack_rows(format, &bytes, batch.len(), cols, self.gpu.row_group())
        };
        packed.map_err(|e| Error::InvalidArgument(format!("{}: {e}", parts[0].spec.name)))
    }
}

/// The bytes read for `batch` when its rows are consecutive rows of one part, in order (then the
/// read is the batch, with no copy to assemble it).
fn in_order<'a>(batch: &[(usize, usize)], spans: &'a [Option<(usize, Vec<u8>)>]) -> Option<&'a [u8]> {
    let &(p, r0) = batch.first()?;
    let consecutive = batch.iter().enumerate().all(|(i, &(q, r))| q == p && r == r0 + i);
    let (lo, bytes) = spans.get(p)?.as_ref()?;
    (consecutive && *lo == r0).then_some(bytes.as_slice())
}

impl Matrix {
    /// Ops computing `y[r, :rows] (+)= x[r, :cols] . self^T (+ bias)` for each row r of the pass
    /// (with `out.glu`, `y[r, :rows / 2]` = silu(gate) * up of an interleaved gate|up matrix);
    /// `bias: [rows]`; `out.col_offset` is ignored (each chunk writes its own columns).
    pub fn matmul(
        &self,
        gpu: &Gpu,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        bias: Option<&GpuBuffer<f32>>,
        y: &GpuBuffer<f32>,
        out: MatmulOut,
    ) -> Vec<Op> {
        self.matmul_first(gpu, step, (x, bias, y), out, self.rows)
    }

    /// [`Matrix::matmul`]'s first `first` output columns alone (`y[r, :first]`; its row stride
    /// `out.ldy`), each with the bits the whole matmul gives it: the weight rows after them are
    /// not read (a draft head ranking the first ids of a vocabulary).
    pub fn matmul_first(
        &self,
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (x, bias, y): (&GpuBuffer<f32>, Option<&GpuBuffer<f32>>, &GpuBuffer<f32>),
        out: MatmulOut,
        first: usize,
    ) -> Vec<Op> {
        // each chunk's matmul sized by the rows of its run of one stored type (the buffers a
        // size limit split it into, together: its bits do not depend on that limit)
        let run_rows = |i: usize| {
            let dtype = self.chunks[i].data.dtype;
            let same = |c: &&Chunk| c.data.dtype == dtype;
            let before = self.chunks[..i].iter().rev().take_while(same).map(|c| c.data.rows).sum::<usize>();
            let after = self.chunks[i..].iter().take_while(same).map(|c| c.data.rows).sum::<usize>();
            before + after
        };
        (self.chunks.iter().enumerate())
            .filter(|(_, c)| c.row_start < first)
            .map(|(i, c)| {
                let out = MatmulOut {
                    col_offset: c.row_start as u32,
                    matrix_rows: run_rows(i) as u32,
                    stored: (first - c.row_start).min(c.data.rows) as u32,
                    ..out
                };
                gpu.matmul(step, x, &c.data, bias, y, out)
            })
            .collect()
    }

    /// Ops gathering `x[r, :] = self[tokens[r], :] * scale` (the matrix used as an embedding table), and
    /// with `scaled = Some((gamma, out))` also `out[r, :] = x[r, :] * gamma`.
    pub fn embed(
        &self,
        gpu: &Gpu,
        step: &wgpu::Buffer,
        tokens: &GpuBuffer<u32>,
        (x, scale): (&GpuBuffer<f32>, f32),
        scaled: Option<(&GpuBuffer<f32>, &GpuBuffer<f32>)>,
    ) -> Vec<Op> {
        self.chunks
            .iter()
            .map(|c| gpu.embed(step, tokens, &c.data, x, (c.row_start, scale), scaled))
            .collect()
    }

    /// How many buffers hold this matrix.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes of GPU memory the matrix takes.
    pub fn gpu_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.data.bytes()).sum()
    }
}

/// The rows of `v` (`order.len()` rows of equal length) in `order`: entry j names the row that
/// becomes row j. None when `v` does not split into those rows or an entry is out of range.
fn reorder_rows<T: Copy>(v: &[T], order: &[usize]) -> Option<Vec<T>> {
    let rows = order.len();
    let row = v.len() / rows.max(1);
    let fits = v.len() == row * rows && order.iter().all(|&r| r < rows);
    fits.then(|| order.iter().flat_map(|&r| &v[r * row..(r + 1) * row]).copied().collect())
}

/// One transformer block's weights (GGUF names `blk.{i}.*`).
pub struct Layer {
    /// `[dim]`; None: the block's input is not normed (an EAGLE head's first layer).
    pub attn_norm: Option<GpuBuffer<f32>>,
    /// `[q_dim + 2 kv_dim, dim]`: the rows of Wq, Wk, Wv stacked, the q and k rows in the order
    /// [`crate::gpu::RopeLayout::pair_rows`] gives (the pairs RoPE rotates together adjacent).
    pub qkv: Matrix,
    pub qkv_bias: Option<GpuBuffer<f32>>, // [q_dim + 2 kv_dim] (qwen2), in the rows' order
    /// `[head_dim]` each: q's and k's per-head norm weights (qwen3, gemma3), in the checkpoint's order.
    pub qk_norm: Option<[GpuBuffer<f32>; 2]>,
    /// `[dim]` each: the norms after attention and after the feed-forward (gemma3).
    pub post_norms: Option<[GpuBuffer<f32>; 2]>,
    pub wo: Matrix,               // [dim, q_dim]
    pub ffn_norm: GpuBuffer<f32>, // [dim]
    pub gate_up: Matrix,          // [2 ffn_dim, dim]: rows of gate and up interleaved
    pub down: Matrix,             // [dim, ffn_dim]
}

impl Layer {
    /// Streams block `i`'s tensors `l` of a model of config `c`. With `norm_optional`, a missing
    /// input norm (`l.attn_norm`) leaves the block without one (an EAGLE head's first layer);
    /// otherwise it is an error like any missing tensor.
    pub async fn load(
        up: &Upload<'_>,
        c: &Config,
        l: &LayerTensors,
        i: usize,
        norm_optional: bool,
    ) -> Result<Layer> {
        let gpu = up.gpu;
        let attn_norm = match norm_optional && !up.ckpt.has(&l.attn_norm.name) {
            true => None,
            false => {
                Some(GpuBuffer::<f32>::from_slice(gpu, &l.attn_norm.name, &up.vector(&l.attn_norm).await?))
            }
        };
        // q and k rows reordered so that RoPE's pairs are adjacent (the matmul rotates them)
        let q_rows = c.rope_layout.pair_rows(c.n_heads, c.head_dim, c.rope_dim);
        let k_rows = c.rope_layout.pair_rows(c.n_kv_heads, c.head_dim, c.rope_dim);
        let qkv_bias = match &l.qkv_bias {
            Some([bq, bk, bv]) => {
                let rows = |t: &TensorSpec, v: Vec<f32>, order: &[usize]| -> Result<Vec<f32>> {
                    reorder_rows(&v, order).ok_or_else(|| {
                        Error::InvalidArgument(format!("{}: {:?} is not a q or k bias", t.name, t.shape))
                    })
                };
                let (q, k) =
                    (rows(bq, up.vector(bq).await?, &q_rows)?, rows(bk, up.vector(bk).await?, &k_rows)?);
                let b = [q, k, up.vector(bv).await?].concat();
                Some(GpuBuffer::<f32>::from_slice(gpu, &format!("blk.{i}.attn_qkv.bias"), &b))
            }
            None => None,
        };
        let qk_norm = match &l.qk_norm {
            Some([q, k]) => {
                let norm = |t: &TensorSpec, v: Vec<f32>| GpuBuffer::<f32>::from_slice(gpu, &t.name, &v);
                Some([norm(q, up.vector(q).await?), norm(k, up.vector(k).await?)])
            }
            None => None,
        };
        let post_norms = match &l.post_norms {
            Some([a, f]) => {
                let norm = |t: &TensorSpec, v: Vec<f32>| GpuBuffer::<f32>::from_slice(gpu, &t.name, &v);
                Some([norm(a, up.vector(a).await?), norm(f, up.vector(f).await?)])
            }
            None => None,
        };
        let qkv = up.stacked(&[(&l.q, Some(&q_rows)), (&l.k, Some(&k_rows)), (&l.v, None)]).await?;
        let wo = up.matrix(&l.wo).await?;
        let ffn_norm = GpuBuffer::<f32>::from_slice(gpu, &l.ffn_norm.name, &up.vector(&l.ffn_norm).await?);
        let gate_up = up.gate_up(&l.gate, &l.up).await?;
        let down = up.matrix(&l.down).await?;
        Ok(Layer { attn_norm, qkv, qkv_bias, qk_norm, post_norms, wo, ffn_norm, gate_up, down })
    }
}

/// All weights of a model on the GPU.
pub struct Weights {
    pub token_embd: Matrix, // [vocab, dim]
    pub layers: Vec<Layer>,
    pub output_norm: GpuBuffer<f32>, // [dim]
    /// `[vocab, dim]`; None when tied to `token_embd`.
    pub output: Option<Matrix>,
}

/// Loading progress: tensors uploaded so far out of the total, and the bytes of the files'
/// weights uploaded so far (counted a batch of rows at a time) out of theirs.
#[derive(Clone, Copy, Debug)]
pub struct LoadProgress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What a load has uploaded so far, reported as it grows.
pub struct Tally<'a> {
    now: LoadProgress,
    report: &'a mut dyn FnMut(LoadProgress),
}

impl<'a> Tally<'a> {
    pub fn new(tensors_total: usize, bytes_total: u64, report: &'a mut dyn FnMut(LoadProgress)) -> Tally<'a> {
        Tally { now: LoadProgress { tensors_done: 0, tensors_total, bytes_done: 0, bytes_total }, report }
    }

    /// Counts `tensors` more tensors done and `bytes` more of their file bytes uploaded.
    fn add(&mut self, tensors: usize, bytes: u64) {
        self.now.tensors_done += tensors;
        self.now.bytes_done += bytes;
        (self.report)(self.now);
    }
}

/// What a tensor is to the model (writers of random-weight models pick its values by this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// The token embedding table `[vocab, dim]`.
    Embedding,
    /// An RMSNorm weight `[dim]`.
    Norm,
    /// A q, k or v projection `[q_dim or kv_dim, dim]`.
    QkvWeight,
    /// A q, k or v bias (qwen2).
    QkvBias,
    /// The attention output or a feed-forward projection.
    Weight,
    /// The untied output projection `[vocab, dim]`.
    Output,
}

/// One tensor a model needs: its GGUF name, its shape (outermost first) and its role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

/// One transformer block's tensors.
#[derive(Clone, Debug)]
pub struct LayerTensors {
    pub attn_norm: TensorSpec,
    pub q: TensorSpec,
    pub k: TensorSpec,
    pub v: TensorSpec,
    /// q, k and v biases (qwen2), in that order.
    pub qkv_bias: Option<[TensorSpec; 3]>,
    /// q's and k's per-head norm weights `[head_dim]` (qwen3, gemma3), in that order.
    pub qk_norm: Option<[TensorSpec; 2]>,
    /// The norms after attention and after the feed-forward `[dim]` (gemma3), in that order.
    pub post_norms: Option<[TensorSpec; 2]>,
    pub wo: TensorSpec,
    pub ffn_norm: TensorSpec,
    pub gate: TensorSpec,
    pub up: TensorSpec,
    pub down: TensorSpec,
}

/// Every tensor a config needs: the one table the loader, the uploader, the checks and the
/// writers of random-weight models (synthetic benchmarks, the tests' tiny models) read.
#[derive(Clone, Debug)]
pub struct TensorTable {
    pub token_embd: TensorSpec,
    pub layers: Vec<LayerTensors>,
    pub output_norm: TensorSpec,
    /// None when the output projection is tied to the token embedding.
    pub output: Option<TensorSpec>,
}

impl TensorTable {
    pub fn new(c: &Config) -> TensorTable {
        let t = |name: String, shape: Vec<usize>, role| TensorSpec { name, shape, role };
        let layers = (0..c.n_layers)
            .map(|i| {
                let b = |s: &str| format!("blk.{i}.{s}");
                let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
                LayerTensors {
                    attn_norm: t(b("attn_norm.weight"), vec![d], TensorRole::Norm),
                    q: t(b("attn_q.weight"), vec![q, d], TensorRole::QkvWeight),
                    k: t(b("attn_k.weight"), vec![kv, d], TensorRole::QkvWeight),
                    v: t(b("attn_v.weight"), vec![kv, d], TensorRole::QkvWeight),
                    qkv_bias: c.arch.qkv_bias().then(|| {
                        [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)]
                            .map(|(name, len)| t(b(name), vec![len], TensorRole::QkvBias))
                    }),
                    qk_norm: c.arch.qk_norm().then(|| {
                        ["attn_q_norm.weight", "attn_k_norm.weight"]
                            .map(|name| t(b(name), vec![c.head_dim], TensorRole::Norm))
                    }),
                    post_norms: c.arch.gemma().then(|| {
                        ["post_attention_norm.weight", "post_ffw_norm.weight"]
                            .map(|name| t(b(name), vec![d], TensorRole::Norm))
                    }),
                    wo: t(b("attn_output.weight"), vec![d, q], TensorRole::Weight),
                    ffn_norm: t(b("ffn_norm.weight"), vec![d], TensorRole::Norm),
                    gate: t(b("ffn_gate.weight"), vec![f, d], TensorRole::Weight),
                    up: t(b("ffn_up.weight"), vec![f, d], TensorRole::Weight),
                    down: t(b("ffn_down.weight"), vec![d, f], TensorRole::Weight),
                }
            })
            .collect();
        TensorTable {
            token_embd: t("token_embd.weight".into(), vec![c.vocab_size, c.dim], TensorRole::Embedding),
            layers,
            output_norm: t("output_norm.weight".into(), vec![c.dim], TensorRole::Norm),
            output: (!c.tied_embeddings)
                .then(|| t("output.weight".into(), vec![c.vocab_size, c.dim], TensorRole::Output)),
        }
    }

    /// Every tensor, in upload (and file) order.
    pub fn iter(&self) -> impl Iterator<Item = &TensorSpec> {
        let layers = self.layers.iter().flat_map(|l| {
            [&l.attn_norm, &l.q, &l.k, &l.v]
                .into_iter()
                .chain(l.qkv_bias.iter().flatten())
                .chain(l.qk_norm.iter().flatten())
                .chain(l.post_norms.iter().flatten())
                .chain([&l.wo, &l.ffn_norm, &l.gate, &l.up, &l.down])
        });
        std::iter::once(&self.token_embd).chain(layers).chain([&self.output_norm]).chain(&self.output)
    }

    /// Weights (parameters) over all tensors.
    pub fn parameters(&self) -> usize {
        self.iter().map(|t| t.shape.iter().product::<usize>()).sum()
    }
}

impl Weights {
    /// The output projection's matrix: its own, or the tied embedding table.
    pub fn output_matrix(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bytes of GPU memory every weight takes.
    pub fn gpu_bytes(&self) -> u64 {
        let v = |b: &GpuBuffer<f32>| b.raw.size();
        let ov = |b: &Option<GpuBuffer<f32>>| b.as_ref().map_or(0, v);
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                [&l.qkv, &l.wo, &l.gate_up, &l.down].iter().map(|m| m.gpu_bytes()).sum::<u64>()
                    + ov(&l.attn_norm)
                    + v(&l.ffn_norm)
                    + ov(&l.qkv_bias)
            })
            .sum();
        self.token_embd.gpu_bytes()
            + layers
            + v(&self.output_norm)
            + self.output.as_ref().map_or(0, |m| m.gpu_bytes())
    }

    /// Streams every tensor of `ckpt` to the GPU, a batch of rows at a time (about
    /// `opts.read_bytes` of the file in host memory at once, never a whole tensor), splitting
    /// matrices into buffers of at most `opts.max_chunk_bytes` (and the adapter's largest
    /// binding); waits for each batch's bytes where a file is still arriving.
    pub async fn load(
        gpu: &Gpu,
        ckpt: &Checkpoint,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Weights> {
        let c = &ckpt.config;
        let table = TensorTable::new(c);
        let bytes = table.iter().filter_map(|t| ckpt.stored_bytes(&t.name)).sum();
        let up = Upload::new(gpu, ckpt, opts, Tally::new(table.iter().count(), bytes, progress));
        let vector = |t| up.vector(t);
        let token_embd = up.matrix(&table.token_embd).await?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for (i, l) in table.layers.iter().enumerate() {
            layers.push(Layer::load(&up, c, l, i, false).await?);
        }
        let output_norm =
            GpuBuffer::<f32>::from_slice(gpu, &table.output_norm.name, &vector(&table.output_norm).await?);
        let output = match &table.output {
            Some(t) => Some(up.matrix(t).await?),
            None => None,
        };
        Ok(Weights { token_embd, layers, output_norm, output })
    }
}
