//! Building an EAGLE head: its tensors as the public layouts name them, the checks of a load,
//! the upload, every buffer allocated once ([`HeadState`]) and every op recorded once
//! ([`HeadOps`]); and the memory plan, from the headers alone.

use super::{
    Eagle3Weights, EagleHead, EagleLayout, HeadOps, HeadState, BATCH_TABLE_BYTES, EAGLE_STORE_SLOTS,
    MAX_EAGLE_DEPTH, MAX_EAGLE_WIDTH, PROJECTED,
};
use crate::error::{Error, Result};
use crate::gpu::{
    table_bytes, EagleTreeParams, Gpu, GpuBuffer, MatmulOut, Op, SideOutput, TopKScratch, EAGLE_TREE_OUT,
    EAGLE_TREE_STATE, KV_PAGE, MAX_TOP_K, MAX_TREE,
};
use crate::model::checkpoint::{hf_name, Checkpoint, Precision};
use crate::model::config::Config;
use crate::model::transformer::{rope_table, Block, BlockIo, LoadOptions, Model, MAX_BATCH};
use crate::model::weights::{
    Layer, LayerTensors, LoadProgress, Matrix, Tally, TensorRole, TensorSpec, TensorTable, Upload,
};
use bytemuck::Zeroable;

/// Words of one page of a head's KV cache pool: [`KV_PAGE`] positions of f32 keys and values.
fn kv_page_words(c: &Config) -> usize {
    KV_PAGE * 2 * c.kv_dim()
}

/// The head's tensors, named as in the public layout.
struct EagleTensors {
    fc: TensorSpec,
    fc_bias: TensorSpec,
    layer: LayerTensors,
    /// EAGLE-3: `midlayer.hidden_norm`, `norm`, `lm_head`.
    eagle3: Option<[TensorSpec; 3]>,
}

impl EagleTensors {
    fn new(c: &Config, layout: EagleLayout) -> EagleTensors {
        let mut layer = TensorTable::new(c).layers.swap_remove(0);
        // `model.layers.0.*` of a Hugging Face model is `layers.0.*` in an EAGLE-1 head's file,
        // `midlayer.*` in an EAGLE-3 head's
        let prefix = match layout {
            EagleLayout::Eagle1 { .. } => "layers.0.",
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
            EagleLayout::Eagle1 { .. } => (2 * c.dim, None),
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

/// The sizes, in 4-byte words, of a head's buffers besides its weights ([`HeadState`]'s, and
/// the ranking scratch its top-k ops allocate): the one table that [`EagleHead::plan`] bills and
/// [`HeadState::new`] allocates.
struct HeadSizes {
    ids: usize,           // [MAX_BATCH] rows, tokens and picks each
    drafts: usize,        // [MAX_EAGLE_DEPTH, 2, MAX_BATCH, top_k] ids, then log-probabilities
    rows: usize,          // [MAX_BATCH, dim] feat, embd, x and xb each
    cat: usize,           // [MAX_BATCH, 2 dim] (EAGLE-3: 3 dim)
    q: usize,             // [MAX_BATCH, q_dim] q and att each
    hb: usize,            // [MAX_BATCH, ffn_dim]
    scores: usize,        // the attention scratch (Gpu::attention_scratch_len)
    logits: usize,        // [PROJECTED, out vocab]
    last: usize,          // [PROJECTED, dim] (and EAGLE-3's lastn)
    top: usize,           // [PROJECTED, top_k] top and logp each, firsts twice
    ranking: TopKScratch, // each of the one-row, the tree's and the batch's projections' top-k's
    store: usize,         // [EAGLE_STORE_SLOTS, dim]
    kv: usize,            // [pages * KV_PAGE, 2 kv_dim]
    page_table: usize,    // [MAX_BATCH, pages a context takes]
    rope: usize,          // [context, rope_dim / 2, 2]
    d2t: usize,           // (EAGLE-3) [draft vocab]
    eagle3: usize,        // 1 for an EAGLE-3 head (its lastn and d2t), else 0
    step_table: usize,    // [MAX_BATCH, 4] each draft step's (1, position, 0, 0)
}

impl HeadSizes {
    fn new(gpu: &Gpu, c: &Config, layout: EagleLayout, context: usize, top_k: usize) -> HeadSizes {
        let pages = context.div_ceil(KV_PAGE);
        let (cat, out_vocab) = layout.widths(c.dim, c.vocab_size);
        let (d2t, eagle3) = match layout {
            EagleLayout::Eagle1 { .. } => (0, 0),
            EagleLayout::Eagle3 { draft_vocab, .. } => (draft_vocab, 1),
        };
        HeadSizes {
            ids: MAX_BATCH,
            drafts: MAX_EAGLE_DEPTH * 2 * MAX_BATCH * top_k,
            rows: MAX_BATCH * c.dim,
            cat: MAX_BATCH * cat,
            q: MAX_BATCH * c.q_dim(),
            hb: MAX_BATCH * c.ffn_dim,
            scores: gpu.attention_scratch_len(c.attention_shape(context, false), MAX_BATCH),
            logits: PROJECTED * out_vocab,
            last: PROJECTED * c.dim,
            top: PROJECTED * top_k,
            // (each projection ranks the rows of `logits` into its own scratch)
            ranking: TopKScratch::new(PROJECTED, out_vocab, top_k, true),
            store: EAGLE_STORE_SLOTS * c.dim,
            kv: pages * kv_page_words(c),
            page_table: MAX_BATCH * pages,
            rope: context * c.rope_dim,
            d2t,
            eagle3,
            step_table: MAX_BATCH * 4,
        }
    }

    /// Every buffer: its label, words and how many there are.
    fn table(&self) -> [(&'static str, usize, usize); 24] {
        [
            ("rows, tokens, picks", self.ids, 3),
            ("drafts", self.drafts, 1),
            ("feat, embd, x, xb", self.rows, 4),
            ("cat", self.cat, 1),
            ("q, att", self.q, 2),
            ("hb", self.hb, 1),
            ("scores", self.scores, 1),
            ("logits", self.logits, 1),
            ("last", self.last, 1),
            ("top, logp, firsts (2)", self.top, 4),
            ("ranking candidates", self.ranking.candidates, 3),
            ("ranking sums", self.ranking.sums, 3),
            ("store", self.store, 1),
            ("tree state", EAGLE_TREE_STATE, 1),
            ("tree out", EAGLE_TREE_OUT, 1),
            ("tree rows", MAX_TREE, 1),
            ("tree newest", MAX_EAGLE_WIDTH, 1),
            ("kv", self.kv, 1),
            ("page table", self.page_table, 1),
            ("rope cos/sin", self.rope, 1),
            ("lastn", self.last, self.eagle3),
            ("d2t", self.d2t, self.eagle3),
            ("step table", self.step_table, 1),
            ("batch step table", BATCH_TABLE_BYTES / 4, 1),
        ]
    }

    fn bytes(&self) -> u64 {
        table_bytes(&self.table())
    }
}

impl HeadState {
    /// Allocates every buffer of a head of config `c` and `layout` with a cache of `context`
    /// positions, ranking `top_k` ids, around its uploaded `weights` (fc, fc's bias, the layer,
    /// EAGLE-3's own).
    fn new(
        g: &Gpu,
        c: &Config,
        layout: EagleLayout,
        (context, rope): (usize, &[f32]),
        top_k: usize,
        (fc, fc_bias, layer, eagle3): (Matrix, Option<GpuBuffer<f32>>, Layer, Option<Eagle3Weights>),
    ) -> HeadState {
        let f32s = |label: &str, len: usize| GpuBuffer::<f32>::zeros(g, label, len);
        let u32s = |label: &str, len: usize| GpuBuffer::<u32>::zeros(g, label, len);
        // (the sizes the plan billed)
        let z = HeadSizes::new(g, c, layout, context, top_k);
        let one = g.step_buffer();
        g.write_step(&one, 1, 0);
        let table = |label: &str, size: u64| {
            g.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        HeadState {
            step: g.step_buffer(),
            one,
            many: g.step_buffer(),
            batch: g.step_buffer(),
            batch_table: table("eagle batch step table", BATCH_TABLE_BYTES as u64),
            picks: u32s("eagle picks", z.ids),
            step_table: table("eagle step table", 4 * z.step_table as u64),
            drafts: u32s("eagle drafts", z.drafts),
            rows: u32s("eagle rows", z.ids),
            tokens: u32s("eagle tokens", z.ids),
            feat: f32s("eagle feat", z.rows),
            embd: f32s("eagle embd", z.rows),
            cat: f32s("eagle cat", z.cat),
            x: f32s("eagle x", z.rows),
            xb: f32s("eagle xb", z.rows),
            q: f32s("eagle q", z.q),
            att: f32s("eagle att", z.q),
            scores: f32s("eagle scores", z.scores),
            hb: f32s("eagle hb", z.hb),
            logits: f32s("eagle logits", z.logits),
            last: f32s("eagle last", z.last),
            top: u32s("eagle top", z.top),
            logp: f32s("eagle logp", z.top),
            firsts: u32s("eagle firsts", 2 * z.top),
            store: f32s("eagle store", z.store),
            tree_state: u32s("eagle tree state", EAGLE_TREE_STATE),
            tree_out: u32s("eagle tree out", EAGLE_TREE_OUT),
            tree_rows: u32s("eagle tree rows", MAX_TREE),
            tree_newest: u32s("eagle tree newest", MAX_EAGLE_WIDTH),
            tree_params: (0..MAX_EAGLE_DEPTH)
                .map(|_| g.uniform("eagle tree params", bytemuck::bytes_of(&EagleTreeParams::zeroed())))
                .collect(),
            kv: u32s("eagle kv", z.kv),
            pages: u32s("eagle page table", z.page_table),
            cos_sin: GpuBuffer::<f32>::from_slice(g, "eagle rope cos/sin", rope),
            config: c.clone(),
            fc,
            fc_bias,
            layer,
            eagle3,
        }
    }

    /// Bytes of GPU memory the head's weights take.
    fn weight_bytes(&self) -> u64 {
        let vector = |b: &GpuBuffer<f32>| b.raw.size();
        let l = &self.layer;
        self.fc.gpu_bytes()
            + self.fc_bias.as_ref().map_or(0, vector)
            + [&l.qkv, &l.wo, &l.gate_up, &l.down].iter().map(|m| m.gpu_bytes()).sum::<u64>()
            + l.attn_norm.as_ref().map_or(0, vector)
            + vector(&l.ffn_norm)
            + l.qkv_bias.as_ref().map_or(0, vector)
            + self.eagle3.as_ref().map_or(0, |e| {
                e.lm_head.gpu_bytes() + vector(&e.embed_norm) + vector(&e.hidden_norm) + vector(&e.norm)
            })
    }
}

/// Checks a head's load arguments: one decoder layer, a top-k the GPU ranks, and (EAGLE-3) the
/// target's feature taps set to the layout's. Returns those taps' buffer.
fn check_load<'t>(
    c: &Config,
    target: &'t Model,
    layout: EagleLayout,
    top_k: usize,
) -> Result<Option<&'t GpuBuffer<f32>>> {
    let (_, ranked) = layout.widths(c.dim, c.vocab_size);
    if top_k == 0 || top_k > MAX_TOP_K.min(ranked) {
        return Err(Error::InvalidArgument(format!(
            "an EAGLE head ranks 1..={} ids (of its {ranked}), not {top_k}",
            MAX_TOP_K.min(ranked)
        )));
    }
    if c.n_layers != 1 {
        return Err(Error::InvalidArgument(format!(
            "an EAGLE head is one decoder layer; its config.json declares {}",
            c.n_layers
        )));
    }
    match layout {
        EagleLayout::Eagle1 { .. } => Ok(None),
        EagleLayout::Eagle3 { taps, .. } => match target.feature_taps() {
            Some((layers, buf)) if layers == taps => Ok(Some(buf)),
            _ => Err(Error::InvalidArgument(format!(
                "an EAGLE-3 head reads the target's residual stream after {taps:?} layers: \
                 set those feature taps on the target first (Model::set_feature_taps)"
            ))),
        },
    }
}

impl Eagle3Weights {
    /// Uploads an EAGLE-3 head's own `tensors` (hidden_norm, norm, lm_head) and its d2t table of
    /// `draft_vocab` ids (all zeros when the file has none and the vocabularies are the same),
    /// `embed_norm` being its midlayer.input_layernorm.
    async fn load(
        up: &Upload<'_>,
        c: &Config,
        [hidden_norm, norm, lm_head]: &[TensorSpec; 3],
        draft_vocab: usize,
        embed_norm: GpuBuffer<f32>,
    ) -> Result<Eagle3Weights> {
        let d2t = match up.ckpt.index_tensor("d2t", draft_vocab) {
            Ok(d2t) => d2t,
            Err(Error::MissingTensor { .. }) if draft_vocab == c.vocab_size => vec![0; draft_vocab],
            Err(e) => return Err(e),
        };
        let table: Vec<u32> = (d2t.iter().enumerate())
            .map(|(d, &off)| {
                u32::try_from(d as i64 + off).ok().filter(|&t| (t as usize) < c.vocab_size).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "d2t maps draft id {d} to {} outside the target's {} ids",
                        d as i64 + off,
                        c.vocab_size
                    ))
                })
            })
            .collect::<Result<_>>()?;
        let g = up.gpu;
        Ok(Eagle3Weights {
            embed_norm,
            hidden_norm: GpuBuffer::<f32>::from_slice(g, "hidden_norm", &up.vector(hidden_norm).await?),
            norm: GpuBuffer::<f32>::from_slice(g, "norm", &up.vector(norm).await?),
            lm_head: up.matrix(lm_head).await?,
            d2t: GpuBuffer::<u32>::from_slice(g, "d2t", &table),
            lastn: GpuBuffer::<f32>::zeros(g, "eagle lastn", PROJECTED * c.dim),
        })
    }
}

impl HeadOps {
    /// Records the ops of a head over `s` for `target` (EAGLE-3: reading its feature `taps`).
    fn record(
        target: &Model,
        s: &HeadState,
        taps: Option<&GpuBuffer<f32>>,
        layout: EagleLayout,
        top_k: usize,
    ) -> HeadOps {
        let (g, c) = (&**target.gpu(), &s.config);
        let st = &s.step;
        let (gather, mut pass) = HeadOps::inputs(target, s, taps);
        let io = BlockIo {
            step: st,
            x: &s.x,
            xb: &s.xb,
            q: &s.q,
            att: &s.att,
            scores: &s.scores,
            hb: &s.hb,
            // (a head's layer is llama's: no per-head norm)
            qkv: None,
            post: None,
            cos_sin: &s.cos_sin,
            pages: &s.pages,
            context: target.context(),
            kv_f16: false,
            qkv_input: s.eagle3.as_ref().map(|_| &s.cat),
            window: None,
        };
        // x += attention, mlp: the predicted feature f^                             [n, dim]
        pass.extend(Block { g, c, layer: &s.layer, kv: &s.kv, io: &io, next_norm: None }.record());
        let (_, out_vocab) = layout.widths(c.dim, c.vocab_size);
        let [project, project_many, project_batch] =
            [&s.one, &s.many, &s.batch].map(|step| s.projection(target, step, out_vocab, top_k));
        // the batch's chains: each sequence's feature row of a pass over several to `last`
        let batch_last = g.gather_rows(&s.batch, &s.x, Some(&s.picks), None, (&s.last, c.dim, 0), c.dim);
        // the draft tree on the GPU: its calls, each pass's features from the store, its newest
        // rows to `last` and to their store slots (expansion e's at 1 + (e - 1) width.. with the
        // largest width: fixed places, so every copy is recorded before the GPU chooses rows)
        let ranks = (&s.top, &s.logp);
        let tree_calls = (s.tree_params.iter())
            .map(|params| g.eagle_tree(st, params, ranks, &s.tree_state, &s.tree_out))
            .collect();
        let tree_features =
            g.gather_rows(st, &s.store, Some(&s.tree_rows), None, (s.feature_in(), c.dim, 0), c.dim);
        let newest = Some(&s.tree_newest);
        let tree_last = g.gather_rows(&s.many, &s.x, newest, None, (&s.last, c.dim, 0), c.dim);
        let tree_store = (1..MAX_EAGLE_DEPTH)
            .map(|e| {
                let at = (1 + (e - 1) * MAX_EAGLE_WIDTH) * c.dim;
                g.gather_rows(&s.many, &s.x, newest, None, (&s.store, c.dim, at), c.dim)
            })
            .collect();
        HeadOps {
            gather,
            pass,
            project,
            project_many,
            project_batch,
            batch_last,
            tree_calls,
            tree_features,
            tree_last,
            tree_store,
        }
    }

    /// The gathering of the target's features, and a pass's ops up to the layer's input (x, and
    /// EAGLE-1's xb; EAGLE-3's cat).
    fn inputs(target: &Model, s: &HeadState, taps: Option<&GpuBuffer<f32>>) -> (Vec<Op>, Vec<Op>) {
        let (g, c) = (&**target.gpu(), &s.config);
        let (st, eps) = (&s.step, c.rms_eps);
        let mut gather = Vec::new();
        let mut pass = target.embed_ops(st, &s.tokens, &s.embd);
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
                let gathered = (&s.feat, c.dim, 0);
                gather.push(g.gather_rows(st, raw, Some(&s.rows), Some((norm, target_eps)), gathered, c.dim));
                // cat = [e | f]; x = cat fc^T + b (and xb = x * the layer's input norm)  [n, dim]
                pass.push(g.concat(st, (&s.embd, c.dim), (&s.feat, c.dim), &s.cat));
                let second = s.layer.attn_norm.as_ref().map(|gamma| SideOutput::Scaled { out: &s.xb, gamma });
                let fc_out = MatmulOut { ldy: c.dim as u32, second, ..Default::default() };
                pass.extend(s.fc.matmul(g, st, &s.cat, s.fc_bias.as_ref(), &s.x, fc_out));
            }
        }
        (gather, pass)
    }
}

impl HeadState {
    /// The projected rows' (`step`: one or a tree pass's many, their f^ in `last`) logits,
    /// top-k ids and log-probabilities. EAGLE-1: last . the target's output^T (no norm), its
    /// first draft vocabulary's rows `[rows, draft vocab]`; EAGLE-3: norm(last) . lm_head^T,
    /// ids renamed by d2t `[rows, draft vocab]`.
    fn projection(&self, target: &Model, step: &wgpu::Buffer, out_vocab: usize, top_k: usize) -> Vec<Op> {
        let (g, c) = (&**target.gpu(), &self.config);
        let out = MatmulOut { ldy: out_vocab as u32, ..Default::default() };
        let mut ops = match &self.eagle3 {
            Some(e3) => {
                let normed = (&e3.lastn, c.dim, 0);
                let mut ops =
                    vec![g.gather_rows(step, &self.last, None, Some((&e3.norm, c.rms_eps)), normed, c.dim)];
                ops.extend(e3.lm_head.matmul(g, step, &e3.lastn, None, &self.logits, out));
                ops
            }
            None => target.output_first_ops(step, &self.last, &self.logits, out, out_vocab),
        };
        ops.extend(g.top_k(step, &self.logits, (&self.top, Some(&self.logp)), out_vocab, top_k));
        if let Some(e3) = &self.eagle3 {
            ops.push(g.map_ids(step, &e3.d2t, &self.top, top_k));
        }
        ops
    }
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
        if c.arch.qk_norm() {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head of architecture {}: its layer is llama's (no per-head norm)",
                c.arch.gguf_name()
            )));
        }
        if c.dim != target.dim || c.vocab_size != target.vocab_size {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head of width {} and vocabulary {} for a target of {} and {}",
                c.dim, c.vocab_size, target.dim, target.vocab_size
            )));
        }
        Ok(c)
    }

    /// The layout of the head in `ckpt` (EAGLE-3 when it has `midlayer.*` tensors), with an
    /// EAGLE-1 head's draft vocabulary (`config.json`'s `draft_vocab_size`, the first ids it
    /// ranks; else the whole vocabulary), an EAGLE-3 head's (its `lm_head` rows) and feature
    /// taps: `config.json`'s `eagle_aux_hidden_state_layer_ids` (top level or in `eagle_config`;
    /// vLLM's meaning: the residual stream after that many target layers), else the default
    /// after 2, N / 2 and N - 3 of the target's N layers.
    pub fn layout_of(target: &Config, config_json: &[u8], ckpt: &Checkpoint) -> Result<EagleLayout> {
        let shapes = ckpt.tensor_shapes();
        let json: serde_json::Value = serde_json::from_slice(config_json)
            .map_err(|e| Error::Metadata { key: "config.json".into(), message: e.to_string() })?;
        if !shapes.iter().any(|(name, _)| name.starts_with("midlayer.")) {
            let draft_vocab = match json.get("draft_vocab_size") {
                None => target.vocab_size,
                Some(v) => match v.as_u64().map(|n| n as usize) {
                    Some(n @ 1..) if n <= target.vocab_size => n,
                    _ => {
                        return Err(Error::Metadata {
                            key: "config.json draft_vocab_size".into(),
                            message: format!(
                                "{v} is not a count of ids up to the vocabulary's {}",
                                target.vocab_size
                            ),
                        })
                    }
                },
            };
            return Ok(EagleLayout::Eagle1 { draft_vocab });
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

    /// Bytes of one page of the head's KV cache pool ([`KV_PAGE`] positions, f32).
    pub fn kv_page_bytes(&self) -> u64 {
        EagleHead::kv_page_bytes_of(&self.config)
    }

    /// Bytes of one page of the KV cache pool of a head of config `c` (its
    /// [`EagleHead::config_for`]).
    pub fn kv_page_bytes_of(c: &Config) -> u64 {
        4 * kv_page_words(c) as u64
    }

    /// Pages of its KV cache pool (at first one context's worth).
    pub fn kv_pages(&self) -> usize {
        self.kv_pages
    }

    /// The most pages its pool may have (one binding).
    pub fn max_kv_pages(&self) -> usize {
        EagleHead::max_kv_pages_of(&self.gpu, &self.config)
    }

    /// The most pages the pool of a head of config `c` (its [`EagleHead::config_for`]) may have
    /// on `gpu`: one binding holds it.
    pub fn max_kv_pages_of(gpu: &Gpu, c: &Config) -> usize {
        (gpu.max_binding_bytes() / EagleHead::kv_page_bytes_of(c).max(1)).min(1 << 24) as usize
    }

    /// Makes the head's KV cache a pool of `pages` pages (at least one context's worth, at most
    /// [`EagleHead::max_kv_pages`]), as [`Model::set_kv_pages`] does the target's: what was cached
    /// is gone and the ops are recorded again (`target`: the model it was loaded for).
    /// [`EagleHead::memory_bytes`] follows.
    pub fn set_kv_pages(&mut self, target: &Model, pages: usize) -> Result<()> {
        if pages * KV_PAGE < self.context || pages > self.max_kv_pages() {
            return Err(Error::InvalidArgument(format!(
                "an EAGLE head's KV cache pool of {pages} pages of {KV_PAGE} positions: it takes {} to {}",
                self.context.div_ceil(KV_PAGE),
                self.max_kv_pages()
            )));
        }
        let taps = check_load(&self.config, target, self.layout, self.top_k)?;
        let g = &*self.gpu;
        let kv = GpuBuffer::<u32>::zeros(g, "eagle kv", pages * kv_page_words(&self.config));
        // (an allocation the device could not make fails here, the old pool kept)
        g.take_error()?;
        let old = self.kv_page_bytes() * self.kv_pages as u64;
        self.state.kv = kv;
        self.memory_bytes = self.memory_bytes - old + self.kv_page_bytes() * pages as u64;
        self.kv_pages = pages;
        self.len = 0;
        self.unprojected = false;
        self.ops = HeadOps::record(target, &self.state, taps, self.layout, self.top_k);
        g.take_error()
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
        let sizes = HeadSizes::new(target.gpu(), c, layout, target.context(), top_k);
        target.gpu().check_bindings(&sizes.table())?;
        Ok(bytes + sizes.bytes())
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
        let taps = check_load(&c, target, layout, top_k)?;
        // (its bill first: a buffer no binding can cover is refused before anything is allocated)
        let memory_bytes = EagleHead::plan(target, ckpt, layout, opts.precision, top_k)?;
        let gpu = target.gpu().clone();
        let g = &*gpu;
        let t = EagleTensors::new(&c, layout);
        let tally = Tally::new(ckpt.tensor_shapes().len(), ckpt.file_bytes(), progress);
        let up = Upload::new(g, ckpt, opts, tally);
        let fc = up.matrix(&t.fc).await?;
        let fc_bias = match ckpt.has(&t.fc_bias.name) {
            true => Some(GpuBuffer::<f32>::from_slice(g, "fc.bias", &up.vector(&t.fc_bias).await?)),
            false => None,
        };
        let mut layer = Layer::load(&up, &c, &t.layer, 0, true).await?;
        let eagle3 = match (&t.eagle3, layout) {
            (Some(tensors), EagleLayout::Eagle3 { draft_vocab, .. }) => {
                // input_layernorm normalises the embedding alone, not the layer's input
                let embed_norm = layer
                    .attn_norm
                    .take()
                    .ok_or_else(|| Error::MissingTensor { name: t.layer.attn_norm.name.clone() })?;
                Some(Eagle3Weights::load(&up, &c, tensors, draft_vocab, embed_norm).await?)
            }
            _ => None,
        };
        // (a head's config.json: its scaling is computed, never stored in a tensor)
        let rope =
            rope_table(&c, target.context(), &c.rope_scaling.divisors(c.rope_theta, c.rope_dim, None)?);
        let state =
            HeadState::new(g, &c, layout, (target.context(), &rope), top_k, (fc, fc_bias, layer, eagle3));
        g.take_error()?;
        // (kernels compile as their first ops are built: one that fails fails the load)
        let scope = g.build_scope();
        let ops = HeadOps::record(target, &state, taps, layout, top_k);
        scope.close("building the EAGLE head's kernels")?;
        Ok(EagleHead {
            config: c,
            layout,
            gpu_bytes: state.weight_bytes(),
            gpu,
            state,
            ops,
            top_k,
            context: target.context(),
            kv_pages: target.context().div_ceil(KV_PAGE),
            len: 0,
            unprojected: false,
            ranked: 0,
            memory_bytes,
        })
    }
}
