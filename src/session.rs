//! Plain (target-only) generation: prompt tokens in, streamed tokens and stats out.

use serde::Serialize;
use web_time::Instant;

use crate::error::{Error, Result};
use crate::model::{Model, MAX_BATCH};
use crate::sampling::{self, Rng, SamplingParams};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (included in the output when produced).
    pub stop_tokens: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was produced.
    Stop,
    /// `max_tokens` were produced, or the context is full.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// Counters and timings of one generation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Forward passes of the target model (prefill chunks included).
    pub target_forwards: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Generated tokens per second of decoding: generated tokens / `decode_seconds`. Prefill
    /// covers the prompt but its last token, whose step yields the first generated token (the
    /// speculative loop counts the same way, so the two rates compare directly).
    pub tokens_per_second: f64,
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: Stats,
}

/// Runs the prompt through `model` from position 0 and generates up to `opts.max_tokens` tokens,
/// calling `on_token` for each (return false to stop). Greedy decoding reads back one token id
/// per step (argmax on the GPU); sampling reads back one row of logits.
pub async fn generate(
    model: &mut Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generation> {
    opts.sampling.validate()?;
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt has no tokens".into()));
    }
    if prompt.len() >= model.context() {
        return Err(Error::ContextOverflow { needed: prompt.len() + 1, context: model.context() });
    }
    let greedy = opts.sampling.is_greedy();
    let mut rng = Rng::new(opts.sampling.seed);
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Stats::default() };
    let t0 = Instant::now();

    // Prefill all but the last prompt token in chunks of MAX_BATCH (as the speculative loop does,
    // so that both count the same passes as decoding): every generated token then comes out of
    // a decode step, the first one from the step over the last prompt token.
    let mut pos = 0;
    let (&last, head) = prompt.split_last().ok_or_else(|| Error::InvalidArgument("empty prompt".into()))?;
    for chunk in head.chunks(MAX_BATCH) {
        model.forward_argmax(chunk, pos).await?;
        stats.target_forwards += 1;
        pos += chunk.len();
    }
    stats.prefill_seconds = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut next = step(model, &[last], pos, greedy, &opts.sampling, &mut rng).await?;
    stats.target_forwards += 1;
    pos += 1;
    let mut tokens = Vec::new();
    let finish = loop {
        if tokens.len() >= opts.max_tokens {
            break FinishReason::Length;
        }
        tokens.push(next);
        if !on_token(next) {
            break FinishReason::Cancelled;
        }
        if opts.stop_tokens.contains(&next) {
            break FinishReason::Stop;
        }
        if tokens.len() >= opts.max_tokens || pos >= model.context() {
            break FinishReason::Length;
        }
        next = step(model, &[next], pos, greedy, &opts.sampling, &mut rng).await?;
        stats.target_forwards += 1;
        pos += 1;
    };
    stats.generated_tokens = tokens.len();
    stats.decode_seconds = t1.elapsed().as_secs_f64();
    stats.tokens_per_second =
        if stats.decode_seconds > 0.0 { tokens.len() as f64 / stats.decode_seconds } else { 0.0 };
    Ok(Generation { tokens, finish, stats })
}

/// One forward over `tokens` at `pos`, returning the next token after the last one.
async fn step(
    model: &mut Model,
    tokens: &[u32],
    pos: usize,
    greedy: bool,
    params: &SamplingParams,
    rng: &mut Rng,
) -> Result<u32> {
    if greedy {
        let ids = model.forward_argmax(tokens, pos).await?;
        ids.last().copied().ok_or_else(|| Error::Gpu("empty argmax read-back".into()))
    } else {
        let logits = model.forward_last(tokens, pos).await?;
        Ok(sampling::sample(&logits, params, rng))
    }
}
