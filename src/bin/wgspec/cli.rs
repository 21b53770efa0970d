//! The `wgspec` command line: generate text (optionally speculating with a draft), benchmark
//! speculation against target-only decoding, serve the OpenAI-compatible API and the demo page,
//! fetch known models.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use wgspec::engine::{DraftKind, DraftSpec, Engine, Request};
use wgspec::gpu::{Gpu, KernelShape};
use wgspec::model::synthetic;
use wgspec::model::{LoadOptions, Model, Precision};
use wgspec::sampling::SamplingParams;
use wgspec::speculative::{self, KPolicy};

use crate::fetch;
use crate::load::load_engine;
use crate::{bench, serve};
use wgspec::tokenizer::Message;
use wgspec::{Error, Result};

#[derive(Parser)]
#[command(name = "wgspec", version, about = "Speculative decoding for LLMs on WebGPU / wgpu")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it, and report tokens/s.
    Generate(GenerateArgs),
    /// Compare target-only decoding with speculation over a prompt set; print and write JSON.
    Bench(BenchArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (and the browser demo beside it).
    Serve(ServeArgs),
    /// Serve the browser demo (www/, the npm package pkg/, the model cache) on 127.0.0.1.
    Web(WebArgs),
    /// Download a known model into the cache and print its path.
    Fetch {
        /// smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, or the heads trained here
        /// smollm2-135m-eagle and smollm2-135m-medusa (shipped in the binary: written into the
        /// cache's models/ folder)
        name: String,
    },
}

/// How generate and bench pick tokens.
#[derive(clap::Args)]
struct SamplingArgs {
    /// 0 = greedy; above 0, sampling. The GPU draws under a top-k of at most 16 (any top-p); a
    /// larger top-k, and a draft model's calibrating cycles, read logits rows back to the CPU.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

#[derive(Parser)]
// "-1" is read as a value (and refused by its type with a clear message), not as an unknown flag
#[command(allow_negative_numbers = true)]
struct GenerateArgs {
    /// A .gguf file, a Hugging Face folder (config.json, tokenizer.json, *.safetensors), or a known model NAME.
    #[arg(long)]
    model: String,
    #[arg(long, required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file (`-`: standard input), for prompts too long for an argument.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// KV cache positions (default: min(model context, 4096)).
    #[arg(long)]
    context: Option<usize>,
    /// The most GPU memory the models may take, in MB (weights, KV cache, scratch; checked
    /// before anything is allocated). Default: only the adapter's limits.
    #[arg(long)]
    max_memory_mb: Option<u64>,
    /// Keep every weight in f32 (exact dequantization; 4 bytes a weight: about 7 times a Q4_K
    /// file's weights, twice an f16 file's).
    #[arg(long)]
    f32: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Speculate with a draft: a smaller model with the same tokenizer (file or known NAME),
    /// `tree:N:MODEL` (its N most likely tokens at each depth: a token tree), `ngram` (prompt
    /// lookup: the latest match's continuation), `MODEL+ngram` (the model's chain
    /// and the n-gram continuations merged into one token tree; `medusa:PATH+ngram` and
    /// `eagle:PATH+ngram` merge the heads' trees likewise), `medusa:PATH` (Medusa heads:
    /// a `medusa_lm_head.safetensors` file or its folder with `config.json`, or the known
    /// `smollm2-135m-medusa`; a token tree), `eagle:PATH` (an EAGLE-1/2 or EAGLE-3 head: a
    /// folder with `config.json` and `model.safetensors`, or the known `smollm2-135m-eagle`),
    /// or `none` (the default).
    #[arg(long, default_value = "none")]
    draft: DraftSpec,
    #[command(flatten)]
    k: KArgs,
    /// Stop when the text contains this string (repeatable); the text ends before it.
    #[arg(long)]
    stop: Vec<String>,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
}

#[derive(clap::Args)]
struct KArgs {
    /// Draft exactly K tokens per verify pass (default: adaptive, from measured acceptance and costs).
    #[arg(long)]
    draft_k: Option<usize>,
    /// The largest K the adaptive choice may take.
    #[arg(long, default_value_t = speculative::DEFAULT_MAX_DRAFT_K)]
    max_draft_k: usize,
}

impl KArgs {
    fn policy(&self) -> KPolicy {
        KPolicy::new(self.draft_k, self.max_draft_k)
    }
}

#[derive(Parser)]
struct WebArgs {
    #[command(flatten)]
    listen: ListenArgs,
}

/// Where a server listens and which static files it serves.
#[derive(clap::Args)]
struct ListenArgs {
    /// The address to bind (loopback by default; then requests must name a loopback Host).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port (0 = any free port; the address is printed on the first line).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The demo page's folder.
    #[arg(long, default_value = "www")]
    www: PathBuf,
    /// The built npm package (`./build.sh wasm`).
    #[arg(long, default_value = "pkg")]
    pkg: PathBuf,
    /// Seconds a connection may take to send a request head (idle keep-alive connections are
    /// closed after as long).
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
}

#[derive(Parser)]
struct ServeArgs {
    /// A .gguf file, a Hugging Face folder or a known model NAME.
    #[arg(long)]
    model: String,
    /// The default draft of requests: `ngram`, a smaller model with the same tokenizer
    /// (`tree:N:MODEL`: its N most likely tokens at each depth), `medusa:PATH` (Medusa heads) or
    /// `eagle:PATH` (an EAGLE head), each but `ngram` alone or followed by `+ngram` (merged with
    /// the n-gram's continuations), or `none`; a request's `draft` field may pick another that
    /// this loads.
    #[arg(long, default_value = "none")]
    draft: DraftSpec,
    /// KV cache positions: prompt and reply of one request together (default: min(model context, 4096)).
    #[arg(long)]
    context: Option<usize>,
    /// The most GPU memory the models may take, in MB (weights, KV cache, scratch; checked
    /// before anything is allocated). Default: only the adapter's limits.
    #[arg(long)]
    max_memory_mb: Option<u64>,
    /// The API (`/v1/*`, `/tokenize`, `/detokenize`) wants `Authorization: Bearer KEY`.
    #[arg(long, env = "WGSPEC_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests that may wait for the GPU (one runs at a time); more are answered 429 at once.
    #[arg(long, default_value_t = 8)]
    max_queue: usize,
    #[command(flatten)]
    listen: ListenArgs,
}

impl ListenArgs {
    fn config(
        self,
        model: Option<serve::ModelConfig>,
        api_key: Option<String>,
        max_queue: usize,
    ) -> serve::ServerConfig {
        serve::ServerConfig {
            host: self.host,
            port: self.port,
            api_key,
            max_queue,
            model,
            roots: serve::Roots { www: self.www, pkg: self.pkg, models: fetch::cache_dir().join("models") },
            header_timeout: std::time::Duration::from_secs(self.header_timeout.max(1)),
        }
    }
}

#[derive(Parser)]
#[command(allow_negative_numbers = true)]
struct BenchArgs {
    /// The target: a .gguf file, a Hugging Face folder or a known NAME.
    #[arg(long, required_unless_present = "synthetic", conflicts_with = "synthetic")]
    model: Option<String>,
    /// Random weights of a real model's exact shape and stored types instead of a file
    /// (qwen2-1.5b and qwen2-7b, llama-1b and llama-8b in Q4_K_M's mix, qwen2-0.5b in the Qwen
    /// 0.5B file's Q5_0 mix, smollm2-135m in Q4_1); prompts are then byte-mapped token ids.
    #[arg(long)]
    synthetic: Option<String>,
    /// `ngram`, a draft model (file or known NAME; `tree:N:MODEL`, its N most likely tokens at
    /// each depth, in CPU-driven cycles), `medusa:PATH` (Medusa heads), `eagle:PATH` (an EAGLE
    /// head), each but `ngram` alone or followed by `+ngram` (merged with the n-gram's
    /// continuations), or with --synthetic a shape name (`tree:N:SHAPE` too), or `self` (the
    /// target's own weights: every draft is accepted, tau = K + 1, every verify row checked on
    /// the real shapes).
    #[arg(long, required_unless_present = "roofline")]
    draft: Option<DraftSpec>,
    /// Token trees verified in one tree pass: `--draft ngram`, the continuations of up to N
    /// earlier matches (default 1, the latest match's chain); `MODEL+ngram`, up to N n-gram
    /// continuations beside the model's chain (default 4; with heads+ngram always 4);
    /// `eagle:PATH`, the nodes its dynamic tree expands per depth (default 4; 0: the head's chain
    /// with 3 next guesses beside each depth). (A draft model's own trees: `tree:N:MODEL`.)
    #[arg(long)]
    tree: Option<usize>,
    /// Instead of speculation: the adapter's bandwidth and arithmetic ceilings, then every kernel
    /// of the target's decode step (and of a verify pass of `--draft-k` + 1 rows, default 4 + 1)
    /// timed alone against them.
    #[arg(long)]
    roofline: bool,
    /// With --roofline: print the passes' shape facts (each dispatch's workgroups and their
    /// invocations, the longest loop of one invocation, its bytes, its waves on 132 compute
    /// units) and write them as JSON, timing nothing and reading no weights (the buffers are
    /// allocated, not filled: seconds and ~100 MB for any model).
    #[arg(long, requires = "roofline")]
    shape_only: bool,
    /// The kernels' shape on any adapter, lavapipe included: `gpu` (16 matmul lanes, up to 64
    /// for narrow matrices; attention split over the cache: what GPUs run) or `cpu` (1 lane, one-pass attention);
    /// --matmul-lanes and --attention override it.
    #[arg(long, value_parser = ["gpu", "cpu"])]
    shape: Option<String>,
    /// With --roofline: cache positions before the timed passes (attention reads them).
    #[arg(long, default_value_t = 64, requires = "roofline")]
    past: usize,
    /// With --roofline: timed runs of each op and pass (the ceilings have their own).
    #[arg(long, default_value_t = 3, requires = "roofline")]
    #[arg(value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
    /// With --roofline, on a CPU adapter (lavapipe): time as the process's CPU seconds (Linux; 10
    /// ms ticks, so give --reps enough runs), not the wall clock. The shaders run on the process's
    /// threads, so this counts their work alone, where a shared machine's wall clock drifts with
    /// its other tenants: for comparing kernels across runs. Ceilings and kernels are then per CPU
    /// second (all threads together).
    #[arg(long, requires = "roofline")]
    cpu_time: bool,
    /// The matmul's invocations per column quad splitting k (1, 2, 4, ..., 64) instead of the
    /// adapter's default (16 on GPUs, 1 on CPU adapters; above 1 the fewest, which narrow
    /// matrices double): to compare kernel shapes on one adapter.
    #[arg(long)]
    matmul_lanes: Option<u32>,
    /// `on`: the invocations of a subgroup share the loads they all need by shuffles (the
    /// matmul's x, the one-pass attention's q and scores: the default with 1 matmul lane on
    /// adapters with subgroups of 8 or more, lavapipe); `off`: each loads its own (as in browsers,
    /// whose subgroups wgpu's WebGPU backend does not expose): to compare the two on one adapter.
    #[arg(long, value_parser = ["on", "off"])]
    shuffle_loads: Option<String>,
    /// `split` (chunks of keys, then a merge: GPUs' default) or `one-pass` (a workgroup per query
    /// head and row walks every key: CPU adapters' default) instead of the adapter's default.
    #[arg(long, value_parser = ["split", "one-pass"])]
    attention: Option<String>,
    #[command(flatten)]
    k: KArgs,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Each prompt as the user's message under the model's chat template (as `generate --chat`).
    #[arg(long)]
    chat: bool,
    /// A JSON array of {name, kind, prompt} (default: the set in benches/prompts.json).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Only the first N prompts.
    #[arg(long)]
    limit: Option<usize>,
    /// KV cache positions.
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Keep every weight in f32.
    #[arg(long)]
    f32: bool,
    /// (bench: speculative and target-only outputs then differ token for token but share the
    /// target's distribution)
    #[command(flatten)]
    sampling: SamplingArgs,
    /// K values at which to measure verify_cost (besides the mean K of the runs).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    verify_ks: Vec<usize>,
    /// Where to write the JSON result.
    #[arg(long, default_value = "bench-spec.json")]
    out: PathBuf,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => pollster::block_on(generate(args)),
        Command::Bench(args) => pollster::block_on(bench_cmd(args)),
        Command::Serve(args) => serve_cmd(args),
        Command::Web(args) => web_cmd(args),
        Command::Fetch { name } => fetch_cmd(&name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", wgspec::error::printable(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// The longest prompt `--prompt-file` reads.
const MAX_PROMPT_BYTES: u64 = 64 << 20;

/// A prompt from a file or (`-`) standard input: at most [`MAX_PROMPT_BYTES`] (a device that
/// never ends, such as /dev/zero, is refused at the limit), UTF-8.
fn read_prompt(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let limited = |r: &mut dyn Read, bytes: &mut Vec<u8>| r.take(MAX_PROMPT_BYTES + 1).read_to_end(bytes);
    let read = if path.as_os_str() == "-" {
        limited(&mut std::io::stdin().lock(), &mut bytes)
    } else {
        std::fs::File::open(path).and_then(|mut f| limited(&mut f, &mut bytes))
    };
    read.map_err(|e| Error::io(path.display(), e))?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{}: a prompt of more than {MAX_PROMPT_BYTES} bytes",
            path.display()
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| Error::InvalidArgument(format!("{}: the prompt is not UTF-8: {e}", path.display())))
}

fn web_cmd(args: WebArgs) -> Result<()> {
    let pkg = &args.listen.pkg;
    if !pkg.join("wgspec_core_bg.wasm").is_file() {
        eprintln!("warning: {} has no wgspec_core_bg.wasm; build it with ./build.sh wasm", pkg.display());
    }
    // the heads that ship in the binary, into the model cache the page reads (/models/NAME/)
    for head in fetch::KNOWN_HEADS {
        if let Some(Err(e)) = fetch::fetch_head(head.name) {
            eprintln!("warning: the head {}: {e}", head.name);
        }
    }
    serve::run(args.listen.config(None, None, 1))
}

fn serve_cmd(args: ServeArgs) -> Result<()> {
    let model = serve::ModelConfig {
        model: args.model,
        draft: args.draft,
        context: args.context,
        max_memory: args.max_memory_mb.map(|mb| mb * 1_000_000),
    };
    serve::run(args.listen.config(Some(model), args.api_key, args.max_queue))
}

fn fetch_cmd(name: &str) -> Result<()> {
    if let Some(dir) = fetch::fetch_head(name) {
        println!("{}", dir?.display());
        return Ok(());
    }
    let m = fetch::known(name).ok_or_else(|| {
        let models = fetch::KNOWN_MODELS.iter().map(|m| m.name);
        let names: Vec<&str> = models.chain(fetch::KNOWN_HEADS.iter().map(|h| h.name)).collect();
        wgspec::Error::InvalidArgument(format!("unknown model {name:?}; known: {}", names.join(", ")))
    })?;
    let path = fetch::fetch(m)?;
    println!("{}", path.display());
    Ok(())
}

async fn generate(args: GenerateArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::new().await?);
    if !args.json {
        eprintln!("adapter: {}", gpu.describe());
    }
    let opts = LoadOptions {
        context: args.context,
        max_memory: args.max_memory_mb.map(|mb| mb * 1_000_000),
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        ..Default::default()
    };
    let mut engine = load_engine(&gpu, &args.model, &args.draft, &opts, args.json)?;
    let info = engine.target_info().clone();
    if !args.json {
        eprintln!(
            "weights on the GPU: {:.1} MB (file: {:.1} MB); GPU memory in all: {:.1} MB",
            info.gpu_weight_bytes as f64 / 1e6,
            info.file_weight_bytes as f64 / 1e6,
            info.gpu_memory_bytes as f64 / 1e6
        );
    }
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => read_prompt(path)?,
        (None, None) => return Err(Error::InvalidArgument("--prompt or --prompt-file is required".into())),
    };
    let mut req = Request::text(&prompt, args.max_tokens);
    if args.chat {
        req.prompt = None;
        req.messages = Some(vec![Message { role: "user".into(), content: prompt }]);
    }
    let SamplingParams { temperature, top_k, top_p, seed } = args.sampling.params();
    (req.temperature, req.top_k, req.top_p, req.seed) = (temperature, top_k, top_p, seed);
    req.stop = args.stop.clone();
    req.draft_k = args.k.draft_k;
    req.max_draft_k = args.k.max_draft_k;

    let mut stdout = std::io::stdout();
    let out = engine
        .generate(&req, &mut |ev| {
            if !args.json {
                let _ = write!(stdout, "{}", ev.text);
                let _ = stdout.flush();
            }
            true
        })
        .await?;
    if args.json {
        #[derive(serde::Serialize)]
        struct Output<'a> {
            #[serde(flatten)]
            completion: &'a wgspec::engine::Completion,
            gpu_weight_bytes: u64,
            file_weight_bytes: u64,
        }
        let output = Output {
            completion: &out,
            gpu_weight_bytes: info.gpu_weight_bytes,
            file_weight_bytes: info.file_weight_bytes,
        };
        let json =
            serde_json::to_string(&output).map_err(|e| Error::InvalidArgument(format!("output: {e}")))?;
        println!("{json}");
    } else {
        println!();
        let s = &out.stats;
        eprintln!(
            "{} prompt tokens, {} generated in {:.2} s: {:.2} tokens/s (prefill {:.2} s)",
            s.base.prompt_tokens,
            s.base.generated_tokens,
            s.base.decode_seconds,
            s.base.tokens_per_second,
            s.base.prefill_seconds
        );
        if s.draft != DraftKind::None {
            eprintln!(
                "speculation: {} target forwards, {} drafted, {} accepted ({:.1}%), {:.2} tokens per target forward, mean K {:.2}",
                s.base.target_forwards,
                s.drafted,
                s.accepted,
                100.0 * s.acceptance_rate,
                s.tokens_per_target_forward,
                s.mean_k
            );
        }
    }
    Ok(())
}

async fn bench_cmd(args: BenchArgs) -> Result<()> {
    let gpu_shape = args.shape.as_deref().map(|s| s == "gpu");
    let shape = KernelShape {
        matmul_lanes: args.matmul_lanes.or(gpu_shape.map(|gpu| if gpu { 16 } else { 1 })),
        split_attention: args.attention.as_deref().map(|a| a == "split").or(gpu_shape),
        shuffle_loads: args.shuffle_loads.as_deref().map(|s| s == "on"),
    };
    let gpu = Arc::new(Gpu::with_shape(shape).await?);
    eprintln!("adapter: {}", gpu.describe());
    let timing = crate::roofline::Timing::new(args.reps as usize, args.cpu_time, &gpu)?;
    let opts = LoadOptions {
        context: Some(args.context),
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        // (shape facts need the ops recorded, not the weights in them)
        skip_weight_data: args.roofline && args.shape_only,
        ..Default::default()
    };
    let prompts_json = match &args.prompts {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Error::io(p.display(), e))?,
        None => bench::DEFAULT_PROMPTS.to_string(),
    };
    let mut prompts = bench::parse_prompts(&prompts_json)?;
    prompts.truncate(args.limit.unwrap_or(usize::MAX));

    // Target, draft and a way to tokenize prompts.
    let synth = |shape: &synthetic::SyntheticShape, seed: u64| -> Result<Model> {
        match opts.skip_weight_data {
            true => eprintln!("recording {}'s passes (no weights)", shape.name),
            false => eprintln!("building random {} weights", shape.name),
        }
        // (its tensors made as the load reads them: never the whole file in memory)
        let file = synthetic::SyntheticFile::new(shape, seed);
        let ckpt = wgspec::model::Checkpoint::from_gguf_source(Box::new(file))?;
        Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {})
    };
    let spec = args.draft.clone().unwrap_or_default();
    if spec == DraftSpec::None && !args.roofline {
        return Err(Error::InvalidArgument(
            "bench compares speculation with target-only decoding: give a --draft".into(),
        ));
    }
    if matches!(spec, DraftSpec::Model { ngram: false, .. }) && args.tree.is_some() {
        return Err(Error::InvalidArgument(format!(
            "--tree with a draft model alone: its top-k trees are `--draft tree:N:{}`",
            spec.source().unwrap_or("MODEL")
        )));
    }
    let target_name = match &args.synthetic {
        Some(shape_name) => format!("synthetic {shape_name}"),
        None => args.model.clone().unwrap_or_default(),
    };
    let mut engine = match &args.synthetic {
        Some(_) if matches!(spec, DraftSpec::Medusa { .. } | DraftSpec::Eagle { .. }) => {
            return Err(Error::InvalidArgument(
                "a --synthetic target drafts with `ngram`, a shape name or `self`, not heads".into(),
            ))
        }
        Some(shape_name) => {
            let target = synth(&synthetic::synthetic_shape(shape_name)?, 1)?;
            let tokenizer = synthetic::byte_tokenizer(target.config.vocab_size)?;
            let mut engine = Engine::new(target, tokenizer.clone(), None);
            if let (DraftSpec::Model { model, tree, .. }, false) = (&spec, args.roofline) {
                // a shape, or `self`: the target's shape and weights (its drafts are always
                // right: tau = K + 1)
                let (shape, seed) = match model.as_str() {
                    "self" => (synthetic::synthetic_shape(shape_name)?, 1),
                    name => (synthetic::synthetic_shape(name)?, 2),
                };
                engine.set_draft(Some((synth(&shape, seed)?, &tokenizer)))?;
                engine.set_model_tree(*tree)?;
            }
            engine
        }
        None if spec.source() == Some("self") => {
            return Err(Error::InvalidArgument(
                "--draft self drafts with a --synthetic target's own weights; for a model file, give its path as --draft".into(),
            ))
        }
        None => {
            let draft = if args.roofline { DraftSpec::None } else { spec.clone() };
            load_engine(&gpu, &target_name, &draft, &opts, false)?
        }
    };
    if args.roofline && args.shape_only {
        let rows = args.k.draft_k.unwrap_or(4) + 1;
        return crate::roofline::shape_only(&gpu, engine.target(), &target_name, rows, args.past, &args.out);
    }
    if args.roofline {
        let rows = args.k.draft_k.unwrap_or(4) + 1;
        let target = engine.target_mut();
        return crate::roofline::run(&gpu, target, &target_name, rows, args.past, &timing, &args.out).await;
    }
    // the trees --tree asks for: the n-gram's continuations (alone, or beside a draft model's
    // chain), the EAGLE head's nodes per depth (0: its chain with siblings)
    let kind = spec.kind();
    let merged = if kind == DraftKind::ModelNgram { args.tree } else { None };
    engine.set_ngram_branches(args.tree.unwrap_or(1), merged.unwrap_or(speculative::TREE_BRANCHES));
    if kind.base() == DraftKind::Eagle {
        engine.set_eagle_tree(match args.tree {
            Some(0) => speculative::EagleTree::Chain { siblings: speculative::EAGLE_SIBLINGS },
            w => speculative::EagleTree::Dynamic { width: w.unwrap_or(speculative::EAGLE_WIDTH) },
        })?;
    }
    engine.set_default_draft(kind)?;
    let sampling = args.sampling.params();
    sampling.validate()?;
    let policy = args.k.policy();
    if args.chat && !engine.has_chat_template() {
        return Err(Error::InvalidArgument("--chat: the model declares no chat template".into()));
    }

    let mut results = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let mut req = Request::text(&p.prompt, args.max_tokens);
        if args.chat {
            req.prompt = None;
            req.messages = Some(vec![Message { role: "user".into(), content: p.prompt.clone() }]);
        }
        let SamplingParams { temperature, top_k, top_p, seed } = sampling;
        (req.temperature, req.top_k, req.top_p, req.seed) = (temperature, top_k, top_p, seed);
        (req.draft_k, req.max_draft_k) = (args.k.draft_k, args.k.max_draft_k);
        let tokens = engine.prompt_tokens(&req)?;
        let r = bench::run_prompt(&mut engine, p, &tokens, &req, i % 2 == 1).await?;
        eprintln!(
            "{:<20} {:<5} target-only {:>7.2} tok/s  speculative {:>7.2} tok/s  x{:.2}  tau {:.2}  accept {:>5.1}%  K {:.1}{}",
            r.name,
            r.kind,
            r.target_only_tokens_per_second,
            r.speculative_tokens_per_second,
            r.speedup,
            r.tokens_per_target_forward,
            100.0 * r.acceptance_rate,
            r.mean_k,
            if r.identical || !sampling.is_greedy() { "" } else { "  (outputs differ!)" }
        );
        results.push(r);
    }

    // verify_cost at the mean K of the runs (or the fixed K) and at the listed Ks.
    let k_runs = match policy {
        KPolicy::Fixed(k) => k,
        KPolicy::Adaptive { .. } => {
            let n = results.len().max(1) as f64;
            (results.iter().map(|r| r.mean_k).sum::<f64>() / n).round().max(1.0) as usize
        }
    };
    let target = engine.target_mut();
    let pos = 64.min(target.context().saturating_sub(wgspec::model::MAX_BATCH));
    let fill: Vec<u32> = (0..pos as u32).map(|i| (i * 31 + 7) % target.config.vocab_size as u32).collect();
    for (c, chunk) in fill.chunks(wgspec::model::MAX_BATCH).enumerate() {
        target.prefill(chunk, c * wgspec::model::MAX_BATCH)?;
    }
    let mut ks: Vec<usize> =
        args.verify_ks.iter().copied().chain([k_runs]).filter(|k| (1..32).contains(k)).collect();
    ks.sort_unstable();
    ks.dedup();
    let costs = bench::verify_costs(target, pos, &ks, 5).await?;
    let verify_cost = costs.iter().find(|(k, _)| *k == k_runs).map(|c| c.1).unwrap_or(0.0);

    let all: Vec<&bench::PromptResult> = results.iter().collect();
    let summary = bench::Summary::of(&all);
    let by_kind = ["code", "prose"]
        .into_iter()
        .filter_map(|kind| {
            let rs: Vec<&bench::PromptResult> = results.iter().filter(|r| r.kind == kind).collect();
            (!rs.is_empty()).then(|| (kind.to_string(), bench::Summary::of(&rs)))
        })
        .collect();
    let synthetic_draft = args.synthetic.is_some() && spec != DraftSpec::Ngram;
    let out = bench::Report {
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
        summary,
        verify_cost,
        verify_cost_k: k_runs,
        by_kind,
        verify_cost_by_k: costs.into_iter().collect(),
        prompts: results,
    };
    let s = &out.summary;
    eprintln!(
        "all: target-only {:.2} tok/s, speculative {:.2} tok/s, speedup x{:.2}, tau {:.2}, acceptance {:.1}%, \
         {:.1} nodes per verify pass ({} trees), {} of {} cycles plain, verify_cost(K={}) {:.2}; \
         {:.0} dispatches and {:.0} us of host encoding per cycle ({:.0} and {:.0} per target-only step)",
        s.target_only_tokens_per_second,
        s.speculative_tokens_per_second,
        s.speedup,
        s.tokens_per_target_forward,
        100.0 * s.acceptance_rate,
        s.nodes_per_verify,
        s.tree_cycles,
        s.plain_cycles,
        s.cycles,
        k_runs,
        verify_cost,
        s.dispatches_per_cycle,
        s.host_us_per_cycle,
        s.target_only_dispatches_per_step,
        s.target_only_host_us_per_step
    );
    let text =
        serde_json::to_string_pretty(&out).map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
    std::fs::write(&args.out, &text).map_err(|e| Error::io(args.out.display(), e))?;
    println!("{text}");
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
