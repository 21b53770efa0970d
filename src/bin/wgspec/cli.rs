//! The `wgspec` command line: generate text (optionally speculating with a draft), benchmark
//! speculation against target-only decoding, serve the OpenAI-compatible API and the demo page,
//! fetch known models.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use wgspec::engine::{BatchLimits, DraftKind, DraftSpec, Request};
use wgspec::gpu::Gpu;
use wgspec::model::{LoadOptions, Precision, MAX_BATCH};
use wgspec::sampling::SamplingParams;
use wgspec::speculative::{self, KPolicy};

use crate::fetch;
use crate::load::{load_engine, TreeArgs};
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
    Bench(bench::BenchArgs),
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
pub(crate) struct SamplingArgs {
    /// 0 (or below 1e-5) = greedy; from 1e-5, sampling (drawn on the GPU, any top-k, min-p and
    /// top-p).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,
    /// Keep only tokens at least this fraction as likely as the most likely one (0 = no cut).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) min_p: f32,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
}

impl SamplingArgs {
    pub(crate) fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
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
    trees: TreeArgs,
    #[command(flatten)]
    k: KArgs,
    /// Stop when the text contains this string (repeatable); the text ends before it.
    #[arg(long)]
    stop: Vec<String>,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Run the request target-only first, then with the draft (both warmed up first: the
    /// speculative run starts with the costs and acceptance its warm-up measured, as a server's
    /// later requests do), and print both speeds, the speedup and τ (greedy: the same text,
    /// checked), and why where speculation lost. Needs --draft.
    #[arg(long)]
    compare: bool,
}

#[derive(clap::Args)]
pub(crate) struct KArgs {
    /// Draft exactly K tokens per verify pass (default: adaptive, from measured acceptance and costs).
    #[arg(long)]
    pub(crate) draft_k: Option<usize>,
    /// The largest K the adaptive choice may take.
    #[arg(long, default_value_t = speculative::DEFAULT_MAX_DRAFT_K)]
    pub(crate) max_draft_k: usize,
}

impl KArgs {
    pub(crate) fn policy(&self) -> KPolicy {
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
    #[command(flatten)]
    trees: TreeArgs,
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
    /// A web page's origin (`http(s)://HOST[:PORT]`, `null`, or `*` for any) whose requests to
    /// the API are answered, with CORS headers; repeat it or separate origins by commas. Pages
    /// on other origins than the server's own are refused (403) by default.
    #[arg(long, value_delimiter = ',')]
    allow_origin: Vec<String>,
    /// Requests that may wait for the GPU beyond those it serves; more are answered 429 at once.
    #[arg(long, default_value_t = 8)]
    max_queue: usize,
    /// Most requests served together, sharing every forward pass (1..=64; 1: one at a time).
    /// Greedy and sampled requests, plain or with the draft model, n-gram, EAGLE or Medusa drafts
    /// (alone or merged with the n-gram's), are batched.
    #[arg(long, default_value_t = MAX_BATCH)]
    max_batch: usize,
    /// Most rows of one forward pass: prompt chunks, decoding tokens and drafts (1..=64).
    #[arg(long, default_value_t = MAX_BATCH)]
    max_batch_tokens: usize,
    /// Pages of 16 positions in the KV cache pool the batched requests share (default: with
    /// --max-memory-mb, as many as the budget leaves beside the models; else one context's
    /// worth). A request waits for pages, or the youngest running one is preempted and later
    /// recomputed.
    #[arg(long)]
    kv_pages: Option<usize>,
    /// Requests never find other requests' pages in the prefix cache, only their own (the
    /// choices of one request still share its prompt): no request's time to first token tells
    /// whether another one's prompt began as its own. Default: shared (a repeated system prompt
    /// is computed once).
    #[arg(long)]
    no_prefix_sharing: bool,
    #[command(flatten)]
    listen: ListenArgs,
}

impl ListenArgs {
    fn config(
        self,
        model: Option<serve::ModelConfig>,
        api_key: Option<String>,
        allow_origins: serve::Origins,
        max_queue: usize,
    ) -> serve::ServerConfig {
        serve::ServerConfig {
            host: self.host,
            port: self.port,
            api_key,
            allow_origins,
            max_queue,
            model,
            roots: serve::Roots { www: self.www, pkg: self.pkg, models: fetch::cache_dir().join("models") },
            header_timeout: std::time::Duration::from_secs(self.header_timeout.max(1)),
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => pollster::block_on(generate(args)),
        Command::Bench(args) => pollster::block_on(bench::run(args)),
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
    serve::run(args.listen.config(None, None, serve::Origins::default(), 1))
}

fn serve_cmd(args: ServeArgs) -> Result<()> {
    let model = serve::ModelConfig {
        model: args.model,
        draft: args.draft,
        context: args.context,
        max_memory: args.max_memory_mb.map(|mb| mb * 1_000_000),
        kv_pages: args.kv_pages,
        batch: BatchLimits { max_seqs: args.max_batch, max_rows: args.max_batch_tokens },
        share_prefixes: !args.no_prefix_sharing,
        trees: args.trees,
    };
    model.trees.check(&model.draft)?;
    if !(1..=MAX_BATCH).contains(&args.max_batch) || !(1..=MAX_BATCH).contains(&args.max_batch_tokens) {
        return Err(Error::InvalidArgument(format!(
            "--max-batch and --max-batch-tokens take 1..={MAX_BATCH}, got {} and {}",
            args.max_batch, args.max_batch_tokens
        )));
    }
    let origins = serve::Origins::parse(&args.allow_origin)?;
    serve::run(args.listen.config(Some(model), args.api_key, origins, args.max_queue))
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

/// `generate --compare`'s verdict: both speeds, the speedup and τ, whether the texts agree, and
/// where speculation lost, why (a cycle's cost in target-only steps against the tokens it yielded).
fn comparison(plain: &wgspec::engine::Completion, spec: &wgspec::engine::Completion, greedy: bool) -> String {
    let (p, s) = (&plain.stats.base, &spec.stats);
    let speedup =
        if p.tokens_per_second > 0.0 { s.base.tokens_per_second / p.tokens_per_second } else { 0.0 };
    let same = match (greedy, plain.tokens == spec.tokens) {
        (true, _) => "the same text, token for token",
        (false, true) => "the same text (sampled)",
        (false, false) => "sampled: two draws of the same distribution differ",
    };
    let mut line = format!(
        "target-only {:.2} tokens/s; speculative ({}) {:.2} tokens/s: x{speedup:.2}, {:.2} tokens per target \
         forward (tau), {:.0}% of {} drafts accepted; {same}",
        p.tokens_per_second,
        s.draft,
        s.base.tokens_per_second,
        s.tokens_per_target_forward,
        100.0 * s.acceptance_rate,
        s.drafted
    );
    let step = if p.generated_tokens > 0 { p.decode_seconds / p.generated_tokens as f64 } else { 0.0 };
    if speedup < 1.0 && step > 0.0 && s.verify_forwards > 0 {
        // (a cycle: its drafting, host or GPU, and its verify pass)
        let cycle = (s.draft_seconds + s.verify_seconds) / s.verify_forwards as f64 / step;
        line += &format!(
            "\nspeculation lost on this adapter: a cycle (mean K {:.1}: drafting and the verify pass) took \
             {cycle:.2} target-only steps and yielded {:.2} tokens",
            s.mean_k, s.tokens_per_target_forward
        );
    }
    line
}

async fn generate(args: GenerateArgs) -> Result<()> {
    // (refused before any model is loaded)
    if args.compare && args.draft == DraftSpec::None {
        return Err(Error::InvalidArgument("--compare compares with a draft: give --draft".into()));
    }
    args.trees.check(&args.draft)?;
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
    args.trees.apply(&mut engine, &args.draft)?;
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
    req.set_sampling(args.sampling.params());
    req.stop = args.stop.clone();
    req.draft_k = args.k.draft_k;
    req.max_draft_k = args.k.max_draft_k;

    let baseline = match args.compare {
        true => {
            // (both ways warmed up first: a device compiles each kernel on its first use)
            let plain = Request { draft: Some(DraftKind::None), ..req.clone() };
            for warm in [&plain, &req] {
                engine.generate(&Request { max_tokens: 4, ..warm.clone() }, &mut |_| true).await?;
            }
            Some(engine.generate(&plain, &mut |_| true).await?)
        }
        false => None,
    };
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
    if let Some(plain) = &baseline {
        if req.sampling().is_greedy() && plain.tokens != out.tokens {
            return Err(Error::Gpu(format!(
                "greedy speculation changed the text: {:?} target-only, {:?} speculative",
                plain.text, out.text
            )));
        }
    }
    if args.json {
        #[derive(serde::Serialize)]
        struct Output<'a> {
            #[serde(flatten)]
            completion: &'a wgspec::engine::Completion,
            gpu_weight_bytes: u64,
            file_weight_bytes: u64,
            /// With --compare: the target-only run of the same request.
            #[serde(skip_serializing_if = "Option::is_none")]
            target_only: Option<&'a wgspec::engine::Completion>,
        }
        let output = Output {
            completion: &out,
            gpu_weight_bytes: info.gpu_weight_bytes,
            file_weight_bytes: info.file_weight_bytes,
            target_only: baseline.as_ref(),
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
        if let Some(plain) = &baseline {
            eprintln!("{}", comparison(plain, &out, req.sampling().is_greedy()));
        }
    }
    Ok(())
}
