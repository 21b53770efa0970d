//! The routes: health and readiness, metrics, the OpenAI API (completions, chat completions,
//! models) and llama.cpp's `/tokenize` and `/detokenize`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use wgspec::engine::DraftKind;

use super::error::ApiError;
use super::metrics::{CompletionCounts, Metrics};
use super::openai::{self, Endpoint, Shape};
use super::worker::{Done, Event, Job, Loaded};
use super::{App, ModelInfo};
use wgspec::openai::fit_context;

/// The largest request body.
pub const MAX_BODY: usize = 8 << 20;
/// A request body must arrive within this time.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// A request body of at most [`MAX_BODY`] bytes, read within [`BODY_TIMEOUT`].
pub struct BodyBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for BodyBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {} MiB", MAX_BODY >> 20),
            )
            .with_code("request_too_large")
        };
        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
        if declared.and_then(|v| v.parse::<u64>().ok()).is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large());
        }
        let mut body = req.into_body();
        let read = async {
            let mut bytes = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
                if let Ok(data) = frame.into_data() {
                    if bytes.len() + data.len() > MAX_BODY {
                        return Err(too_large());
                    }
                    bytes.extend_from_slice(&data);
                }
            }
            Ok(Bytes::from(bytes))
        };
        match tokio::time::timeout(BODY_TIMEOUT, read).await {
            Ok(r) => r.map(BodyBytes),
            Err(_) => Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
            )),
        }
    }
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 once the models are loaded (at once without a model), 503 before, or when the GPU worker
/// has ended.
pub async fn ready(State(app): State<Arc<App>>) -> Response {
    match &app.model {
        None => Json(json!({"status": "ready"})).into_response(),
        Some(m) if m.jobs.is_closed() => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "failed"}))).into_response()
        }
        Some(m) if m.loaded.get().is_some() => Json(json!({"status": "ready"})).into_response(),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response(),
    }
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render())
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

pub async fn models(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let model = app.model.as_ref().ok_or_else(|| ApiError::not_found("this server has no model"))?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(app.started.elapsed().as_secs()))
        .unwrap_or(0);
    let context = model.loaded.get().map(|l| l.context);
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": model.ids[0],
            "object": "model",
            "created": created,
            "owned_by": "wgspec",
            "wgspec": {"context": context, "draft": model.default_draft.name()},
        }],
    })))
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

pub async fn tokenize(
    State(app): State<Arc<App>>,
    BodyBytes(body): BodyBytes,
) -> Result<Json<Value>, ApiError> {
    let (_, loaded) = loaded(&app)?;
    let body: TokenizeBody = openai::typed(openai::parse_object(&body)?)?;
    let text = match (body.content, body.prompt) {
        (Some(t), None) | (None, Some(t)) => t,
        _ => return Err(ApiError::field("content", "give exactly one of `content` and `prompt`")),
    };
    let prompter = loaded.prompter.clone();
    let tokens = tokio::task::spawn_blocking(move || prompter.tokenizer().encode(&text, body.add_special))
        .await
        .map_err(|e| ApiError::internal(format!("tokenize: {e}")))??;
    Ok(Json(json!({ "tokens": tokens })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(app): State<Arc<App>>,
    BodyBytes(body): BodyBytes,
) -> Result<Json<Value>, ApiError> {
    let (_, loaded) = loaded(&app)?;
    let body: DetokenizeBody = openai::typed(openai::parse_object(&body)?)?;
    let prompter = loaded.prompter.clone();
    let content = tokio::task::spawn_blocking(move || prompter.tokenizer().decode(&body.tokens))
        .await
        .map_err(|e| ApiError::internal(format!("detokenize: {e}")))??;
    Ok(Json(json!({ "content": content })))
}

pub async fn chat_completions(
    State(app): State<Arc<App>>,
    BodyBytes(body): BodyBytes,
) -> Result<Response, ApiError> {
    complete(app, Endpoint::Chat, &body).await
}

pub async fn completions(
    State(app): State<Arc<App>>,
    BodyBytes(body): BodyBytes,
) -> Result<Response, ApiError> {
    complete(app, Endpoint::Completions, &body).await
}

/// Queues a generation and answers it whole or as a stream of server-sent events.
async fn complete(app: Arc<App>, endpoint: Endpoint, body: &[u8]) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let model = app.model.as_ref().ok_or_else(|| ApiError::not_found("this server has no model"))?;
    let parsed = openai::parse(endpoint, body, &model.ids)?;
    let (_, loaded) = loaded(&app)?;
    let mut request = parsed.request;
    // a draft model or heads (alone or merged with the n-gram) only where the server loaded them
    if let Some(asked) = request.draft.filter(|d| d.base() != model.default_draft.base()) {
        let loaded = match asked.base() {
            DraftKind::Model => Some("no draft model (start it with --draft MODEL)"),
            DraftKind::Medusa => Some("no Medusa heads (start it with --draft medusa:PATH)"),
            DraftKind::Eagle => Some("no EAGLE head (start it with --draft eagle:PATH)"),
            _ => None,
        };
        if let Some(why) = loaded {
            return Err(ApiError::field(
                "draft",
                format!("`draft` \"{}\": this server runs {why}", asked.name()),
            ));
        }
    }
    request.draft = Some(request.draft.unwrap_or(model.default_draft));
    // Tokenized here, off the async threads: a prompt over the context is answered at once, not
    // after the generations queued before it.
    let prompter = loaded.prompter.clone();
    let (prompt, mut request) =
        tokio::task::spawn_blocking(move || (prompter.prompt_tokens(&request), request))
            .await
            .map_err(|e| ApiError::internal(format!("tokenize: {e}")))?;
    let prompt = prompt?;
    let field = if request.messages.is_some() { "messages" } else { "prompt" };
    request.max_tokens = fit_context(prompt.len(), parsed.max_tokens, loaded.context, field)?;
    let (events, mut rx) = mpsc::unbounded_channel();
    let job = Job { request, prompt, events };
    match model.jobs.try_send(job) {
        Ok(()) => {
            app.metrics.queue_depth.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Err(mpsc::error::TrySendError::Full(_)) => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                format!(
                    "the queue is full ({} requests wait for the GPU); retry later",
                    model.jobs.max_capacity()
                ),
            )
            .with_code("queue_full"))
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            return Err(ApiError::unavailable("the GPU worker has stopped"))
        }
    }
    // The worker tells when the generation starts (or that the worker has gone).
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(ApiError::internal("the GPU worker stopped before the request ran")),
    }
    let shape = Shape::new(endpoint, &model.ids[0], parsed.include_usage);
    let timing = Timing { arrived, last: None, metrics: app.metrics.clone() };
    if parsed.stream {
        Ok(stream(shape, rx, timing))
    } else {
        whole(shape, rx, timing).await
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

    fn done(&self, d: &Done) {
        self.metrics.completion(&CompletionCounts {
            prompt_tokens: d.prompt_tokens,
            generated_tokens: d.completion_tokens,
            drafted: d.stats.drafted,
            accepted: d.stats.accepted,
            tokens_per_target_forward: d.stats.tokens_per_target_forward,
        });
    }
}

/// The answer of a request without `stream`.
async fn whole(
    shape: Shape,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut timing: Timing,
) -> Result<Response, ApiError> {
    loop {
        match rx.recv().await {
            Some(Event::Token(ev)) => {
                if ev.id.is_some() {
                    timing.token();
                }
            }
            Some(Event::Done(d)) => {
                timing.done(&d);
                let usage = openai::usage(d.prompt_tokens, d.completion_tokens);
                let body =
                    shape.response(&d.text, openai::finish_reason(d.finish), usage, &d.stats, &d.from_draft);
                return Ok(Json(body).into_response());
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started) | None => {
                return Err(ApiError::internal("the GPU worker stopped in the middle of a request"))
            }
        }
    }
}

/// Server-sent events: (chat) a first chunk with the role, a chunk per token with text, a last
/// chunk with `finish_reason` and the request's stats, the usage chunk when asked, `[DONE]`.
fn stream(shape: Shape, rx: mpsc::UnboundedReceiver<Event>, timing: Timing) -> Response {
    // Completions chunks have no role to announce.
    let role_sent = shape.endpoint == Endpoint::Completions;
    let out = Streamer { shape, rx, timing, from_draft: Vec::new(), role_sent, ended: false };
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

struct Streamer {
    shape: Shape,
    rx: mpsc::UnboundedReceiver<Event>,
    timing: Timing,
    /// Provenance of the tokens not yet sent in a chunk (their text was held back).
    from_draft: Vec<bool>,
    role_sent: bool,
    ended: bool,
}

impl Streamer {
    /// The next events' text, or `None` after `[DONE]`.
    async fn next_piece(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        if !self.role_sent {
            self.role_sent = true;
            return Some(openai::sse(&self.shape.chunk("", true, None, json!({"from_draft": []}))));
        }
        loop {
            match self.rx.recv().await {
                Some(Event::Token(ev)) => {
                    if ev.id.is_some() {
                        self.timing.token();
                        self.from_draft.push(ev.from_draft);
                    }
                    if !ev.text.is_empty() {
                        let flags = std::mem::take(&mut self.from_draft);
                        return Some(openai::sse(&self.shape.chunk(
                            &ev.text,
                            false,
                            None,
                            json!({"from_draft": flags}),
                        )));
                    }
                }
                Some(Event::Done(d)) => {
                    self.ended = true;
                    self.timing.done(&d);
                    let mut wgspec = serde_json::to_value(&d.stats).unwrap_or_else(|_| json!({}));
                    wgspec["from_draft"] = json!(std::mem::take(&mut self.from_draft));
                    let finish = openai::finish_reason(d.finish);
                    let mut text = openai::sse(&self.shape.chunk("", false, Some(finish), wgspec));
                    if self.shape.include_usage {
                        text += &openai::sse(
                            &self.shape.usage_chunk(openai::usage(d.prompt_tokens, d.completion_tokens)),
                        );
                    }
                    text += "data: [DONE]\n\n";
                    return Some(text);
                }
                other => {
                    self.ended = true;
                    let e = match other {
                        Some(Event::Failed(e)) => e,
                        _ => ApiError::internal("the GPU worker stopped in the middle of a stream"),
                    };
                    self.timing.metrics.error(e.kind);
                    return Some(openai::sse(&e.body()) + "data: [DONE]\n\n");
                }
            }
        }
    }
}
