//! Medusa heads on the GPU (Cai et al., "Medusa", arXiv 2401.10774): extra decoding heads on the
//! target's final hidden state, head i guessing the token i + 2 places after the position it
//! reads (the target's own output guesses the next one).
//!
//! The public Medusa-1 layout (`medusa_lm_head.safetensors`, with `medusa_num_heads` and
//! `medusa_num_layers` in its `config.json`): head h is `medusa_num_layers` residual blocks and a
//! vocabulary projection,
//!
//! ```text
//!   h_0     = the target's final hidden state (after its output norm)    [dim]
//!   h_{l+1} = h_l + silu(W_{h,l} h_l + b_{h,l})    `{h}.{l}.linear.weight` [dim, dim], `.bias` [dim]
//!   logits  = W_{h,L} h_L                          `{h}.{L}.weight` [vocab, dim]
//! ```
//!
//! A file may leave out every head's `{h}.{L}.weight`: the heads then project with the target's
//! own output matrix (heads trained with the projection frozen at the target's `lm_head`, as
//! `scripts/train/train_medusa.py` trains them), a file of the blocks alone, and one matmul over
//! `[heads, n, dim]` reads that matrix once for every head and row.
//!
//! Everything runs in one submission with one small read-back: the target's hidden rows (picked
//! by row indices written before the submission: one for a sequence's draft, up to
//! [`MEDUSA_ROWS`] for several sequences of a batch), each head's blocks and projection over
//! them, and each head's top-k ids ([`Gpu::top_k`]): `[heads, rows, k]` ids come back, never
//! logits. A row's ids do not depend on the other rows (batch-invariant kernels).

use std::sync::Arc;

use super::checkpoint::{Checkpoint, Precision};
use super::config::Config;
use super::transformer::{LoadOptions, Model, MAX_BATCH};
use super::weights::{LoadProgress, Matrix, Tally, TensorRole, TensorSpec, Upload};
use crate::error::{Error, Result};
use crate::gpu::{table_bytes, Gpu, GpuBuffer, MatmulOut, Op, TopKScratch, MAX_TOP_K};

/// The shape of a set of Medusa heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MedusaConfig {
    /// Heads (`medusa_num_heads`): head i guesses the token i + 2 places ahead.
    pub heads: usize,
    /// Residual blocks per head (`medusa_num_layers`).
    pub layers: usize,
    /// Whether the heads project with the target's output matrix (the file has no
    /// `{h}.{L}.weight`), rather than each with its own.
    pub shared_output: bool,
}

/// The most heads a set may have (a tree is at most this deep).
pub const MAX_MEDUSA_HEADS: usize = 16;

/// The most target rows one run of the heads reads ([`MedusaHeads::top_rows`]).
pub const MEDUSA_ROWS: usize = 8;

/// The tensors of one head, in the public layout.
#[derive(Clone, Debug)]
struct HeadTensors {
    /// Per residual block: `{h}.{l}.linear.weight` `[dim, dim]` and `.bias` `[dim]`.
    blocks: Vec<(TensorSpec, TensorSpec)>,
    /// `{h}.{L}.weight` `[vocab, dim]`; `None`: the target's output matrix.
    out: Option<TensorSpec>,
}

/// Every tensor of a set of heads, named as in the file (a common prefix such as
/// `medusa_head.` kept).
fn head_tensors(prefix: &str, c: MedusaConfig, dim: usize, vocab: usize) -> Vec<HeadTensors> {
    let spec = |name: String, shape: Vec<usize>, role| TensorSpec { name, shape, role };
    (0..c.heads)
        .map(|h| HeadTensors {
            blocks: (0..c.layers)
                .map(|l| {
                    (
                        spec(format!("{prefix}{h}.{l}.linear.weight"), vec![dim, dim], TensorRole::Weight),
                        spec(format!("{prefix}{h}.{l}.linear.bias"), vec![dim], TensorRole::QkvBias),
                    )
                })
                .collect(),
            out: (!c.shared_output).then(|| {
                spec(format!("{prefix}{h}.{}.weight", c.layers), vec![vocab, dim], TensorRole::Output)
            }),
        })
        .collect()
}

impl MedusaConfig {
    /// The heads a file holds, from its tensor names (`[prefix]{h}.{l}.linear.weight`,
    /// `[prefix]{h}.{L}.weight`), checked against `config_json`'s `medusa_num_heads` and
    /// `medusa_num_layers` where given. Returns the config and the names' common prefix.
    pub fn of_checkpoint(ckpt: &Checkpoint, config_json: Option<&[u8]>) -> Result<(MedusaConfig, String)> {
        let bad = |why: String| Error::InvalidArgument(format!("Medusa heads: {why}"));
        let names: Vec<&str> = ckpt.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        let prefix = names
            .first()
            .and_then(|n| n.find(|c: char| c.is_ascii_digit()))
            .and_then(|i| names.first().map(|n| &n[..i]))
            .unwrap_or("")
            .to_string();
        let (mut heads, mut layers, mut projections) = (0usize, 0usize, Vec::new());
        for name in &names {
            let rest = name.strip_prefix(prefix.as_str()).ok_or_else(|| {
                bad(format!("tensor {name:?} does not start with {prefix:?} as the others do"))
            })?;
            let mut parts = rest.split('.');
            let index = |p: Option<&str>| p.and_then(|s| s.parse::<usize>().ok());
            let (Some(h), Some(l)) = (index(parts.next()), index(parts.next())) else {
                return Err(bad(format!("tensor {name:?} is not named {{head}}.{{layer}}.*")));
            };
            if h >= MAX_MEDUSA_HEADS || l > 64 {
                return Err(bad(format!("tensor {name:?}: at most {MAX_MEDUSA_HEADS} heads of 64 blocks")));
            }
            heads = heads.max(h + 1);
            match parts.next() {
                Some("linear") => layers = layers.max(l + 1),
                Some("weight") => projections.push(h),
                _ => {}
            }
        }
        if heads == 0 {
            return Err(bad("the file holds no tensors".into()));
        }
        let json: Option<serde_json::Value> = match config_json {
            Some(bytes) => Some(serde_json::from_slice(bytes).map_err(|e| Error::corrupt("config.json", e))?),
            None => None,
        };
        let declared = |key: &str| json.as_ref().and_then(|j| j.get(key)).and_then(|v| v.as_u64());
        for (key, found) in [("medusa_num_heads", heads), ("medusa_num_layers", layers)] {
            if let Some(d) = declared(key).filter(|&d| d != found as u64) {
                return Err(bad(format!("config.json declares {key} = {d}, the weights hold {found}")));
            }
        }
        projections.sort_unstable();
        projections.dedup();
        if !projections.is_empty() && projections.len() != heads {
            let lacking: Vec<usize> = (0..heads).filter(|h| !projections.contains(h)).collect();
            return Err(bad(format!(
                "heads {lacking:?} have no {{head}}.{layers}.weight projection and the others do: \
                 every head has its own, or none has (the target's output is shared)"
            )));
        }
        Ok((MedusaConfig { heads, layers, shared_output: projections.is_empty() }, prefix))
    }
}

/// One head's weights and its scratch (kept alive for the bind groups that reference them).
#[allow(dead_code)]
struct Head {
    blocks: Vec<(Matrix, GpuBuffer<f32>)>, // per block: W [dim, dim], b [dim]
    out: Option<Matrix>,                   // [vocab, dim] (None: the target's output)
    state: [GpuBuffer<f32>; 2],            // [MEDUSA_ROWS, dim] each: h_l, then h_{l+1} (ping-pong)
    logits: Option<GpuBuffer<f32>>,        // [MEDUSA_ROWS, vocab] (own projection)
    top: Option<GpuBuffer<u32>>,           // [MEDUSA_ROWS, k] the head's most likely ids (own projection)
}

/// One step of the heads' submission over n target rows: a compute pass of ops, or a buffer copy
/// between them.
enum Action {
    /// Ops of a pass of `n` times this many rows.
    Ops(Vec<Op>, u32),
    /// The first n rows of `row_bytes` each of `from` to `to`, at head h's place there (`[heads,
    /// n, ..]`: h n rows in) or at its start.
    Copy { from: wgpu::Buffer, to: wgpu::Buffer, head: Option<usize>, row_bytes: u64 },
}

/// Medusa heads on the GPU, reading one target's hidden states (see the module's doc).
pub struct MedusaHeads {
    pub config: MedusaConfig,
    gpu: Arc<Gpu>,
    /// Kept alive for the bind groups that reference them.
    _heads: Vec<Head>,
    step: wgpu::Buffer,      // uniform Step: n rows
    steps: wgpu::Buffer,     // uniform Step: n rows per head (the shared projection)
    _last: GpuBuffer<f32>,   // [heads, MEDUSA_ROWS, dim] every head's h_L (the shared projection)
    _logits: GpuBuffer<f32>, // [heads, MEDUSA_ROWS, vocab] their logits (the shared projection)
    rows: GpuBuffer<u32>,    // [MEDUSA_ROWS] the target's rows the heads read
    _hidden: GpuBuffer<f32>, // [MEDUSA_ROWS, dim] the target's final hidden states at those rows
    top: GpuBuffer<u32>,     // [heads, n, k] every head's top ids of each row
    top_k: usize,
    program: Vec<Action>,
    gpu_bytes: u64,
    /// Its bill ([`MedusaHeads::plan`]): weights and scratch.
    memory_bytes: u64,
}

/// The sizes, in 4-byte words, of the heads' buffers besides their weights (and their top-k
/// ops' scratch): the one table that [`MedusaHeads::plan`] bills and [`MedusaHeads::load`]
/// allocates.
struct MedusaSizes {
    dim: usize,
    vocab: usize,
    top_k: usize,
    top: usize,    // [heads, MEDUSA_ROWS, top_k] every head's most likely ids
    last: usize,   // [heads, MEDUSA_ROWS, dim] every head's h_L (shared projection; else one word)
    logits: usize, // [heads, MEDUSA_ROWS, vocab] their logits (shared projection; else one word)
    heads: usize,
    /// Heads with their own projection (each: logits, top and a top-k of MEDUSA_ROWS rows), and
    /// 1 where they share the target's (one top-k over every head's rows).
    own: usize,
    shared: usize,
    own_ranking: TopKScratch,
    shared_ranking: TopKScratch,
}

impl MedusaSizes {
    fn new(c: &Config, config: MedusaConfig, top_k: usize) -> MedusaSizes {
        let (dim, vocab, heads) = (c.dim, c.vocab_size, config.heads);
        let rows = if config.shared_output { heads * MEDUSA_ROWS } else { 0 };
        MedusaSizes {
            dim,
            vocab,
            top_k,
            top: heads * MEDUSA_ROWS * top_k,
            last: (rows * dim).max(1),
            logits: (rows * vocab).max(1),
            heads,
            own: if config.shared_output { 0 } else { heads },
            shared: config.shared_output as usize,
            own_ranking: TopKScratch::new(MEDUSA_ROWS, vocab, top_k, false),
            shared_ranking: TopKScratch::new(heads * MEDUSA_ROWS, vocab, top_k, false),
        }
    }

    /// Every buffer: its label, words and how many there are.
    fn table(&self) -> [(&'static str, usize, usize); 14] {
        let (own, shared) = (self.own, self.shared);
        [
            ("rows", MEDUSA_ROWS, 1),
            ("hidden", MEDUSA_ROWS * self.dim, 1),
            ("top", self.top, 1),
            ("last", self.last, 1),
            ("logits", self.logits, 1),
            ("states", MEDUSA_ROWS * self.dim, 2 * self.heads),
            ("own logits", MEDUSA_ROWS * self.vocab, own),
            ("own top", MEDUSA_ROWS * self.top_k, own),
            ("own ranking candidates", self.own_ranking.candidates, own),
            ("own ranking sums", self.own_ranking.sums, own),
            ("own ranking placeholder", 1, own * self.own_ranking.placeholder),
            ("shared ranking candidates", self.shared_ranking.candidates, shared),
            ("shared ranking sums", self.shared_ranking.sums, shared),
            ("shared ranking placeholder", 1, shared * self.shared_ranking.placeholder),
        ]
    }

    fn bytes(&self) -> u64 {
        table_bytes(&self.table())
    }
}

impl MedusaHeads {
    /// The GPU memory the heads of `ckpt` take when loaded by [`MedusaHeads::load`] with the same
    /// arguments (weights as they will be kept, and scratch), from the headers alone.
    pub fn plan(
        target: &Model,
        ckpt: &Checkpoint,
        (config, prefix): (MedusaConfig, &str),
        precision: Precision,
        top_k: usize,
    ) -> Result<u64> {
        let (dim, vocab) = (target.config.dim as u64, target.config.vocab_size as u64);
        let mut bytes = 0;
        for t in head_tensors(prefix, config, dim as usize, vocab as usize) {
            for spec in t.blocks.iter().flat_map(|(w, b)| [w, b]).chain(&t.out) {
                let n = spec.shape.iter().product::<usize>() as u64;
                let stored = ckpt.dtype(&spec.name, &spec.shape)?;
                let kept = precision == Precision::Auto && spec.shape.len() > 1;
                bytes += if kept { stored.bytes_for(n).unwrap_or(4 * n) } else { 4 * n };
            }
        }
        let sizes = MedusaSizes::new(&target.config, config, top_k);
        target.gpu().check_bindings(&sizes.table())?;
        Ok(bytes + sizes.bytes())
    }

    /// Uploads the heads of `ckpt` (a [`Checkpoint::from_named_safetensors`] of the heads' file,
    /// `config` from [`MedusaConfig::of_checkpoint`], names under `prefix`) for `target`, whose
    /// hidden states they read, ranking `top_k` ids per head (at most [`MAX_TOP_K`]). `opts`
    /// gives the precision, the largest weight buffer and the bytes read at once (its context
    /// and budget are the caller's: see [`MedusaHeads::plan`]).
    pub async fn load(
        target: &Model,
        ckpt: &Checkpoint,
        (config, prefix): (MedusaConfig, &str),
        opts: &LoadOptions,
        top_k: usize,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<MedusaHeads> {
        let c: &Config = &target.config;
        let (dim, vocab) = (c.dim, c.vocab_size);
        if top_k == 0 || top_k > MAX_TOP_K {
            return Err(Error::InvalidArgument(format!(
                "Medusa heads rank 1..={MAX_TOP_K} ids, not {top_k}"
            )));
        }
        // (their bill first: a buffer no binding can cover is refused before anything is allocated)
        let memory_bytes = MedusaHeads::plan(target, ckpt, (config, prefix), opts.precision, top_k)?;
        let gpu = target.gpu().clone();
        let g = &*gpu;
        let table = head_tensors(prefix, config, dim, vocab);
        let all: Vec<&TensorSpec> =
            table.iter().flat_map(|h| h.blocks.iter().flat_map(|(w, b)| [w, b]).chain(&h.out)).collect();
        let bytes = all.iter().filter_map(|t| ckpt.stored_bytes(&t.name)).sum();
        let up = Upload::new(g, ckpt, opts, Tally::new(all.len(), bytes, progress));
        let step = g.step_buffer();
        // (the sizes the plan billed)
        let z = MedusaSizes::new(c, config, top_k);
        let rows = GpuBuffer::<u32>::zeros(g, "medusa rows", MEDUSA_ROWS);
        let hidden = GpuBuffer::<f32>::zeros(g, "medusa hidden", MEDUSA_ROWS * dim);
        let top = GpuBuffer::<u32>::zeros(g, "medusa top", z.top);
        let steps = g.step_buffer();
        let last = GpuBuffer::<f32>::zeros(g, "medusa last", z.last);
        let all_logits = GpuBuffer::<f32>::zeros(g, "medusa logits", z.logits);
        let (raw, norm) = target.hidden_buffers();
        let gather = g.gather_rows(&step, raw, Some(&rows), Some((norm, c.rms_eps)), (&hidden, dim, 0), dim);
        let mut program = vec![Action::Ops(vec![gather], 1)];
        let mut heads = Vec::with_capacity(config.heads);
        let mut gpu_bytes = 0;
        let shared = Shared { step: &step, hidden: &hidden, last: &last, top: &top, top_k, dim, vocab };
        for (h, t) in table.iter().enumerate() {
            let (head, bytes) = load_head(&up, &shared, h, t, &mut program).await?;
            heads.push(head);
            gpu_bytes += bytes;
        }
        if config.shared_output {
            // every head's logits in one pass over the target's output matrix, `[heads, n,
            // vocab]`, and their top_k ids: `top` row by row
            let out = MatmulOut { ldy: vocab as u32, ..Default::default() };
            let mut ops = target.output_ops(&steps, &last, &all_logits, out);
            ops.extend(g.top_k(&steps, &all_logits, (&top, None), vocab, top_k));
            program.push(Action::Ops(ops, config.heads as u32));
        }
        g.take_error()?;
        Ok(MedusaHeads {
            config,
            gpu,
            _heads: heads,
            step,
            steps,
            _last: last,
            _logits: all_logits,
            rows,
            _hidden: hidden,
            top,
            top_k,
            program,
            gpu_bytes,
            memory_bytes,
        })
    }

    /// Ids ranked per head.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Bytes of GPU memory the heads' weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.gpu_bytes
    }

    /// Bytes of GPU memory the heads take in all (weights and scratch: their plan).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Runs every head on row `row` of the target's last pass and returns each head's `top_k`
    /// most likely ids, most likely first: `[heads][top_k]`. One submission, one read-back.
    pub async fn top(&self, row: usize) -> Result<Vec<Vec<u32>>> {
        let mut all = self.top_rows(&[row]).await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// [`MedusaHeads::top`] for up to [`MEDUSA_ROWS`] rows of the target's last pass at once
    /// (several sequences of a batch): `[rows][heads][top_k]`, each row's ids those it has alone.
    /// One submission, one read-back.
    pub async fn top_rows(&self, rows: &[usize]) -> Result<Vec<Vec<Vec<u32>>>> {
        let n = rows.len();
        if n == 0 || n > MEDUSA_ROWS || rows.iter().any(|&r| r >= MAX_BATCH) {
            return Err(Error::InvalidArgument(format!(
                "Medusa heads read 1..={MEDUSA_ROWS} rows of a pass of at most {MAX_BATCH}, got {rows:?}"
            )));
        }
        let g = &*self.gpu;
        let picks: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        g.queue.write_buffer(&self.rows.raw, 0, bytemuck::cast_slice(&picks));
        g.write_step(&self.step, n, 0);
        g.write_step(&self.steps, self.config.heads * n, 0);
        let mut enc = g.encoder();
        for action in &self.program {
            match action {
                Action::Ops(ops, per) => g.encode(&mut enc, ops, per * n as u32),
                Action::Copy { from, to, head, row_bytes } => {
                    let at = head.map_or(0, |h| (h * n) as u64 * row_bytes);
                    enc.copy_buffer_to_buffer(from, 0, to, at, n as u64 * row_bytes)
                }
            }
        }
        let (heads, k) = (self.config.heads, self.top_k);
        let raw = g.submit_and_read(enc, &self.top.raw, 0, (heads * n * k * 4) as u64).await?;
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        // (`top` is [heads, n, k])
        Ok((0..n)
            .map(|i| (0..heads).map(|h| ids[(h * n + i) * k..(h * n + i + 1) * k].to_vec()).collect())
            .collect())
    }
}

/// The buffers every head's program reads or writes.
struct Shared<'b> {
    step: &'b wgpu::Buffer,     // uniform Step of n rows
    hidden: &'b GpuBuffer<f32>, // [MEDUSA_ROWS, dim] the target's hidden states of the rows drafted from
    last: &'b GpuBuffer<f32>,   // [heads, n, dim] each head's h_L (shared output), else unused
    top: &'b GpuBuffer<u32>,    // [heads, n, top_k] each head's most likely ids
    top_k: usize,
    /// The target's width and vocabulary.
    dim: usize,
    vocab: usize,
}

/// Uploads head `h` (its tensors `t`) and records its part of the program: its blocks from
/// `hidden`, then its own projection and top-k into rows h n.. of `top`, or (a shared output
/// projection, recorded after every head) its h_L into rows h n.. of `last`. Returns the head and
/// its weights' bytes on the GPU.
async fn load_head(
    up: &Upload<'_>,
    b: &Shared<'_>,
    h: usize,
    t: &HeadTensors,
    program: &mut Vec<Action>,
) -> Result<(Head, u64)> {
    let g = up.gpu;
    let (dim, vocab) = (b.dim, b.vocab);
    let mut blocks = Vec::with_capacity(t.blocks.len());
    for (w, bias) in &t.blocks {
        let bias_buf = GpuBuffer::<f32>::from_slice(g, &bias.name, &up.vector(bias).await?);
        blocks.push((up.matrix(w).await?, bias_buf));
    }
    let out = match &t.out {
        Some(spec) => Some(up.matrix(spec).await?),
        None => None,
    };
    let state =
        [0, 1].map(|i| GpuBuffer::<f32>::zeros(g, &format!("medusa {h} state {i}"), MEDUSA_ROWS * dim));
    // h_{l+1} = h_l + silu(W h_l + b): the input copied to the output, then the block added by
    // the matmul's epilogue
    let mut input = b.hidden;
    for (l, (w, bias)) in blocks.iter().enumerate() {
        let output = &state[l % 2];
        program.push(Action::Copy {
            from: input.raw.clone(),
            to: output.raw.clone(),
            head: None,
            row_bytes: 4 * dim as u64,
        });
        let block = MatmulOut { ldy: dim as u32, accumulate: true, silu: true, ..Default::default() };
        program.push(Action::Ops(w.matmul(g, b.step, input, Some(bias), output, block), 1));
        input = output;
    }
    let mut bytes = blocks.iter().map(|(w, b)| w.gpu_bytes() + b.raw.size()).sum::<u64>();
    let Some(out) = out else {
        // h_L into rows h n.. of `last`, projected with the others' after every head
        program.push(Action::Copy {
            from: input.raw.clone(),
            to: b.last.raw.clone(),
            head: Some(h),
            row_bytes: 4 * dim as u64,
        });
        return Ok((Head { blocks, out: None, state, logits: None, top: None }, bytes));
    };
    // logits = W_out h_L, and their top_k ids into rows h n.. of `top`
    let logits = GpuBuffer::<f32>::zeros(g, &format!("medusa {h} logits"), MEDUSA_ROWS * vocab);
    let head_top = GpuBuffer::<u32>::zeros(g, &format!("medusa {h} top"), MEDUSA_ROWS * b.top_k);
    let mut ops =
        out.matmul(g, b.step, input, None, &logits, MatmulOut { ldy: vocab as u32, ..Default::default() });
    ops.extend(g.top_k(b.step, &logits, (&head_top, None), vocab, b.top_k));
    program.push(Action::Ops(ops, 1));
    program.push(Action::Copy {
        from: head_top.raw.clone(),
        to: b.top.raw.clone(),
        head: Some(h),
        row_bytes: 4 * b.top_k as u64,
    });
    bytes += out.gpu_bytes();
    Ok((Head { blocks, out: Some(out), state, logits: Some(logits), top: Some(head_top) }, bytes))
}
