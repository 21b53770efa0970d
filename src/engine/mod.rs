//! The engine behind every front end (CLI, wasm facade, HTTP server, bench): it loads a target
//! model, its tokenizer and chat template, and an optional draft (checked against the target's
//! vocabulary once, before its upload), with progress; text or chat messages in, streamed text
//! (with per-token draft provenance) and typed stats out. Plain decoding is the speculative loop
//! without a draft: one decode loop for every front end.
//!
//! A [`Request`] is plain data (it deserializes from the JSON the browser package sends):
//! the prompt or the messages, sampling, stop strings, the draft to use and K.

use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::files::{ModelFiles, OpenedModel};
use crate::generation::{FinishReason, GenerateOptions};
use crate::gpu::Gpu;
use crate::loader::source;
use crate::model::{
    Checkpoint, EagleHead, EagleLayout, LoadOptions, LoadProgress, MedusaConfig, MedusaHeads, MemoryBill,
    Model, TensorTable,
};
use crate::speculative::{
    self, DraftModel, Drafter, Eagle, EagleTree, Ensemble, KPolicy, Medusa, NGram, Schedule, SpecGeneration,
    EAGLE_SIBLINGS, EAGLE_WIDTH, TREE_BRANCHES,
};
pub use crate::speculative::{DraftKind, DraftSpec};
use crate::tokenizer::{ChatTemplate, Message, Tokenizer};

mod batch;
mod pool;
mod prompt;
mod request;
pub use batch::{BatchEvent, BatchLimits, BatchStatus, FixedCosts, SeqId};
pub use prompt::Prompter;
use prompt::TextStream;
pub use request::{Completion, Request, TokenEvent};

/// Which model a load report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Target,
    Draft,
}

/// A loaded model, in figures.
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    /// `"llama"` or `"qwen2"`.
    pub arch: String,
    pub layers: usize,
    pub dim: usize,
    pub vocab: usize,
    /// KV cache positions allocated.
    pub context: usize,
    pub params: usize,
    /// Bytes of the model's files.
    pub file_bytes: u64,
    /// Weight bytes on the GPU, and in the file (equal when blocks stay as stored).
    pub gpu_weight_bytes: u64,
    pub file_weight_bytes: u64,
    /// GPU memory in all: weights, KV cache and scratch.
    pub gpu_memory_bytes: u64,
    /// Whether a usable chat template came with the model.
    pub chat_template: bool,
}

impl ModelInfo {
    fn of(model: &Model, file_bytes: u64, chat_template: Option<&ChatTemplate>) -> ModelInfo {
        let c = &model.config;
        ModelInfo {
            arch: c.arch.gguf_name().to_string(),
            layers: c.n_layers,
            dim: c.dim,
            vocab: c.vocab_size,
            context: model.context(),
            params: TensorTable::new(c).parameters(),
            file_bytes,
            gpu_weight_bytes: model.weight_bytes(),
            file_weight_bytes: model.file_weight_bytes(),
            gpu_memory_bytes: model.memory_bytes(),
            chat_template: chat_template.is_some_and(|t| t.check().is_ok()),
        }
    }
}

/// A loaded target (and optional draft) ready to generate.
pub struct Engine {
    target: Model,
    target_info: ModelInfo,
    /// How the target was loaded (a draft is loaded alike, with the target's context).
    load_options: LoadOptions,
    /// (shared with a generation's text decoding and with front ends that tokenize apart)
    prompter: Arc<Prompter>,
    draft: Option<(DraftModel, ModelInfo)>,
    medusa: Option<Medusa>,
    eagle: Option<Eagle>,
    /// The draft of requests that name none: the last one loaded, or what
    /// [`Engine::set_default_draft`] chose.
    default_draft: DraftKind,
    /// The n-gram's continuations per proposal: drafting alone (1: the latest match's chain)
    /// and merged into an ensemble's tree.
    ngram_branches: (usize, usize),
    /// Per draft kind and decoding (greedy or sampled), the K schedule its requests share: a
    /// request starts from the costs and acceptance the earlier ones measured (cleared when a
    /// draft is loaded).
    schedules: Vec<((DraftKind, bool), Schedule)>,
    /// Requests served together ([`Engine::batch_submit`]) in pages of the target's KV cache.
    batch: batch::Batch,
}

impl Engine {
    /// Uploads `target` (its files are dropped as soon as the weights are on the GPU), reporting
    /// progress per tensor.
    pub fn load(
        gpu: Arc<Gpu>,
        target: OpenedModel,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<Engine> {
        source::now("loading the target", Engine::load_async(gpu, target, opts, progress))
    }

    /// [`Engine::load`], waiting for the weights where a file is still arriving (the browser
    /// overlaps a model's download with its upload).
    pub async fn load_async(
        gpu: Arc<Gpu>,
        target: OpenedModel,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<Engine> {
        let model =
            Model::load_async(gpu, &target.checkpoint, opts, &mut |p| progress(Role::Target, p)).await?;
        let info = ModelInfo::of(&model, target.checkpoint.file_bytes(), target.chat_template.as_ref());
        let mut engine = Engine::new(model, target.tokenizer, target.chat_template);
        engine.target_info = info;
        engine.load_options = opts.clone();
        Ok(engine)
    }

    /// An engine on an already uploaded target (tests, random-weight models). Every row of the
    /// target's output decodes ([`Tokenizer::cover`]).
    pub fn new(target: Model, mut tokenizer: Tokenizer, chat_template: Option<ChatTemplate>) -> Engine {
        tokenizer.cover(target.config.vocab_size);
        let target_info = ModelInfo::of(&target, 0, chat_template.as_ref());
        let target_pages = target.kv_pages();
        let load_options = LoadOptions { context: Some(target.context()), ..Default::default() };
        Engine {
            target,
            target_info,
            load_options,
            prompter: Arc::new(Prompter { tokenizer, chat_template }),
            draft: None,
            medusa: None,
            eagle: None,
            default_draft: DraftKind::None,
            ngram_branches: (1, TREE_BRANCHES),
            schedules: Vec::new(),
            batch: batch::Batch::new(target_pages),
        }
    }

    /// Whether [`Engine::batch_submit`] takes `req`: greedy or sampled (each request's rows
    /// drawn on the GPU by its own ops), plain or with n-gram drafts (the draft it names, else
    /// the default; token trees with [`Engine::set_ngram_branches`]), the EAGLE head's chains
    /// with siblings (its passes batched over the requests drafting with it) or the Medusa
    /// heads' trees (several requests' rows per run of the heads), or the draft model's chains
    /// (its passes batched alike; a sampled request's drawn with the noise its target rows draw
    /// with), each alone or merged with the n-gram's continuations (an ensemble: one token
    /// tree). Not: a draft this engine has not loaded.
    pub fn batchable(&self, req: &Request) -> bool {
        let kind = req.draft.unwrap_or(self.default_draft).base();
        let model = kind == DraftKind::Model && self.draft.is_some();
        let eagle = kind == DraftKind::Eagle && self.eagle.is_some();
        let medusa = kind == DraftKind::Medusa && self.medusa.is_some();
        matches!(kind, DraftKind::None | DraftKind::Ngram) || model || eagle || medusa
    }

    /// Queues a request for the batch, its prompt tokenized ([`Engine::prompt_tokens`]): each
    /// [`Engine::batch_step`] then runs a pass over the rows of every running request, and its
    /// tokens are, bit for bit, those [`Engine::generate_from`] gives it alone. Refuses what
    /// [`Engine::batchable`] does not take, bad sampling parameters, an empty prompt or one
    /// that fills the context.
    pub fn batch_submit(&mut self, prompt: Vec<u32>, req: &Request) -> Result<SeqId> {
        self.check_batched(&prompt, req)?;
        let kind = req.draft.unwrap_or(self.default_draft);
        Ok(self.batch.submit(prompt, req, kind, None))
    }

    /// [`Engine::batch_submit`] for `n` choices of one prompt (OpenAI's `n`, 1 to
    /// [`crate::openai::MAX_CHOICES`]): choice i samples with seed `req.seed + i`, its tokens those
    /// of a request of that seed alone. The prompt is computed once: the choices after the first
    /// wait until its prompt is, then find its pages in the prefix cache (all but the part of
    /// the last page each computes itself).
    pub fn batch_submit_choices(&mut self, prompt: Vec<u32>, req: &Request, n: usize) -> Result<Vec<SeqId>> {
        if !(1..=crate::openai::MAX_CHOICES).contains(&n) {
            let most = crate::openai::MAX_CHOICES;
            return Err(Error::InvalidArgument(format!("choices: 1 to {most}, not {n}")));
        }
        self.check_batched(&prompt, req)?;
        let kind = req.draft.unwrap_or(self.default_draft);
        let first = self.batch.submit(prompt.clone(), req, kind, None);
        let mut ids = vec![first];
        for i in 1..n as u64 {
            let choice = Request { seed: req.seed.wrapping_add(i), ..req.clone() };
            ids.push(self.batch.submit(prompt.clone(), &choice, kind, Some(first)));
        }
        Ok(ids)
    }

    /// [`Engine::batchable`] as an error naming what the batch takes.
    pub fn check_batchable(&self, req: &Request) -> Result<()> {
        match self.batchable(req) {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!(
                "only requests plain or with the draft model, n-gram, EAGLE or Medusa drafts (of this \
                 engine, alone or with the n-gram) are batched, not draft {:?}",
                req.draft.unwrap_or(self.default_draft),
            ))),
        }
    }

    /// What [`Engine::batch_submit`] refuses.
    fn check_batched(&self, prompt: &[u32], req: &Request) -> Result<()> {
        req.sampling().validate()?;
        self.check_batchable(req)?;
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt has no tokens".into()));
        }
        let context = self.target.context();
        if prompt.len() >= context {
            return Err(Error::ContextOverflow { needed: prompt.len() + 1, context });
        }
        // (a bad id would fail the pass, and every request in it)
        let vocab = self.target.config.vocab_size;
        if let Some(&id) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::TokenOutOfRange { id, vocab });
        }
        Ok(())
    }

    /// Takes a request out of the batch (its client left), its pages back to the pool at once;
    /// false if it is not there (it ended).
    pub fn batch_cancel(&mut self, id: SeqId) -> bool {
        self.batch.cancel(id)
    }

    /// Runs one pass of the batch and returns each request's events of it, in order: its
    /// committed tokens, then [`BatchEvent::Done`] (nothing when the batch is idle). An error is
    /// the pass's own (the GPU's): every request it held stays where it was.
    pub async fn batch_step(&mut self) -> Result<Vec<(SeqId, BatchEvent)>> {
        let prompter = self.prompter.clone();
        let eagle_siblings = self.eagle.as_ref().map_or(0, Eagle::batch_siblings);
        let drafters = batch::Drafters {
            eagle_siblings,
            model: self.draft.as_mut().map(|(d, _)| d.model_mut()),
            eagle: self.eagle.as_mut().map(Eagle::head_mut),
            medusa: self.medusa.as_ref(),
        };
        batch::step(&mut self.batch, &mut self.target, drafters, &prompter.tokenizer).await
    }

    /// The batch in figures.
    pub fn batch_status(&self) -> BatchStatus {
        self.batch.status()
    }

    /// Whether no request is waiting or running in the batch.
    pub fn batch_idle(&self) -> bool {
        self.batch.is_idle()
    }

    /// Sets the sequences and rows one pass takes (each clamped to 1..=[`crate::model::MAX_BATCH`]).
    pub fn set_batch_limits(&mut self, limits: BatchLimits) {
        self.batch.limits = limits;
    }

    /// Fixes the costs the batch's plans take as measured ([`FixedCosts`]: the target's passes,
    /// the EAGLE head's follows and steps), or (none) has them measured again from the next pass.
    pub fn set_batch_costs(&mut self, costs: Option<FixedCosts>) {
        self.batch.fix_costs(costs);
    }

    /// The sequences and rows one pass takes.
    pub fn batch_limits(&self) -> BatchLimits {
        self.batch.limits
    }

    /// Whether the requests submitted from now on find the pages other requests computed in the
    /// prefix cache (the default), or only their own: the choices of one request still share its
    /// prompt, and a preempted request finds its own pages, but no request's time to first token
    /// tells whether another one's prompt began as its own (vLLM's `cache_salt`, for every
    /// request).
    pub fn set_prefix_sharing(&mut self, share: bool) {
        self.batch.share_prefixes = share;
    }

    /// Makes the target's KV cache a pool of `pages` pages for the batch
    /// ([`Model::set_kv_pages`]), or with `None` as many as the memory budget leaves beside
    /// everything loaded (at least one context's worth; the adapter's binding limit at most; one
    /// context's worth without a budget). Only while the batch is idle. Returns the pages.
    pub fn set_kv_pool(&mut self, pages: Option<usize>) -> Result<usize> {
        self.check_batch_idle("the KV cache pool changes")?;
        // (the draft model's and the EAGLE head's pools have as many pages: a page of each per
        // position of a sequence)
        let t = &self.target;
        let models = [Some(t), self.draft_model()];
        let head = self.eagle();
        let head_page = head.map_or(0, |h| h.kv_page_bytes());
        let page_bytes: u64 = models.iter().flatten().map(|m| m.kv_page_bytes()).sum::<u64>() + head_page;
        let pools: u64 =
            models.iter().flatten().map(|m| m.kv_page_bytes() * m.kv_pages() as u64).sum::<u64>()
                + head.map_or(0, |h| head_page * h.kv_pages() as u64);
        let most = (models.iter().flatten().map(|m| m.max_kv_pages()))
            .chain(head.map(EagleHead::max_kv_pages))
            .min()
            .unwrap_or(0);
        let pages = match (pages, self.load_options.max_memory) {
            (Some(p), _) => p,
            (None, None) => t.context().div_ceil(crate::gpu::KV_PAGE),
            (None, Some(budget)) => {
                let left = budget.saturating_sub(self.memory_bytes());
                let fits = ((pools + left) / page_bytes.max(1)) as usize;
                fits.min(most).max(t.context().div_ceil(crate::gpu::KV_PAGE))
            }
        };
        let least =
            models.iter().flatten().map(|m| m.context().div_ceil(crate::gpu::KV_PAGE)).max().unwrap_or(0);
        if !(least..=most).contains(&pages) {
            return Err(Error::InvalidArgument(format!(
                "a KV cache pool of {pages} pages of {} positions: it takes {least} to {most}",
                crate::gpu::KV_PAGE
            )));
        }
        if let Some(budget) = self.load_options.max_memory {
            let needs = (self.memory_bytes() - pools) + page_bytes * pages as u64;
            if needs > budget {
                return Err(Error::GpuLimit(format!(
                    "a KV cache pool of {pages} pages needs {:.1} MB more than the budget of {:.1} MB holds",
                    (needs - budget) as f64 / 1e6,
                    budget as f64 / 1e6
                )));
            }
        }
        self.target.set_kv_pages(pages)?;
        if let Some((draft, info)) = &mut self.draft {
            draft.model_mut().set_kv_pages(pages)?;
            draft.forget();
            info.gpu_memory_bytes = draft.model().memory_bytes();
        }
        if let Some(eagle) = &mut self.eagle {
            eagle.head_mut().set_kv_pages(&self.target, pages)?;
            eagle.forget();
        }
        self.batch.resize(pages);
        self.target_info.gpu_memory_bytes = self.target.memory_bytes();
        Ok(pages)
    }

    /// Refuses what `what` names unless no request is waiting or running in the batch.
    fn check_batch_idle(&self, what: &str) -> Result<()> {
        match self.batch.is_idle() {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!("{what} only while the batch is idle"))),
        }
    }

    /// The draft requests that name none speculate with: the draft model, Medusa heads or EAGLE
    /// head loaded last, else none, unless [`Engine::set_default_draft`] chose another.
    pub fn default_draft(&self) -> DraftKind {
        self.default_draft
    }

    /// Sets the draft requests that name none speculate with (`ngram`, or `eagle+ngram` once an
    /// EAGLE head is loaded); refused when it needs a draft that is not loaded.
    pub fn set_default_draft(&mut self, kind: DraftKind) -> Result<()> {
        if let Some(what) = self.missing(kind) {
            return Err(Error::InvalidArgument(format!("default draft {kind}: {what} not loaded")));
        }
        self.default_draft = kind;
        Ok(())
    }

    /// The n-gram's continuations per proposal (from the latest matches): `alone` drafting with
    /// the n-gram (default 1, a chain; the batch's requests submitted from now on too) and
    /// `merged` beside an ensemble's draft (default [`TREE_BRANCHES`]); at least 1 each.
    pub fn set_ngram_branches(&mut self, alone: usize, merged: usize) {
        self.ngram_branches = (alone.max(1), merged.max(1));
        self.batch.ngram_branches = self.ngram_branches;
        self.schedules.retain(|((kind, _), _)| *kind != DraftKind::Ngram && !kind.is_ensemble());
    }

    /// The loaded EAGLE head's trees (default: EAGLE-2's dynamic tree of [`EAGLE_WIDTH`] nodes
    /// expanded per depth); refused without a head.
    pub fn set_eagle_tree(&mut self, shape: EagleTree) -> Result<()> {
        let eagle =
            self.eagle.as_mut().ok_or_else(|| Error::InvalidArgument("no EAGLE head is loaded".into()))?;
        eagle.set_tree(shape);
        self.schedules.retain(|((kind, _), _)| kind.base() != DraftKind::Eagle);
        Ok(())
    }

    /// What `kind` needs that is not loaded (None: it can run): "a draft model is", ...
    pub fn missing(&self, kind: DraftKind) -> Option<&'static str> {
        match kind.base() {
            DraftKind::Model if self.draft.is_none() => Some("a draft model is"),
            DraftKind::Medusa if self.medusa.is_none() => Some("Medusa heads are"),
            DraftKind::Eagle if self.eagle.is_none() => Some("an EAGLE head is"),
            _ => None,
        }
    }

    /// Drafts with the loaded draft model as top-k trees of `per_depth` tokens at each depth (1:
    /// chains, the default; at most [`crate::gpu::MAX_TOP_K`]); its requests' K schedules start
    /// over.
    pub fn set_model_tree(&mut self, per_depth: usize) -> Result<()> {
        let Some((draft, _)) = self.draft.as_mut() else {
            return Err(Error::InvalidArgument("a draft model tree: no draft model is loaded".into()));
        };
        if !(1..=crate::gpu::MAX_TOP_K).contains(&per_depth) {
            return Err(Error::InvalidArgument(format!(
                "a draft model tree of {per_depth} tokens per depth: 1 to {} are possible",
                crate::gpu::MAX_TOP_K
            )));
        }
        draft.set_tree(per_depth - 1);
        self.schedules.retain(|((kind, _), _)| kind.base() != DraftKind::Model);
        Ok(())
    }

    /// Replaces the Medusa heads with those in `files` (a `medusa_lm_head.safetensors`, or
    /// several shards, and optionally the heads' `config.json`), uploaded for the target with its
    /// precision, ranking [`speculative::medusa::ranks_needed`] ids per head for the default
    /// tree ([`speculative::MEDUSA_CHOICES`], cut to the heads' depth). Their weights count
    /// against the memory budget left by the target and the draft model.
    pub fn load_medusa(
        &mut self,
        files: ModelFiles,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&MedusaHeads> {
        source::now("loading Medusa heads", self.load_medusa_async(files, progress))
    }

    /// [`Engine::load_medusa`], waiting for the weights where a file is still arriving.
    pub async fn load_medusa_async(
        &mut self,
        files: ModelFiles,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&MedusaHeads> {
        self.check_batch_idle("the Medusa heads change")?;
        self.batch.forget_drafter(DraftKind::Medusa);
        self.medusa = None;
        self.schedules.clear();
        let named = files.open_named()?;
        let ckpt = Checkpoint::from_named_safetensors(self.target.config.clone(), named.shards)?;
        let (config, prefix) = MedusaConfig::of_checkpoint(&ckpt, named.config_json.as_deref())?;
        let choices: Vec<Vec<usize>> =
            speculative::medusa::default_choices().into_iter().filter(|p| p.len() <= config.heads).collect();
        let top_k = speculative::medusa::ranks_needed(&choices);
        let opts = &self.load_options;
        let bytes = MedusaHeads::plan(&self.target, &ckpt, (config, &prefix), opts.precision, top_k)?;
        self.check_budget("the Medusa heads", bytes)?;
        let heads = &mut |p| progress(Role::Draft, p);
        let heads = MedusaHeads::load(&self.target, &ckpt, (config, &prefix), opts, top_k, heads).await?;
        self.default_draft = DraftKind::Medusa;
        Ok(self.medusa.insert(Medusa::new(heads, choices)?).heads())
    }

    /// The loaded Medusa heads.
    pub fn medusa(&self) -> Option<&MedusaHeads> {
        self.medusa.as_ref().map(Medusa::heads)
    }

    /// Replaces the EAGLE head with the one in `files` (its `config.json` and
    /// `model.safetensors`, in the public EAGLE-1/2 or EAGLE-3 layout; an EAGLE-3 head sets the
    /// target's feature taps), uploaded for the target with its precision; proposals are
    /// EAGLE-2's dynamic trees expanding [`EAGLE_WIDTH`] nodes per depth (each ranking
    /// [`EAGLE_SIBLINGS`] + 1 children). Its weights, cache and scratch count against the memory
    /// budget left by the target, the draft model and Medusa heads.
    pub fn load_eagle(
        &mut self,
        files: ModelFiles,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&EagleHead> {
        source::now("loading the EAGLE head", self.load_eagle_async(files, progress))
    }

    /// [`Engine::load_eagle`], waiting for the weights where a file is still arriving.
    pub async fn load_eagle_async(
        &mut self,
        files: ModelFiles,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&EagleHead> {
        self.check_batch_idle("the EAGLE head changes")?;
        // (cached pages' head parts were the old head's)
        self.batch.forget_prefixes();
        self.batch.forget_drafter(DraftKind::Eagle);
        self.eagle = None;
        self.schedules.clear();
        let named = files.open_named()?;
        let json = named
            .config_json
            .ok_or_else(|| Error::io("config.json", "missing from the EAGLE head's files"))?;
        let config = EagleHead::config_for(&self.target.config, &json)?;
        let ckpt = Checkpoint::from_named_safetensors(config, named.shards)?;
        let layout = EagleHead::layout_of(&self.target.config, &json, &ckpt)?;
        let opts = &self.load_options;
        let top_k = EAGLE_SIBLINGS + 1;
        // (its KV cache pool has as many pages as the target's, for the batch; the plan bills one
        // context's worth)
        let pages = self.target.kv_pages();
        let most = EagleHead::max_kv_pages_of(self.target.gpu(), &ckpt.config);
        let page_bytes = EagleHead::kv_page_bytes_of(&ckpt.config);
        let extra = pages.saturating_sub(self.target.context().div_ceil(crate::gpu::KV_PAGE));
        let bytes = EagleHead::plan(&self.target, &ckpt, layout, opts.precision, top_k)?;
        self.check_budget("the EAGLE head", bytes + extra as u64 * page_bytes)?;
        if pages > most {
            return Err(Error::GpuLimit(format!(
                "the EAGLE head's KV cache pool of {pages} pages (the target's) exceeds the {most} one binding holds"
            )));
        }
        // an EAGLE-3 head reads three taps of the target's residual stream
        let taps = match layout {
            EagleLayout::Eagle3 { taps, .. } => taps.to_vec(),
            EagleLayout::Eagle1 { .. } => Vec::new(),
        };
        self.target.set_feature_taps(&taps)?;
        let progress = &mut |p| progress(Role::Draft, p);
        let mut head =
            EagleHead::load(&self.target, &ckpt, layout, &self.load_options, top_k, progress).await?;
        if head.kv_pages() != pages {
            head.set_kv_pages(&self.target, pages)?;
        }
        let shape = EagleTree::Dynamic { width: EAGLE_WIDTH };
        self.default_draft = DraftKind::Eagle;
        Ok(self.eagle.insert(Eagle::with_tree(head, shape)).head())
    }

    /// The K schedule that requests drafting with `kind`, greedy or not, share (after the first
    /// such request; gone when a draft is loaded).
    pub fn schedule(&self, kind: DraftKind, greedy: bool) -> Option<&Schedule> {
        self.schedules.iter().find(|(k, _)| *k == (kind, greedy)).map(|(_, s)| s)
    }

    /// The loaded EAGLE head.
    pub fn eagle(&self) -> Option<&EagleHead> {
        self.eagle.as_ref().map(Eagle::head)
    }

    /// GPU memory the target, the draft model and the heads loaded take (each its bill).
    pub fn memory_bytes(&self) -> u64 {
        self.target.memory_bytes()
            + self.draft_model().map_or(0, |d| d.memory_bytes())
            + self.medusa().map_or(0, |m| m.memory_bytes())
            + self.eagle().map_or(0, |e| e.memory_bytes())
    }

    /// Refuses `bytes` more GPU memory for `what` when the budget cannot hold them beside the
    /// models and heads already loaded (the one check for a draft model and every head).
    fn check_budget(&self, what: &str, bytes: u64) -> Result<()> {
        let used = self.memory_bytes();
        match self.load_options.max_memory.filter(|&b| used + bytes > b) {
            Some(budget) => Err(Error::GpuLimit(format!(
                "{what} needs {:.1} MB of GPU memory; {:.1} MB of the {:.1} MB budget are left",
                bytes as f64 / 1e6,
                budget.saturating_sub(used) as f64 / 1e6,
                budget as f64 / 1e6
            ))),
            None => Ok(()),
        }
    }

    /// Replaces the draft with `draft`: its vocabulary is checked against the target's before
    /// its weights are uploaded, with the target's context and precision.
    pub fn load_draft(
        &mut self,
        draft: OpenedModel,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&ModelInfo> {
        source::now("loading the draft", self.load_draft_async(draft, progress))
    }

    /// [`Engine::load_draft`], waiting for the weights where a file is still arriving.
    pub async fn load_draft_async(
        &mut self,
        draft: OpenedModel,
        progress: &mut dyn FnMut(Role, LoadProgress),
    ) -> Result<&ModelInfo> {
        self.check_batch_idle("the draft model changes")?;
        self.draft = None; // the old draft's GPU memory goes first
        self.batch.forget_drafter(DraftKind::Model);
        self.schedules.clear();
        speculative::check_draft(
            (&self.target.config, &self.prompter.tokenizer),
            (&draft.checkpoint.config, &draft.tokenizer),
        )?;
        self.plan_draft(&draft.checkpoint)?;
        let opts = self.draft_options();
        let gpu = self.target.gpu().clone();
        let model =
            Model::load_async(gpu, &draft.checkpoint, &opts, &mut |p| progress(Role::Draft, p)).await?;
        let info = ModelInfo::of(&model, draft.checkpoint.file_bytes(), draft.chat_template.as_ref());
        self.attach_draft(model, info)
    }

    /// The bill of `checkpoint` as this target's draft model (the target's context and
    /// precision), refused when the budget cannot hold it beside the target and the heads loaded
    /// (the draft model loaded now, if any, counts too: [`Engine::load_draft`] drops it first).
    /// The browser checks a draft's GGUF header with it before the rest is downloaded.
    pub fn plan_draft(&self, checkpoint: &Checkpoint) -> Result<MemoryBill> {
        let bill = Model::plan(self.target.gpu(), checkpoint, &self.draft_options())?;
        self.check_budget("the draft model", bill.total)?;
        Ok(bill)
    }

    /// A draft model's load options: the target's context, the budget checked by the engine.
    fn draft_options(&self) -> LoadOptions {
        LoadOptions { context: Some(self.target.context()), max_memory: None, ..self.load_options.clone() }
    }

    /// Sets an already uploaded draft model (it must share the target's tokenizer) or removes it.
    pub fn set_draft(&mut self, draft: Option<(Model, &Tokenizer)>) -> Result<()> {
        self.check_batch_idle("the draft model changes")?;
        self.draft = None;
        self.batch.forget_drafter(DraftKind::Model);
        self.schedules.clear();
        if self.default_draft.base() == DraftKind::Model {
            self.default_draft = DraftKind::None;
        }
        if let Some((model, tokenizer)) = draft {
            speculative::check_draft(
                (&self.target.config, &self.prompter.tokenizer),
                (&model.config, tokenizer),
            )?;
            let info = ModelInfo::of(&model, 0, None);
            self.attach_draft(model, info)?;
        }
        Ok(())
    }

    fn attach_draft(&mut self, model: Model, info: ModelInfo) -> Result<&ModelInfo> {
        let draft = DraftModel::new(model, &self.target.config)?;
        self.default_draft = DraftKind::Model;
        Ok(&self.draft.insert((draft, info)).1)
    }

    pub fn target(&self) -> &Model {
        &self.target
    }

    pub fn target_info(&self) -> &ModelInfo {
        &self.target_info
    }

    pub fn draft_model(&self) -> Option<&Model> {
        self.draft.as_ref().map(|d| d.0.model())
    }

    pub fn draft_info(&self) -> Option<&ModelInfo> {
        self.draft.as_ref().map(|d| &d.1)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.prompter.tokenizer
    }

    /// The tokenizer and chat template, to tokenize requests away from the engine.
    pub fn prompter(&self) -> &Prompter {
        &self.prompter
    }

    /// The same, shared (no copy of the vocabulary).
    pub fn shared_prompter(&self) -> Arc<Prompter> {
        self.prompter.clone()
    }

    /// The target, mutably: harnesses (the roofline, verify costs) run passes on it directly,
    /// while the batch is idle (those passes may write any page of the pool: the batch's prefix
    /// cache is forgotten); a generation after them starts from its own prefill.
    pub fn target_mut(&mut self) -> &mut Model {
        debug_assert!(self.batch.is_idle(), "the target's passes would write running requests' pages");
        self.batch.forget_prefixes();
        &mut self.target
    }

    /// Forgets every page of the prefix cache (a benchmark's level that must not find an earlier
    /// one's prompts computed). Only while no request is waiting or running.
    pub fn forget_prefix_cache(&mut self) -> Result<()> {
        self.check_batch_idle("the prefix cache is forgotten")?;
        self.batch.forget_prefixes();
        Ok(())
    }

    pub fn has_chat_template(&self) -> bool {
        self.prompter.has_chat_template()
    }

    /// The prompt text of `messages` under the model's chat template (assistant turn opened).
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String> {
        self.prompter.chat_prompt(messages)
    }

    /// The prompt's token ids (see [`Prompter::prompt_tokens`]); a prompt longer in bytes than
    /// the context could hold is refused before it is tokenized
    /// ([`Prompter::prompt_tokens_within`]).
    pub fn prompt_tokens(&self, req: &Request) -> Result<Vec<u32>> {
        self.prompter.prompt_tokens_within(req, self.target_info.context)
    }

    /// Generates for `req`, calling `on_token` for every committed token (return false to stop)
    /// and once more with `id: None` when held-back text remains at the end.
    pub async fn generate(
        &mut self,
        req: &Request,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Completion> {
        let prompt = self.prompt_tokens(req)?;
        self.generate_from(prompt, req, on_token).await
    }

    /// [`Engine::generate`] for a prompt already tokenized (by [`Engine::prompt_tokens`] or a
    /// [`Prompter`]); `req`'s `prompt` and `messages` are not looked at.
    pub async fn generate_from(
        &mut self,
        prompt: Vec<u32>,
        req: &Request,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Completion> {
        let prompter = self.prompter.clone();
        let tokenizer = &prompter.tokenizer;
        let mut stream = TextStream::new(&req.stop, &prompt);
        let mut stream_err = None;
        let mut on_commit = |id: u32, from_draft: bool| -> bool {
            let text = match stream.push(tokenizer, id) {
                Ok(text) => text,
                Err(e) => {
                    stream_err = Some(e);
                    return false;
                }
            };
            let go_on = on_token(&TokenEvent { id: Some(id), text, from_draft });
            go_on && !stream.stopped()
        };
        let mut g = self.decode(&prompt, req, &mut on_commit).await?;
        if let Some(trace) = g.stats.last_cycle.as_mut() {
            trace.texts = trace.tokens.iter().map(|&t| tokenizer.decode(&[t]).unwrap_or_default()).collect();
        }
        if let Some(e) = stream_err {
            return Err(e);
        }
        let tail = stream.finish(tokenizer)?;
        if !tail.is_empty() {
            on_token(&TokenEvent { id: None, text: tail, from_draft: false });
        }
        let finish = if stream.stopped() { FinishReason::Stop } else { g.finish };
        let text = stream.text().to_string();
        Ok(Completion {
            prompt_tokens: prompt,
            tokens: g.tokens,
            from_draft: g.from_draft,
            text,
            finish_reason: finish,
            stats: g.stats,
        })
    }

    /// Generates from `prompt`'s token ids without text (harnesses: the bench), as
    /// [`Engine::generate_from`] does: the draft `req.draft` names (else the default), its K and
    /// the schedule its kind shares, generation ending at `max_tokens` or an end-of-text token
    /// (unless `ignore_eos`);
    /// `req`'s `stop` strings are not looked at. The loop's own result: tokens, their
    /// provenance, the stats.
    pub async fn generate_tokens(&mut self, prompt: &[u32], req: &Request) -> Result<SpecGeneration> {
        self.decode(prompt, req, &mut |_, _| true).await
    }

    /// The decode loop of a request: the draft it names (else the default; refused when not
    /// loaded), alone or merged with the n-gram, and the K schedule its kind and decoding share.
    async fn decode(
        &mut self,
        prompt: &[u32],
        req: &Request,
        on_commit: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<SpecGeneration> {
        let opts = GenerateOptions {
            max_tokens: req.max_tokens,
            sampling: req.sampling(),
            stop_tokens: if req.ignore_eos { Vec::new() } else { self.prompter.tokenizer.eos_ids().to_vec() },
        };
        // (a one-sequence pass uses the pool's first pages as its own)
        self.check_batch_idle("a request runs alone")?;
        self.batch.forget_prefixes();
        if std::mem::take(&mut self.batch.draft_used) {
            // (the batch's draft passes wrote the draft's pool: its cache holds nothing known)
            if let Some((d, _)) = &mut self.draft {
                d.forget();
            }
        }
        if std::mem::take(&mut self.batch.head_used) {
            // (and the EAGLE head's passes its pool)
            if let Some(e) = &mut self.eagle {
                e.forget();
            }
        }
        let kind = req.draft.unwrap_or(self.default_draft);
        if let Some(what) = self.missing(kind) {
            return Err(Error::InvalidArgument(format!("draft {kind} asked for, but {what} not loaded")));
        }
        let (alone_branches, merged_branches) = self.ngram_branches;
        let mut ngram = NGram { branches: alone_branches, ..NGram::default() };
        let mut ensemble;
        // (each kind's draft is loaded: `missing` above)
        let alone: Drafter = match kind.base() {
            DraftKind::Ngram => Drafter::Other(&mut ngram),
            DraftKind::Model => self.draft.as_mut().map_or(Drafter::None, |(d, _)| Drafter::Model(d)),
            DraftKind::Medusa => self.medusa.as_mut().map_or(Drafter::None, |m| Drafter::Other(m)),
            DraftKind::Eagle => self.eagle.as_mut().map_or(Drafter::None, |e| Drafter::Other(e)),
            _ => Drafter::None,
        };
        let draft = match (kind.is_ensemble(), alone) {
            (true, d) => match d.into_draft() {
                Some(d) => {
                    let ngram = NGram { branches: merged_branches, ..NGram::default() };
                    ensemble = Ensemble { draft: d, ngram };
                    Drafter::Other(&mut ensemble)
                }
                None => Drafter::None,
            },
            (false, d) => d,
        };
        // (plain decoding keeps no schedule)
        let mut unshared = Schedule::new(req.k_policy());
        let schedule = match kind {
            DraftKind::None => &mut unshared,
            _ => shared_schedule(&mut self.schedules, (kind, opts.sampling.is_greedy()), req.k_policy()),
        };
        schedule.start(req.k_policy());
        speculative::generate_with(&mut self.target, draft, prompt, &opts, schedule, on_commit).await
    }
}

/// The schedule of `key` in `schedules`, made under `policy` on first use.
fn shared_schedule(
    schedules: &mut Vec<((DraftKind, bool), Schedule)>,
    key: (DraftKind, bool),
    policy: KPolicy,
) -> &mut Schedule {
    let i = match schedules.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            schedules.push((key, Schedule::new(policy)));
            schedules.len() - 1
        }
    };
    &mut schedules[i].1
}
