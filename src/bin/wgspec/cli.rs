//! The `wgspec` command line: generate text (optionally speculating with a draft), benchmark
//! speculation against target-only decoding, fetch known models.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use wgspec::engine::{DraftKind, Engine, Request};
use wgspec::gpu::Gpu;
use wgspec::model::{LoadOptions, Model, Precision};
use wgspec::sampling::SamplingParams;
use wgspec::session::GenerateOptions;
use wgspec::spec::{self, bench, Draft, DraftModel, KPolicy, NGram};
use wgspec::tokenizer::{ChatTemplate, Message, Tokenizer};
use wgspec::{fetch, server};
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
    /// Serve the browser demo (www/, the npm package pkg/, the model cache) on 127.0.0.1.
    Web(WebArgs),
    /// Download a known model into the cache and print its path.
    Fetch {
        /// smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b
        name: String,
    },
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
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV cache positions (default: min(model context, 4096)).
    #[arg(long)]
    context: Option<usize>,
    /// Keep every weight in f32 (exact dequantization, twice the memory).
    #[arg(long)]
    f32: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Speculate with a draft: a smaller model with the same tokenizer (file or known NAME), or
    /// `ngram` (prompt lookup).
    #[arg(long)]
    draft: Option<String>,
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
    #[arg(long, default_value_t = 16)]
    max_draft_k: usize,
}

impl KArgs {
    fn policy(&self) -> KPolicy {
        match self.draft_k {
            Some(k) => KPolicy::Fixed(k),
            None => KPolicy::Adaptive { max: self.max_draft_k },
        }
    }
}

#[derive(Parser)]
struct WebArgs {
    /// Port on 127.0.0.1 (0 = any free port; the address is printed on the first line).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The demo page's folder.
    #[arg(long, default_value = "www")]
    www: PathBuf,
    /// The built npm package (`./build.sh wasm`).
    #[arg(long, default_value = "pkg")]
    pkg: PathBuf,
}

#[derive(Parser)]
#[command(allow_negative_numbers = true)]
struct BenchArgs {
    /// The target: a .gguf file, a Hugging Face folder or a known NAME.
    #[arg(long, required_unless_present = "synthetic", conflicts_with = "synthetic")]
    model: Option<String>,
    /// Random weights of a real model's exact shape instead of a file (qwen2-1.5b, qwen2-0.5b,
    /// llama-1b, smollm2-135m); prompts are then byte-mapped token ids.
    #[arg(long)]
    synthetic: Option<String>,
    /// `ngram`, a draft model (file or known NAME), or with --synthetic a shape name.
    #[arg(long, required_unless_present = "roofline")]
    draft: Option<String>,
    /// Instead of speculation: the adapter's bandwidth and arithmetic ceilings, then every kernel
    /// of the target's decode step (and of a verify pass of `--draft-k` + 1 rows, default 4 + 1)
    /// timed alone against them.
    #[arg(long)]
    roofline: bool,
    /// With --roofline: cache positions before the timed passes (attention reads them).
    #[arg(long, default_value_t = 64)]
    past: usize,
    #[command(flatten)]
    k: KArgs,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
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
        Command::Web(args) => web_cmd(args),
        Command::Fetch { name } => fetch_cmd(&name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", printable(&e.to_string()));
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

/// `text` with control characters (other than newlines and tabs) escaped: error messages quote
/// names from model files and arguments, which must not drive the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn web_cmd(args: WebArgs) -> Result<()> {
    if !args.pkg.join("wgspec_core_bg.wasm").is_file() {
        eprintln!(
            "warning: {} has no wgspec_core_bg.wasm; build it with ./build.sh wasm",
            args.pkg.display()
        );
    }
    let roots = server::DemoRoots { www: args.www, pkg: args.pkg, models: fetch::cache_dir().join("models") };
    server::serve_demo(args.port, roots, |port| {
        println!("listening on http://127.0.0.1:{port}");
        let _ = std::io::stdout().flush();
    })
}

fn fetch_cmd(name: &str) -> Result<()> {
    let m = fetch::known(name).ok_or_else(|| {
        let names: Vec<&str> = fetch::KNOWN_MODELS.iter().map(|m| m.name).collect();
        wgspec::Error::InvalidArgument(format!("unknown model {name:?}; known: {}", names.join(", ")))
    })?;
    let path = fetch::fetch(m)?;
    println!("{}", path.display());
    Ok(())
}

/// Loads a model, its tokenizer and chat template from a file, a folder or a known name. A draft
/// (`draft_of`: the target's config and tokenizer) is checked against the target's vocabulary
/// before its weights are uploaded.
fn load(
    gpu: &Arc<Gpu>,
    arg: &str,
    opts: &LoadOptions,
    draft_of: Option<(&Model, &Tokenizer)>,
    quiet: bool,
) -> Result<(Model, Tokenizer, Option<ChatTemplate>)> {
    let path: PathBuf = fetch::resolve_model(arg)?;
    let opened = wgspec::local::open(&path)?;
    if let Some((target, target_tokenizer)) = draft_of {
        spec::check_draft(
            (&target.config, target_tokenizer),
            (&opened.checkpoint.config, &opened.tokenizer),
        )?;
    }
    let mut shown = 0;
    let model = Model::load(gpu.clone(), &opened.checkpoint, opts, &mut |p| {
        // About 20 updates, whatever the tensor count.
        let step = p.tensors_done * 20 / p.tensors_total.max(1);
        if !quiet && (step > shown || p.tensors_done == p.tensors_total) {
            shown = step;
            eprint!("\rloading {}: {}/{} tensors", path.display(), p.tensors_done, p.tensors_total);
        }
    })?;
    if !quiet {
        eprintln!();
    }
    Ok((model, opened.tokenizer, opened.chat_template))
}

/// The draft named by `--draft`: `ngram`, or a model sharing the target's tokenizer.
fn load_draft(
    gpu: &Arc<Gpu>,
    arg: &str,
    opts: &LoadOptions,
    target: &Model,
    target_tokenizer: &Tokenizer,
    quiet: bool,
) -> Result<Box<dyn Draft>> {
    if arg == "ngram" {
        return Ok(Box::new(NGram::default()));
    }
    let (model, _, _) = load(gpu, arg, opts, Some((target, target_tokenizer)), quiet)?;
    Ok(Box::new(DraftModel::new(model, &target.config)?))
}

async fn generate(args: GenerateArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::new().await?);
    if !args.json {
        eprintln!("adapter: {}", gpu.describe());
    }
    let opts = LoadOptions {
        context: args.context,
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        ..Default::default()
    };
    let (model, tokenizer, template) = load(&gpu, &args.model, &opts, None, false)?;
    let context = model.context();
    let weight_bytes = (model.weight_bytes(), model.file_weight_bytes());
    if !args.json {
        eprintln!(
            "weights on the GPU: {:.1} MB (file: {:.1} MB)",
            weight_bytes.0 as f64 / 1e6,
            weight_bytes.1 as f64 / 1e6
        );
    }
    let mut engine = Engine::new(model, tokenizer, template);
    let draft = match args.draft.as_deref() {
        None => DraftKind::None,
        Some("ngram") => DraftKind::Ngram,
        Some(d) => {
            let draft_opts = LoadOptions { context: Some(context), ..opts.clone() };
            let of = Some((engine.target(), engine.tokenizer()));
            let (model, tokenizer, _) = load(&gpu, d, &draft_opts, of, false)?;
            engine.set_draft(Some((model, &tokenizer)))?;
            DraftKind::Model
        }
    };
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
    req.temperature = args.temperature;
    req.top_k = args.top_k;
    req.top_p = args.top_p;
    req.seed = args.seed;
    req.stop = args.stop.clone();
    req.draft = Some(draft);
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
        let mut json =
            serde_json::to_value(&out).map_err(|e| Error::InvalidArgument(format!("output: {e}")))?;
        if let Some(o) = json.as_object_mut() {
            if draft == DraftKind::None {
                // Plain decoding: every token is the target's; keep the output as before speculation.
                o.remove("from_draft");
            }
            o.insert("gpu_weight_bytes".into(), weight_bytes.0.into());
            o.insert("file_weight_bytes".into(), weight_bytes.1.into());
        }
        println!("{json}");
    } else {
        println!();
        let stats = &out.stats;
        let num = |k: &str| stats.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        eprintln!(
            "{} prompt tokens, {} generated in {:.2} s: {:.2} tokens/s (prefill {:.2} s)",
            num("prompt_tokens"),
            num("generated_tokens"),
            num("decode_seconds"),
            num("tokens_per_second"),
            num("prefill_seconds")
        );
        if draft != DraftKind::None {
            eprintln!(
                "speculation: {} target forwards, {} drafted, {} accepted ({:.1}%), {:.2} tokens per target forward, mean K {:.2}",
                num("target_forwards"),
                num("drafted"),
                num("accepted"),
                100.0 * num("acceptance_rate"),
                num("tokens_per_target_forward"),
                num("mean_k")
            );
        }
    }
    Ok(())
}

async fn bench_cmd(args: BenchArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::new().await?);
    eprintln!("adapter: {}", gpu.describe());
    let opts = LoadOptions {
        context: Some(args.context),
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        ..Default::default()
    };
    let prompts_json = match &args.prompts {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Error::io(p.display(), e))?,
        None => bench::DEFAULT_PROMPTS.to_string(),
    };
    let mut prompts = bench::parse_prompts(&prompts_json)?;
    prompts.truncate(args.limit.unwrap_or(usize::MAX));

    // Target, draft and a way to tokenize prompts.
    let synth = |shape: &bench::SyntheticShape, seed: u64| -> Result<Model> {
        eprintln!("building random {} weights", shape.name);
        let ckpt = wgspec::model::Checkpoint::from_gguf(bench::synthetic_gguf(shape, seed))?;
        Model::load(gpu.clone(), &ckpt, &opts, &mut |_| {})
    };
    let (mut target, tokenizer, target_name) = match &args.synthetic {
        Some(shape_name) => {
            (synth(&bench::synthetic_shape(shape_name)?, 1)?, None, format!("synthetic {shape_name}"))
        }
        None => {
            let name = args.model.clone().unwrap_or_default();
            let (target, tokenizer, _) = load(&gpu, &name, &opts, None, false)?;
            (target, Some(tokenizer), name)
        }
    };
    if args.roofline {
        let rows = args.k.draft_k.unwrap_or(4) + 1;
        return crate::roofline::run(&gpu, &mut target, &target_name, rows, args.past, &args.out).await;
    }
    let draft_arg = args.draft.clone().unwrap_or_default();
    let mut draft: Box<dyn Draft> = match (&args.synthetic, &tokenizer) {
        _ if draft_arg == "ngram" => Box::new(NGram::default()),
        (Some(_), _) | (None, None) => {
            Box::new(DraftModel::new(synth(&bench::synthetic_shape(&draft_arg)?, 2)?, &target.config)?)
        }
        (None, Some(tok)) => load_draft(&gpu, &draft_arg, &opts, &target, tok, false)?,
    };
    let stop_tokens = tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default();
    let gen_opts =
        GenerateOptions { max_tokens: args.max_tokens, sampling: SamplingParams::greedy(), stop_tokens };
    let policy = args.k.policy();

    let mut results = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let tokens = match &tokenizer {
            Some(t) => t.encode(&p.prompt, true)?,
            None => bench::byte_tokens(&p.prompt, target.config.vocab_size),
        };
        let r =
            bench::run_prompt(&mut target, draft.as_mut(), p, &tokens, &gen_opts, policy, i % 2 == 1).await?;
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
            if r.identical { "" } else { "  (outputs differ!)" }
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
    let pos = 64.min(target.context().saturating_sub(wgspec::model::MAX_BATCH));
    let fill: Vec<u32> = (0..pos as u32).map(|i| (i * 31 + 7) % target.config.vocab_size as u32).collect();
    for (c, chunk) in fill.chunks(wgspec::model::MAX_BATCH).enumerate() {
        target.forward_argmax(chunk, c * wgspec::model::MAX_BATCH).await?;
    }
    let mut ks: Vec<usize> =
        args.verify_ks.iter().copied().chain([k_runs]).filter(|k| (1..32).contains(k)).collect();
    ks.sort_unstable();
    ks.dedup();
    let costs = bench::verify_costs(&mut target, pos, &ks, 5).await?;
    let verify_cost = costs.iter().find(|(k, _)| *k == k_runs).map(|c| c.1).unwrap_or(0.0);

    let summarize = |rs: &[&bench::PromptResult]| {
        let tokens: usize = rs.iter().map(|r| r.generated_tokens).sum();
        let plain_s: f64 = rs
            .iter()
            .map(|r| {
                if r.target_only_tokens_per_second > 0.0 {
                    r.generated_tokens as f64 / r.target_only_tokens_per_second
                } else {
                    0.0
                }
            })
            .sum();
        let spec_s: f64 = rs.iter().map(|r| r.stats.base.decode_seconds).sum();
        let drafted: usize = rs.iter().map(|r| r.stats.drafted).sum();
        let accepted: usize = rs.iter().map(|r| r.stats.accepted).sum();
        let verifies: usize = rs.iter().map(|r| r.stats.verify_forwards).sum();
        let plain_tps = if plain_s > 0.0 { tokens as f64 / plain_s } else { 0.0 };
        let spec_tps = if spec_s > 0.0 { tokens as f64 / spec_s } else { 0.0 };
        serde_json::json!({
            "prompts": rs.len(),
            "generated_tokens": tokens,
            "target_only_tokens_per_second": plain_tps,
            "speculative_tokens_per_second": spec_tps,
            "speedup": if plain_tps > 0.0 { spec_tps / plain_tps } else { 0.0 },
            "tokens_per_target_forward": if verifies > 0 { tokens as f64 / verifies as f64 } else { 0.0 },
            "acceptance_rate": if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 },
            "all_identical": rs.iter().all(|r| r.identical),
        })
    };
    let all: Vec<&bench::PromptResult> = results.iter().collect();
    let mut summary = summarize(&all);
    summary["verify_cost"] = serde_json::json!(verify_cost);
    summary["verify_cost_k"] = serde_json::json!(k_runs);
    let mut by_kind = serde_json::Map::new();
    for kind in ["code", "prose"] {
        let rs: Vec<&bench::PromptResult> = results.iter().filter(|r| r.kind == kind).collect();
        if !rs.is_empty() {
            by_kind.insert(kind.to_string(), summarize(&rs));
        }
    }
    let out = serde_json::json!({
        "adapter": gpu.describe(),
        "target": target_name,
        "target_gpu_weight_bytes": target.weight_bytes(),
        "target_file_weight_bytes": target.file_weight_bytes(),
        "draft": if args.synthetic.is_some() && draft_arg != "ngram" { format!("synthetic {draft_arg}") } else { draft_arg.clone() },
        "k": match policy { KPolicy::Fixed(k) => serde_json::json!(k), KPolicy::Adaptive { max } => serde_json::json!(format!("adaptive (max {max})")) },
        "max_tokens": args.max_tokens,
        "summary": summary,
        "by_kind": by_kind,
        "verify_cost_by_k": costs.iter().map(|(k, c)| (k.to_string(), serde_json::json!(c))).collect::<serde_json::Map<_, _>>(),
        "prompts": results,
    });
    let s = &out["summary"];
    eprintln!(
        "all: target-only {:.2} tok/s, speculative {:.2} tok/s, speedup x{:.2}, tau {:.2}, acceptance {:.1}%, verify_cost(K={}) {:.2}",
        s["target_only_tokens_per_second"].as_f64().unwrap_or(0.0),
        s["speculative_tokens_per_second"].as_f64().unwrap_or(0.0),
        s["speedup"].as_f64().unwrap_or(0.0),
        s["tokens_per_target_forward"].as_f64().unwrap_or(0.0),
        100.0 * s["acceptance_rate"].as_f64().unwrap_or(0.0),
        k_runs,
        verify_cost
    );
    let text =
        serde_json::to_string_pretty(&out).map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
    std::fs::write(&args.out, &text).map_err(|e| Error::io(args.out.display(), e))?;
    println!("{text}");
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
