//! The `wgspec` command line: generate text, fetch known models.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use wgspec::fetch;
use wgspec::gpu::Gpu;
use wgspec::model::{LoadOptions, Model, Precision};
use wgspec::sampling::SamplingParams;
use wgspec::session::{self, GenerateOptions};
use wgspec::tokenizer::StreamDecoder;
use wgspec::Result;

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
    /// Download a known model into the cache and print its path.
    Fetch {
        /// smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b
        name: String,
    },
}

#[derive(Parser)]
struct GenerateArgs {
    /// A .gguf file, a Hugging Face folder (config.json, tokenizer.json, *.safetensors), or a known model NAME.
    #[arg(long)]
    model: String,
    #[arg(long)]
    prompt: String,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => pollster::block_on(generate(args)),
        Command::Fetch { name } => fetch_cmd(&name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
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

async fn generate(args: GenerateArgs) -> Result<()> {
    let path: PathBuf = fetch::resolve_model(&args.model)?;
    let (ckpt, tokenizer) = wgspec::local::open(&path)?;
    let gpu = Arc::new(Gpu::new().await?);
    if !args.json {
        eprintln!("adapter: {}", gpu.describe());
    }
    let opts = LoadOptions {
        context: args.context,
        precision: if args.f32 { Precision::F32 } else { Precision::Auto },
        ..Default::default()
    };
    let mut shown = 0;
    let mut model = Model::load(gpu, &ckpt, &opts, &mut |p| {
        // About 20 updates, whatever the tensor count.
        let step = p.tensors_done * 20 / p.tensors_total.max(1);
        if step > shown || p.tensors_done == p.tensors_total {
            shown = step;
            eprint!("\rloading {}: {}/{} tensors", path.display(), p.tensors_done, p.tensors_total);
        }
    })?;
    eprintln!();
    drop(ckpt);
    let prompt = tokenizer.encode(&args.prompt, true)?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let gen_opts =
        GenerateOptions { max_tokens: args.max_tokens, sampling, stop_tokens: tokenizer.eos_ids().to_vec() };
    let mut decoder = StreamDecoder::new();
    let mut stdout = std::io::stdout();
    let mut stream_err = None;
    let generation = session::generate(&mut model, &prompt, &gen_opts, &mut |tok| {
        if !args.json {
            match decoder.push(&tokenizer, tok) {
                Ok(text) => {
                    let _ = write!(stdout, "{text}");
                    let _ = stdout.flush();
                }
                Err(e) => stream_err = Some(e),
            }
        }
        true
    })
    .await?;
    if let Some(e) = stream_err {
        return Err(e);
    }
    let text = tokenizer.decode(&generation.tokens)?;
    let s = &generation.stats;
    if args.json {
        let out = serde_json::json!({
            "prompt_tokens": prompt,
            "tokens": generation.tokens,
            "text": text,
            "finish_reason": generation.finish,
            "stats": s,
        });
        println!("{out}");
    } else {
        println!();
        eprintln!(
            "{} prompt tokens, {} generated in {:.2} s: {:.2} tokens/s (prefill {:.2} s)",
            s.prompt_tokens, s.generated_tokens, s.decode_seconds, s.tokens_per_second, s.prefill_seconds
        );
    }
    Ok(())
}
