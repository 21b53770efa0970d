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
//! drafting continues from. A pass over the target's kept rows leaves that projection to the next
//! draft: a cycle that drafts nothing (a plain step) never reads the output matrix.
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
use crate::gpu::{
    reduce_slices, EagleTreeParams, Gpu, GpuBuffer, MatmulOut, Op, Second, EAGLE_TREE_MANY,
    EAGLE_TREE_NEWEST, EAGLE_TREE_OUT, EAGLE_TREE_RESULT, EAGLE_TREE_SLOTS, EAGLE_TREE_STATE,
    EAGLE_TREE_STEP, EAGLE_TREE_TOKENS, MAX_TOP_K, MAX_TREE,
};
use bytemuck::Zeroable;

/// The most nodes one tree pass expands (its newest rows, projected together).
pub const MAX_EAGLE_WIDTH: usize = 8;

/// The deepest draft tree (depth 1 comes from the target's pass, each further depth is one
/// head pass).
pub const MAX_EAGLE_DEPTH: usize = 16;

/// Slots of the store of expanded nodes' features: the root's, then each pass's expanded nodes.
pub const EAGLE_STORE_SLOTS: usize = 1 + (MAX_EAGLE_DEPTH - 1) * MAX_EAGLE_WIDTH;

/// How a draft tree is grown ([`EagleHead::draft_tree`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeShape {
    /// At most this deep (<= [`MAX_EAGLE_DEPTH`]).
    pub depth: usize,
    /// Nodes expanded per depth (<= [`MAX_EAGLE_WIDTH`] and the head's top-k).
    pub width: usize,
    /// Drafted nodes the tree may hold (<= [`MAX_TREE`] - 1).
    pub max_nodes: usize,
    /// With measured costs (`verify[n - 1]`: seconds of a verify pass of n rows; seconds per
    /// draft pass), the number of nodes maximises expected tokens per second instead of
    /// filling `max_nodes`, each node's chance of acceptance being `calibration * exp(score)`.
    pub costs: Option<([f32; MAX_TREE], f32)>,
    pub calibration: f32,
}

/// A draft tree as the GPU chose it: its nodes by depth (best first within a depth).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftedTree {
    pub tokens: Vec<u32>,
    /// Each node's parent among the nodes before it; `None`: a child of the root.
    pub parents: Vec<Option<usize>>,
    /// The sum of the nodes' path probabilities (uncalibrated): their predicted accepted number.
    pub predicted: f32,
    /// Head passes run.
    pub passes: usize,
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

impl EagleLayout {
    /// Columns of fc's input (`cat`) and ids the head ranks, for a head of width `dim` drafting
    /// for a vocabulary of `vocab` ids.
    fn widths(self, dim: usize, vocab: usize) -> (usize, usize) {
        match self {
            EagleLayout::Eagle1 => (2 * dim, vocab),
            EagleLayout::Eagle3 { draft_vocab, .. } => (3 * dim, draft_vocab),
        }
    }
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
    scores: GpuBuffer<f32>,          // attention scratch (Gpu::attention_scratch_len for MAX_BATCH rows)
    hb: GpuBuffer<f32>,              // [MAX_BATCH, ffn_dim]
    logits: GpuBuffer<f32>,          // [W, vocab] the projected rows' (W = MAX_EAGLE_WIDTH)
    last: GpuBuffer<f32>,            // [W, dim] the projected rows' f^ (row 0: where a chain goes on)
    top: GpuBuffer<u32>,             // [W, top_k] the projected rows' most likely ids
    logp: GpuBuffer<f32>,            // [W, top_k] their log-probabilities
    store: GpuBuffer<f32>,           // [EAGLE_STORE_SLOTS, dim] f^ of a draft tree's expanded nodes
    tree_state: GpuBuffer<u32>,      // [EAGLE_TREE_STATE] the draft tree's candidates
    tree_out: GpuBuffer<u32>,        // [EAGLE_TREE_OUT] the next tree pass, the chosen tree
    tree_rows: GpuBuffer<u32>,       // [MAX_TREE] the store slot each tree-pass row reads
    tree_newest: GpuBuffer<u32>,     // [W] the tree pass's rows to project
    tree_params: Vec<wgpu::Buffer>,  // [MAX_EAGLE_DEPTH] uniform EagleTreeParams per call
    kv: GpuBuffer<u32>,              // [context, 2 kv_dim] f32 bits (a head's cache stays f32)
    cos_sin: GpuBuffer<f32>,         // [context, rope_dim / 2, 2]
    fc: Matrix,                      // [dim, 2 dim] (EAGLE-3: [dim, 3 dim])
    fc_bias: Option<GpuBuffer<f32>>, // [dim]
    layer: Layer,
    eagle3: Option<Eagle3Weights>,
}

impl HeadState {
    /// Where a pass's rows take their feature from: EAGLE-1's `feat` (fc follows), EAGLE-3's x
    /// (the residual stream, fc already applied to the target's taps).
    fn feature_in(&self) -> &GpuBuffer<f32> {
        match self.eagle3 {
            Some(_) => &self.x,
            None => &self.feat,
        }
    }
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
    /// The draft tree's calls of `eagle_tree.wgsl`: the start, then one per expansion (the last
    /// one also finishes).
    tree_calls: Vec<Op>,
    /// A tree pass's features: each row's parent's, from the store.
    tree_features: Op,
    /// A tree pass's newest rows to `last` (to project them).
    tree_last: Op,
    /// Per expansion: its newest rows to their store slots.
    tree_store: Vec<Op>,
    top_k: usize,
    context: usize,
    /// Positions in the head's KV cache.
    len: usize,
    /// The last pass's row is in `last` but not yet projected: the next draft projects it first
    /// (a plain cycle, which drafts nothing, then never reads the output matrix).
    unprojected: bool,
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
        let (cat, out_vocab) = layout.widths(c.dim, c.vocab_size);
        let extra = match layout {
            EagleLayout::Eagle1 => 0,
            // lastn, d2t
            EagleLayout::Eagle3 { draft_vocab, .. } => MAX_EAGLE_WIDTH * c.dim + draft_vocab,
        };
        // per row: rows, tokens, feat, embd, cat, x, xb, q, att, hb, drafts; then the
        // projected rows' last, logits, top and logp, the top-k's candidates and sums of each
        // slice of the logits, the store and the read-back
        let widths = (4 * c.dim + cat + 2 * c.q_dim() + c.ffn_dim + top_k + 2) as u64;
        // (twice: the one-row and the many-row projections each rank into their own)
        let ranking = 2 * 2 * reduce_slices(out_vocab) * (top_k + 1);
        let projected = (MAX_EAGLE_WIDTH * (c.dim + out_vocab + 2 * top_k + ranking) + extra) as u64;
        let store =
            (EAGLE_STORE_SLOTS * c.dim + EAGLE_TREE_STATE + EAGLE_TREE_OUT + MAX_TREE + MAX_EAGLE_WIDTH)
                as u64;
        let cache = ctx * (2 * c.kv_dim() + c.rope_dim) as u64;
        let attention =
            target.gpu().attention_scratch_len(c.attention_shape(ctx as usize, false), MAX_BATCH) as u64;
        Ok(bytes + 4 * (batch * widths + attention + projected + store + cache))
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
        let up = Upload::new(g, ckpt, opts, Tally::new(bytes, ckpt.file_bytes(), progress));
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
        let (cat_width, out_vocab) = layout.widths(c.dim, c.vocab_size);
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
            scores: f32s(
                "eagle scores",
                g.attention_scratch_len(c.attention_shape(context, false), MAX_BATCH),
            ),
            hb: f32s("eagle hb", MAX_BATCH * c.ffn_dim),
            logits: f32s("eagle logits", MAX_EAGLE_WIDTH * out_vocab),
            last: f32s("eagle last", MAX_EAGLE_WIDTH * c.dim),
            top: GpuBuffer::<u32>::zeros(g, "eagle top", MAX_EAGLE_WIDTH * top_k),
            logp: f32s("eagle logp", MAX_EAGLE_WIDTH * top_k),
            store: f32s("eagle store", EAGLE_STORE_SLOTS * c.dim),
            tree_state: GpuBuffer::<u32>::zeros(g, "eagle tree state", EAGLE_TREE_STATE),
            tree_out: GpuBuffer::<u32>::zeros(g, "eagle tree out", EAGLE_TREE_OUT),
            tree_rows: GpuBuffer::<u32>::zeros(g, "eagle tree rows", MAX_TREE),
            tree_newest: GpuBuffer::<u32>::zeros(g, "eagle tree newest", MAX_EAGLE_WIDTH),
            tree_params: (0..MAX_EAGLE_DEPTH)
                .map(|_| g.uniform("eagle tree params", bytemuck::bytes_of(&EagleTreeParams::zeroed())))
                .collect(),
            kv: GpuBuffer::<u32>::zeros(g, "eagle kv", context * 2 * c.kv_dim()),
            cos_sin: GpuBuffer::<f32>::from_slice(g, "eagle rope cos/sin", &rope),
            fc,
            fc_bias,
            layer,
            eagle3,
        };
        g.take_error()?;
        // (kernels compile as their first ops are built: one that fails fails the load)
        let scope = g.build_scope();
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
            kv_f16: false,
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
            ops.extend(g.top_k(step, &s.logits, (&s.top, Some(&s.logp)), out_vocab, top_k));
            if let Some(e3) = &s.eagle3 {
                ops.push(g.map_ids(step, &e3.d2t, &s.top, top_k));
            }
            ops
        };
        let (project, project_many) = (projection(&s.one), projection(&s.many));
        // the draft tree on the GPU: its calls, each pass's features from the store, its newest
        // rows to `last` and to their store slots (expansion e's at 1 + (e - 1) width.. with the
        // largest width: fixed places, so every copy is recorded before the GPU chooses rows)
        let ranks = (&s.top, &s.logp);
        let tree_calls = (s.tree_params.iter())
            .map(|params| g.eagle_tree(st, params, ranks, &s.tree_state, &s.tree_out))
            .collect();
        let feature_in = s.feature_in();
        let tree_features =
            g.gather_rows(st, &s.store, Some(&s.tree_rows), None, (feature_in, c.dim, 0), c.dim);
        let newest = Some(&s.tree_newest);
        let tree_last = g.gather_rows(&s.many, &s.x, newest, None, (&s.last, c.dim, 0), c.dim);
        let tree_store = (1..MAX_EAGLE_DEPTH)
            .map(|e| {
                let at = (1 + (e - 1) * MAX_EAGLE_WIDTH) * c.dim;
                g.gather_rows(&s.many, &s.x, newest, None, (&s.store, c.dim, at), c.dim)
            })
            .collect();
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
        let memory_bytes = EagleHead::plan(target, ckpt, layout, opts.precision, top_k)?;
        scope.close("building the EAGLE head's kernels")?;
        Ok(EagleHead {
            config: c,
            layout,
            gpu,
            state,
            gather,
            pass,
            project,
            project_many,
            tree_calls,
            tree_features,
            tree_last,
            tree_store,
            top_k,
            context,
            len: 0,
            unprojected: false,
            gpu_bytes,
            memory_bytes,
        })
    }

    /// The head's layout.
    pub fn layout(&self) -> EagleLayout {
        self.layout
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
    /// feature f^ is where drafting continues ([`EagleHead::draft`], which first projects and
    /// ranks it: a generation's plain cycles never pay for the projection).
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
        self.encode_features(&mut enc, n);
        g.submit(enc);
        self.len = start_pos + n;
        self.unprojected = true;
        Ok(())
    }

    /// A pass of `n` rows (its step uniform set), then the last row's f^ copied to `last`.
    fn encode_features(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        let (g, s) = (&*self.gpu, &self.state);
        let row = 4 * self.config.dim as u64;
        g.encode(enc, &self.pass, n as u32);
        enc.copy_buffer_to_buffer(&s.x.raw, (n as u64 - 1) * row, &s.last.raw, 0, row);
    }

    /// [`EagleHead::encode_features`], then that row projected and ranked.
    fn encode_pass(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        self.encode_features(enc, n);
        self.gpu.encode(enc, &self.project, 1);
    }

    /// The last pass's row projected and ranked, if [`EagleHead::run_target_rows`] left it
    /// unprojected (the caller clears `unprojected` once the submission succeeded).
    fn encode_pending_projection(&self, enc: &mut wgpu::CommandEncoder) {
        if self.unprojected {
            self.gpu.encode(enc, &self.project, 1);
        }
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
        let mut enc = g.encoder();
        self.encode_pending_projection(&mut enc);
        let s = &self.state;
        let (dim, k, word) = (self.config.dim as u64, self.top_k as u64, 4u64);
        let table: Vec<u32> = (0..steps).flat_map(|i| [1, (self.len + i) as u32, 0, 0]).collect();
        if !table.is_empty() {
            g.queue.write_buffer(&s.step_table, 0, bytemuck::cast_slice(&table));
        }
        enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, 0, k * word);
        for i in 0..steps as u64 {
            // the input: the previous pass's last feature and most likely id
            enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.feature_in().raw, 0, dim * word);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.tokens.raw, 0, word);
            enc.copy_buffer_to_buffer(&s.step_table, i * 16, &s.step, 0, 16);
            self.encode_pass(&mut enc, 1);
            enc.copy_buffer_to_buffer(&s.top.raw, 0, &s.drafts.raw, (1 + i) * k * word, k * word);
        }
        let bytes = (1 + steps as u64) * k * word;
        let raw = g.submit_and_read(enc, &s.drafts.raw, 0, bytes).await?;
        self.len += steps;
        self.unprojected = false;
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        Ok(ids.chunks(self.top_k).map(<[u32]>::to_vec).collect())
    }

    /// EAGLE-2's draft tree below `root` (the context's last token), grown on the GPU from the
    /// latest pass's last row (which ranks the root's children): depth by depth, a tree pass
    /// over the best-scoring unexpanded nodes of the newest depth and their ancestors, each fed
    /// its parent's f^ from a store, the newest rows projected and ranked with log-probabilities
    /// (see `shaders/eagle_tree.wgsl`); then the best nodes. One submission, one read-back.
    pub async fn draft_tree(&mut self, root: u32, shape: TreeShape) -> Result<DraftedTree> {
        let (depth, width, max_nodes) = (shape.depth, shape.width, shape.max_nodes);
        if depth == 0
            || depth > MAX_EAGLE_DEPTH
            || width == 0
            || width > MAX_EAGLE_WIDTH.min(self.top_k)
            || max_nodes == 0
            || max_nodes >= MAX_TREE
            || root as usize >= self.config.vocab_size
        {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE draft tree {depth} deep, {width} wide, of {max_nodes} nodes (at most \
                 {MAX_EAGLE_DEPTH}, {} and {}) below token {root}",
                MAX_EAGLE_WIDTH.min(self.top_k),
                MAX_TREE - 1
            )));
        }
        let g = self.gpu.clone();
        let mut enc = g.encoder();
        self.encode_pending_projection(&mut enc);
        let s = &self.state;
        let room = self.context.saturating_sub(self.len).min(MAX_TREE);
        let (verify, draft_pass) = shape.costs.unwrap_or(([0.0; MAX_TREE], 0.0));
        let params = |mode: u32, depth: usize, slot0: usize| EagleTreeParams {
            mode,
            root,
            start_pos: self.len as u32,
            k: self.top_k as u32,
            width: width as u32,
            depth: depth as u32,
            slot0: slot0 as u32,
            max_nodes: max_nodes as u32,
            room: room as u32,
            use_costs: shape.costs.is_some() as u32,
            calibration: shape.calibration,
            draft_pass,
            verify,
        };
        // call 0 starts (and picks depth 1's nodes to expand when deeper ones are wanted); call e
        // takes expansion e's ranks (its nodes in slots 1 + (e - 1) W..) and picks depth e + 1's;
        // the last call also finishes (mode + 4)
        let expansions = depth - 1;
        let next_depth = |e: usize| if e < expansions { e + 1 } else { 0 };
        let finish = |e: usize| if e == expansions { 4 } else { 0 };
        let write =
            |i: usize, p: EagleTreeParams| g.queue.write_buffer(&s.tree_params[i], 0, bytemuck::bytes_of(&p));
        write(0, params(finish(0), next_depth(0), 0));
        for e in 1..=expansions {
            write(e, params(1 + finish(e), next_depth(e), 1 + (e - 1) * MAX_EAGLE_WIDTH));
        }
        let (dim, word) = (self.config.dim as u64 * 4, 4u64);
        enc.copy_buffer_to_buffer(&s.last.raw, 0, &s.store.raw, 0, dim);
        g.encode(&mut enc, &self.tree_calls[..1], 1);
        for e in 1..=expansions {
            let out = |at: u64, to: &wgpu::Buffer, words: u64, enc: &mut wgpu::CommandEncoder| {
                enc.copy_buffer_to_buffer(&s.tree_out.raw, at * word, to, 0, words * word);
            };
            out(EAGLE_TREE_STEP, &s.step, 4 + MAX_TREE as u64, &mut enc);
            out(EAGLE_TREE_MANY, &s.many, 4, &mut enc);
            out(EAGLE_TREE_SLOTS, &s.tree_rows.raw, MAX_TREE as u64, &mut enc);
            out(EAGLE_TREE_NEWEST, &s.tree_newest.raw, MAX_EAGLE_WIDTH as u64, &mut enc);
            out(EAGLE_TREE_TOKENS, &s.tokens.raw, MAX_TREE as u64, &mut enc);
            // grids for the most rows this pass can have; the kernels stop at the pass's own
            let rows = (width * e).min(room) as u32;
            g.encode(&mut enc, std::slice::from_ref(&self.tree_features), rows);
            g.encode(&mut enc, &self.pass, rows);
            g.encode(&mut enc, std::slice::from_ref(&self.tree_last), width as u32);
            g.encode(&mut enc, std::slice::from_ref(&self.tree_store[e - 1]), width as u32);
            g.encode(&mut enc, &self.project_many, width as u32);
            g.encode(&mut enc, &self.tree_calls[e..e + 1], 1);
        }
        let at = EAGLE_TREE_RESULT * word;
        let bytes = (EAGLE_TREE_OUT as u64 - EAGLE_TREE_RESULT) * word;
        let raw = g.submit_and_read(enc, &s.tree_out.raw, at, bytes).await?;
        self.unprojected = false;
        let r: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let n = (r[0] as usize).min(MAX_TREE - 1);
        // (32 token words, then 32 parent words)
        let tokens = r[3..3 + n].to_vec();
        let parents =
            r[3 + MAX_TREE..3 + MAX_TREE + n].iter().map(|&p| Some(p as usize).filter(|&p| p < n)).collect();
        Ok(DraftedTree { tokens, parents, predicted: f32::from_bits(r[1]), passes: r[2] as usize })
    }

    /// The head's output features of the latest pass's first `n` rows, `[n, dim]` (tests compare
    /// them with a reference).
    pub async fn features(&self, n: usize) -> Result<Vec<f32>> {
        let bytes = (n.min(MAX_BATCH) * self.config.dim * 4) as u64;
        let raw = self.gpu.submit_and_read(self.gpu.encoder(), &self.state.x.raw, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }

    /// The top ids of the latest pass's last row, `[top_k]` (projected now if still pending).
    pub async fn top_ids(&mut self) -> Result<Vec<u32>> {
        let bytes = (self.top_k * 4) as u64;
        let mut enc = self.gpu.encoder();
        self.encode_pending_projection(&mut enc);
        let raw = self.gpu.submit_and_read(enc, &self.state.top.raw, 0, bytes).await?;
        self.unprojected = false;
        Ok(bytemuck::pod_collect_to_vec(&raw))
    }
}
