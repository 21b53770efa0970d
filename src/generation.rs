//! What a generation asks for and how it ended: options, finish reason, base stats. The one
//! decode loop is [`generate`](fn@crate::speculative::generate) (plain decoding is that loop without a draft).

use serde::Serialize;

use crate::sampling::SamplingParams;

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
    /// Prompt tokens whose keys and values were found computed (the batch's prefix cache:
    /// OpenAI's `usage.prompt_tokens_details.cached_tokens`).
    pub cached_prompt_tokens: usize,
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
