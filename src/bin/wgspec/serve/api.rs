//! The routes: health and readiness, metrics, the OpenAI API (completions, chat completions,
//! models) and llama.cpp's `/tokenize` and `/detokenize`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use wgspec::engine::{DraftKind, Prompter};
use wgspec::openai::{self, Endpoint, Shape};

use super::error::ApiError;
use super::metrics::Metrics;
use super::worker::{Event, Job, Loaded, Part, Refused};
use super::{App, ModelInfo};
use wgspec::tokenizer::TextLimit;

/// The largest request body.
pub const MAX_BODY: usize = 8 << 20;
/// A request body must arrive within this time (waiting for room in [`BODY_BUDGET`] included).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bodies up to this size are read at once; 64 KiB holds any chat a client types by hand. With
/// at most `MAX_CONNECTIONS` (1024) requests open, such bodies take at most 64 MiB together.
pub const SMALL_BODY: usize = 64 << 10;
/// Bytes of larger bodies held at once, server-wide: 4 bodies of [`MAX_BODY`]. A larger body
/// waits for room before more of it than [`SMALL_BODY`] is read (a body without
/// `Content-Length` takes room for [`MAX_BODY`]).
pub const BODY_BUDGET: usize = 4 * MAX_BODY;
/// Requests parsed, rendered and tokenized at once, server-wide (the CPU work before a request
/// is queued; the others wait their turn).
pub const PREPARE_AT_ONCE: usize = 2;

/// A request body of at most [`MAX_BODY`] bytes, read within [`BODY_TIMEOUT`], holding its room
/// in the server's [`BODY_BUDGET`] until it is dropped.
pub struct BodyBytes {
    pub bytes: Bytes,
    _room: Option<OwnedSemaphorePermit>,
}

impl FromRequest<Arc<App>> for BodyBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {} MiB", MAX_BODY >> 20),
            )
            .with_code("request_too_large")
        };
        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
        let declared = declared.and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large());
        }
        let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
        let budget = app.bodies.clone();
        let room_for = |bytes: usize| {
            let budget = budget.clone();
            async move {
                // `bytes` <= MAX_BODY < u32::MAX; the budget is never closed.
                match tokio::time::timeout_at(deadline, budget.acquire_many_owned(bytes as u32)).await {
                    Ok(Ok(permit)) => Ok(permit),
                    _ => Err(ApiError::unavailable(format!(
                        "the server is reading other large requests ({} MiB at once); retry later",
                        BODY_BUDGET >> 20
                    ))
                    .with_code("server_busy")),
                }
            }
        };
        let mut room = None;
        if let Some(n) = declared.map(|n| n as usize).filter(|&n| n > SMALL_BODY) {
            room = Some(room_for(n).await?);
        }
        let mut body = req.into_body();
        let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    return Err(ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "invalid_request_error",
                        format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
                    )
                    .with_code("request_timeout"))
                }
            };
            let frame = frame.map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                let len = bytes.len() + data.len();
                if len > MAX_BODY {
                    return Err(too_large());
                }
                if len > SMALL_BODY && room.is_none() {
                    room = Some(room_for(MAX_BODY).await?);
                }
                bytes.extend_from_slice(&data);
            }
        }
        Ok(BodyBytes { bytes: Bytes::from(bytes), _room: room })
    }
}

/// How long a request waits for one of the [`PREPARE_AT_ONCE`] places (503 after).
const PREPARE_WAIT: Duration = Duration::from_secs(30);

/// Runs `work` on a blocking thread once one of the server's [`PREPARE_AT_ONCE`] places is free.
/// The place goes with the work: a client that leaves while it runs frees it only when it ends.
async fn prepare<T: Send + 'static>(
    app: &App,
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    let busy = || {
        ApiError::unavailable(format!(
            "{PREPARE_AT_ONCE} requests are being read and tokenized, and this one waited {PREPARE_WAIT:?}; retry later"
        ))
        .with_code("server_busy")
    };
    let place = match tokio::time::timeout(PREPARE_WAIT, app.preparing.clone().acquire_owned()).await {
        Ok(Ok(place)) => place,
        _ => return Err(busy()),
    };
    tokio::task::spawn_blocking(move || {
        let result = work();
        drop(place);
        result
    })
    .await
    .map_err(|e| ApiError::internal(format!("{what}: {e}")))
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 once the models are loaded (at once without a model), 503 before, or when the GPU worker
/// has ended.
pub async fn ready(State(app): State<Arc<App>>) -> Response {
    match &app.model {
        None => Json(json!({"status": "ready"})).into_response(),
        Some(m) if m.queue.is_closed() => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "failed"}))).into_response()
        }
        Some(m) if m.loaded.get().is_some() => Json(json!({"status": "ready"})).into_response(),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    let queue_depth = app.model.as_ref().map_or(0, |m| m.queue.len());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render(queue_depth))
        .into_response()
}

pub async fn method_not_allowed(method: Method, req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{method} is not allowed on {}", req.uri().path()),
    )
    .with_code("method_not_allowed")
}

/// The served model, and its loaded state (503 while loading).
fn loaded(app: &App) -> Result<(&ModelInfo, &Loaded), ApiError> {
    let model = app.model.as_ref().ok_or_else(|| ApiError::not_found("this server has no model"))?;
    let loaded = model.loaded.get().ok_or_else(|| ApiError::unavailable("the model is still loading"))?;
    Ok((model, loaded))
}

/// `GET /v1/models`: the served model in a list.
pub async fn models(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"object": "list", "data": [model_object(&app)?]})))
}

/// `GET /v1/models/{model}`: the served model by any name a request's `model` may give (404
/// `model_not_found` for others), as OpenAI's `models.retrieve` asks.
pub async fn model(
    State(app): State<Arc<App>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let object = model_object(&app)?;
    let Path(name) =
        name.map_err(|e| ApiError::invalid(format!("the model's name: {e}")).with_param("model"))?;
    let ids = app.model.as_ref().map_or(&[][..], |m| &m.ids[..]);
    openai::known_model(&name, ids).map_err(|e| ApiError::from(e).with_param_if_none("model"))?;
    Ok(Json(object))
}

/// The served model as OpenAI's model object (created: when the server started), with its
/// context (null while loading) and default draft.
fn model_object(app: &App) -> Result<Value, ApiError> {
    let model = app.model.as_ref().ok_or_else(|| ApiError::not_found("this server has no model"))?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(app.started.elapsed().as_secs()))
        .unwrap_or(0);
    let context = model.loaded.get().map(|l| l.context);
    Ok(json!({
        "id": model.ids[0],
        "object": "model",
        "created": created,
        "owned_by": "wgspec",
        "wgspec": {"context": context, "draft": model.default_draft.name()},
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeBody {
    content: Option<String>,
    prompt: Option<String>,
    /// BOS (and EOS) where the vocabulary asks for them; default false, as llama.cpp's.
    #[serde(default)]
    add_special: bool,
}

pub async fn tokenize(State(app): State<Arc<App>>, body: BodyBytes) -> Result<Json<Value>, ApiError> {
    let tokens = with_tokenizer(&app, "tokenize", body, |body: TokenizeBody, prompter, context| {
        let text = match (body.content, body.prompt) {
            (Some(t), None) | (None, Some(t)) => t,
            _ => return Err(ApiError::field("content", "give exactly one of `content` and `prompt`")),
        };
        // No text longer than any prompt this server could take is tokenized.
        if let Some(limit) = TextLimit::new(prompter.tokenizer(), context) {
            limit.check(text.len()).map_err(|e| ApiError::from(e).with_param_if_none("content"))?;
        }
        Ok(prompter.tokenizer().encode(&text, body.add_special)?)
    })
    .await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// Parses a body of type `B` and runs `work` on it with the model's prompter and context, off
/// the async threads as [`prepare`] does.
async fn with_tokenizer<B: DeserializeOwned, T: Send + 'static>(
    app: &App,
    what: &str,
    body: BodyBytes,
    work: impl FnOnce(B, &Prompter, usize) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let (_, loaded) = loaded(app)?;
    let (prompter, context) = (loaded.prompter.clone(), loaded.context);
    prepare(app, what, move || work(openai::parse_json(&body.bytes)?, &prompter, context)).await?
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

pub async fn detokenize(State(app): State<Arc<App>>, body: BodyBytes) -> Result<Json<Value>, ApiError> {
    let content = with_tokenizer(&app, "detokenize", body, |body: DetokenizeBody, prompter, context| {
        // No more than a context's worth: what decoding makes is then bounded too.
        if body.tokens.len() > context {
            return Err(ApiError::field(
                "tokens",
                format!("{} tokens; this server's context holds {context}", body.tokens.len()),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(prompter.tokenizer().decode(&body.tokens)?)
    })
    .await?;
    Ok(Json(json!({ "content": content })))
}

pub async fn chat_completions(State(app): State<Arc<App>>, body: BodyBytes) -> Result<Response, ApiError> {
    complete(app, Endpoint::Chat, body).await
}

pub async fn completions(State(app): State<Arc<App>>, body: BodyBytes) -> Result<Response, ApiError> {
    complete(app, Endpoint::Completions, body).await
}

/// Queues a generation and answers it whole or as a stream of server-sent events.
async fn complete(app: Arc<App>, endpoint: Endpoint, body: BodyBytes) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let model = app.model.as_ref().ok_or_else(|| ApiError::not_found("this server has no model"))?;
    let (_, loaded) = loaded(&app)?;
    // Parsed and tokenized off the async threads, a few at a time; a prompt over the context is
    // answered at once (refused before tokenizing when its bytes alone cannot fit), not after
    // the generations queued before it.
    let ids = model.ids.clone();
    let prompter = loaded.prompter.clone();
    let context = loaded.context;
    let prompts = prepare(&app, "tokenize", move || {
        let parsed = openai::parse(endpoint, &body.bytes, &ids)?;
        drop(body);
        let prompts = parsed.per_prompt();
        let listed = prompts.len() > 1;
        let prompts = prompts.into_iter().enumerate().map(|(i, parsed)| {
            let prompt = prompter.prompt_tokens_within(&parsed.request, context);
            let prompt = prompt.map_err(|e| ApiError::from(e).with_param_if_none(parsed.prompt_field()));
            Ok::<_, ApiError>((parsed, prompt.map_err(|e| e.of_prompt(listed.then_some(i)))?))
        });
        prompts.collect::<Result<Vec<_>, _>>()
    })
    .await??;
    // a draft model or heads (alone or merged with the n-gram) only where the server loaded them
    let server_draft = model.default_draft;
    let missing = |asked: DraftKind| {
        let why = match asked.base() {
            base if base == server_draft.base() => return None,
            DraftKind::Model => "no draft model (start it with --draft MODEL)",
            DraftKind::Medusa => "no Medusa heads (start it with --draft medusa:PATH)",
            DraftKind::Eagle => "no EAGLE head (start it with --draft eagle:PATH)",
            _ => return None,
        };
        Some(format!("`draft` \"{}\": this server runs {why}", asked.name()))
    };
    // (the engine reads the ids: the text need not wait in the queue)
    // (every prompt's request answers as the first's)
    let (streamed, include_usage, n) = (prompts.first().map(|(p, _)| (p.stream, p.include_usage, p.n)))
        .ok_or_else(|| ApiError::internal("a request of no prompt"))?;
    let mut parts = Vec::with_capacity(prompts.len());
    let listed = prompts.len() > 1;
    for (i, (parsed, prompt)) in prompts.into_iter().enumerate() {
        let parsed = parsed.ready(&prompt, loaded.context, server_draft, &missing);
        let parsed = parsed.map_err(|e| ApiError::from(e).of_prompt(listed.then_some(i)))?;
        parts.push(Part { request: parsed.request, prompt });
    }
    let choices = parts.len() * n;
    let (events, mut rx) = mpsc::unbounded_channel();
    let job = Job { parts, n, events };
    // Dropped when this handler is (its client left): the job leaves the queue with it.
    let _ticket = match model.queue.push(job) {
        Ok(ticket) => ticket,
        Err(Refused::Full) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!(
                    "the queue is full ({} requests wait for the GPU); retry later",
                    model.queue.capacity()
                ),
            )
            .with_code("queue_full"))
        }
        Err(Refused::Closed) => return Err(ApiError::unavailable("the GPU worker has stopped")),
    };
    // The worker tells when the generation starts (or that the worker has gone).
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(ApiError::internal("the GPU worker stopped before the request ran")),
    }
    let shape = Shape::new(endpoint, &model.ids[0], include_usage, n);
    let timing = Timing { arrived, last: None, metrics: app.metrics.clone() };
    if streamed {
        Ok(stream(openai::Stream::new(shape, choices), rx, timing))
    } else {
        whole(shape, choices, rx, timing).await
    }
}

/// When tokens arrived, for the latency histograms.
struct Timing {
    arrived: Instant,
    last: Option<Instant>,
    metrics: Arc<Metrics>,
}

impl Timing {
    fn token(&mut self) {
        let now = Instant::now();
        match self.last {
            None => self.metrics.first_token(now - self.arrived),
            Some(last) => self.metrics.next_token(now - last),
        }
        self.last = Some(now);
    }
}

/// The answer of a request of `n` choices without `stream`, once every choice has ended.
async fn whole(
    shape: Shape,
    n: usize,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut timing: Timing,
) -> Result<Response, ApiError> {
    let mut replies: Vec<Option<openai::Reply>> = vec![None; n];
    loop {
        match rx.recv().await {
            Some(Event::Token(_, ev)) => {
                if ev.id.is_some() {
                    timing.token();
                }
            }
            Some(Event::Done(choice, reply)) => {
                if let Some(slot) = replies.get_mut(choice) {
                    *slot = Some(*reply);
                }
                if replies.iter().all(Option::is_some) {
                    let replies: Vec<openai::Reply> = replies.into_iter().flatten().collect();
                    return Ok(Json(shape.response(&replies)).into_response());
                }
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started) | None => {
                return Err(ApiError::internal("the GPU worker stopped in the middle of a request"))
            }
        }
    }
}

/// Server-sent events: the chunks of [`openai::Stream`], then `[DONE]` once every choice has
/// ended; an error midway is sent as its error body, then `[DONE]`.
fn stream(chunks: openai::Stream, rx: mpsc::UnboundedReceiver<Event>, timing: Timing) -> Response {
    let out = Streamer { chunks, rx, timing, started: false, ended: false };
    let body = futures_util::stream::unfold(out, |mut s| async move {
        let piece = s.next_piece().await?;
        Some((Ok::<_, Infallible>(Bytes::from(piece)), s))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        // nginx: pass each event on at once
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| ApiError::internal(format!("stream: {e}")).into_response())
}

/// One server-sent event carrying `value`.
fn sse(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    format!("data: {json}\n\n")
}

struct Streamer {
    chunks: openai::Stream,
    rx: mpsc::UnboundedReceiver<Event>,
    timing: Timing,
    /// The chunk before the tokens has been sent.
    started: bool,
    ended: bool,
}

impl Streamer {
    /// The next events' text, or `None` after `[DONE]`.
    async fn next_piece(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        if !self.started {
            self.started = true;
            let first = self.chunks.start();
            if !first.is_empty() {
                return Some(first.iter().map(sse).collect());
            }
        }
        loop {
            match self.rx.recv().await {
                Some(Event::Token(choice, ev)) => {
                    if ev.id.is_some() {
                        self.timing.token();
                    }
                    if let Some(chunk) = self.chunks.token(choice, &ev) {
                        return Some(sse(&chunk));
                    }
                }
                Some(Event::Done(choice, reply)) => {
                    let last: String = self.chunks.finish(choice, &reply).iter().map(sse).collect();
                    if !self.chunks.ended() {
                        return Some(last);
                    }
                    self.ended = true;
                    return Some(last + "data: [DONE]\n\n");
                }
                other => {
                    self.ended = true;
                    let e = match other {
                        Some(Event::Failed(e)) => e,
                        _ => ApiError::internal("the GPU worker stopped in the middle of a stream"),
                    };
                    self.timing.metrics.error(e.kind());
                    return Some(sse(&e.body()) + "data: [DONE]\n\n");
                }
            }
        }
    }
}
