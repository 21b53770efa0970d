//! OpenAI's response shapes: completions, chat completions and their SSE chunks (the requests
//! are read by the library's [`wgspec::openai`]).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use wgspec::generation::FinishReason;
use wgspec::openai::random_u64;
pub use wgspec::openai::{parse, parse_json, Endpoint};

use super::worker::WgspecStats;

/// OpenAI's `finish_reason`. A cancelled generation has no client left to tell.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Cancelled => "length",
    }
}

/// `{prompt_tokens, completion_tokens, total_tokens}`.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// What every response and chunk of one request shares.
#[derive(Clone, Debug)]
pub struct Shape {
    pub endpoint: Endpoint,
    /// `chatcmpl-…` or `cmpl-…`, the same in every chunk.
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

impl Shape {
    pub fn new(endpoint: Endpoint, model: &str, include_usage: bool) -> Shape {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Shape {
            endpoint,
            id: format!("{prefix}-{:016x}{:08x}", random_u64(), random_u64() as u32),
            created,
            model: model.to_string(),
            include_usage,
        }
    }

    /// The whole answer of a request without `stream`.
    pub fn response(
        &self,
        text: &str,
        finish: &str,
        usage: Value,
        stats: &WgspecStats,
        from_draft: &[bool],
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            Endpoint::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut wgspec = serde_json::to_value(stats).unwrap_or_else(|_| json!({}));
        wgspec["from_draft"] = json!(from_draft);
        json!({
            "id": self.id,
            "object": match self.endpoint { Endpoint::Chat => "chat.completion", Endpoint::Completions => "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
            "wgspec": wgspec,
        })
    }

    /// One streamed chunk: `text` (chat: with the role when `first`), and `finish` in the last.
    pub fn chunk(&self, text: &str, first: bool, finish: Option<&str>, wgspec: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match (first, finish.is_some() && text.is_empty()) {
                    (true, _) => json!({"role": "assistant", "content": text}),
                    (false, true) => json!({}),
                    (false, false) => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut chunk = self.chunk_head();
        chunk["choices"] = json!([choice]);
        chunk["wgspec"] = wgspec;
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The chunk after the last one when `stream_options.include_usage` is set: no choices.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let mut chunk = self.chunk_head();
        chunk["choices"] = json!([]);
        chunk["usage"] = usage;
        chunk
    }

    fn chunk_head(&self) -> Value {
        json!({
            "id": self.id,
            "object": match self.endpoint { Endpoint::Chat => "chat.completion.chunk", Endpoint::Completions => "text_completion" },
            "created": self.created,
            "model": self.model,
        })
    }
}

/// One server-sent event carrying `value`.
pub fn sse(value: &Value) -> String {
    format!("data: {value}\n\n")
}
