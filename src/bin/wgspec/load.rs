//! Loading for every command of the binary (generate, bench, serve): a model from a path or a
//! known name (fetched into the cache when absent), and an [`Engine`] with the draft a
//! [`DraftSpec`] names, the spec's kind its requests' default.

use std::sync::Arc;

use wgspec::engine::{DraftKind, DraftSpec, Engine, Role};
use wgspec::files::OpenedModel;
use wgspec::gpu::Gpu;
use wgspec::model::{LoadOptions, LoadProgress};
use wgspec::speculative;
use wgspec::{Error, Result};

use crate::fetch;

/// A model's files from a path or a known name (fetched into the cache when absent); their
/// problems name the path.
pub fn open(arg: &str) -> Result<OpenedModel> {
    let path = fetch::resolve_model(arg)?;
    wgspec::local::open(&path).map_err(|e| e.in_file(path.display()))
}

/// Prints load progress on stderr: about 20 updates per model, whatever its tensor count.
pub fn progress_bar(quiet: bool) -> impl FnMut(Role, LoadProgress) {
    let mut shown = (Role::Target, 0);
    move |role, p| {
        let step = p.tensors_done * 20 / p.tensors_total.max(1);
        if quiet || (role, step) == shown && p.tensors_done != p.tensors_total {
            return;
        }
        shown = (role, step);
        let name = if role == Role::Target { "target" } else { "draft" };
        eprint!("\rloading {name}: {}/{} tensors", p.tensors_done, p.tensors_total);
        if p.tensors_done == p.tensors_total {
            eprintln!();
        }
    }
}

/// The engine a command runs: the target `model`, and what `draft` loads (a draft model sharing
/// the target's tokenizer, Medusa heads or an EAGLE head; `ngram` and `none` load nothing), with
/// `draft.kind()` as the draft of requests that name none.
pub fn load_engine(
    gpu: &Arc<Gpu>,
    model: &str,
    draft: &DraftSpec,
    opts: &LoadOptions,
    quiet: bool,
) -> Result<Engine> {
    let mut engine = Engine::load(gpu.clone(), open(model)?, opts, &mut progress_bar(quiet))
        .map_err(|e| e.in_file(model))?;
    attach_draft(&mut engine, draft, quiet)?;
    Ok(engine)
}

/// `--tree`: the token trees of the drafts that grow them (bench, generate and serve alike).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TreeArgs {
    /// Token trees verified in one tree pass: `--draft ngram`, the continuations of up to N
    /// earlier matches (default 1, the latest match's chain); `MODEL+ngram`, up to N n-gram
    /// continuations beside the model's chain (default 4; with heads+ngram always 4);
    /// `eagle:PATH`, the nodes its dynamic tree expands per depth (default 4; 0: the head's chain
    /// with 3 next guesses beside each depth; in a server's batch, its chain with N - 1 next
    /// guesses beside each depth). (A draft model's own trees: `tree:N:MODEL`.)
    #[arg(long)]
    pub tree: Option<usize>,
}

impl TreeArgs {
    /// Refuses `--tree` with a draft model alone (its trees are `tree:N:MODEL`): before
    /// anything is loaded.
    pub fn check(&self, draft: &DraftSpec) -> Result<()> {
        if matches!(draft, DraftSpec::Model { ngram: false, .. }) && self.tree.is_some() {
            return Err(Error::InvalidArgument(format!(
                "--tree with a draft model alone: its top-k trees are `--draft tree:N:{}`",
                draft.source().unwrap_or("MODEL")
            )));
        }
        Ok(())
    }

    /// Sets the trees asked for on `engine`, whose default draft is `draft`'s: the n-gram's
    /// continuations (alone, or beside a draft model's chain), the EAGLE head's nodes per depth
    /// (0: its chain with siblings). Checked first ([`TreeArgs::check`]).
    pub fn apply(&self, engine: &mut Engine, draft: &DraftSpec) -> Result<()> {
        self.check(draft)?;
        let kind = draft.kind();
        let merged = if kind == DraftKind::ModelNgram { self.tree } else { None };
        engine.set_ngram_branches(self.tree.unwrap_or(1), merged.unwrap_or(speculative::TREE_BRANCHES));
        if kind.base() == DraftKind::Eagle {
            engine.set_eagle_tree(match self.tree {
                Some(0) => speculative::EagleTree::Chain { siblings: speculative::EAGLE_SIBLINGS },
                w => speculative::EagleTree::Dynamic { width: w.unwrap_or(speculative::EAGLE_WIDTH) },
            })?;
        }
        Ok(())
    }
}

/// Loads what `draft` names beside `engine`'s target (a draft model sharing its tokenizer, Medusa
/// heads or an EAGLE head; `ngram` and `none` load nothing) and makes `draft.kind()` the draft of
/// requests that name none.
pub fn attach_draft(engine: &mut Engine, draft: &DraftSpec, quiet: bool) -> Result<()> {
    let mut progress = progress_bar(quiet);
    match draft {
        DraftSpec::None | DraftSpec::Ngram => {}
        DraftSpec::Model { model, tree, .. } => {
            engine.load_draft(open(model)?, &mut progress).map_err(|e| e.in_file(model))?;
            engine.set_model_tree(*tree)?;
        }
        DraftSpec::Medusa { path, .. } => {
            let files = wgspec::local::heads_files(&fetch::resolve_head(path)?)?;
            let heads = engine.load_medusa(files, &mut progress).map_err(|e| e.in_file(path))?;
            if !quiet {
                let c = heads.config;
                let mb = heads.weight_bytes() as f64 / 1e6;
                eprintln!("Medusa: {} heads of {} blocks, {mb:.1} MB", c.heads, c.layers);
            }
        }
        DraftSpec::Eagle { path, .. } => {
            let files = wgspec::local::heads_files(&fetch::resolve_head(path)?)?;
            let head = engine.load_eagle(files, &mut progress).map_err(|e| e.in_file(path))?;
            if !quiet {
                eprintln!("EAGLE head: {:.1} MB", head.weight_bytes() as f64 / 1e6);
            }
        }
    }
    engine.set_default_draft(draft.kind())
}
