//! OpenAI's response shapes, built once for every front end: the HTTP server serialises them,
//! the browser facade hands the same JSON to JavaScript.
//!
//! - [`Shape`]: what every answer of one request shares (id, `created`, model, route).
//! - [`Shape::response`]: the whole answer of a request without `stream` ([`Response`]).
//! - [`Stream`]: the chunks of a streamed one, in order: (chat) a first chunk with the role, a
//!   chunk per token with text, a last chunk with `finish_reason` and the request's stats, and
//!   the usage chunk when `stream_options.include_usage` asked for it ([`Chunk`]). With `n`
//!   choices each has its own chunks (its `index`), interleaved as their tokens come; the usage
//!   chunk comes after the last choice's last chunk.
//! - [`ErrorReply`]: a refusal or failure as OpenAI's `{"error": {message, type, param, code}}`
//!   with its HTTP status.
//!
//! Beside OpenAI's fields every answer carries `wgspec`: which tokens came from the draft
//! (`from_draft`, one flag per token of the chunk or the answer) and, once the generation ends,
//! its speculation figures ([`WgspecStats`]).

use serde::Serialize;

use crate::engine::{Completion, DraftKind, TokenEvent};
use crate::error::Error;
use crate::generation::FinishReason;

use super::{random_u64, Endpoint};

/// OpenAI's `finish_reason`. A cancelled generation is never answered (the server's client has
/// left; the browser's caller aborted and gets an `AbortError`): it reads as "length".
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Cancelled => "length",
    }
}

/// `{prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens}}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values were found computed (the server's prefix cache).
    pub cached_tokens: usize,
}

impl Usage {
    /// A request's usage from its choices' replies, `n` per prompt: each prompt once (as its
    /// first choice found it cached), every choice's tokens.
    pub fn of(replies: &[Reply], n: usize) -> Usage {
        let firsts = replies.iter().step_by(n.max(1));
        let (prompt_tokens, cached_tokens) =
            firsts.fold((0, 0), |(p, c), r| (p + r.prompt_tokens, c + r.cached_tokens));
        let completion_tokens = replies.iter().map(|r| r.completion_tokens).sum::<usize>();
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// The speculation figures of one request: the `wgspec` object of an answer (with `from_draft`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WgspecStats {
    /// The draft that proposed (`none` for plain decoding).
    pub draft: DraftKind,
    pub drafted: usize,
    pub accepted: usize,
    /// accepted / drafted (0 without drafts).
    pub acceptance_rate: f64,
    /// τ: tokens per target forward pass while decoding (1 for plain decoding).
    pub tokens_per_target_forward: f64,
    /// Mean K asked for per cycle.
    pub mean_k: f64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub tokens_per_second: f64,
}

/// A finished generation, as much of it as an answer tells.
#[derive(Clone, Debug)]
pub struct Reply {
    pub text: String,
    pub prompt_tokens: usize,
    /// Of them, those found computed (the prefix cache).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub finish: FinishReason,
    /// One flag per generated token: the target accepted it from the draft.
    pub from_draft: Vec<bool>,
    pub stats: WgspecStats,
}

impl From<Completion> for Reply {
    fn from(c: Completion) -> Reply {
        let s = &c.stats;
        let stats = WgspecStats {
            draft: s.draft,
            drafted: s.drafted,
            accepted: s.accepted,
            acceptance_rate: s.acceptance_rate,
            tokens_per_target_forward: s.tokens_per_target_forward,
            mean_k: s.mean_k,
            prefill_seconds: s.base.prefill_seconds,
            decode_seconds: s.base.decode_seconds,
            tokens_per_second: s.base.tokens_per_second,
        };
        Reply {
            prompt_tokens: c.prompt_tokens.len(),
            cached_tokens: s.base.cached_prompt_tokens,
            completion_tokens: c.tokens.len(),
            finish: c.finish_reason,
            from_draft: c.from_draft,
            text: c.text,
            stats,
        }
    }
}

/// The `wgspec` object: the draft flags of the tokens an answer or chunk carries, and (the whole
/// answer, the last chunk) the request's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Wgspec {
    #[serde(flatten)]
    pub stats: Option<WgspecStats>,
    pub from_draft: Vec<bool>,
}

/// The whole answer of a request without `stream`. Its `wgspec` is its first choice's; with
/// several choices (`n`) each carries its own too.
#[derive(Clone, Debug, Serialize)]
pub struct Response {
    pub id: String,
    /// `chat.completion` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
    pub wgspec: Wgspec,
}

/// A choice of a [`Response`]: the message (chat) or the text (completions).
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    #[serde(flatten)]
    pub content: Content,
    /// Always null: log-probabilities are not offered.
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
    /// This choice's `wgspec` (only with several choices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wgspec: Option<Wgspec>,
}

/// What a choice says: a chat message or a completion's text.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Content {
    Message { role: &'static str, content: String },
    Text(String),
}

/// One streamed chunk.
#[derive(Clone, Debug, Serialize)]
pub struct Chunk {
    pub id: String,
    /// `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    /// One choice; none in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Absent unless `stream_options.include_usage` asked for it; then null but in the usage
    /// chunk, which comes after the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// Absent from the usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wgspec: Option<Wgspec>,
}

/// The choice of a [`Chunk`].
#[derive(Clone, Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    #[serde(flatten)]
    pub content: ChunkContent,
    /// Always null.
    pub logprobs: Option<()>,
    /// Null but in the last chunk.
    pub finish_reason: Option<&'static str>,
}

/// What a chunk's choice adds: chat's `delta` or a completion's `text`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkContent {
    Delta(Delta),
    Text(String),
}

/// A chat chunk's `delta`: the role in the first, text in the next, nothing in the last.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// What every answer and chunk of one request shares.
#[derive(Clone, Debug)]
pub struct Shape {
    pub endpoint: Endpoint,
    /// `chatcmpl-…` or `cmpl-…`, the same in every chunk.
    pub id: String,
    /// Seconds since the Unix epoch when the generation started.
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Choices per prompt (`n`): the usage counts each prompt once.
    pub n: usize,
}

impl Shape {
    pub fn new(endpoint: Endpoint, model: &str, include_usage: bool, n: usize) -> Shape {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        let since = web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH);
        Shape {
            endpoint,
            id: format!("{prefix}-{:016x}{:08x}", random_u64(), random_u64() as u32),
            created: since.map(|d| d.as_secs()).unwrap_or(0),
            model: model.to_string(),
            include_usage,
            n,
        }
    }

    /// The whole answer of a request without `stream`: its choices' replies, in order (one but
    /// with `n` or several prompts).
    pub fn response(&self, replies: &[Reply]) -> Response {
        let wgspec = |r: &Reply| Wgspec { stats: Some(r.stats.clone()), from_draft: r.from_draft.clone() };
        let choices = (replies.iter().enumerate())
            .map(|(i, reply)| Choice {
                index: i as u32,
                content: match self.endpoint {
                    Endpoint::Chat => Content::Message { role: "assistant", content: reply.text.clone() },
                    Endpoint::Completions => Content::Text(reply.text.clone()),
                },
                logprobs: None,
                finish_reason: finish_reason(reply.finish),
                wgspec: (replies.len() > 1).then(|| wgspec(reply)),
            })
            .collect();
        Response {
            id: self.id.clone(),
            object: match self.endpoint {
                Endpoint::Chat => "chat.completion",
                Endpoint::Completions => "text_completion",
            },
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: Usage::of(replies, self.n),
            wgspec: replies.first().map_or(Wgspec { stats: None, from_draft: Vec::new() }, wgspec),
        }
    }

    /// A chunk of choice `index`: `text` (chat: the role too when `first`; no content in the last
    /// when it has no text), and `finish` in the last.
    fn chunk(
        &self,
        index: usize,
        text: String,
        first: bool,
        finish: Option<&'static str>,
        wgspec: Wgspec,
    ) -> Chunk {
        let content = match self.endpoint {
            Endpoint::Chat => ChunkContent::Delta(Delta {
                role: first.then_some("assistant"),
                content: (first || finish.is_none() || !text.is_empty()).then_some(text),
            }),
            Endpoint::Completions => ChunkContent::Text(text),
        };
        let choice = ChunkChoice { index: index as u32, content, logprobs: None, finish_reason: finish };
        Chunk {
            choices: vec![choice],
            usage: self.include_usage.then_some(None),
            wgspec: Some(wgspec),
            ..self.chunk_head()
        }
    }

    fn chunk_head(&self) -> Chunk {
        Chunk {
            id: self.id.clone(),
            object: match self.endpoint {
                Endpoint::Chat => "chat.completion.chunk",
                Endpoint::Completions => "text_completion",
            },
            created: self.created,
            model: self.model.clone(),
            choices: Vec::new(),
            usage: None,
            wgspec: None,
        }
    }
}

/// The chunks of one streamed answer of `n` choices, built from the engine's token events as
/// they come.
#[derive(Debug)]
pub struct Stream {
    pub shape: Shape,
    /// Per choice: the draft flags of its tokens not yet sent in a chunk (their text was held
    /// back).
    from_draft: Vec<Vec<bool>>,
    /// Per choice: its reply once it has ended.
    replies: Vec<Option<Reply>>,
}

impl Stream {
    /// The stream of a request of `n` choices in all (at least 1).
    pub fn new(shape: Shape, n: usize) -> Stream {
        let n = n.max(1);
        Stream { shape, from_draft: vec![Vec::new(); n], replies: vec![None; n] }
    }

    /// The chunks before any token: chat announces the role of each choice; completions have
    /// none.
    pub fn start(&self) -> Vec<Chunk> {
        let chat = self.shape.endpoint == Endpoint::Chat;
        let wgspec = || Wgspec { stats: None, from_draft: Vec::new() };
        (0..self.replies.len())
            .filter(|_| chat)
            .map(|i| self.shape.chunk(i, String::new(), true, None, wgspec()))
            .collect()
    }

    /// The chunk of choice `index`'s token event: one when it makes text final, carrying the
    /// draft flags of the choice's tokens since its last chunk.
    pub fn token(&mut self, index: usize, ev: &TokenEvent) -> Option<Chunk> {
        let flags = self.from_draft.get_mut(index)?;
        if ev.id.is_some() {
            flags.push(ev.from_draft);
        }
        if ev.text.is_empty() {
            return None;
        }
        let wgspec = Wgspec { stats: None, from_draft: std::mem::take(flags) };
        Some(self.shape.chunk(index, ev.text.clone(), false, None, wgspec))
    }

    /// Choice `index`'s last chunk: `finish_reason` with its figures; after the last choice's,
    /// the usage chunk when it was asked for.
    pub fn finish(&mut self, index: usize, reply: &Reply) -> Vec<Chunk> {
        let (Some(flags), Some(slot)) = (self.from_draft.get_mut(index), self.replies.get_mut(index)) else {
            return Vec::new();
        };
        let wgspec = Wgspec { stats: Some(reply.stats.clone()), from_draft: std::mem::take(flags) };
        *slot = Some(reply.clone());
        let finish = Some(finish_reason(reply.finish));
        let mut last = vec![self.shape.chunk(index, String::new(), false, finish, wgspec)];
        if self.ended() && self.shape.include_usage {
            let replies: Vec<Reply> = self.replies.iter().flatten().cloned().collect();
            last.push(Chunk {
                usage: Some(Some(Usage::of(&replies, self.shape.n))),
                ..self.shape.chunk_head()
            });
        }
        last
    }

    /// Whether every choice has ended.
    pub fn ended(&self) -> bool {
        self.replies.iter().all(Option::is_some)
    }
}

/// An error as OpenAI answers it: `{"error": {message, type, param, code}}` with an HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `service_unavailable`,
    /// `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

/// The body of an [`ErrorReply`].
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ErrorReply {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ErrorReply {
        ErrorReply { status, message: message.into(), kind, param: None, code: None }
    }

    /// Names `param` as the field at fault of a 400 that names none.
    pub fn with_param_if_none(mut self, param: &str) -> ErrorReply {
        if self.param.is_none() && self.status == 400 {
            self.param = Some(param.to_string());
        }
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let error = ErrorFields {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: self.code,
        };
        serde_json::to_value(ErrorBody { error }).unwrap_or_default()
    }
}

/// Client mistakes are 400 (404 for an unknown model), a busy engine 503, the rest 500.
impl From<&Error> for ErrorReply {
    fn from(e: &Error) -> ErrorReply {
        let invalid = |message: String| ErrorReply::new(400, "invalid_request_error", message);
        match e {
            Error::Request { message, param, code } => {
                let mut reply = if *code == Some("model_not_found") {
                    ErrorReply::new(404, "not_found_error", message.clone())
                } else {
                    invalid(message.clone())
                };
                reply.param = param.clone();
                reply.code = *code;
                reply
            }
            Error::ContextOverflow { .. } | Error::PromptTooLong { .. } => {
                ErrorReply { code: Some("context_length_exceeded"), ..invalid(e.to_string()) }
            }
            Error::InvalidArgument(_)
            | Error::ChatTemplate(_)
            | Error::Tokenizer(_)
            | Error::TokenOutOfRange { .. } => invalid(e.to_string()),
            Error::Busy(_) => ErrorReply::new(503, "service_unavailable", e.to_string()),
            _ => ErrorReply::new(500, "server_error", e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn shape(endpoint: Endpoint, include_usage: bool) -> Shape {
        Shape::new(endpoint, "m", include_usage, 1)
    }

    fn token(id: Option<u32>, text: &str, from_draft: bool) -> TokenEvent {
        TokenEvent { id, text: text.into(), from_draft }
    }

    fn reply() -> Reply {
        let stats = WgspecStats { draft: DraftKind::Ngram, drafted: 3, accepted: 2, ..Default::default() };
        let from_draft = vec![true, false, true];
        Reply {
            text: "abc".into(),
            prompt_tokens: 5,
            cached_tokens: 0,
            completion_tokens: 3,
            finish: FinishReason::Stop,
            from_draft,
            stats,
        }
    }

    fn to_json(v: &impl Serialize) -> Value {
        serde_json::to_value(v).expect("serialises")
    }

    /// The answer's fields, without the per-request id and clock.
    fn without_id(mut v: Value) -> Value {
        let map = v.as_object_mut().expect("an object");
        assert!(map.remove("id").and_then(|id| id.as_str().map(|s| s.contains('-'))).unwrap_or(false));
        assert!(map.remove("created").is_some_and(|c| c.is_u64()));
        v
    }

    #[test]
    fn a_chat_stream_announces_the_role_carries_flags_per_text_and_ends_with_the_figures() {
        let mut s = Stream::new(shape(Endpoint::Chat, false), 1);
        let first = without_id(to_json(&s.start()[0]));
        let head = json!({"object": "chat.completion.chunk", "model": "m"});
        let mut want = head.clone();
        want["choices"] = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
        want["wgspec"] = json!({"from_draft": []});
        assert_eq!(first, want);
        // a token whose text is held back sends nothing; its flag goes with the next text
        assert!(s.token(0, &token(Some(1), "", true)).is_none());
        let chunk = without_id(to_json(&s.token(0, &token(Some(2), "ab", false)).expect("text")));
        assert_eq!(chunk["choices"][0]["delta"], json!({"content": "ab"}));
        assert_eq!(chunk["wgspec"], json!({"from_draft": [true, false]}));
        assert!(chunk.get("usage").is_none(), "no usage unless asked: {chunk}");
        // the final flush of held-back text is no token: no flag
        let flush = to_json(&s.token(0, &token(None, "c", false)).expect("text"));
        assert_eq!(flush["wgspec"], json!({"from_draft": []}));
        let last = s.finish(0, &reply());
        assert_eq!(last.len(), 1, "no usage chunk unless asked");
        let last = without_id(to_json(&last[0]));
        assert_eq!(
            last["choices"],
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}])
        );
        let mut figures = to_json(&reply().stats);
        figures["from_draft"] = json!([]);
        assert_eq!(last["wgspec"], figures);
    }

    #[test]
    fn a_completions_stream_has_no_role_and_its_usage_chunk_comes_last_when_asked() {
        let mut s = Stream::new(shape(Endpoint::Completions, true), 1);
        assert!(s.start().is_empty());
        let chunk = to_json(&s.token(0, &token(Some(7), "x", true)).expect("text"));
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(
            chunk["choices"],
            json!([{"index": 0, "text": "x", "logprobs": null, "finish_reason": null}])
        );
        assert_eq!(chunk["usage"], Value::Null);
        assert!(chunk.as_object().is_some_and(|m| m.contains_key("usage")));
        let last: Vec<Value> = s.finish(0, &reply()).iter().map(to_json).collect();
        assert_eq!(last.len(), 2);
        assert_eq!(last[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(last[0]["choices"][0]["text"], "");
        assert_eq!(last[0]["usage"], Value::Null);
        let usage = without_id(last[1].clone());
        let want = json!({"object": "text_completion", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 0}}});
        assert_eq!(usage, want);
        assert_eq!(to_json(&last[0])["id"], chunk["id"], "one id for every chunk");
    }

    #[test]
    fn whole_answers_have_openais_fields_and_every_tokens_flag() {
        let r = reply();
        let chat = without_id(to_json(&shape(Endpoint::Chat, false).response(std::slice::from_ref(&r))));
        let mut wgspec = to_json(&r.stats);
        wgspec["from_draft"] = json!([true, false, true]);
        let want = json!({
            "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "abc"}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 0}},
            "wgspec": wgspec,
        });
        assert_eq!(chat, want);
        let text = to_json(
            &shape(Endpoint::Completions, true).response(&[Reply { finish: FinishReason::Length, ..r }]),
        );
        assert!(text["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
        assert_eq!(text["object"], "text_completion");
        assert_eq!(
            text["choices"],
            json!([{"index": 0, "text": "abc", "logprobs": null, "finish_reason": "length"}])
        );
    }

    #[test]
    fn several_choices_have_their_indices_flags_and_one_usage() {
        // a whole answer: each choice its index and its own figures; the prompt counted once
        let (a, b) = (
            reply(),
            Reply { text: "xy".into(), completion_tokens: 2, from_draft: vec![false; 2], ..reply() },
        );
        let two = Shape::new(Endpoint::Completions, "m", false, 2);
        let whole = to_json(&two.response(&[a.clone(), b.clone()]));
        assert_eq!(whole["choices"][1]["index"], 1);
        assert_eq!(whole["choices"][1]["text"], "xy");
        assert_eq!(whole["choices"][1]["wgspec"]["from_draft"], json!([false, false]));
        assert_eq!(whole["choices"][0]["wgspec"]["from_draft"], json!([true, false, true]));
        assert_eq!(whole["usage"]["prompt_tokens"], 5);
        assert_eq!(whole["usage"]["completion_tokens"], 5);
        // two prompts of one choice each (a completions list): each prompt counted, its cache too
        let c = Reply { prompt_tokens: 7, cached_tokens: 4, ..b.clone() };
        let usage = to_json(&shape(Endpoint::Completions, false).response(&[a.clone(), c]))["usage"].clone();
        assert_eq!((&usage["prompt_tokens"], &usage["total_tokens"]), (&json!(12), &json!(17)), "{usage}");
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 4 + a.cached_tokens);
        let one = to_json(&shape(Endpoint::Completions, false).response(std::slice::from_ref(&a)));
        assert!(one["choices"][0].get("wgspec").is_none(), "one choice: the answer's wgspec only");
        // a stream: a role chunk per choice, chunks by index, the usage after the last choice
        let mut s = Stream::new(Shape::new(Endpoint::Chat, "m", true, 2), 2);
        let starts: Vec<Value> = s.start().iter().map(to_json).collect();
        assert_eq!(starts.len(), 2);
        assert_eq!(
            (starts[0]["choices"][0]["index"].clone(), starts[1]["choices"][0]["index"].clone()),
            (json!(0), json!(1))
        );
        let c = to_json(&s.token(1, &token(Some(3), "q", true)).expect("text"));
        assert_eq!(
            (c["choices"][0]["index"].clone(), c["wgspec"]["from_draft"].clone()),
            (json!(1), json!([true]))
        );
        assert!(s.token(0, &token(Some(4), "", false)).is_none());
        let first_done = s.finish(1, &b);
        assert_eq!(first_done.len(), 1, "no usage before every choice ended");
        assert!(!s.ended());
        let last: Vec<Value> = s.finish(0, &a).iter().map(to_json).collect();
        assert!(s.ended());
        assert_eq!(last[0]["choices"][0]["index"], 0);
        assert_eq!(last[0]["wgspec"]["from_draft"], json!([false]));
        assert_eq!(last[1]["usage"]["completion_tokens"], 5);
        assert_eq!(last[1]["usage"]["prompt_tokens"], 5);
        assert!(s.token(2, &token(Some(1), "z", false)).is_none(), "no such choice");
    }

    #[test]
    fn errors_are_answered_with_openais_status_type_param_and_code() {
        let unknown = Error::Request {
            message: "no such model".into(),
            param: Some("model".into()),
            code: Some("model_not_found"),
        };
        let e = ErrorReply::from(&unknown);
        assert_eq!(
            (e.status, e.kind, e.param.as_deref(), e.code),
            (404, "not_found_error", Some("model"), Some("model_not_found"))
        );
        let long = ErrorReply::from(&Error::PromptTooLong { bytes: 9, max_bytes: 4, context: 2 })
            .with_param_if_none("messages");
        assert_eq!(
            (long.status, long.code, long.param.as_deref()),
            (400, Some("context_length_exceeded"), Some("messages"))
        );
        let body = long.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(
            body["error"]["message"],
            Error::PromptTooLong { bytes: 9, max_bytes: 4, context: 2 }.to_string()
        );
        let busy = ErrorReply::from(&Error::Busy("x".into())).with_param_if_none("messages");
        assert_eq!((busy.status, busy.param), (503, None), "only a 400 names a field");
        assert_eq!(ErrorReply::from(&Error::InvalidArgument("x".into())).status, 400);
        assert_eq!(ErrorReply::from(&Error::io("f", "gone")).status, 500);
        assert_eq!(finish_reason(FinishReason::Cancelled), "length");
    }
}
