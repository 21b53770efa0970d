//! Building a model on the GPU: its memory bill from the headers ([`Model::plan`], one table of
//! its buffers), the upload, every buffer allocated once ([`RunState`]) and the forward pass
//! recorded once as an op list (one transformer block: [`Block::record`]).

use std::sync::Arc;

use super::{BlockIo, LoadOptions, MemoryBill, Model, RunState, MAX_BATCH, MAX_PASSES};
use crate::error::{Error, Result};
use crate::gpu::{
    argmax_scratch, table_bytes, Gpu, GpuBuffer, HeadNormIo, KeepParams, KvOut, MatmulOut, NormIn, Op,
    RopeOut, SideOutput, KV_PAGE,
};
use crate::loader::source;
use crate::model::checkpoint::{Checkpoint, Precision};
use crate::model::config::Config;
use crate::model::weights::{Layer, LoadProgress, TensorTable, Weights};
use bytemuck::Zeroable;

/// RoPE angles for every position: `[context, rope_dim / 2]` pairs (cos, sin), computed in f64,
/// each frequency divided by its `divisors` entry (the scaling's: [`crate::model::RopeScaling`]).
pub(crate) fn rope_table(c: &Config, context: usize, divisors: &[f64]) -> Vec<f32> {
    let half = c.rope_dim / 2;
    let mut t = Vec::with_capacity(context * half * 2);
    for pos in 0..context {
        for (i, divisor) in divisors.iter().enumerate().take(half) {
            let freq = (c.rope_theta as f64).powf(-2.0 * i as f64 / c.rope_dim as f64) / divisor;
            let angle = pos as f64 * freq;
            t.push(angle.cos() as f32);
            t.push(angle.sin() as f32);
        }
    }
    t
}

impl Model {
    /// The GPU memory `ckpt` needs under `opts` (weights as they will be kept, KV cache, scratch),
    /// checked against the adapter's limits and `opts.max_memory` from the headers alone: a
    /// front end can refuse a model before downloading its weights.
    pub fn plan(gpu: &Gpu, ckpt: &Checkpoint, opts: &LoadOptions) -> Result<MemoryBill> {
        let c = &ckpt.config;
        let context = opts.context.unwrap_or(c.context_len.min(4096));
        if context == 0 || context > c.context_len.max(1) * 8 || context > 1 << 20 {
            return Err(Error::InvalidArgument(format!(
                "context {context} for a model of {}",
                c.context_len
            )));
        }
        let kv_pages = opts.kv_pages.unwrap_or(context.div_ceil(KV_PAGE));
        if kv_pages * KV_PAGE < context || kv_pages > 1 << 24 {
            return Err(Error::InvalidArgument(format!(
                "a KV cache pool of {kv_pages} pages of {KV_PAGE} positions for sequences of {context}: \
                 it must hold one at least"
            )));
        }
        // Buffers bound whole: checked before anything is allocated.
        let buffers = Buffers::new(gpu, c, (context, kv_pages), kv_in_f16(c, opts.precision));
        gpu.check_bindings(&buffers.table())?;
        // The whole bill before the first allocation: weights as they will be kept (stored
        // blocks, or f32), then the KV cache and the scratch buffers above.
        let (mut weight_bytes, mut file_weight_bytes) = (0u64, 0u64);
        for t in TensorTable::new(c).iter() {
            let n = t.shape.iter().product::<usize>() as u64;
            let stored = ckpt.stored_bytes(&t.name);
            file_weight_bytes += stored.unwrap_or(0);
            let kept = opts.precision == Precision::Auto && t.shape.len() > 1;
            weight_bytes += if kept { stored.unwrap_or(4 * n) } else { 4 * n };
        }
        let (kv_bytes, scratch_bytes) = buffers.bytes();
        let total = weight_bytes + kv_bytes + scratch_bytes;
        if let Some(budget) = opts.max_memory.filter(|&b| total > b) {
            return Err(Error::GpuLimit(format!(
                "the model needs {:.1} MB of GPU memory (weights {:.1} MB, KV cache of {} positions \
                 {:.1} MB, scratch {:.1} MB); the budget is {:.1} MB",
                kv_pages * KV_PAGE,
                total as f64 / 1e6,
                weight_bytes as f64 / 1e6,
                kv_bytes as f64 / 1e6,
                scratch_bytes as f64 / 1e6,
                budget as f64 / 1e6
            )));
        }
        Ok(MemoryBill { total, context, kv_pages, file_weight_bytes })
    }

    /// Uploads the checkpoint's weights and records the forward pass (files that are whole: see
    /// [`Model::load_async`] for files still arriving).
    pub fn load(
        gpu: Arc<Gpu>,
        ckpt: &Checkpoint,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Model> {
        source::now("loading a model", Model::load_async(gpu, ckpt, opts, progress))
    }

    /// [`Model::load`], waiting for each batch of weights where a file is still arriving (a
    /// download the load overlaps).
    pub async fn load_async(
        gpu: Arc<Gpu>,
        ckpt: &Checkpoint,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Model> {
        let MemoryBill { total, context, kv_pages, file_weight_bytes } = Model::plan(&gpu, ckpt, opts)?;
        let c = ckpt.config.clone();
        let kv_f16 = kv_in_f16(&c, opts.precision);
        let weights = Weights::load(&gpu, ckpt, opts, progress).await?;
        let rope = rope_table(&c, context, &ckpt.rope_divisors()?);
        let g = &*gpu;
        // (the sizes the plan billed)
        let b = Buffers::new(g, &c, (context, kv_pages), kv_f16);
        let f32s = |label: &str, len: usize| GpuBuffer::<f32>::zeros(g, label, len);
        let state = RunState {
            step: g.step_buffer(),
            step_table: g.create_buffer(&wgpu::BufferDescriptor {
                label: Some("step table"),
                size: 4 * b.step_table as u64,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            keep: g.uniform("keep", bytemuck::bytes_of(&KeepParams::zeroed())),
            tokens: GpuBuffer::<u32>::zeros(g, "tokens", b.ids),
            x: f32s("x", b.x),
            xb: f32s("xb", b.x),
            q: f32s("q", b.q),
            att: f32s("att", b.q),
            scores: f32s("attention scratch", b.scores),
            hb: f32s("hb", b.hb),
            qkv: (b.qkv > 0).then(|| f32s("raw qkv", b.qkv)),
            post: (b.post > 0).then(|| f32s("post-norm input", b.post)),
            // (local layers: their own base, no long-context scaling)
            local_rope: (b.local_rope > 0).then(|| {
                let local = Config { rope_theta: c.local_rope_theta, ..c.clone() };
                let table = rope_table(&local, context, &vec![1.0; c.rope_dim / 2]);
                GpuBuffer::<f32>::from_slice(g, "local rope cos/sin", &table)
            }),
            logits: f32s("logits", b.logits),
            argmax: GpuBuffer::<u32>::zeros(g, "argmax", b.ids),
            out_step: g.step_buffer(),
            out_rows: GpuBuffer::<u32>::zeros(g, "output rows", b.ids),
            x_out: f32s("output rows' x", b.x),
            xb_out: f32s("output rows' xb", b.x),
            kv_cache: (0..b.layers)
                .map(|i| GpuBuffer::<u32>::zeros(g, &format!("kv_cache {i}"), b.kv))
                .collect(),
            pages: GpuBuffer::<u32>::zeros(g, "page table", b.pages),
            kv_f16,
            cos_sin: GpuBuffer::<f32>::from_slice(g, "rope cos/sin", &rope),
            taps: None,
        };
        // An allocation the device could not make (out of memory) fails the load, not the process.
        g.take_error()?;
        // (kernels compile as their first ops are built: one that fails fails the load)
        let scope = g.build_scope();
        let (forward_ops, body_ops, layer_ops) = record_forward(g, &c, &weights, &state, context);
        let argmax_ops = g.argmax(&state.step, &state.logits, &state.argmax, c.vocab_size);
        let out_ops = record_gathered_output(g, &c, &weights, &state);
        let out_argmax_ops = g.argmax(&state.out_step, &state.logits, &state.argmax, c.vocab_size);
        let width = kv_words(&c, kv_f16) as u32;
        let keep_ops =
            state.kv_cache.iter().map(|kv| g.kv_keep(&state.step, &state.keep, kv, width)).collect();
        scope.close("building the model's kernels")?;
        Ok(Model {
            config: c,
            gpu,
            weights,
            state,
            forward_ops,
            body_ops,
            layer_ops,
            argmax_ops,
            out_ops,
            out_argmax_ops,
            top_k: None,
            keep_ops,
            context,
            kv_pages,
            file_weight_bytes,
            memory_bytes: total,
            len: 0,
        })
    }
}

/// The sizes, in 4-byte words, of a model's buffers besides its weights ([`RunState`]'s, and the
/// argmax's pairs, which [`Gpu::argmax`] allocates): the one table that [`Model::plan`] bills and
/// checks against the adapter's binding limit, and that the load allocates.
struct Buffers {
    x: usize,          // [MAX_BATCH, dim] x and xb each, and the output rows' copies of them
    q: usize,          // [MAX_BATCH, q_dim] q and att each
    hb: usize,         // [MAX_BATCH, ffn_dim]
    qkv: usize,        // [MAX_BATCH, q_dim + 2 kv_dim] the raw q|k|v of models that norm each head, else 0
    post: usize,       // [MAX_BATCH, dim] a sub-block's output before its post-norm (Gemma), else 0
    local_rope: usize, // [context, rope_dim / 2, 2] the local layers' RoPE (Gemma), else 0
    scores: usize,     // the attention scratch (Gpu::attention_scratch_len)
    logits: usize,     // [MAX_BATCH, vocab]
    pairs: usize,      // [MAX_BATCH, slices, 2] the argmax's best pair of each slice of the logits
    ids: usize,        // [MAX_BATCH] tokens and argmax each
    kv: usize,         // [kv_pages * KV_PAGE, kv words] each layer's KV cache
    pages: usize,      // [MAX_BATCH, context / KV_PAGE] a paged pass's page table
    layers: usize,
    rope: usize,       // [context, rope_dim / 2, 2]
    step_table: usize, // [MAX_PASSES, 4] each recorded pass's (n, start_pos, 0, 0)
}

impl Buffers {
    fn new(gpu: &Gpu, c: &Config, (context, kv_pages): (usize, usize), kv_f16: bool) -> Buffers {
        Buffers {
            x: MAX_BATCH * c.dim,
            q: MAX_BATCH * c.q_dim(),
            hb: MAX_BATCH * c.ffn_dim,
            qkv: if c.arch.qk_norm() { MAX_BATCH * (c.q_dim() + 2 * c.kv_dim()) } else { 0 },
            post: if c.arch.gemma() { MAX_BATCH * c.dim } else { 0 },
            local_rope: if c.arch.gemma() { context * c.rope_dim } else { 0 },
            scores: gpu.attention_scratch_len(c.attention_shape(context, kv_f16), MAX_BATCH),
            logits: MAX_BATCH * c.vocab_size,
            pairs: argmax_scratch(MAX_BATCH, c.vocab_size),
            ids: MAX_BATCH,
            kv: kv_pages * KV_PAGE * kv_words(c, kv_f16),
            pages: MAX_BATCH * context.div_ceil(KV_PAGE),
            layers: c.n_layers,
            rope: context * c.rope_dim,
            step_table: MAX_PASSES * 4,
        }
    }

    /// Every buffer: its label, words and how many there are.
    fn table(&self) -> [(&'static str, usize, usize); 20] {
        [
            ("x", self.x, 1),
            ("xb", self.x, 1),
            ("output rows' x", self.x, 1),
            ("output rows' xb", self.x, 1),
            ("output rows", self.ids, 1),
            ("q", self.q, 1),
            ("att", self.q, 1),
            ("hb", self.hb, 1),
            ("raw qkv", self.qkv, (self.qkv > 0) as usize),
            ("post-norm input", self.post, (self.post > 0) as usize),
            ("local rope cos/sin", self.local_rope, (self.local_rope > 0) as usize),
            ("attention scratch", self.scores, 1),
            ("logits", self.logits, 1),
            // (a pass's argmax, and a paged pass's over the rows that want logits)
            ("argmax pairs", self.pairs, 2),
            ("tokens", self.ids, 1),
            ("argmax", self.ids, 1),
            ("kv_cache", self.kv, self.layers),
            ("page table", self.pages, 1),
            ("rope cos/sin", self.rope, 1),
            ("step table", self.step_table, 1),
        ]
    }

    /// Bytes of the KV caches, and of everything else.
    fn bytes(&self) -> (u64, u64) {
        let all = table_bytes(&self.table());
        let kv = table_bytes(&[("kv_cache", self.kv, self.layers)]);
        (kv, all - kv)
    }
}

/// Whether a model keeps its KV cache in f16 (as llama.cpp does): under [`Precision::Auto`]
/// when the q|k|v epilogue can pack each value with its neighbour (head and rotary dimensions
/// multiples of 4); [`Precision::F32`] keeps the exact f32 reference path.
fn kv_in_f16(c: &Config, precision: Precision) -> bool {
    precision == Precision::Auto && c.head_dim.is_multiple_of(4) && c.rope_dim.is_multiple_of(4)
}

/// 32-bit words of one KV cache position: k and v, as f16 pairs or f32.
pub(super) fn kv_words(c: &Config, kv_f16: bool) -> usize {
    if kv_f16 {
        c.kv_dim()
    } else {
        2 * c.kv_dim()
    }
}

/// One transformer block, to record as ops ([`Block::record`]).
pub(crate) struct Block<'a> {
    pub g: &'a Gpu,
    pub c: &'a Config,
    pub layer: &'a Layer,
    pub kv: &'a GpuBuffer<u32>, // [context, kv_words] the layer's cache
    pub io: &'a BlockIo<'a>,
    /// The weight of the norm after the block (the next layer's input norm or the output norm).
    pub next_norm: Option<&'a GpuBuffer<f32>>,
}

impl Block<'_> {
    /// The block's ops, reading x (and xb = x * its input norm's weight, which the op before it
    /// wrote, when the block has an input norm) and leaving x += the block, and xb = x *
    /// `next_norm` when a normed op follows: 5 dispatches (6 with attention split in chunks), one
    /// more where each head is normed, two more where the sub-blocks are post-normed (Gemma).
    pub(crate) fn record(&self) -> Vec<Op> {
        let Block { g, c, layer, kv, io, .. } = *self;
        let st = io.step;
        let shape = io.shape(c);
        let mut ops = Vec::new();
        let to = |ldy: usize| MatmulOut { ldy: ldy as u32, ..Default::default() };
        let normed = |ldy: usize| MatmulOut { norm: Some(NormIn { raw: io.x, eps: c.rms_eps }), ..to(ldy) };
        // [q | k | v] = rmsnorm(x) Wqkv^T + bqkv (x itself without an input norm), one matmul: q and
        // k rotated by their positions in its epilogue, q to its scratch [n, q_dim], k | v to the
        // cache row start_pos + r [context, 2 kv_dim]
        let (input, out) = match (io.qkv_input, &layer.attn_norm) {
            (Some(input), _) => (input, to(c.q_dim())),
            (None, Some(_)) => (io.xb, normed(c.q_dim())),
            (None, None) => (io.x, to(c.q_dim())),
        };
        // (heads normed one by one: the matmul's raw q|k|v to their scratch, then one op norms and
        // rotates q and k and routes q|k|v to their places)
        if let (Some([q_norm, k_norm]), Some(raw)) = (&layer.qk_norm, io.qkv) {
            let width = c.q_dim() + 2 * c.kv_dim();
            ops.extend(layer.qkv.matmul(
                g,
                st,
                input,
                layer.qkv_bias.as_ref(),
                raw,
                MatmulOut { ldy: width as u32, ..out },
            ));
            let places = HeadNormIo { qkv: raw, norms: [q_norm, k_norm], cos_sin: io.cos_sin, q: io.q, kv };
            ops.push(g.head_norm(st, places, shape, (c.rope_dim as u32, c.rope_layout), c.rms_eps));
            return self.attention_and_ffn(ops);
        }
        let qkv = MatmulOut {
            second: Some(SideOutput::Kv(KvOut {
                cache: kv,
                ld: 2 * c.kv_dim() as u32,
                split: c.q_dim() as u32,
                f16: io.kv_f16,
            })),
            rope: Some(RopeOut {
                cos_sin: io.cos_sin,
                cols: (c.q_dim() + c.kv_dim()) as u32,
                head_dim: c.head_dim as u32,
                rope_dim: c.rope_dim as u32,
                layout: c.rope_layout,
            }),
            ..out
        };
        ops.extend(layer.qkv.matmul(g, st, input, layer.qkv_bias.as_ref(), io.q, qkv));
        self.attention_and_ffn(ops)
    }

    /// The rest of a block once q and the cache row are written: attention, its output projection
    /// and the feed-forward, appended to `ops`.
    fn attention_and_ffn(&self, mut ops: Vec<Op>) -> Vec<Op> {
        let Block { g, c, layer, kv, io, next_norm } = *self;
        let st = io.step;
        let shape = io.shape(c);
        let normed = |ldy: usize| MatmulOut {
            ldy: ldy as u32,
            norm: Some(NormIn { raw: io.x, eps: c.rms_eps }),
            ..Default::default()
        };
        // x += y, and xb = x * gamma for the next norm
        fn add_then_scale<'a>(
            io: &BlockIo<'a>,
            dim: usize,
            gamma: Option<&'a GpuBuffer<f32>>,
        ) -> MatmulOut<'a> {
            MatmulOut {
                ldy: dim as u32,
                accumulate: true,
                second: gamma.map(|gamma| SideOutput::Scaled { out: io.xb, gamma }),
                ..Default::default()
            }
        }
        // hb = act(rmsnorm(x) Wgate^T) * (rmsnorm(x) Wup^T): one matmul over the interleaved rows,
        // SwiGLU (or Gemma's GeGLU) in its epilogue                   [n, ffn_dim]
        let glu = MatmulOut { glu: true, gelu: c.arch.gemma(), ..normed(c.ffn_dim) };
        // att = softmax(q k^T / sqrt(head_dim), causal) v            [n, q_dim]
        ops.extend(g.attention(st, io.q, (kv, io.pages), io.scores, io.att, shape));
        // (Gemma: each sub-block's output normed before its residual add)
        if let (Some([post_attention, post_ffw]), Some(y)) = (&layer.post_norms, io.post) {
            let to = MatmulOut { ldy: c.dim as u32, ..Default::default() };
            // y = att Wo^T; x += rmsnorm(y) * post_attention; xb = x * ffn_norm      [n, dim]
            ops.extend(layer.wo.matmul(g, st, io.att, None, y, to));
            ops.push(g.norm_add(
                st,
                (y, post_attention, c.rms_eps),
                io.x,
                Some((&layer.ffn_norm, io.xb)),
                c.dim,
            ));
            ops.extend(layer.gate_up.matmul(g, st, io.xb, None, io.hb, glu));
            // y = hb Wdown^T; x += rmsnorm(y) * post_ffw; xb = x * the next norm      [n, dim]
            ops.extend(layer.down.matmul(g, st, io.hb, None, y, to));
            ops.push(g.norm_add(st, (y, post_ffw, c.rms_eps), io.x, next_norm.map(|n| (n, io.xb)), c.dim));
            return ops;
        }
        // x += att Wo^T; xb = x * ffn_norm                            [n, dim]
        ops.extend(layer.wo.matmul(
            g,
            st,
            io.att,
            None,
            io.x,
            add_then_scale(io, c.dim, Some(&layer.ffn_norm)),
        ));
        ops.extend(layer.gate_up.matmul(g, st, io.xb, None, io.hb, glu));
        // x += hb Wdown^T; xb = x * the next norm's weight            [n, dim]
        ops.extend(layer.down.matmul(g, st, io.hb, None, io.x, add_then_scale(io, c.dim, next_norm)));
        ops
    }
}

/// The forward pass as one flat op list, in the order the GPU runs it (5 dispatches per layer);
/// how many of its ops come before the output projection (the body); and how many the layer with
/// the most takes (a matrix split across stored types is a dispatch per type). Every RMSNorm is
/// folded into the matmul that reads its output: the op before it writes the residual stream x
/// and also x * the norm's weight into xb; the matmul reads xb and divides each row's sums by the
/// RMS of x's row.
pub(super) fn record_forward(
    g: &Gpu,
    c: &Config,
    w: &Weights,
    s: &RunState,
    context: usize,
) -> (Vec<Op>, usize, usize) {
    let st = &s.step;
    let mut ops = Vec::new();
    let input_norm = |l: usize| w.layers.get(l).map_or(Some(&w.output_norm), |n| n.attn_norm.as_ref());
    // x = token_embd[tokens]; xb = x * attn_norm                   [n, dim]
    // (Gemma: times sqrt(dim))
    let scale = if c.arch.gemma() { (c.dim as f32).sqrt() } else { 1.0 };
    ops.extend(w.token_embd.embed(g, st, &s.tokens, (&s.x, scale), input_norm(0).map(|n| (n, &s.xb))));
    // (feature taps) taps[:, j dim..] = x after `after` layers     [n, taps * dim]
    let taps = |after: usize, ops: &mut Vec<Op>| {
        if let Some((layers, buf)) = &s.taps {
            let ld = layers.len() * c.dim;
            for (j, _) in layers.iter().enumerate().filter(|(_, &l)| l == after) {
                ops.push(g.gather_rows(st, &s.x, None, None, (buf, ld, j * c.dim), c.dim));
            }
        }
    };
    taps(0, &mut ops);
    let io = BlockIo {
        step: st,
        x: &s.x,
        xb: &s.xb,
        q: &s.q,
        att: &s.att,
        scores: &s.scores,
        hb: &s.hb,
        qkv: s.qkv.as_ref(),
        post: s.post.as_ref(),
        cos_sin: &s.cos_sin,
        pages: &s.pages,
        context,
        kv_f16: s.kv_f16,
        qkv_input: None,
        window: None,
    };
    let mut per_layer = 0;
    for (l, layer) in w.layers.iter().enumerate() {
        // (Gemma's local layers: a sliding window and their own RoPE table)
        let window = c.layer_window(l);
        let cos_sin = match (window, &s.local_rope) {
            (Some(_), Some(local)) => local,
            _ => &s.cos_sin,
        };
        let io = BlockIo { window, cos_sin, ..io };
        // (the next layer's attn_norm, or output_norm)
        let block = Block { g, c, layer, kv: &s.kv_cache[l], io: &io, next_norm: input_norm(l + 1) }.record();
        per_layer = per_layer.max(block.len());
        ops.extend(block);
        taps(l + 1, &mut ops);
    }
    let body = ops.len();
    // logits = rmsnorm(x) * output_norm . output^T                   [n, vocab]
    ops.extend(output_projection(g, c, w, st, (&s.xb, &s.x), &s.logits));
    (ops, body, per_layer)
}

/// The output projection under `st`, RMSNorm folded in: `logits = rmsnorm(x) * output_norm .
/// output^T` from `xb` (x times output_norm, `[n, dim]`) and `x` itself (`[n, dim]`), into
/// `logits` (`[n, vocab]`).
fn output_projection(
    g: &Gpu,
    c: &Config,
    w: &Weights,
    st: &wgpu::Buffer,
    (xb, x): (&GpuBuffer<f32>, &GpuBuffer<f32>),
    logits: &GpuBuffer<f32>,
) -> Vec<Op> {
    let output = w.output_matrix();
    let normed = MatmulOut {
        ldy: c.vocab_size as u32,
        norm: Some(NormIn { raw: x, eps: c.rms_eps }),
        ..Default::default()
    };
    output.matmul(g, st, xb, None, logits, normed)
}

/// The output of a paged pass's rows that want logits, under `out_step` (m rows): their rows
/// of x and xb gathered (`out_rows`), then the output projection as [`record_forward`]'s, over
/// the copies (the same bits: a row's logits do not depend on its place in a pass).
/// logits[i] = rmsnorm(x[out_rows[i]]) * output_norm . output^T      [m, vocab]
fn record_gathered_output(g: &Gpu, c: &Config, w: &Weights, s: &RunState) -> Vec<Op> {
    let st = &s.out_step;
    let mut ops = vec![
        g.gather_rows(st, &s.x, Some(&s.out_rows), None, (&s.x_out, c.dim, 0), c.dim),
        g.gather_rows(st, &s.xb, Some(&s.out_rows), None, (&s.xb_out, c.dim, 0), c.dim),
    ];
    ops.extend(output_projection(g, c, w, st, (&s.xb_out, &s.x_out), &s.logits));
    ops
}
