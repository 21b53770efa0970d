//! Weights on the GPU. A [`Matrix`] hides its storage type and its split into row chunks (for
//! tensors larger than the adapter's max storage binding) behind one matmul entry point, so the
//! forward pass never branches on dtype.

use super::checkpoint::{Checkpoint, HostData, HostTensor, Precision};
use super::config::Config;
use crate::error::{Error, Result};
use crate::gpu::{pack_f32_rows, pack_rows, Gpu, GpuBuffer, MatmulOut, Op, WeightBuffer};
use crate::loader::DType;

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

impl Matrix {
    /// Uploads `t` (shape `[rows, cols]`) in the format it is held in (its stored blocks, or F32),
    /// splitting it so that no chunk exceeds `max_bytes` (at most the adapter's max storage binding).
    pub fn upload(gpu: &Gpu, max_bytes: u64, t: &HostTensor) -> Result<Matrix> {
        let [rows, cols] = t.shape[..] else {
            return Err(Error::InvalidArgument(format!("{} is not a matrix: {:?}", t.name, t.shape)));
        };
        let dtype = match &t.data {
            HostData::F32(_) => DType::F32,
            HostData::Stored { dtype, .. } => *dtype,
        };
        let row_bytes = dtype.gpu_row_bytes(cols);
        let max_bytes = max_bytes.min(gpu.max_binding_bytes());
        // 16 bytes of slack: a buffer rounds its scale section and its size up.
        let by_bytes = (max_bytes.saturating_sub(16) / row_bytes.max(1)) as usize;
        // Each matmul workgroup takes a few rows; the grid has at most 65535 column tiles along y.
        let by_groups =
            gpu.limits.max_compute_workgroups_per_dimension as usize * gpu.matmul_columns_per_group();
        // Chunks start at multiples of 4 rows, the columns of one matmul invocation (so the
        // (gate, up) pairs of an interleaved matrix stay together).
        let rows_per_chunk = by_bytes.min(by_groups) / 4 * 4;
        if rows_per_chunk == 0 {
            return Err(Error::GpuLimit(format!(
                "{}: four rows of {row_bytes} bytes exceed the largest weight buffer of {max_bytes} bytes",
                t.name
            )));
        }
        let elem_bytes = |n: usize| dtype.bytes_for(n as u64).unwrap_or(0) as usize;
        let mut chunks = Vec::new();
        let mut row_start = 0;
        while row_start < rows {
            let n = rows_per_chunk.min(rows - row_start);
            let label = format!("{} rows {row_start}..{}", t.name, row_start + n);
            let packed = match &t.data {
                HostData::F32(v) => pack_f32_rows(&v[row_start * cols..(row_start + n) * cols], n, cols),
                HostData::Stored { bytes, .. } => {
                    let range = elem_bytes(row_start * cols)..elem_bytes((row_start + n) * cols);
                    let part = bytes.get(range).ok_or_else(|| {
                        Error::InvalidArgument(format!("{}: fewer bytes than its shape needs", t.name))
                    })?;
                    pack_rows(dtype, part, n, cols)
                }
            }
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", t.name)))?;
            chunks.push(Chunk { row_start, data: WeightBuffer::upload(gpu, &label, &packed) });
            row_start += n;
        }
        Ok(Matrix { rows, cols, chunks })
    }

    /// Uploads `gate` and `up` (both `[f, cols]`) as one `[2 f, cols]` matrix whose rows
    /// interleave them (g0, u0, g1, u1, ...): its matmul with `glu` writes silu(gate) * up.
    pub fn upload_gate_up(gpu: &Gpu, max_bytes: u64, gate: &HostTensor, up: &HostTensor) -> Result<Matrix> {
        let (Some(&f), Some(&cols)) = (gate.shape.first(), gate.shape.get(1)) else {
            return Err(Error::InvalidArgument(format!("{} is not a matrix: {:?}", gate.name, gate.shape)));
        };
        if up.shape != gate.shape {
            return Err(Error::TensorShape {
                name: up.name.clone(),
                expected: gate.shape.clone(),
                found: up.shape.clone(),
            });
        }
        let data = match (&gate.data, &up.data) {
            (HostData::F32(g), HostData::F32(u)) => HostData::F32(interleave_rows(g, u, cols)),
            (HostData::Stored { dtype, bytes: g }, HostData::Stored { dtype: du, bytes: u })
                if dtype == du =>
            {
                let row = dtype.bytes_for(cols as u64).unwrap_or(0) as usize;
                if row == 0 || g.len() != row * f || u.len() != row * f {
                    return Err(Error::InvalidArgument(format!(
                        "{}: bytes do not match its shape",
                        gate.name
                    )));
                }
                HostData::Stored { dtype: *dtype, bytes: interleave_rows(g, u, row) }
            }
            // different stored types: both as f32 (exact values, more memory)
            _ => HostData::F32(interleave_rows(&gate.to_f32()?, &up.to_f32()?, cols)),
        };
        let name = format!("{} | {}", gate.name, up.name);
        Matrix::upload(gpu, max_bytes, &HostTensor { name, shape: vec![2 * f, cols], data })
    }

    /// Uploads `parts` (each `[rows_i, cols]`, with an optional row order: entry j names the
    /// part's row that becomes its row j) stacked into one `[sum rows_i, cols]` matrix. Adjacent
    /// parts of one stored type share buffers; a part of another type starts new ones (its
    /// matmul is then one more dispatch, never a conversion).
    pub fn upload_stacked(
        gpu: &Gpu,
        max_bytes: u64,
        parts: Vec<(HostTensor, Option<Vec<usize>>)>,
    ) -> Result<Matrix> {
        let mut groups: Vec<(HostTensor, usize)> = Vec::new(); // (stacked parts, their first row)
        let mut cols = None;
        let mut rows = 0;
        for (mut t, order) in parts {
            let [r, c] = t.shape[..] else {
                return Err(Error::InvalidArgument(format!("{} is not a matrix: {:?}", t.name, t.shape)));
            };
            if *cols.get_or_insert(c) != c {
                return Err(Error::InvalidArgument(format!("{} has {c} columns, not {cols:?}", t.name)));
            }
            if let Some(order) = order {
                t.data = reorder(&t, &order)?;
            }
            match groups.last_mut() {
                Some((g, _)) if same_storage(&g.data, &t.data) => {
                    match (&mut g.data, t.data) {
                        (HostData::F32(a), HostData::F32(b)) => a.extend(b),
                        (HostData::Stored { bytes: a, .. }, HostData::Stored { bytes: b, .. }) => a.extend(b),
                        _ => {}
                    }
                    g.shape[0] += r;
                    g.name = format!("{} | {}", g.name, t.name);
                }
                _ => groups.push((t, rows)),
            }
            rows += r;
        }
        let mut chunks = Vec::new();
        for (t, first) in &groups {
            let m = Matrix::upload(gpu, max_bytes, t)?;
            chunks.extend(m.chunks.into_iter().map(|c| Chunk { row_start: first + c.row_start, ..c }));
        }
        Ok(Matrix { rows, cols: cols.unwrap_or(0), chunks })
    }

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
        self.chunks
            .iter()
            .map(|c| {
                let out = MatmulOut { col_offset: c.row_start as u32, ..out };
                gpu.matmul(step, x, &c.data, bias, y, out)
            })
            .collect()
    }

    /// Ops gathering `x[r, :] = self[tokens[r], :]` (the matrix used as an embedding table), and
    /// with `scaled = Some((gamma, out))` also `out[r, :] = x[r, :] * gamma`.
    pub fn embed(
        &self,
        gpu: &Gpu,
        step: &wgpu::Buffer,
        tokens: &GpuBuffer<u32>,
        x: &GpuBuffer<f32>,
        scaled: Option<(&GpuBuffer<f32>, &GpuBuffer<f32>)>,
    ) -> Vec<Op> {
        self.chunks.iter().map(|c| gpu.embed(step, tokens, &c.data, x, c.row_start, scaled)).collect()
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

/// Whether two host tensors hold their values in the same form (F32, or the same stored type).
fn same_storage(a: &HostData, b: &HostData) -> bool {
    match (a, b) {
        (HostData::F32(_), HostData::F32(_)) => true,
        (HostData::Stored { dtype: x, .. }, HostData::Stored { dtype: y, .. }) => x == y,
        _ => false,
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

/// The rows of a matrix (or the values of a vector) in `order`, as [`reorder_rows`].
fn reorder(t: &HostTensor, order: &[usize]) -> Result<HostData> {
    let data = match &t.data {
        _ if t.shape.first() != Some(&order.len()) => None,
        HostData::F32(v) => reorder_rows(v, order).map(HostData::F32),
        HostData::Stored { dtype, bytes } => {
            reorder_rows(bytes, order).map(|bytes| HostData::Stored { dtype: *dtype, bytes })
        }
    };
    data.ok_or_else(|| {
        Error::InvalidArgument(format!("{}: a row order of {} rows for {:?}", t.name, order.len(), t.shape))
    })
}

/// Rows of `a` and `b` (each `row` elements) alternated: a0, b0, a1, b1, ...
fn interleave_rows<T: Copy>(a: &[T], b: &[T], row: usize) -> Vec<T> {
    a.chunks_exact(row).zip(b.chunks_exact(row)).flat_map(|(x, y)| x.iter().chain(y)).copied().collect()
}

/// One transformer block's weights (GGUF names `blk.{i}.*`).
pub struct Layer {
    pub attn_norm: GpuBuffer<f32>, // [dim]
    /// `[q_dim + 2 kv_dim, dim]`: the rows of Wq, Wk, Wv stacked, the q and k rows in the order
    /// [`crate::gpu::RopeLayout::pair_rows`] gives (the pairs RoPE rotates together adjacent).
    pub qkv: Matrix,
    pub qkv_bias: Option<GpuBuffer<f32>>, // [q_dim + 2 kv_dim] (qwen2), in the rows' order
    pub wo: Matrix,                       // [dim, q_dim]
    pub ffn_norm: GpuBuffer<f32>,         // [dim]
    pub gate_up: Matrix,                  // [2 ffn_dim, dim]: rows of gate and up interleaved
    pub down: Matrix,                     // [dim, ffn_dim]
}

/// All weights of a model on the GPU.
pub struct Weights {
    pub token_embd: Matrix, // [vocab, dim]
    pub layers: Vec<Layer>,
    pub output_norm: GpuBuffer<f32>, // [dim]
    /// `[vocab, dim]`; None when tied to `token_embd`.
    pub output: Option<Matrix>,
}

/// Loading progress: tensors uploaded so far out of the total.
#[derive(Clone, Copy, Debug)]
pub struct LoadProgress {
    pub tensors_done: usize,
    pub tensors_total: usize,
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
            [&l.attn_norm, &l.q, &l.k, &l.v].into_iter().chain(l.qkv_bias.iter().flatten()).chain([
                &l.wo,
                &l.ffn_norm,
                &l.gate,
                &l.up,
                &l.down,
            ])
        });
        std::iter::once(&self.token_embd).chain(layers).chain([&self.output_norm]).chain(&self.output)
    }

    /// Weights (parameters) over all tensors.
    pub fn parameters(&self) -> usize {
        self.iter().map(|t| t.shape.iter().product::<usize>()).sum()
    }
}

impl Weights {
    /// Bytes of GPU memory every weight takes.
    pub fn gpu_bytes(&self) -> u64 {
        let v = |b: &GpuBuffer<f32>| b.raw.size();
        let ov = |b: &Option<GpuBuffer<f32>>| b.as_ref().map_or(0, v);
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                [&l.qkv, &l.wo, &l.gate_up, &l.down].iter().map(|m| m.gpu_bytes()).sum::<u64>()
                    + v(&l.attn_norm)
                    + v(&l.ffn_norm)
                    + ov(&l.qkv_bias)
            })
            .sum();
        self.token_embd.gpu_bytes()
            + layers
            + v(&self.output_norm)
            + self.output.as_ref().map_or(0, |m| m.gpu_bytes())
    }

    /// Uploads every tensor of `ckpt`, one at a time (never the whole model twice in memory),
    /// splitting matrices into buffers of at most `max_bytes`.
    pub fn load(
        gpu: &Gpu,
        ckpt: &Checkpoint,
        precision: Precision,
        max_bytes: u64,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Weights> {
        let c = &ckpt.config;
        let table = TensorTable::new(c);
        let total = table.iter().count();
        let mut done = 0;
        let mut fetch = |t: &TensorSpec| -> Result<HostTensor> {
            let tensor = ckpt.tensor(&t.name, &t.shape, precision)?;
            done += 1;
            progress(LoadProgress { tensors_done: done, tensors_total: total });
            Ok(tensor)
        };
        let vector = |t: HostTensor| -> Result<GpuBuffer<f32>> {
            Ok(GpuBuffer::<f32>::from_slice(gpu, &t.name, &t.to_f32()?))
        };
        let token_embd = Matrix::upload(gpu, max_bytes, &fetch(&table.token_embd)?)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for (i, l) in table.layers.iter().enumerate() {
            let attn_norm = vector(fetch(&l.attn_norm)?)?;
            // q and k rows reordered so that RoPE's pairs are adjacent (the matmul rotates them)
            let q_rows = c.rope_layout.pair_rows(c.n_heads, c.head_dim, c.rope_dim);
            let k_rows = c.rope_layout.pair_rows(c.n_kv_heads, c.head_dim, c.rope_dim);
            let (q, k, v) = (fetch(&l.q)?, fetch(&l.k)?, fetch(&l.v)?);
            let qkv_bias = match &l.qkv_bias {
                Some([bq, bk, bv]) => {
                    let rows = |t: &HostTensor, order: &[usize]| -> Result<Vec<f32>> {
                        reorder_rows(&t.to_f32()?, order).ok_or_else(|| {
                            Error::InvalidArgument(format!("{}: {:?} is not a q or k bias", t.name, t.shape))
                        })
                    };
                    let (bq, bk, bv) = (fetch(bq)?, fetch(bk)?, fetch(bv)?);
                    let b = [rows(&bq, &q_rows)?, rows(&bk, &k_rows)?, bv.to_f32()?].concat();
                    Some(GpuBuffer::<f32>::from_slice(gpu, &format!("blk.{i}.attn_qkv.bias"), &b))
                }
                None => None,
            };
            let qkv = Matrix::upload_stacked(
                gpu,
                max_bytes,
                vec![(q, Some(q_rows)), (k, Some(k_rows)), (v, None)],
            )?;
            let wo = Matrix::upload(gpu, max_bytes, &fetch(&l.wo)?)?;
            let ffn_norm = vector(fetch(&l.ffn_norm)?)?;
            let (gate, up) = (fetch(&l.gate)?, fetch(&l.up)?);
            let gate_up = Matrix::upload_gate_up(gpu, max_bytes, &gate, &up)?;
            drop((gate, up));
            let down = Matrix::upload(gpu, max_bytes, &fetch(&l.down)?)?;
            layers.push(Layer { attn_norm, qkv, qkv_bias, wo, ffn_norm, gate_up, down });
        }
        let output_norm = vector(fetch(&table.output_norm)?)?;
        let output = match &table.output {
            Some(t) => Some(Matrix::upload(gpu, max_bytes, &fetch(t)?)?),
            None => None,
        };
        Ok(Weights { token_embd, layers, output_norm, output })
    }
}
