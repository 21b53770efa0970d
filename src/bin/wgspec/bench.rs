//! The speculative-decoding benchmark harness: target-only decoding and speculation over a
//! prompt set, alternating them, plus `verify_cost = t(forward of K+1 tokens) / t(forward of 1
//! token)`. Both runs go through the engine every front end uses ([`Engine::generate_tokens`]),
//! so a bench measures the drafts, ensembles and schedules that requests get.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use serde::{Deserialize, Serialize};
use web_time::Instant;
use wgspec::engine::{BatchLimits, DraftKind, DraftSpec, Engine, FixedCosts, Request};
use wgspec::gpu::{Gpu, KernelShape};
use wgspec::model::{synthetic, LoadOptions, Model, Precision, MAX_BATCH};
use wgspec::speculative::{KPolicy, SpecStats};
use wgspec::tokenizer::Message;
use wgspec::{Error, Result};

use crate::cli::{KArgs, SamplingArgs};
use crate::load::{load_engine, TreeArgs};

/// The prompt set kept in the repository (`benches/prompts.json`): code and prose.
pub const DEFAULT_PROMPTS: &str = include_str!("../../../benches/prompts.json");

#[derive(Parser)]
#[command(allow_negative_numbers = true)]
pub struct BenchArgs {
    /// The target: a .gguf file, a Hugging Face folder or a known NAME.
    #[arg(long, required_unless_present = "synthetic", conflicts_with = "synthetic")]
    pub model: Option<String>,
    /// Random weights of a real model's exact shape and stored types instead of a file
    /// (qwen2-1.5b and qwen2-7b, llama-1b and llama-8b in Q4_K_M's mix, qwen2-0.5b in the Qwen
    /// 0.5B file's Q5_0 mix, smollm2-135m in Q4_1); prompts are then byte-mapped token ids.
    #[arg(long)]
    pub synthetic: Option<String>,
    /// `ngram`, a draft model (file or known NAME; `tree:N:MODEL`, its N most likely tokens at
    /// each depth, in CPU-driven cycles), `medusa:PATH` (Medusa heads), `eagle:PATH` (an EAGLE
    /// head), each but `ngram` alone or followed by `+ngram` (merged with the n-gram's
    /// continuations), or with --synthetic a shape name (`tree:N:SHAPE` too), or `self` (the
    /// target's own weights: every draft is accepted, tau = K + 1, every verify row checked on
    /// the real shapes).
    #[arg(long, required_unless_present_any = ["roofline", "concurrency"])]
    pub draft: Option<DraftSpec>,
    #[command(flatten)]
    pub trees: TreeArgs,
    /// Instead of speculation: the adapter's bandwidth and arithmetic ceilings, then every kernel
    /// of the target's decode step (and of a verify pass of `--draft-k` + 1 rows, default 4 + 1)
    /// timed alone against them.
    #[arg(long)]
    pub roofline: bool,
    /// With --roofline: print the passes' shape facts (each dispatch's workgroups and their
    /// invocations, the longest loop of one invocation, its bytes, its waves on 132 compute
    /// units) and write them as JSON, timing nothing and reading no weights (the buffers are
    /// allocated, not filled: seconds and ~100 MB for any model).
    #[arg(long, requires = "roofline")]
    pub shape_only: bool,
    /// The kernels' shape on any adapter, lavapipe included: `gpu` (16 matmul lanes, up to 64
    /// for narrow matrices; attention split over the cache: what GPUs run) or `cpu` (1 lane, one-pass attention);
    /// --matmul-lanes and --attention override it.
    #[arg(long, value_parser = ["gpu", "cpu"])]
    pub shape: Option<String>,
    /// With --roofline: cache positions before the timed passes (attention reads them).
    #[arg(long, default_value_t = 64, requires = "roofline")]
    pub past: usize,
    /// With --roofline: timed runs of each op and pass (the ceilings have their own).
    #[arg(long, default_value_t = 3, requires = "roofline")]
    #[arg(value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: u32,
    /// With --roofline, on a CPU adapter (lavapipe): time as the process's CPU seconds (Linux; 10
    /// ms ticks, so give --reps enough runs), not the wall clock. The shaders run on the process's
    /// threads, so this counts their work alone, where a shared machine's wall clock drifts with
    /// its other tenants: for comparing kernels across runs. Ceilings and kernels are then per CPU
    /// second (all threads together).
    #[arg(long, requires = "roofline")]
    pub cpu_time: bool,
    /// The matmul's invocations per column quad splitting k (1, 2, 4, ..., 64) instead of the
    /// adapter's default (16 on GPUs, 1 on CPU adapters; above 1 the fewest, which narrow
    /// matrices double): to compare kernel shapes on one adapter.
    #[arg(long)]
    pub matmul_lanes: Option<u32>,
    /// `on`: the invocations of a subgroup share the loads they all need by shuffles (the
    /// matmul's x, the one-pass attention's q and scores: the default with 1 matmul lane on
    /// adapters with subgroups of 8 or more, lavapipe); `off`: each loads its own (as in browsers,
    /// whose subgroups wgpu's WebGPU backend does not expose): to compare the two on one adapter.
    #[arg(long, value_parser = ["on", "off"])]
    pub shuffle_loads: Option<String>,
    /// `split` (chunks of keys, then a merge: GPUs' default) or `one-pass` (a workgroup per row
    /// and block of up to 4 query heads of a KV group walks every key: CPU adapters' default)
    /// instead of the adapter's default.
    #[arg(long, value_parser = ["split", "one-pass"])]
    pub attention: Option<String>,
    #[command(flatten)]
    pub k: KArgs,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Each prompt as the user's message under the model's chat template (as `generate --chat`).
    #[arg(long)]
    pub chat: bool,
    /// A JSON array of {name, kind, prompt} (default: the set in benches/prompts.json).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Only the first N prompts.
    #[arg(long)]
    pub limit: Option<usize>,
    /// KV cache positions.
    #[arg(long, default_value_t = 2048)]
    pub context: usize,
    /// Keep every weight in f32.
    #[arg(long)]
    pub f32: bool,
    /// (bench: speculative and target-only outputs then differ token for token but share the
    /// target's distribution)
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// K values at which to measure verify_cost (besides the mean K of the runs).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub verify_ks: Vec<usize>,
    /// Instead of speculation against target-only decoding: the engine's batch under load, for
    /// each N listed (1..=64) the same requests with at most N served together (`--draft none`,
    /// `ngram`, a draft model, an EAGLE head or Medusa heads; greedy or sampled): tokens/s, time
    /// to first token, time per
    /// output token, rows per pass, and the requests whose tokens differ from the first N's.
    #[arg(long, value_delimiter = ',', conflicts_with = "roofline")]
    pub concurrency: Vec<usize>,
    /// With --concurrency: requests per level, prompt i mod the set (default: the set's size).
    #[arg(long, requires = "concurrency")]
    pub requests: Option<usize>,
    /// With --concurrency: most rows of one pass, as `serve --max-batch-tokens` (1..=64; default
    /// 64; below a level's N, at most that many requests run at once).
    #[arg(long, requires = "concurrency")]
    pub max_batch_tokens: Option<usize>,
    /// With --concurrency: pages of 16 positions in the KV cache pool (default: the largest N
    /// times the pages of a 512-token prompt and --max-tokens, at least one context).
    #[arg(long, requires = "concurrency")]
    pub kv_pages: Option<usize>,
    /// With --concurrency: costs in seconds that the batch's plans take instead of measured ones,
    /// `PASS,ROW,FOLLOW,STEP` (a target pass of one row, each row more, the EAGLE head's follow,
    /// each row of its steps), or `PASS,ROW,FOLLOW,FOLLOW_ROW,HEAD_PASS,STEP` (a follow's fixed
    /// seconds and each row it runs, a submission of the head's steps and each step row), as
    /// every level prints what it measured (`Engine::set_batch_costs`): what another adapter's
    /// costs would draft, here. Each level then also reports its tokens per second at those
    /// costs (its passes, rows, follows and steps priced so), deterministic where the outputs
    /// are (five runs gave the same plans: BENCHMARKS.md).
    #[arg(long, value_delimiter = ',', requires = "concurrency")]
    pub batch_costs: Vec<f64>,
    /// Where to write the JSON result.
    #[arg(long, default_value = "bench-spec.json")]
    pub out: PathBuf,
}

/// `wgspec bench`: the adapter in the kernel shape asked for, the target (a file or a synthetic
/// shape) and its draft, then either the roofline (or only the shape facts) or the prompt set run
/// target-only and with speculation, verify_cost measured after, and the report written.
pub async fn run(args: BenchArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::with_shape(kernel_shape(&args)).await?);
    eprintln!("adapter: {}", gpu.describe());
    let timing = crate::roofline::Timing::new(args.reps as usize, args.cpu_time, &gpu)?;
    let opts = LoadOptions {
        context: Some(args.context),
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        // (shape facts need the ops recorded, not the weights in them)
        skip_weight_data: args.roofline && args.shape_only,
        kv_pages: args.concurrency.iter().max().map(|&n| {
            let pages = |positions: usize| positions.div_ceil(wgspec::gpu::KV_PAGE);
            args.kv_pages.unwrap_or(n * pages(512 + args.max_tokens)).max(pages(args.context))
        }),
        ..Default::default()
    };
    let prompts_json = match &args.prompts {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Error::io(p.display(), e))?,
        None => DEFAULT_PROMPTS.to_string(),
    };
    let mut prompts = parse_prompts(&prompts_json)?;
    prompts.truncate(args.limit.unwrap_or(usize::MAX));
    let spec = args.draft.clone().unwrap_or_default();
    let (mut engine, target_name) = bench_engine(&args, &gpu, &opts, &spec)?;
    if args.roofline {
        let rows = args.k.draft_k.unwrap_or(4) + 1;
        let target = engine.target_mut();
        return match args.shape_only {
            true => crate::roofline::shape_only(&gpu, target, &target_name, rows, args.past, &args.out),
            false => {
                crate::roofline::run(&gpu, target, &target_name, rows, args.past, &timing, &args.out).await
            }
        };
    }
    args.trees.apply(&mut engine, &spec)?;
    engine.set_default_draft(spec.kind())?;
    let sampling = args.sampling.params();
    sampling.validate()?;
    if args.chat && !engine.has_chat_template() {
        return Err(Error::InvalidArgument("--chat: the model declares no chat template".into()));
    }
    let request = |p: &BenchPrompt| {
        let mut req = Request::text(&p.prompt, args.max_tokens);
        if args.chat {
            req.prompt = None;
            req.messages = Some(vec![Message { role: "user".into(), content: p.prompt.clone() }]);
        }
        req.set_sampling(sampling);
        (req.draft_k, req.max_draft_k) = (args.k.draft_k, args.k.max_draft_k);
        req
    };
    if !args.concurrency.is_empty() {
        let count = args.requests.unwrap_or(prompts.len());
        let requests = (0..count)
            .map(|i| {
                let mut req = request(&prompts[i % prompts.len().max(1)]);
                // (each sampled request its own seed)
                req.seed = req.seed.wrapping_add(i as u64);
                Ok((engine.prompt_tokens(&req)?, req))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(rows) = args.max_batch_tokens {
            if !(1..=MAX_BATCH).contains(&rows) {
                return Err(Error::InvalidArgument(format!(
                    "--max-batch-tokens takes 1..={MAX_BATCH}, got {rows}"
                )));
            }
            engine.set_batch_limits(BatchLimits { max_rows: rows, ..engine.batch_limits() });
        }
        let costs = batch_costs(&args.batch_costs)?;
        engine.set_batch_costs(costs);
        let levels = crate::bench_batch::run(&mut engine, &requests, &args.concurrency, costs).await?;
        let report = serde_json::json!({
            "adapter": gpu.describe(),
            "target": target_name,
            "draft": spec.to_string(),
            "max_tokens": args.max_tokens,
            "max_batch_tokens": engine.batch_limits().max_rows,
            "batch_costs": costs,
            "levels": levels,
        });
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
        std::fs::write(&args.out, &text).map_err(|e| Error::io(args.out.display(), e))?;
        eprintln!("wrote {}", args.out.display());
        return Ok(());
    }
    let mut results = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let req = request(p);
        let tokens = engine.prompt_tokens(&req)?;
        let r = run_prompt(&mut engine, p, &tokens, &req, i % 2 == 1).await?;
        r.print(!sampling.is_greedy());
        results.push(r);
    }
    // verify_cost at the mean K of the runs (or the fixed K) and at the listed Ks
    let policy = args.k.policy();
    let k_runs = match policy {
        KPolicy::Fixed(k) => k,
        KPolicy::Adaptive { .. } => {
            let n = results.len().max(1) as f64;
            (results.iter().map(|r| r.mean_k).sum::<f64>() / n).round().max(1.0) as usize
        }
    };
    let mut ks: Vec<usize> =
        args.verify_ks.iter().copied().chain([k_runs]).filter(|k| (1..MAX_BATCH).contains(k)).collect();
    ks.sort_unstable();
    ks.dedup();
    let costs = verify_costs_filled(engine.target_mut(), &ks).await?;
    let synthetic_draft = args.synthetic.is_some() && spec != DraftSpec::Ngram;
    let report = Report::new(
        Report {
            adapter: gpu.describe(),
            target: target_name,
            target_gpu_weight_bytes: engine.target().weight_bytes(),
            target_file_weight_bytes: engine.target().file_weight_bytes(),
            draft: if synthetic_draft { format!("synthetic {spec}") } else { spec.to_string() },
            k: match policy {
                KPolicy::Fixed(k) => k.to_string(),
                KPolicy::Adaptive { max } => format!("adaptive (max {max})"),
            },
            max_tokens: args.max_tokens,
            verify_cost: costs.iter().find(|(k, _)| *k == k_runs).map_or(0.0, |c| c.1),
            verify_cost_k: k_runs,
            verify_cost_by_k: costs.into_iter().collect(),
            ..Report::default()
        },
        results,
    );
    report.print_summary();
    let text =
        serde_json::to_string_pretty(&report).map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
    std::fs::write(&args.out, &text).map_err(|e| Error::io(args.out.display(), e))?;
    println!("{text}");
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// `--batch-costs`' seconds: none, four (the head's follow and steps by their fixed seconds
/// and their rows alone) or six, each finite and not negative.
fn batch_costs(c: &[f64]) -> Result<Option<FixedCosts>> {
    let bad = || {
        Error::InvalidArgument(format!(
            "--batch-costs takes PASS,ROW,FOLLOW,STEP or PASS,ROW,FOLLOW,FOLLOW_ROW,HEAD_PASS,STEP: \
             seconds, none negative; got {c:?}"
        ))
    };
    if !c.iter().all(|c| c.is_finite() && *c >= 0.0) {
        return Err(bad());
    }
    Ok(match *c {
        [] => None,
        [pass, row, follow, head_step] => {
            Some(FixedCosts { pass, row, follow, head_step, ..FixedCosts::default() })
        }
        [pass, row, follow, follow_row, head_pass, head_step] => {
            Some(FixedCosts { pass, row, follow, follow_row, head_pass, head_step })
        }
        _ => return Err(bad()),
    })
}

/// The kernel shape `--shape`, `--matmul-lanes`, `--attention` and `--shuffle-loads` ask for.
fn kernel_shape(args: &BenchArgs) -> KernelShape {
    let gpu_shape = args.shape.as_deref().map(|s| s == "gpu");
    KernelShape {
        matmul_lanes: args.matmul_lanes.or(gpu_shape.map(|gpu| if gpu { 16 } else { 1 })),
        split_attention: args.attention.as_deref().map(|a| a == "split").or(gpu_shape),
        shuffle_loads: args.shuffle_loads.as_deref().map(|s| s == "on"),
    }
}

/// The engine a bench runs, and its target's name: a model file with the draft `spec` loads, or a
/// synthetic shape (random weights made as the load reads them) drafting with `ngram`, another
/// shape, `self`, or heads of its shape (Medusa, EAGLE). A roofline loads no draft.
fn bench_engine(
    args: &BenchArgs,
    gpu: &Arc<Gpu>,
    opts: &LoadOptions,
    spec: &DraftSpec,
) -> Result<(Engine, String)> {
    if *spec == DraftSpec::None && !args.roofline && args.concurrency.is_empty() {
        return Err(Error::InvalidArgument(
            "bench compares speculation with target-only decoding: give a --draft".into(),
        ));
    }
    args.trees.check(spec)?;
    let Some(shape_name) = &args.synthetic else {
        if spec.source() == Some("self") {
            return Err(Error::InvalidArgument(
                "--draft self drafts with a --synthetic target's own weights; for a model file, give its path as --draft".into(),
            ));
        }
        let name = args.model.clone().unwrap_or_default();
        let draft = if args.roofline { DraftSpec::None } else { spec.clone() };
        return Ok((load_engine(gpu, &name, &draft, opts, false)?, name));
    };
    let synth = |shape: &synthetic::SyntheticShape, seed: u64| -> Result<Model> {
        match opts.skip_weight_data {
            true => eprintln!("recording {}'s passes (no weights)", shape.name),
            false => eprintln!("building random {} weights", shape.name),
        }
        // (its tensors made as the load reads them: never the whole file in memory)
        let file = synthetic::SyntheticFile::new(shape, seed);
        let ckpt = wgspec::model::Checkpoint::from_gguf_source(Box::new(file))?;
        Model::load(gpu.clone(), &ckpt, opts, &mut |_| {})
    };
    let target = synth(&synthetic::synthetic_shape(shape_name)?, 1)?;
    let tokenizer = synthetic::byte_tokenizer(target.config.vocab_size)?;
    let mut engine = Engine::new(target, tokenizer.clone(), None);
    if let (DraftSpec::Model { model, tree, .. }, false) = (spec, args.roofline) {
        // a shape, or `self`: the target's shape and weights (its drafts are always right:
        // tau = K + 1)
        let (shape, seed) = match model.as_str() {
            "self" => (synthetic::synthetic_shape(shape_name)?, 1),
            name => (synthetic::synthetic_shape(name)?, 2),
        };
        engine.set_draft(Some((synth(&shape, seed)?, &tokenizer)))?;
        engine.set_model_tree(*tree)?;
    }
    // heads of the target's shape (a real head beside random target weights: their costs, not
    // their acceptance)
    if matches!(spec, DraftSpec::Medusa { .. } | DraftSpec::Eagle { .. }) && !args.roofline {
        crate::load::attach_draft(&mut engine, spec, false)?;
    }
    Ok((engine, format!("synthetic {shape_name}")))
}

/// One benchmark prompt.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BenchPrompt {
    pub name: String,
    /// `"code"` or `"prose"`.
    pub kind: String,
    pub prompt: String,
}

/// Parses a prompt set (a JSON array of [`BenchPrompt`]).
pub fn parse_prompts(json: &str) -> Result<Vec<BenchPrompt>> {
    serde_json::from_str(json).map_err(|e| Error::InvalidArgument(format!("prompt set: {e}")))
}

/// Both modes' speeds and what speculation achieved, of one prompt or over a set.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Rates {
    /// Generated tokens over the decode seconds of each mode.
    pub target_only_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    /// Speculative over target-only tokens per second.
    pub speedup: f64,
    /// τ: generated tokens per verify pass.
    pub tokens_per_target_forward: f64,
    /// Accepted over drafted tokens.
    pub acceptance_rate: f64,
}

impl Rates {
    fn new((plain, spec): (f64, f64), tokens_per_target_forward: f64, acceptance_rate: f64) -> Rates {
        Rates {
            target_only_tokens_per_second: plain,
            speculative_tokens_per_second: spec,
            speedup: ratio(spec, plain),
            tokens_per_target_forward,
            acceptance_rate,
        }
    }

    /// The figures as one line prints them.
    fn line(&self) -> String {
        format!(
            "target-only {:>7.2} tok/s  speculative {:>7.2} tok/s  x{:.2}  tau {:.2}  accept {:>5.1}%",
            self.target_only_tokens_per_second,
            self.speculative_tokens_per_second,
            self.speedup,
            self.tokens_per_target_forward,
            100.0 * self.acceptance_rate
        )
    }
}

/// a / b, or 0 where b is not positive.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The outcome of one prompt: target-only and speculative runs of the same request.
#[derive(Clone, Debug, Serialize)]
pub struct PromptResult {
    pub name: String,
    pub kind: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    #[serde(flatten)]
    pub rates: Rates,
    pub mean_k: f64,
    /// The target-only run's steps, its dispatches and its host time encoding and submitting
    /// them (the speculative run's are in `stats`).
    pub target_only_steps: usize,
    pub target_only_dispatches: u64,
    pub target_only_host_encode_seconds: f64,
    /// Whether the speculative tokens equal the target-only tokens (always expected when greedy).
    pub identical: bool,
    /// Which run went first (they alternate from prompt to prompt).
    pub speculative_first: bool,
    pub stats: SpecStats,
}

/// Runs `bench` (tokenized: `prompt`) with the target alone and with speculation (in the order
/// `spec_first` says), both through the engine with `req` (its draft, else the engine's
/// default, for the speculative run); the speculative runs of a bench share the engine's K
/// schedule, as a server's requests do.
pub async fn run_prompt(
    engine: &mut Engine,
    bench: &BenchPrompt,
    prompt: &[u32],
    req: &Request,
    spec_first: bool,
) -> Result<PromptResult> {
    let plain_req = Request { draft: Some(DraftKind::None), ..req.clone() };
    let mut plain = None;
    let mut spec = None;
    for spec_turn in [spec_first, !spec_first] {
        if spec_turn {
            spec = Some(engine.generate_tokens(prompt, req).await?);
        } else {
            plain = Some(engine.generate_tokens(prompt, &plain_req).await?);
        }
    }
    let (Some(plain), Some(spec)) = (plain, spec) else {
        return Err(Error::InvalidArgument("benchmark run missing".into()));
    };
    let s = spec.stats;
    let tps = (plain.stats.base.tokens_per_second, s.base.tokens_per_second);
    Ok(PromptResult {
        name: bench.name.clone(),
        kind: bench.kind.clone(),
        prompt_tokens: prompt.len(),
        generated_tokens: s.base.generated_tokens,
        rates: Rates::new(tps, s.tokens_per_target_forward, s.acceptance_rate),
        mean_k: s.mean_k,
        target_only_steps: plain.stats.verify_forwards,
        target_only_dispatches: plain.stats.dispatches,
        target_only_host_encode_seconds: plain.stats.host_encode_seconds,
        identical: spec.tokens == plain.tokens,
        speculative_first: spec_first,
        stats: s,
    })
}

impl PromptResult {
    /// One line on stderr (`sampled`: outputs are not expected to agree).
    fn print(&self, sampled: bool) {
        eprintln!(
            "{:<20} {:<5} {}  K {:.1}{}",
            self.name,
            self.kind,
            self.rates.line(),
            self.mean_k,
            if self.identical || sampled { "" } else { "  (outputs differ!)" }
        );
    }
}

/// Totals over a set of prompt results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub prompts: usize,
    pub generated_tokens: usize,
    /// Over the summed decode times of each mode, all verify passes and all drafts.
    #[serde(flatten)]
    pub rates: Rates,
    /// Drafted tokens (tree nodes) per verify pass, and the passes that verified a tree.
    pub nodes_per_verify: f64,
    pub tree_cycles: usize,
    /// Cycles the adaptive K ran as plain steps (drafting judged not to pay), and all cycles.
    pub plain_cycles: usize,
    pub cycles: usize,
    /// Compute dispatches and host microseconds (encoding and submitting them) per cycle of the
    /// speculative runs, and per step of the target-only runs.
    pub dispatches_per_cycle: f64,
    pub host_us_per_cycle: f64,
    pub target_only_dispatches_per_step: f64,
    pub target_only_host_us_per_step: f64,
    pub all_identical: bool,
}

impl Summary {
    pub fn of(rs: &[&PromptResult]) -> Summary {
        let tokens: usize = rs.iter().map(|r| r.generated_tokens).sum();
        let plain_s: f64 =
            rs.iter().map(|r| ratio(r.generated_tokens as f64, r.rates.target_only_tokens_per_second)).sum();
        let spec_s: f64 = rs.iter().map(|r| r.stats.base.decode_seconds).sum();
        let drafted: usize = rs.iter().map(|r| r.stats.drafted).sum();
        let accepted: usize = rs.iter().map(|r| r.stats.accepted).sum();
        let verifies: usize = rs.iter().map(|r| r.stats.verify_forwards).sum();
        let steps = rs.iter().map(|r| r.target_only_steps as f64).sum::<f64>();
        let (plain_tps, spec_tps) = (ratio(tokens as f64, plain_s), ratio(tokens as f64, spec_s));
        Summary {
            prompts: rs.len(),
            generated_tokens: tokens,
            rates: Rates::new(
                (plain_tps, spec_tps),
                ratio(tokens as f64, verifies as f64),
                ratio(accepted as f64, drafted as f64),
            ),
            nodes_per_verify: ratio(drafted as f64, verifies as f64),
            tree_cycles: rs.iter().map(|r| r.stats.tree_cycles).sum(),
            plain_cycles: rs.iter().map(|r| r.stats.plain_cycles).sum(),
            cycles: verifies,
            dispatches_per_cycle: ratio(rs.iter().map(|r| r.stats.dispatches as f64).sum(), verifies as f64),
            host_us_per_cycle: ratio(
                1e6 * rs.iter().map(|r| r.stats.host_encode_seconds).sum::<f64>(),
                verifies as f64,
            ),
            target_only_dispatches_per_step: ratio(
                rs.iter().map(|r| r.target_only_dispatches as f64).sum(),
                steps,
            ),
            target_only_host_us_per_step: ratio(
                1e6 * rs.iter().map(|r| r.target_only_host_encode_seconds).sum::<f64>(),
                steps,
            ),
            all_identical: rs.iter().all(|r| r.identical),
        }
    }
}

/// What `wgspec bench` writes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub adapter: String,
    pub target: String,
    pub target_gpu_weight_bytes: u64,
    pub target_file_weight_bytes: u64,
    pub draft: String,
    /// `"4"` or `"adaptive (max 16)"`.
    pub k: String,
    pub max_tokens: usize,
    /// Over all prompts, with verify_cost at `verify_cost_k` (the fixed K or the runs' mean K).
    pub summary: Summary,
    pub verify_cost: f64,
    pub verify_cost_k: usize,
    /// `"code"` and `"prose"`.
    pub by_kind: std::collections::BTreeMap<String, Summary>,
    pub verify_cost_by_k: std::collections::BTreeMap<usize, f64>,
    pub prompts: Vec<PromptResult>,
}

impl Report {
    /// `base` with the prompts' `results` and their summaries, over all and by kind.
    fn new(base: Report, results: Vec<PromptResult>) -> Report {
        let all: Vec<&PromptResult> = results.iter().collect();
        let by_kind = ["code", "prose"]
            .into_iter()
            .filter_map(|kind| {
                let rs: Vec<&PromptResult> = results.iter().filter(|r| r.kind == kind).collect();
                (!rs.is_empty()).then(|| (kind.to_string(), Summary::of(&rs)))
            })
            .collect();
        Report { summary: Summary::of(&all), by_kind, prompts: results, ..base }
    }

    /// The summary's line on stderr.
    fn print_summary(&self) {
        let s = &self.summary;
        eprintln!(
            "all: {}; {:.1} nodes per verify pass ({} trees), {} of {} cycles plain, verify_cost(K={}) {:.2}; \
             {:.0} dispatches and {:.0} us of host encoding per cycle ({:.0} and {:.0} per target-only step)",
            s.rates.line(),
            s.nodes_per_verify,
            s.tree_cycles,
            s.plain_cycles,
            s.cycles,
            self.verify_cost_k,
            self.verify_cost,
            s.dispatches_per_cycle,
            s.host_us_per_cycle,
            s.target_only_dispatches_per_step,
            s.target_only_host_us_per_step
        );
    }
}

/// Median time of a forward pass of `rows` tokens at position `pos` (argmax read-back, as a
/// greedy verify pass), over `reps` runs after one warm-up. The cache is rolled back to `pos`.
pub async fn forward_seconds(model: &mut Model, pos: usize, rows: usize, reps: usize) -> Result<f64> {
    if rows == 0 || rows > MAX_BATCH || pos + rows > model.context() || pos > model.len() {
        return Err(Error::InvalidArgument(format!(
            "timing {rows} rows at {pos} with {} cached of {}",
            model.len(),
            model.context()
        )));
    }
    let vocab = model.config.vocab_size as u32;
    let tokens: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut times = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let t = Instant::now();
        model.forward_argmax(&tokens, pos).await?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
        model.truncate(pos);
    }
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(0.0))
}

/// `verify_cost` for each K in `ks`: t(forward of K+1 tokens) / t(forward of 1 token) at `pos`
/// (the model must hold at least `pos` positions).
pub async fn verify_costs(
    model: &mut Model,
    pos: usize,
    ks: &[usize],
    reps: usize,
) -> Result<Vec<(usize, f64)>> {
    let one = forward_seconds(model, pos, 1, reps).await?;
    let mut out = Vec::with_capacity(ks.len());
    for &k in ks {
        let t = forward_seconds(model, pos, k + 1, reps).await?;
        out.push((k, if one > 0.0 { t / one } else { 0.0 }));
    }
    Ok(out)
}

/// [`verify_costs`] for `ks` after filling the cache with 64 positions (fewer in a shorter
/// context), 5 timed runs each.
async fn verify_costs_filled(target: &mut Model, ks: &[usize]) -> Result<Vec<(usize, f64)>> {
    let pos = 64.min(target.context().saturating_sub(MAX_BATCH));
    let fill: Vec<u32> = (0..pos as u32).map(|i| (i * 31 + 7) % target.config.vocab_size as u32).collect();
    for (c, chunk) in fill.chunks(MAX_BATCH).enumerate() {
        target.prefill(chunk, c * MAX_BATCH)?;
    }
    verify_costs(target, pos, ks, 5).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_set_parses_and_has_code_and_prose() {
        let p = parse_prompts(DEFAULT_PROMPTS).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.iter().any(|x| x.kind == "code") && p.iter().any(|x| x.kind == "prose"));
    }

    #[test]
    fn batch_costs_take_four_or_six_seconds() {
        assert_eq!(batch_costs(&[]).ok(), Some(None));
        let four = batch_costs(&[1.0, 0.02, 0.15, 0.1]).ok().flatten();
        let want = FixedCosts { pass: 1.0, row: 0.02, follow: 0.15, head_step: 0.1, ..FixedCosts::default() };
        assert_eq!(four, Some(want));
        let six = batch_costs(&[1.0, 0.02, 0.15, 0.01, 0.05, 0.1]).ok().flatten();
        assert_eq!(six, Some(FixedCosts { follow_row: 0.01, head_pass: 0.05, ..want }));
        for bad in [
            &[1.0, 0.02][..],
            &[1.0, 0.02, 0.1, 0.1, 0.1],
            &[1.0, -0.1, 0.0, 0.0],
            &[f64::NAN, 0.0, 0.0, 0.0],
        ] {
            assert!(matches!(batch_costs(bad), Err(Error::InvalidArgument(_))), "{bad:?}");
        }
    }
}
