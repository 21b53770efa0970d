//! OpenAI's request and response shapes: a JSON body checked field by field (unknown fields
//! refused, the harmless ones clients send by default accepted), turned into an
//! [`engine::Request`]; completions, chat completions and their SSE chunks built back.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{json, Map, Value};
use wgspec::engine::{self, DraftKind};
use wgspec::session::FinishReason;
use wgspec::tokenizer::Message;

use super::error::ApiError;
use super::worker::WgspecStats;

/// `temperature` when a request gives none (OpenAI's default: sampling, not greedy).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;
/// The most stop strings one request may give.
pub const MAX_STOPS: usize = 16;
/// The largest `draft_k` / `max_draft_k` accepted (the engine caps K at its batch size anyway).
pub const MAX_DRAFT_K: usize = 64;

/// Which completion route a body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`: `messages` under the model's chat template.
    Chat,
    /// `POST /v1/completions`: a plain `prompt`.
    Completions,
}

/// Fields both routes take. Besides these, a body may carry the fields of [`HARMLESS`].
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "draft",
    "draft_k",
    "max_draft_k",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
];
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
];
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "best_of", "suffix"];
/// Fields clients send that change nothing here; their values are not looked at.
const HARMLESS: &[&str] = &["user", "metadata", "store", "service_tier"];

/// A body's fields with the types OpenAI documents; the ones with several shapes stay JSON and
/// are read by hand.
#[derive(Deserialize)]
struct Body {
    model: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    prompt: Option<Value>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<i64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    draft: Option<DraftKind>,
    draft_k: Option<u64>,
    max_draft_k: Option<u64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: Option<Map<String, Value>>,
    logprobs: Option<Value>,
    top_logprobs: Option<u64>,
    response_format: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    functions: Option<Vec<Value>>,
    function_call: Option<Value>,
    /// Without tools there is nothing to call in parallel: any value is harmless.
    #[serde(rename = "parallel_tool_calls")]
    _parallel_tool_calls: Option<bool>,
    echo: Option<bool>,
    best_of: Option<u64>,
    suffix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
    /// OpenAI's flag for obfuscation padding; nothing to pad here.
    #[serde(default, rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Value>,
    /// A participant's name: accepted, not shown to the model.
    #[serde(default, rename = "name")]
    _name: Option<String>,
}

/// A completion request, checked: what the engine runs and how to answer.
#[derive(Debug)]
pub struct Parsed {
    /// The engine's request; its `max_tokens` is set once the prompt's length is known.
    pub request: engine::Request,
    /// The `max_tokens` asked for (`None`: up to the end of the context).
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Reads a completion body for `endpoint`. `model_ids` are the names the loaded model answers to.
pub fn parse(endpoint: Endpoint, bytes: &[u8], model_ids: &[String]) -> Result<Parsed, ApiError> {
    let value = parse_object(bytes)?;
    let own = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completions => COMPLETION_FIELDS,
    };
    if let Value::Object(map) = &value {
        for key in map.keys() {
            let known = [COMMON_FIELDS, own, HARMLESS].iter().any(|list| list.contains(&key.as_str()));
            if !known {
                return Err(ApiError::field(key, format!("unrecognized request argument `{key}`")));
            }
        }
    }
    let body: Body = typed(value)?;
    check_harmless(&body)?;

    if let Some(model) = &body.model {
        if !model_ids.iter().any(|id| id == model) {
            return Err(ApiError::not_found(format!(
                "the model `{model}` does not exist; this server runs `{}`",
                model_ids.first().map(String::as_str).unwrap_or("")
            ))
            .with_param("model")
            .with_code("model_not_found"));
        }
    }
    if let Some(n) = body.n {
        if n != 1 {
            return Err(ApiError::field("n", format!("`n` must be 1 (one choice per request), not {n}")));
        }
    }

    let mut request = engine::Request::text("", 0);
    match endpoint {
        Endpoint::Chat => {
            let messages =
                body.messages.ok_or_else(|| ApiError::field("messages", "`messages` is required"))?;
            if messages.is_empty() {
                return Err(ApiError::field("messages", "`messages` must hold at least one message"));
            }
            let messages =
                messages.into_iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<_, _>>()?;
            request.prompt = None;
            request.messages = Some(messages);
        }
        Endpoint::Completions => {
            let prompt = body.prompt.ok_or_else(|| ApiError::field("prompt", "`prompt` is required"))?;
            request.prompt = Some(prompt_text(prompt)?);
        }
    }

    let max_tokens = match (body.max_tokens, body.max_completion_tokens) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "max_completion_tokens",
                "give `max_tokens` or `max_completion_tokens`, not both",
            ))
        }
        (Some(n), None) => Some(("max_tokens", n)),
        (None, Some(n)) => Some(("max_completion_tokens", n)),
        (None, None) => None,
    };
    let max_tokens = match max_tokens {
        Some((field, 0)) => return Err(ApiError::field(field, format!("`{field}` must be at least 1"))),
        Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };

    let temperature = body.temperature.unwrap_or(f64::from(DEFAULT_TEMPERATURE));
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::field(
            "temperature",
            format!("`temperature` must be in [0, 2], not {temperature}"),
        ));
    }
    request.temperature = temperature as f32;
    if let Some(p) = body.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::field("top_p", format!("`top_p` must be in (0, 1], not {p}")));
        }
        request.top_p = p as f32;
    }
    request.top_k = match body.top_k {
        // -1 and 0: no top-k cut (vLLM's and llama.cpp's spellings).
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::field(
                "top_k",
                format!("`top_k` must be positive (or 0 / -1 for none), not {k}"),
            ))
        }
    };
    request.seed = match body.seed {
        // The same bits for negative seeds: any integer is a valid seed.
        Some(s) => s as u64,
        None => random_u64(),
    };
    request.stop = match body.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::field("stop", "`stop` must be a string or a list of strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::field("stop", "`stop` must be a string or a list of strings")),
    };
    if request.stop.len() > MAX_STOPS {
        return Err(ApiError::field("stop", format!("at most {MAX_STOPS} stop strings")));
    }
    request.draft = body.draft;
    let k_field = |field: &str, k: u64| {
        if k == 0 || k > MAX_DRAFT_K as u64 {
            Err(ApiError::field(field, format!("`{field}` must be in 1..={MAX_DRAFT_K}, not {k}")))
        } else {
            Ok(k as usize)
        }
    };
    request.draft_k = body.draft_k.map(|k| k_field("draft_k", k)).transpose()?;
    if let Some(k) = body.max_draft_k {
        request.max_draft_k = k_field("max_draft_k", k)?;
    }
    let stream = body.stream.unwrap_or(false);
    let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
    Ok(Parsed { request, max_tokens, stream, include_usage })
}

/// A JSON object body, or a 400 saying what is wrong with it.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(format!("the body is not valid JSON: {e}")).with_code("invalid_json")
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid("the body must be a JSON object").with_code("invalid_json"));
    }
    Ok(value)
}

/// `value` as `T`, naming the field whose type is wrong.
pub fn typed<T: for<'de> Deserialize<'de>>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." | "" => ApiError::invalid(format!("the body: {inner}")),
            field => {
                let param = field.split(['.', '[']).next().unwrap_or(field);
                ApiError::field(param, format!("`{field}`: {inner}"))
            }
        }
    })
}

/// The fields accepted when they ask for nothing this server does not do.
fn check_harmless(b: &Body) -> Result<(), ApiError> {
    for (field, value) in
        [("presence_penalty", b.presence_penalty), ("frequency_penalty", b.frequency_penalty)]
    {
        if value.is_some_and(|v| v != 0.0) {
            return Err(ApiError::field(field, format!("`{field}` is not supported (only 0)")));
        }
    }
    if b.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::field("logit_bias", "`logit_bias` is not supported"));
    }
    // Chat: a boolean; completions: the number of log probabilities (null or 0 only).
    if !matches!(b.logprobs, None | Some(Value::Null) | Some(Value::Bool(false))) {
        return Err(ApiError::field("logprobs", "`logprobs` is not supported"));
    }
    if b.top_logprobs.is_some_and(|n| n != 0) {
        return Err(ApiError::field("top_logprobs", "`top_logprobs` is not supported"));
    }
    match &b.response_format {
        None | Some(Value::Null) => {}
        Some(v) if v.get("type") == Some(&Value::from("text")) => {}
        Some(_) => {
            return Err(ApiError::field("response_format", "only `{\"type\": \"text\"}` is supported"))
        }
    }
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) || b.functions.as_ref().is_some_and(|t| !t.is_empty())
    {
        let field = if b.tools.is_some() { "tools" } else { "functions" };
        return Err(ApiError::field(field, format!("`{field}` (tool calls) are not supported")));
    }
    for (field, value) in [("tool_choice", &b.tool_choice), ("function_call", &b.function_call)] {
        let harmless = match value {
            None | Some(Value::Null) => true,
            Some(v) => matches!(v.as_str(), Some("none" | "auto")),
        };
        if !harmless {
            return Err(ApiError::field(field, format!("`{field}` is not supported")));
        }
    }
    if b.echo == Some(true) {
        return Err(ApiError::field("echo", "`echo` is not supported"));
    }
    if b.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::field("best_of", "`best_of` must be 1"));
    }
    if b.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "`suffix` is not supported"));
    }
    Ok(())
}

/// A chat message: `content` is a string or a list of text parts.
fn message(i: usize, m: ChatMessage) -> Result<Message, ApiError> {
    let field = format!("messages[{i}].content");
    let content = match m.content {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::field(
                            "messages",
                            format!("`{field}`: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported"),
                        ))
                    }
                }
            }
            text
        }
        None | Some(Value::Null) => {
            return Err(ApiError::field("messages", format!("`{field}` is required")))
        }
        Some(_) => {
            return Err(ApiError::field(
                "messages",
                format!("`{field}` must be a string or a list of text parts"),
            ))
        }
    };
    if m.role.is_empty() {
        return Err(ApiError::field("messages", format!("`messages[{i}].role` is empty")));
    }
    Ok(Message { role: m.role, content })
}

/// A completions `prompt`: a string, or a list holding exactly one string.
fn prompt_text(prompt: Value) -> Result<String, ApiError> {
    match prompt {
        Value::String(s) => Ok(s),
        Value::Array(mut items) if items.len() == 1 && items[0].is_string() => match items.pop() {
            Some(Value::String(s)) => Ok(s),
            _ => Err(ApiError::field("prompt", "`prompt` must be a string")),
        },
        Value::Array(_) => Err(ApiError::field(
            "prompt",
            "`prompt` must be one string (lists of several prompts and token arrays are not supported)",
        )),
        _ => Err(ApiError::field("prompt", "`prompt` must be a string")),
    }
}

/// A random 64-bit value (ids, seeds of unseeded requests): std's randomly keyed hasher.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Vec<String> {
        vec!["tiny".to_string()]
    }

    #[test]
    fn chat_bodies_become_engine_requests() {
        let body = br#"{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 5, "temperature": 0, "stop": "x", "seed": -1, "user": "u",
            "presence_penalty": 0, "logprobs": false, "stream": true, "stream_options": {"include_usage": true},
            "draft": "ngram", "draft_k": 3}"#;
        let p = parse(Endpoint::Chat, body, &ids()).expect("valid");
        assert_eq!(p.max_tokens, Some(5));
        assert!(p.stream && p.include_usage);
        assert_eq!(p.request.messages.as_ref().map(|m| m[0].content.as_str()), Some("hi"));
        assert_eq!(p.request.stop, ["x"]);
        assert_eq!(p.request.seed, u64::MAX);
        assert_eq!(p.request.draft, Some(DraftKind::Ngram));
        assert_eq!(p.request.draft_k, Some(3));
        assert_eq!(p.request.temperature, 0.0);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases: &[(&[u8], &str)] = &[
            (b"{", ""),
            (b"[]", ""),
            (br#"{"prompt": "a", "temperature": "hot"}"#, "temperature"),
            (br#"{"prompt": "a", "temperature": -1}"#, "temperature"),
            (br#"{"prompt": "a", "top_p": 0}"#, "top_p"),
            (br#"{"prompt": "a", "max_tokens": 0}"#, "max_tokens"),
            (br#"{"prompt": "a", "max_tokens": -3}"#, "max_tokens"),
            (br#"{"prompt": "a", "n": 2}"#, "n"),
            (br#"{"prompt": "a", "frequency_penalty": 0.5}"#, "frequency_penalty"),
            (br#"{"prompt": "a", "logprobs": 2}"#, "logprobs"),
            (br#"{"prompt": "a", "bogus": 1}"#, "bogus"),
            (br#"{"prompt": [1, 2]}"#, "prompt"),
            (br#"{"prompt": "a", "stop": [1]}"#, "stop"),
            (br#"{"prompt": "a", "draft": "eagle"}"#, "draft"),
            (br#"{"prompt": "a", "draft_k": 0}"#, "draft_k"),
            (br#"{}"#, "prompt"),
        ];
        for (body, param) in cases {
            let e = parse(Endpoint::Completions, body, &ids()).expect_err(&String::from_utf8_lossy(body));
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
            assert_eq!(
                e.param.as_deref().unwrap_or(""),
                *param,
                "{}: {}",
                String::from_utf8_lossy(body),
                e.message
            );
        }
        let e =
            parse(Endpoint::Completions, br#"{"prompt": "a", "model": "gpt-4"}"#, &ids()).expect_err("model");
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
    }
}
