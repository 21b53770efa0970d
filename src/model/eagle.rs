//! An EAGLE draft head on the GPU (Li et al., "EAGLE", arXiv 2401.15077; EAGLE-2, 2406.16858):
//! one decoder layer that predicts the target's next feature from its current one.
//!
//! The public EAGLE-1/2 layout (a `config.json` of one llama layer and `model.safetensors`):
//!
//! ```text
//!   f_p   the target's final hidden state at position p (after its output norm)   [dim]
//!   e     the target's embedding of token t_{p+1}                               [dim]
//!   x     = fc([e | f_p]) (+ fc.bias)           `fc.weight` [dim, 2 dim], `fc.bias` [dim] (optional)
//!   h     = x + attention(x) at position p      `layers.0.self_attn.{q,k,v,o}_proj.weight`, no input
//!                                               norm (EAGLE-1's first layer has none; an
//!                                               `input_layernorm` is used when present)
//!   f^    = h + mlp(rmsnorm(h))                 `layers.0.post_attention_layernorm.weight`,
//!                                               `layers.0.mlp.{gate,up,down}_proj.weight`
//!   logits = the target's output projection of f^ (no norm): t^_{p+2}
//! ```
//!
//! The public EAGLE-3 layout (Li et al., arXiv 2503.01840; `LlamaForCausalLMEagle3`, as
//! SafeAILab's EAGLE, vLLM and SGLang read it):
//!
//! ```text
//!   a_p   the target's residual stream at position p after l1, l2, l3 layers, side by side
//!         (default 2, N/2, N-3 of its N layers; config.json's eagle_aux_hidden_state_layer_ids,
//!         vLLM's meaning)                                                       [3 dim]
//!   g     = fc(a_p) (+ fc.bias)                 `fc.weight` [dim, 3 dim]; a draft step's g is
//!                                               the head's own previous output h (no fc)
//!   u     = [rmsnorm(e) | rmsnorm(g)]           `midlayer.input_layernorm.weight`,
//!                                               `midlayer.hidden_norm.weight`       [2 dim]
//!   h     = g + attention(u) at position p      `midlayer.self_attn.{q,k,v}_proj.weight`
//!                                               [*, 2 dim], `o_proj` [dim, q_dim]
//!   h     = h + mlp(rmsnorm(h))                 `midlayer.post_attention_layernorm.weight`,
//!                                               `midlayer.mlp.*`
//!   logits = lm_head(rmsnorm(h))                `norm.weight`, `lm_head.weight` [draft_vocab, dim];
//!         draft id d is the target's d + d2t[d] (`d2t` [draft_vocab] I64; `t2d` is for training)
//! ```
//!
//! The head keeps its own KV cache over the positions it has run. A pass of n rows: the features
//! gathered from the target's pass ([`Gpu::gather_rows`]) or copied from the head's own previous
//! output, the embedding, the concatenation, fc and the layer over every row; then the
//! projection (a `[vocab, dim]` matmul, most of a pass's bytes; EAGLE-3's `[draft_vocab, dim]`)
//! and a top-k of the LAST row only (EAGLE-3: its ids renamed by d2t on the GPU), the one
//! drafting continues from.
//!
//! Drafting continues in one of two ways:
//! - a chain ([`EagleHead::draft`]): one-row passes, each fed the previous one's f^ and most
//!   likely id, in one submission;
//! - a tree (EAGLE-2's expansion, [`EagleHead::expand_root`] and [`EagleHead::expand`]): a tree
//!   pass over chosen draft nodes and their ancestors (each row attends to the cache and its
//!   ancestors' rows, as the target's tree pass does), each node fed its parent's f^ from a store
//!   of the expanded nodes' features; the newest nodes are projected and ranked with the
//!   log-probabilities of their ids, which the caller ranks the tree's nodes by.

use std::sync::Arc;

use super::checkpoint::{hf_name, Checkpoint, Precision};
use super::config::Config;
use super::transformer::{record_block, BlockIo, LoadOptions, Model, MAX_BATCH};
use super::weights::{Layer, LoadProgress, Matrix, Tally, TensorRole, TensorSpec, TensorTable, Upload};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuffer, MatmulOut, Op, Second, MAX_TOP_K, MAX_TREE};

/// The most nodes one tree pass expands (its newest rows, projected together).
pub const MAX_EAGLE_WIDTH: usize = 8;

/// Slots of the store of expanded nodes' features: the root's, then every expanded node's.
pub const EAGLE_STORE_SLOTS: usize = 1 + MAX_TREE;

/// A row of a draft-tree pass ([`EagleHead::expand`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeRow {
    /// The node's token.
    pub token: u32,
    /// The store slot of its parent's predicted feature (0: the root's).
    pub input: usize,
    /// Bit j: row j of the pass is this row or its ancestor (ancestors come first, by depth).
    pub ancestors: u32,
}

/// What a pass ranked, per projected row: the `top_k` most likely ids and their
/// log-probabilities (the log-softmax of the head's logits).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ranked {
    pub ids: Vec<Vec<u32>>,
    pub logp: Vec<Vec<f32>>,
}

/// Which public layout a head's file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EagleLayout {
    /// EAGLE-1/2: `fc` over [embedding | the target's final hidden state], `layers.0.*`, the
    /// target's output projection.
    Eagle1,
    /// EAGLE-3: `fc` over three taps of the target's residual stream (after `taps[i]` layers),
    /// `midlayer.*` attending over [input_layernorm(embedding) | hidden_norm(feature)], its own
    /// `norm` and `lm_head` over `draft_vocab` ids, the target's id of draft id d being
    /// `d + d2t[d]`.
    Eagle3 { draft_vocab: usize, taps: [usize; 3] },
}

/// The head's tensors, named as in the public layout.
struct EagleTensors {
    fc: TensorSpec,
    fc_bias: TensorSpec,
    layer: super::weights::LayerTensors,
    /// EAGLE-3: `midlayer.hidden_norm`, `norm`, `lm_head`.
    eagle3: Option<[TensorSpec; 3]>,
}

impl EagleTensors {
    fn new(c: &Config, layout: EagleLayout) -> EagleTensors {
        let mut layer = TensorTable::new(c).layers.swap_remove(0);
        // `model.layers.0.*` of a Hugging Face model is `layers.0.*` in an EAGLE-1 head's file,
        // `midlayer.*` in an EAGLE-3 head's
        let prefix = match layout {
            EagleLayout::Eagle1 => "layers.0.",
            EagleLayout::Eagle3 { .. } => "midlayer.",
        };
        let rename = |t: &mut TensorSpec| {
            if let Some(hf) = hf_name(&t.name) {
                t.name = format!("{prefix}{}", hf.trim_start_matches("model.layers.0."));
            }
        };
        for t in [
            &mut layer.attn_norm,
            &mut layer.q,
            &mut layer.k,
            &mut layer.v,
            &mut layer.wo,
            &mut layer.ffn_norm,
            &mut layer.gate,
            &mut layer.up,
            &mut layer.down,
        ] {
            rename(t);
        }
        for b in layer.qkv_bias.iter_mut().flatten() {
            rename(b);
        }
        let spec = |name: &str, shape: Vec<usize>, role| TensorSpec { name: name.into(), shape, role };
        let (fc_in, eagle3) = match layout {
            EagleLayout::Eagle1 => (2 * c.dim, None),
            EagleLayout::Eagle3 { draft_vocab, .. } => {
                // q, k and v read [embedding | feature], both normalised: 2 dim wide
                for t in [&mut layer.q, &mut layer.k, &mut layer.v] {
                    t.shape[1] = 2 * c.dim;
                }
                let extra = [
                    spec("midlayer.hidden_norm.weight", vec![c.dim], TensorRole::Norm),
                    spec("norm.weight", vec![c.dim], TensorRole::Norm),
                    spec("lm_head.weight", vec![draft_vocab, c.dim], TensorRole::Weight),
                ];
                (3 * c.dim, Some(extra))
            }
        };
        EagleTensors {
            fc: spec("fc.weight", vec![c.dim, fc_in], TensorRole::Weight),
            fc_bias: spec("fc.bias", vec![c.dim], TensorRole::QkvBias),
            layer,
            eagle3,
        }
    }

    fn all(&self) -> Vec<&TensorSpec> {
        let l = &self.layer;
        let mut all = vec![
            &self.fc,
            &self.fc_bias,
            &l.attn_norm,
            &l.q,
            &l.k,
            &l.v,
            &l.wo,
            &l.ffn_norm,
            &l.gate,
            &l.up,
            &l.down,
        ];
        all.extend(l.qkv_bias.iter().flatten());
        all.extend(self.eagle3.iter().flatten());
        all
    }
}

/// An EAGLE-3 head's own tensors on the GPU.
struct Eagle3Weights {
    embed_norm: GpuBuffer<f32>,  // [dim] midlayer.input_layernorm
    hidden_norm: GpuBuffer<f32>, // [dim] midlayer.hidden_norm
    norm: GpuBuffer<f32>,        // [dim] norm (before lm_head)
    lm_head: Matrix,             // [draft_vocab, dim]
    d2t: GpuBuffer<u32>,         // [draft_vocab] the target's id of each draft id
    lastn: GpuBuffer<f32>,       // [W, dim] norm(last)
}

/// Buffers of the head, each allocated once for [`MAX_BATCH`] rows.
#[allow(dead_code)] // kept alive for the bind groups that reference them
struct HeadState {
    step: wgpu::Buffer,              // uniform Step of the head's passes
    step_table: wgpu::Buffer,        // [MAX_BATCH, 4] u32: (1, position, 0, 0) of each draft step
    one: wgpu::Buffer,               // uniform Step of one row: the last row's projection
    many: wgpu::Buffer,              // uniform Step of a tree pass's projected rows
    drafts: GpuBuffer<u32>,          // [MAX_BATCH, top_k] the top ids of each draft step
    rows: GpuBuffer<u32>,            // [MAX_BATCH] the target's rows a pass gathers
    tokens: GpuBuffer<u32>,          // [MAX_BATCH] t_{p+1} of each row
    feat: GpuBuffer<f32>,            // [MAX_BATCH, dim] f_p of each row (EAGLE-1)
    embd: GpuBuffer<f32>,            // [MAX_BATCH, dim] the tokens' embeddings
    cat: GpuBuffer<f32>,             // [MAX_BATCH, 2 dim] [embd | feat]; EAGLE-3: [MAX_BATCH, 3 dim]
    x: GpuBuffer<f32>,               // [MAX_BATCH, dim] residual stream: f^ at the end of a pass
    xb: GpuBuffer<f32>,              // [MAX_BATCH, dim]
    q: GpuBuffer<f32>,               // [MAX_BATCH, q_dim]
    att: GpuBuffer<f32>,             // [MAX_BATCH, q_dim]
    scores: GpuBuffer<f32>,          // [MAX_BATCH, n_heads, context]
    hb: GpuBuffer<f32>,              // [MAX_BATCH, ffn_dim]
    logits: GpuBuffer<f32>,          // [W, vocab] the projected rows' (W = MAX_EAGLE_WIDTH)
    last: GpuBuffer<f32>,            // [W, dim] the projected rows' f^ (row 0: where a chain goes on)
    top: GpuBuffer<u32>,             // [W, top_k] the projected rows' most likely ids
    logp: GpuBuffer<f32>,            // [W, top_k] their log-probabilities
    store: GpuBuffer<f32>,           // [EAGLE_STORE_SLOTS, dim] f^ of a draft tree's expanded nodes
    ranked: GpuBuffer<u32>,          // [2, 1 + W, top_k] what a tree pass read back: ids, logp bits
    kv: GpuBuffer<f32>,              // [context, 2 kv_dim]
    cos_sin: GpuBuffer<f32>,         // [context, rope_dim / 2, 2]
    fc: Matrix,                      // [dim, 2 dim] (EAGLE-3: [dim, 3 dim])
    fc_bias: Option<GpuBuffer<f32>>, // [dim]
    layer: Layer,
    eagle3: Option<Eagle3Weights>,
}

/// An EAGLE head on the GPU for one target (see the module's doc).
pub struct EagleHead {
    /// The head's config (one layer; the target's vocabulary).
    pub config: Config,
    layout: EagleLayout,
    gpu: Arc<Gpu>,
    state: HeadState,
    /// Takes the target's features of `rows` (EAGLE-1: into `feat`; EAGLE-3: through fc into x).
    gather: Vec<Op>,
    /// A pass over its rows: embedding, the layer's input, the layer.
    pass: Vec<Op>,
    /// The last row's projection and top-k (one row, from `last`).
    project: Vec<Op>,
    /// A tree pass's projection and top-k (its `many` rows, from `last`).
    project_many: Vec<Op>,
    top_k: usize,
    context: usize,
    /// Positions in the head's KV cache.
    len: usize,
    gpu_bytes: u64,
    memory_bytes: u64,
}

impl EagleHead {
    /// The head's config from its `config.json`, checked against the target's: the same
    /// width and vocabulary (the head reads the target's features and embeddings; an EAGLE-1
    /// head also its projection). An EAGLE-3 config (`LlamaForCausalLMEagle3`) reads as llama.
    pub fn config_for(target: &Config, config_json: &[u8]) -> Result<Config> {
        let mut json: serde_json::Value = serde_json::from_slice(config_json)
            .map_err(|e| Error::Metadata { key: "config.json".into(), message: e.to_string() })?;
        if let Some(arch) = json.pointer_mut("/architectures/0") {
            if arch.as_str().is_some_and(|a| a.ends_with("Eagle3")) {
                *arch = "LlamaForCausalLM".into();
            }
        }
        let c = Config::from_hf_json(json.to_string().as_bytes())?;
        if c.dim != target.dim || c.vocab_size != target.vocab_size {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head of width {} and vocabulary {} for a target of {} and {}",
                c.dim, c.vocab_size, target.dim, target.vocab_size
            )));
        }
        Ok(c)
    }

    /// The layout of the head in `ckpt` (EAGLE-3 when it has `midlayer.*` tensors), with an
    /// EAGLE-3 head's draft vocabulary (its `lm_head` rows) and feature taps: `config.json`'s
    /// `eagle_aux_hidden_state_layer_ids` (top level or in `eagle_config`; vLLM's meaning: the
    /// residual stream after that many target layers), else the default after 2, N / 2 and
    /// N - 3 of the target's N layers.
    pub fn layout_of(target: &Config, config_json: &[u8], ckpt: &Checkpoint) -> Result<EagleLayout> {
        let shapes = ckpt.tensor_shapes();
        if !shapes.iter().any(|(name, _)| name.starts_with("midlayer.")) {
            return Ok(EagleLayout::Eagle1);
        }
        let lm_head = shapes.iter().find(|(name, _)| *name == "lm_head.weight");
        let draft_vocab = match lm_head.map(|(_, shape)| *shape) {
            Some(&[rows, _]) if rows > 0 && rows <= target.vocab_size => rows,
            Some(shape) => {
                return Err(Error::InvalidArgument(format!(
                    "an EAGLE-3 head's lm_head.weight of shape {shape:?} for a vocabulary of {}",
                    target.vocab_size
                )))
            }
            None => return Err(Error::MissingTensor { name: "lm_head.weight".into() }),
        };
        let json: serde_json::Value = serde_json::from_slice(config_json)
            .map_err(|e| Error::Metadata { key: "config.json".into(), message: e.to_string() })?;
        let ids = json
            .pointer("/eagle_config/eagle_aux_hidden_state_layer_ids")
            .or_else(|| json.get("eagle_aux_hidden_state_layer_ids"));
        let n = target.n_layers;
        let taps = match ids {
            None => [2.min(n), n / 2, n.saturating_sub(3)],
            Some(v) => {
                let ids: Vec<usize> = serde_json::from_value(v.clone()).unwrap_or_default();
                match ids.as_slice() {
                    &[a, b, c] if [a, b, c].iter().all(|&l| l <= n) => [a, b, c],
                    _ => {
                        return Err(Error::Metadata {
                            key: "config.json eagle_aux_hidden_state_layer_ids".into(),
                            message: format!("{v} is not three layer counts up to {n}"),
                        })
                    }
                }
            }
        };
        Ok(EagleLayout::Eagle3 { draft_vocab, taps })
    }

    /// GPU memory the head takes when loaded with these arguments (weights as kept, cache,
    /// scratch), from the headers alone.
    pub fn plan(
        target: &Model,
        ckpt: &Checkpoint,
        layout: EagleLayout,
        precision: Precision,
        top_k: usize,
    ) -> Result<u64> {
        let c = &ckpt.config;
        let t = EagleTensors::new(c, layout);
        let mut bytes = 0;
        for spec in t.all().into_iter().filter(|s| ckpt.has(&s.name)) {
            let n = spec.shape.iter().product::<usize>() as u64;
            let kept = precision == Precision::Auto && spec.shape.len() > 1;
            let stored = ckpt.dtype(&spec.name, &spec.shape)?.bytes_for(n).unwrap_or(4 * n);
            bytes += if kept { stored } else { 4 * n };
        }
        let (ctx, batch) = (target.context() as u64, MAX_BATCH as u64);
        let (cat, out_vocab, extra) = match layout {
            EagleLayout::Eagle1 => (2 * c.dim, c.vocab_size, 0),
            // lastn, d2t
            EagleLayout::Eagle3 { draft_vocab, .. } => {
                (3 * c.dim, draft_vocab, MAX_EAGLE_WIDTH * c.dim + draft_vocab)
            }
        };
        // per row: rows, tokens, feat, embd, cat, x, xb, q, att, hb, drafts; then the
        // projected rows' last, logits, top and logp, the store and the read-back
        let widths = (4 * c.dim + cat + 2 * c.q_dim() + c.ffn_dim + top_k + 2) as u64;
        let projected = (MAX_EAGLE_WIDTH * (c.dim + out_vocab + 2 * top_k) + extra) as u64;
        let store = (EAGLE_STORE_SLOTS * c.dim + 2 * (1 + MAX_EAGLE_WIDTH) * top_k) as u64;
        let cache = ctx * (2 * c.kv_dim() + c.rope_dim) as u64;
        Ok(bytes + 4 * (batch * (widths + c.n_heads as u64 * ctx) + projected + store + cache))
    }

    /// Uploads the head of `ckpt` (a [`Checkpoint::from_named_safetensors`] of its file with the
    /// config from [`EagleHead::config_for`]), of `layout` ([`EagleHead::layout_of`]), for
    /// `target`, whose hidden states (an EAGLE-3 head: its feature taps, which
    /// [`Model::set_feature_taps`] must have set to the layout's), embedding table and (EAGLE-1)
    /// output projection it reads, ranking `top_k` ids per row (at most [`MAX_TOP_K`]). `opts`
    /// gives the precision, the largest weight buffer and the bytes read at once.
    pub async fn load(
        target: &Model,
        ckpt: &Checkpoint,
        layout: EagleLayout,
        opts: &LoadOptions,
        top_k: usize,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<EagleHead> {
        let c = ckpt.config.clone();
        if top_k == 0 || top_k > MAX_TOP_K {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head ranks 1..={MAX_TOP_K} ids, not {top_k}"
            )));
        }
        if c.n_layers != 1 {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head is one decoder layer; its config.json declares {}",
                c.n_layers
            )));
        }
        let taps = match layout {
            EagleLayout::Eagle1 => None,
            EagleLayout::Eagle3 { taps, .. } => match target.feature_taps() {
                Some((layers, buf)) if layers == taps => Some(buf),
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "an EAGLE-3 head reads the target's residual stream after {taps:?} layers: \
                         set those feature taps on the target first (Model::set_feature_taps)"
                    )))
                }
            },
        };
        let gpu = target.gpu().clone();
        let g = &*gpu;
        let t = EagleTensors::new(&c, layout);
        let context = target.context();
        let bytes = ckpt.tensor_shapes().len();
        let tally = std::cell::RefCell::new(Tally::new(bytes, ckpt.file_bytes(), progress));
        let max_bytes = opts.max_chunk_bytes.unwrap_or(u64::MAX).min(g.max_binding_bytes());
        let precision = opts.precision;
        let up = Upload { gpu: g, ckpt, precision, max_bytes, read_bytes: opts.read_bytes, tally };
        let fc = up.matrix(&t.fc).await?;
        let fc_bias = match ckpt.has(&t.fc_bias.name) {
            true => Some(GpuBuffer::<f32>::from_slice(g, "fc.bias", &up.vector(&t.fc_bias).await?)),
            false => None,
        };
        let mut layer = Layer::load(&up, &c, &t.layer, 0, true).await?;
        let f32s = |label: &str, len: usize| GpuBuffer::<f32>::zeros(g, label, len);
        let eagle3 = match (&t.eagle3, layout) {
            (Some([hidden_norm, norm, lm_head]), EagleLayout::Eagle3 { draft_vocab, .. }) => {
                // input_layernorm normalises the embedding alone, not the layer's input
                let embed_norm = layer
                    .attn_norm
                    .take()
                    .ok_or_else(|| Error::MissingTensor { name: t.layer.attn_norm.name.clone() })?;
                let d2t = match ckpt.index_tensor("d2t", draft_vocab) {
                    Ok(d2t) => d2t,
                    Err(Error::MissingTensor { .. }) if draft_vocab == c.vocab_size => vec![0; draft_vocab],
                    Err(e) => return Err(e),
                };
                let table: Vec<u32> = d2t
                    .iter()
                    .enumerate()
                    .map(|(d, &off)| {
                        u32::try_from(d as i64 + off)
                            .ok()
                            .filter(|&t| (t as usize) < c.vocab_size)
                            .ok_or_else(|| {
                                Error::InvalidArgument(format!(
                                    "d2t maps draft id {d} to {} outside the target's {} ids",
                                    d as i64 + off,
                                    c.vocab_size
                                ))
                            })
                    })
                    .collect::<Result<_>>()?;
                Some(Eagle3Weights {
                    embed_norm,
                    hidden_norm: GpuBuffer::<f32>::from_slice(
                        g,
                        "hidden_norm",
                        &up.vector(hidden_norm).await?,
                    ),
                    norm: GpuBuffer::<f32>::from_slice(g, "norm", &up.vector(norm).await?),
                    lm_head: up.matrix(lm_head).await?,
                    d2t: GpuBuffer::<u32>::from_slice(g, "d2t", &table),
                    lastn: f32s("eagle lastn", MAX_EAGLE_WIDTH * c.dim),
                })
            }
            _ => None,
        };
        let (cat_width, out_vocab) = match layout {
            EagleLayout::Eagle1 => (2 * c.dim, c.vocab_size),
            EagleLayout::Eagle3 { draft_vocab, .. } => (3 * c.dim, draft_vocab),
        };
        let rope = super::transformer::rope_table(&c, context);
        let state = HeadState {
            step: g.step_buffer(),
            one: {
                let one = g.step_buffer();
                g.write_step(&one, 1, 0);
                one
            },
            many: g.step_buffer(),
            step_table: g.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("eagle step table"),
                size: (MAX_BATCH * 16) as u64,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            drafts: GpuBuffer::<u32>::zeros(g, "eagle drafts", MAX_BATCH * top_k),
            rows: GpuBuffer::<u32>::zeros(g, "eagle rows", MAX_BATCH),
            tokens: GpuBuffer::<u32>::zeros(g, "eagle tokens", MAX_BATCH),
            feat: f32s("eagle feat", MAX_BATCH * c.dim),
            embd: f32s("eagle embd", MAX_BATCH * c.dim),
            cat: f32s("eagle cat", MAX_BATCH * cat_width),
            x: f32s("eagle x", MAX_BATCH * c.dim),
            xb: f32s("eagle xb", MAX_BATCH * c.dim),
            q: f32s("eagle q", MAX_BATCH * c.q_dim()),
            att: f32s("eagle att", MAX_BATCH * c.q_dim()),
            scores: f32s("eagle scores", MAX_BATCH * c.n_heads * context),
            hb: f32s("eagle hb", MAX_BATCH * c.ffn_dim),
            logits: f32s("eagle logits", MAX_EAGLE_WIDTH * out_vocab),
            last: f32s("eagle last", MAX_EAGLE_WIDTH * c.dim),
            top: GpuBuffer::<u32>::zeros(g, "eagle top", MAX_EAGLE_WIDTH * top_k),
            logp: f32s("eagle logp", MAX_EAGLE_WIDTH * top_k),
            store: f32s("eagle store", EAGLE_STORE_SLOTS * c.dim),
            ranked: GpuBuffer::<u32>::zeros(g, "eagle ranked", 2 * (1 + MAX_EAGLE_WIDTH) * top_k),
            kv: f32s("eagle kv", context * 2 * c.kv_dim()),
            cos_sin: GpuBuffer::<f32>::from_slice(g, "eagle rope cos/sin", &rope),
            fc,
            fc_bias,
            layer,
            eagle3,
        };
        g.take_error()?;
        let s = &state;
        let st = &s.step;
        let eps = c.rms_eps;
        let mut gather = Vec::new();
        let mut pass = target.embed_ops(st, &s.tokens, &s.embd);
        let io = BlockIo {
            step: st,
            x: &s.x,
            xb: &s.xb,
            q: &s.q,
            att: &s.att,
            scores: &s.scores,
            hb: &s.hb,
            cos_sin: &s.cos_sin,
            context,
            qkv_input: s.eagle3.as_ref().map(|_| &s.cat),
        };
        match (&s.eagle3, taps) {
            (Some(e3), Some(taps)) => {
                // the target's taps of the gathered rows, fc: x = g                   [n, dim]
                let width = 3 * c.dim;
                gather.push(g.gather_rows(st, taps, Some(&s.rows), None, (&s.cat, width, 0), width));
                let out = MatmulOut { ldy: c.dim as u32, ..Default::default() };
                gather.extend(s.fc.matmul(g, st, &s.cat, s.fc_bias.as_ref(), &s.x, out));
                // cat = [input_layernorm(e) | hidden_norm(g)]                         [n, 2 dim]
                let ld = 2 * c.dim;
                pass.push(g.gather_rows(
                    st,
                    &s.embd,
                    None,
                    Some((&e3.embed_norm, eps)),
                    (&s.cat, ld, 0),
                    c.dim,
                ));
                pass.push(g.gather_rows(
                    st,
                    &s.x,
                    None,
                    Some((&e3.hidden_norm, eps)),
                    (&s.cat, ld, c.dim),
                    c.dim,
                ));
            }
            _ => {
                // the target's final hidden states of the gathered rows                [n, dim]
                let (raw, norm) = target.hidden_buffers();
                let target_eps = target.config.rms_eps;
                gather.push(g.gather_rows(
                    st,
                    raw,
                    Some(&s.rows),
                    Some((norm, target_eps)),
                    (&s.feat, c.dim, 0),
                    c.dim,
                ));
                // cat = [e | f]; x = cat fc^T + b (and xb = x * the layer's input norm)  [n, dim]
                pass.push(g.concat(st, (&s.embd, c.dim), (&s.feat, c.dim), &s.cat));
                let second = s.layer.attn_norm.as_ref().map(|gamma| Second::Scaled { out: &s.xb, gamma });
                let fc_out = MatmulOut { ldy: c.dim as u32, second, ..Default::default() };
                pass.extend(s.fc.matmul(g, st, &s.cat, s.fc_bias.as_ref(), &s.x, fc_out));
            }
        }
        // x += attention, mlp: the predicted feature f^                             [n, dim]
        pass.extend(record_block(g, &c, &s.layer, &s.kv, &io, None));
        // (the projected rows' f^ copied to `last`) their logits, top-k ids and log-probabilities
        // EAGLE-1: last . the target's output^T (no norm)                        [1 or m, vocab]
        // EAGLE-3: norm(last) . lm_head^T, ids renamed by d2t              [1 or m, draft vocab]
        let out = MatmulOut { ldy: out_vocab as u32, ..Default::default() };
        let projection = |step: &wgpu::Buffer| {
            let mut ops = match &s.eagle3 {
                Some(e3) => {
                    let mut ops = vec![g.gather_rows(
                        step,
                        &s.last,
                        None,
                        Some((&e3.norm, eps)),
                        (&e3.lastn, c.dim, 0),
                        c.dim,
                    )];
                    ops.extend(e3.lm_head.matmul(g, step, &e3.lastn, None, &s.logits, out));
                    ops
                }
                None => target.output_ops(step, &s.last, &s.logits, out),
            };
            ops.push(g.top_k(step, &s.logits, (&s.top, Some(&s.logp)), out_vocab, top_k));
            if let Some(e3) = &s.eagle3 {
                ops.push(g.map_ids(step, &e3.d2t, &s.top, top_k));
            }
            ops
        };
        let (project, project_many) = (projection(&s.one), projection(&s.many));
        let gpu_bytes = s.fc.gpu_bytes()
            + s.fc_bias.as_ref().map_or(0, |b| b.raw.size())
            + [&s.layer.qkv, &s.layer.wo, &s.layer.gate_up, &s.layer.down]
                .iter()
                .map(|m| m.gpu_bytes())
                .sum::<u64>()
            + s.layer.attn_norm.as_ref().map_or(0, |b| b.raw.size())
            + s.layer.ffn_norm.raw.size()
            + s.layer.qkv_bias.as_ref().map_or(0, |b| b.raw.size())
            + s.eagle3.as_ref().map_or(0, |e| {
                e.lm_head.gpu_bytes() + e.embed_norm.raw.size() + e.hidden_norm.raw.size() + e.norm.raw.size()
            });
        let memory_bytes = EagleHead::plan(target, ckpt, layout, precision, top_k)?;
        Ok(EagleHead {
            config: c,
            layout,
            gpu,
            state,
            gather,
            pass,
            project,
            project_many,
            top_k,
            context,
            len: 0,
            gpu_bytes,
            memory_bytes,
        })
    }

    /// The head's layout.
    pub fn layout(&self) -> EagleLayout {
        self.layout
    }

    /// Where a pass's rows take their feature from: EAGLE-1's `feat` (fc follows), EAGLE-3's x
    /// (the residual stream, fc already applied to the target's taps).
    fn feature_in(&self) -> &GpuBuffer<f32> {
        match self.state.eagle3 {
            Some(_) => &self.state.x,
            None => &self.state.feat,
        }
    }

    /// Ids ranked per row.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Bytes of GPU memory the head's weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.gpu_bytes
    }

    /// GPU memory the head takes in all: weights, KV cache and scratch.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Positions in the head's KV cache.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the head's cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// KV cache positions allocated (the target's context).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Rolls the head's cache back to its first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Records a head pass over the target's rows `rows` of its last pass (positions
    /// `start_pos..`, each row's next token in `next`): the target's features of those rows, each
    /// with its next token, through the head. Rows and tokens are written by the host, so this
    /// must be the first head pass of a submission. Submitted without a read-back; the last row's
    /// output (the feature f^ and the top ids) is where drafting continues ([`EagleHead::draft`]).
    pub fn run_target_rows(&mut self, rows: &[usize], next: &[u32], start_pos: usize) -> Result<()> {
        let n = rows.len();
        if n == 0 || n > MAX_BATCH || next.len() != n || start_pos > self.len || start_pos + n > self.context
        {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE pass of {n} rows ({} tokens) at {start_pos} of a cache of {} positions",
                next.len(),
                self.len
            )));
        }
        if let Some(&id) = next.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::TokenOutOfRange { id, vocab: self.config.vocab_size });
        }
        let g = &*self.gpu;
        let rows: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        g.queue.write_buffer(&self.state.rows.raw, 0, bytemuck::cast_slice(&rows));
        g.queue.write_buffer(&self.state.tokens.raw, 0, bytemuck::cast_slice(next));
        g.write_step(&self.state.step, n, start_pos);
        let mut enc = g.encoder();
        g.encode(&mut enc, &self.gather, n as u32);
        self.encode_pass(&mut enc, n);
        g.submit(enc);
        self.len = start_pos + n;
        Ok(())
    }

    /// A pass of `n` rows (its step uniform set), then the last row's f^ copied to `last` and
    /// projected.
    fn encode_pass(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        let (g, s) = (&*self.gpu, &self.state);
        let row = 4 * self.config.dim as u64;
        g.encode(enc, &self.pass, n as u32);
        enc.copy_buffer_to_buffer(&s.x.raw, (n as u64 - 1) * row, &s.last.raw, 0, row);
        g.encode(enc, &self.project, 1);
    }

    /// The ids ranked at the last row of the latest pass, then `steps` draft steps, each a
    /// one-row pass at the next position whose input is the previous pass's last feature f^ and
    /// most likely id: `[1 + steps][top_k]` ids. One submission (each step's position copied into
    /// the step uniform by the GPU, from a table written before), one read-back.
    pub async fn draft(&mut self, steps: usize) -> Result<Vec<Vec<u32>>> {
        if steps >= MAX_BATCH || self.len + steps > self.context {
            return Err(Error::InvalidArgument(format!(
                "{steps} EAGLE draft steps at {} of {} positions",
                self.len, self.context
            )));
        }
        let g = self.gpu.clone();
        let s = &self.state;
        let (dim, k, word) = (self.config.dim as u64, self.top_k as u64, 4u64);
        let table: Vec<u32> = (0..steps).flat_map(|i| [1, (self.len + i) as u32, 0, 0]).collect();
        if !table.is_empty() {
            g.queue.write_buffer(&s.step_table, 0, bytemuck::cast_slice(&table));
        }
        let mut enc = g.encoder();
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, 0, k * word);
        for i in 0..steps as u64 {
            // the input: the previous pass's last feature and most likely id
            enc.copy_buffer_to_buffer(&s.last.raw, 0, &self.feature_in().raw, 0, dim * word);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.tokens.raw, 0, word);
            enc.copy_buffer_to_buffer(&s.step_table, i * 16, &s.step, 0, 16);
            self.encode_pass(&mut enc, 1);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, (1 + i) * k * word, k * word);
        }
        self.len += steps;
        let bytes = (1 + steps as u64) * k * word;
        let raw = g.submit_and_read(enc, &s.drafts.raw, 0, bytes).await?;
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        Ok(ids.chunks(self.top_k).map(<[u32]>::to_vec).collect())
    }

    /// The first step of a draft tree: the ids ranked at the latest pass's last row (the root's
    /// children), then a tree pass expanding the `width` most likely of them (each fed the
    /// root's f^, at the next position): `1 + width` rows of ranks, the root's first. The root's
    /// f^ goes to store slot 0 and the expanded nodes' to slots `1..=width`. The expanded ids
    /// are copied on the GPU, so the whole step is one submission and one read-back.
    pub async fn expand_root(&mut self, width: usize) -> Result<Ranked> {
        if width > MAX_EAGLE_WIDTH.min(self.top_k) || self.len + width > self.context {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE tree pass expanding {width} of {} ids at {} of {} positions",
                self.top_k, self.len, self.context
            )));
        }
        let g = self.gpu.clone();
        let s = &self.state;
        let (dim, k, word) = (self.config.dim as u64 * 4, self.top_k as u64, 4u64);
        let mut enc = g.encoder();
        enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.store.raw, 0, dim);
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.ranked.raw, 0, k * word);
        enc.copy_buffer_to_buffer(&s.logp.raw, 0, &s.ranked.raw, self.logp_offset(), k * word);
        if width > 0 {
            let forest: Vec<u32> = (0..width).map(|i| 1 << i).collect();
            g.write_tree_step(&s.step, self.len, &forest);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.tokens.raw, 0, width as u64 * word);
            for i in 0..width as u64 {
                enc.copy_buffer_to_buffer(&s.last.raw, 0, &self.feature_in().raw, i * dim, dim);
            }
            self.encode_tree_pass(&mut enc, width, width, 1, 1);
        }
        self.read_ranked(enc, 1 + width).await
    }

    /// A further step of a draft tree: a tree pass over `rows` at the positions after the
    /// head's cache (each row at its depth in the pass), whose last `newest` rows are projected
    /// and ranked, their f^ saved to store slots `save_at..` (where later rows find their
    /// parents' features). One submission, one read-back of `[newest]` rows of ranks.
    pub async fn expand(&mut self, rows: &[TreeRow], newest: usize, save_at: usize) -> Result<Ranked> {
        let n = rows.len();
        let bad_row = rows.iter().enumerate().any(|(i, r)| {
            r.input >= EAGLE_STORE_SLOTS
                || r.ancestors >> i != 1
                || r.token as usize >= self.config.vocab_size
        });
        if n == 0
            || n > MAX_TREE
            || newest == 0
            || newest > n.min(MAX_EAGLE_WIDTH)
            || save_at + newest > EAGLE_STORE_SLOTS
            || self.len + n > self.context
            || bad_row
        {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE tree pass of {n} rows ({newest} newest, saved at {save_at}) at {} of {} \
                 positions: rows must be at most {MAX_TREE}, each its own last ancestor, with known \
                 tokens and store slots",
                self.len, self.context
            )));
        }
        let g = self.gpu.clone();
        let s = &self.state;
        let dim = self.config.dim as u64 * 4;
        let ancestors: Vec<u32> = rows.iter().map(|r| r.ancestors).collect();
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        g.write_tree_step(&s.step, self.len, &ancestors);
        g.queue.write_buffer(&s.tokens.raw, 0, bytemuck::cast_slice(&tokens));
        let mut enc = g.encoder();
        for (i, r) in rows.iter().enumerate() {
            enc.copy_buffer_to_buffer(
                &s.store.raw,
                r.input as u64 * dim,
                &self.feature_in().raw,
                i as u64 * dim,
                dim,
            );
        }
        self.encode_tree_pass(&mut enc, n, newest, save_at, 0);
        self.read_ranked(enc, newest).await
    }

    /// Byte offset of the log-probabilities in `ranked`.
    fn logp_offset(&self) -> u64 {
        (4 * (1 + MAX_EAGLE_WIDTH) * self.top_k) as u64
    }

    /// A tree pass of `n` rows (its step written), its last `m` rows' f^ saved to store slots
    /// `save_at..` and projected, their ranks copied to `ranked` from row `ranked_row`.
    fn encode_tree_pass(
        &self,
        enc: &mut wgpu::CommandEncoder,
        n: usize,
        m: usize,
        save_at: usize,
        ranked_row: usize,
    ) {
        let (g, s) = (&*self.gpu, &self.state);
        let (dim, k) = (self.config.dim as u64 * 4, self.top_k as u64 * 4);
        let (n, m) = (n as u64, m as u64);
        g.write_step(&s.many, m as usize, 0);
        g.encode(enc, &self.pass, n as u32);
        enc.copy_buffer_to_buffer(&s.x.raw, (n - m) * dim, &s.last.raw, 0, m * dim);
        enc.copy_buffer_to_buffer(&s.x.raw, (n - m) * dim, &s.store.raw, save_at as u64 * dim, m * dim);
        g.encode(enc, &self.project_many, m as u32);
        let at = ranked_row as u64 * k;
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.ranked.raw, at, m * k);
        enc.copy_buffer_to_buffer(&s.logp.raw, 0, &s.ranked.raw, self.logp_offset() + at, m * k);
    }

    /// Submits `enc` and reads back the first `rows` rows of `ranked`.
    async fn read_ranked(&self, enc: wgpu::CommandEncoder, rows: usize) -> Result<Ranked> {
        let s = &self.state;
        let raw = self.gpu.submit_and_read(enc, &s.ranked.raw, 0, s.ranked.raw.size()).await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let (ids, logp) = words.split_at(words.len() / 2);
        let k = self.top_k;
        Ok(Ranked {
            ids: ids.chunks(k).take(rows).map(<[u32]>::to_vec).collect(),
            logp: logp.chunks(k).take(rows).map(|c| c.iter().map(|&b| f32::from_bits(b)).collect()).collect(),
        })
    }

    /// The head's output features of the latest pass's first `n` rows, `[n, dim]` (tests compare
    /// them with a reference).
    pub async fn features(&self, n: usize) -> Result<Vec<f32>> {
        let bytes = (n.min(MAX_BATCH) * self.config.dim * 4) as u64;
        let raw = self.gpu.submit_and_read(self.gpu.encoder(), &self.state.x.raw, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// The top ids of the latest pass's last row, `[top_k]`.
    pub async fn top_ids(&self) -> Result<Vec<u32>> {
        let bytes = (self.top_k * 4) as u64;
        let raw = self.gpu.submit_and_read(self.gpu.encoder(), &self.state.top.raw, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }
}
