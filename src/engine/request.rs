//! What a request asks for ([`Request`], plain data: it deserializes from the JSON the browser
//! package sends) and what a generation gives back ([`TokenEvent`]s as it goes, a
//! [`Completion`] at the end).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::generation::FinishReason;
use crate::sampling::SamplingParams;
use crate::speculative::{DraftKind, KPolicy, SpecStats, DEFAULT_MAX_DRAFT_K};
use crate::tokenizer::Message;

fn default_max_tokens() -> usize {
    128
}
fn default_top_p() -> f32 {
    1.0
}
fn default_max_draft_k() -> usize {
    DEFAULT_MAX_DRAFT_K
}

/// One generation request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Plain text prompt (BOS added where the vocabulary asks for it). Exclusive with `messages`.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Chat messages, rendered with the model's chat template. Exclusive with `prompt`.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// 0 (or below [`crate::sampling::MIN_TEMPERATURE`]) = greedy.
    #[serde(default)]
    pub temperature: f32,
    /// 0 = no top-k cut.
    #[serde(default)]
    pub top_k: usize,
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    /// 0 = no min-p cut ([`SamplingParams::min_p`]).
    #[serde(default)]
    pub min_p: f32,
    #[serde(default)]
    pub seed: u64,
    /// Generation ends when the text contains one of these; the text ends before it.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Default: the engine's ([`Engine::default_draft`](super::Engine::default_draft): the draft loaded last, else none).
    #[serde(default)]
    pub draft: Option<DraftKind>,
    /// Fixed K; `None` = adaptive up to `max_draft_k`.
    #[serde(default)]
    pub draft_k: Option<usize>,
    #[serde(default = "default_max_draft_k")]
    pub max_draft_k: usize,
    /// End-of-generation tokens do not end it (vLLM's `ignore_eos`, for benchmarks of a fixed
    /// length): it runs to `max_tokens` or a stop string; such a token still gives no text.
    #[serde(default)]
    pub ignore_eos: bool,
}

impl Request {
    /// A greedy request for `prompt` with every other field at its default.
    pub fn text(prompt: &str, max_tokens: usize) -> Request {
        Request {
            prompt: Some(prompt.to_string()),
            messages: None,
            max_tokens,
            temperature: 0.0,
            top_k: 0,
            top_p: default_top_p(),
            min_p: 0.0,
            seed: 0,
            stop: Vec::new(),
            draft: None,
            draft_k: None,
            max_draft_k: default_max_draft_k(),
            ignore_eos: false,
        }
    }

    /// Parses a JSON request, naming the problem when it is malformed.
    pub fn from_json(json: &str) -> Result<Request> {
        let de = &mut serde_json::Deserializer::from_str(json);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let err = e.into_inner();
            match path.as_str() {
                "." | "" => Error::InvalidArgument(format!("request: {err}")),
                field => Error::InvalidArgument(format!("request field `{field}`: {err}")),
            }
        })
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
        }
    }

    /// Sets the sampling fields (the inverse of [`Request::sampling`]).
    pub fn set_sampling(&mut self, p: SamplingParams) {
        let SamplingParams { temperature, top_k, top_p, min_p, seed } = p;
        (self.temperature, self.top_k, self.top_p, self.min_p, self.seed) =
            (temperature, top_k, top_p, min_p, seed);
    }

    pub fn k_policy(&self) -> KPolicy {
        KPolicy::new(self.draft_k, self.max_draft_k)
    }
}

/// One streamed piece of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The token committed, or `None` for the final flush of text held back (an incomplete
    /// UTF-8 sequence, or text that could have begun a stop string).
    pub id: Option<u32>,
    /// Text that became final with this event (possibly empty).
    pub text: String,
    /// The token was a draft token the target accepted (false: the target produced it).
    pub from_draft: bool,
}

/// The result of [`Engine::generate`](super::Engine::generate). `text` equals the concatenation of the streamed texts.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub from_draft: Vec<bool>,
    pub text: String,
    /// `"stop"` (a stop token or string), `"length"` or `"cancelled"`.
    pub finish_reason: FinishReason,
    /// Counts and timings; `stats.draft` is `"none"` for plain decoding.
    pub stats: SpecStats,
}
