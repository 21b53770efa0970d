//! The HTTP server: `wgspec serve` (an OpenAI-compatible API over one engine, plus the demo
//! page) and `wgspec web` (the demo page alone).
//!
//! One GPU worker thread owns the engine and runs one generation at a time ([`worker`]); HTTP
//! handlers read, parse and tokenize a request within server-wide bounds (body bytes held at
//! once, requests tokenizing at once, a prompt's bytes against the context), queue it in a
//! bounded queue (full: 429 at once) and stream its token events back ([`api`]). Connections
//! are served by hyper directly, so that each one has a header read timeout (idle keep-alive
//! connections included), a bounded head, a write stall timeout, JSON bodies on hyper's own
//! error answers ([`net`]) and a place under a cap on open connections. A request carries one
//! `Host`; on a loopback bind it must name a loopback host (DNS rebinding); with `--api-key` the
//! API wants `Authorization: Bearer KEY`; a browser's request to the API must come from the
//! server's own origin or one `--allow-origin` names, which get CORS answers ([`origin`]).
//! Every request is counted once, when its answer has been sent or its client has left
//! ([`metrics`]).

mod api;
mod error;
mod files;
mod metrics;
mod net;
mod origin;
mod worker;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Version};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use wgspec::engine::DraftKind;
use wgspec::Error;

pub use files::Roots;
pub use origin::Origins;
pub use worker::ModelConfig;

use error::{ApiError, ErrorKind};
use metrics::Metrics;

/// Open connections at most; more are closed as soon as they are accepted. Idle ones cost a
/// task and a few kB each until the header timeout closes them, so the cap is well above what
/// a burst of idle connections (500 in the tests) takes.
const MAX_CONNECTIONS: usize = 1024;
/// A response write that makes no progress for this long (a client that stopped reading)
/// closes its connection.
const WRITE_STALL: Duration = Duration::from_secs(30);
/// How long SIGTERM / SIGINT waits for in-flight requests before the process exits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a server whose models failed to load or whose GPU worker stopped waits for its
/// connections (their requests have had their errors; a client still sending a body has nothing
/// to wait for).
const FATAL_GRACE: Duration = Duration::from_secs(5);
/// The longest request head (request line and headers) a connection may send; a longer one gets
/// 431. With [`MAX_CONNECTIONS`] open, heads take at most 64 MiB.
pub const MAX_HEAD: usize = 64 << 10;
/// The most header lines of one request (431 beyond).
pub const MAX_HEADERS: usize = 100;

/// What the server runs with.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: IpAddr,
    /// 0: any free port (the address is printed on the first line of standard output).
    pub port: u16,
    /// The API wants `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// The origins besides its own whose pages may call the API.
    pub allow_origins: Origins,
    /// Requests waiting for the GPU worker at most (the running one not counted).
    pub max_queue: usize,
    /// The model to serve; `None` serves the static files only (`wgspec web`).
    pub model: Option<ModelConfig>,
    pub roots: Roots,
    /// A connection must send a whole request head within this time of being ready for one
    /// (idle keep-alive connections included).
    pub header_timeout: Duration,
}

/// The served model, as the API sees it.
pub struct ModelInfo {
    /// The names a request's `model` may give: the model's id first (the file stem, the folder
    /// or known name), then the `--model` argument itself.
    pub ids: Vec<String>,
    pub default_draft: DraftKind,
    /// Set once the models are loaded.
    pub loaded: OnceLock<worker::Loaded>,
    /// The jobs waiting for the GPU worker (closed when the worker thread has ended).
    pub queue: Arc<worker::Queue>,
}

/// Everything a handler reaches.
pub struct App {
    pub model: Option<ModelInfo>,
    pub metrics: Arc<Metrics>,
    pub roots: Roots,
    pub api_key: Option<String>,
    /// The origins besides its own whose pages may call the API.
    pub origins: Origins,
    /// Bound to a loopback address: requests must name a loopback host.
    pub loopback: bool,
    pub started: Instant,
    /// Room for request bodies larger than [`api::SMALL_BODY`]: [`api::BODY_BUDGET`] bytes.
    pub bodies: Arc<Semaphore>,
    /// Places for requests being parsed and tokenized: [`api::PREPARE_AT_ONCE`].
    pub preparing: Arc<Semaphore>,
}

/// The id of the model `--model ARG` names: a known name as is, a file without its `.gguf`, a
/// folder by its name.
fn model_id(arg: &str) -> String {
    let path = std::path::Path::new(arg.trim_end_matches('/'));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(arg);
    name.strip_suffix(".gguf").unwrap_or(name).to_string()
}

/// Runs the server until SIGTERM or SIGINT (then in-flight requests get [`SHUTDOWN_GRACE`] to
/// finish), or until the models fail to load or the GPU worker stops (an error, after
/// [`FATAL_GRACE`] for the connections).
pub fn run(cfg: ServerConfig) -> wgspec::Result<()> {
    if cfg.max_queue == 0 {
        return Err(Error::InvalidArgument("--max-queue must be at least 1".into()));
    }
    return_large_blocks();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wgspec-http")
        .build()
        .map_err(|e| Error::io("tokio runtime", e))?;
    let result = runtime.block_on(serve(cfg));
    // Blocking tasks still reading files must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// glibc's malloc raises its mmap threshold each time a large block is freed (up to 32 MiB), and
/// from then on blocks of a request's size (a body, its text, the template's output: megabytes)
/// come from heaps it keeps: the process's memory then grows with the number of large requests
/// served, though only a few are held at once. A fixed threshold of 1 MiB gives such blocks back
/// to the system when they are freed (measured: 32 maximal bodies at once peak where 4 do).
fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt sets a parameter of the allocator under its own lock; it reads and
        // writes no memory of ours.
        if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) } != 1 {
            eprintln!("warning: mallopt(M_MMAP_THRESHOLD) failed; large requests may leave memory held");
        }
    }
}

async fn serve(cfg: ServerConfig) -> wgspec::Result<()> {
    let listener = TcpListener::bind((cfg.host, cfg.port))
        .await
        .map_err(|e| Error::io(SocketAddr::new(cfg.host, cfg.port), e))?;
    let addr = listener.local_addr().map_err(|e| Error::io("listener", e))?;
    {
        use std::io::Write;
        println!("listening on http://{addr}");
        let _ = std::io::stdout().flush();
    }

    let metrics = Arc::new(Metrics::new());
    let (fatal_tx, fatal_rx) = oneshot::channel::<Error>();
    let model = match cfg.model.clone() {
        None => None,
        Some(model_cfg) => {
            let queue = worker::Queue::new(cfg.max_queue);
            let (loaded_tx, loaded_rx) = oneshot::channel();
            let (stopped_tx, stopped_rx) = oneshot::channel();
            worker::spawn(model_cfg.clone(), queue.clone(), metrics.clone(), loaded_tx, stopped_tx)
                .map_err(|e| Error::io("the GPU worker thread", e))?;
            let mut ids = vec![model_id(&model_cfg.model)];
            if ids[0] != model_cfg.model {
                ids.push(model_cfg.model.clone());
            }
            let info =
                ModelInfo { ids, default_draft: model_cfg.default_draft(), loaded: OnceLock::new(), queue };
            Some((info, (loaded_rx, stopped_rx)))
        }
    };
    let (model, loaded_rx) = match model {
        Some((info, rx)) => (Some(info), Some(rx)),
        None => (None, None),
    };
    let app = Arc::new(App {
        model,
        metrics,
        roots: cfg.roots.clone(),
        api_key: cfg.api_key.clone(),
        origins: cfg.allow_origins.clone(),
        loopback: cfg.host.is_loopback(),
        started: Instant::now(),
        bodies: Arc::new(Semaphore::new(api::BODY_BUDGET)),
        preparing: Arc::new(Semaphore::new(api::PREPARE_AT_ONCE)),
    });
    if let Some((rx, stopped)) = loaded_rx {
        let app = app.clone();
        tokio::spawn(async move {
            match rx.await {
                Ok(Ok(loaded)) => {
                    eprintln!("ready: context {} tokens", loaded.context);
                    if let Some(m) = &app.model {
                        let _ = m.loaded.set(loaded);
                    }
                    // (it runs for as long as the process lives: it stops only on a panic)
                    if let Ok(why) = stopped.await {
                        let _ = fatal_tx.send(Error::Gpu(format!("the GPU worker stopped: {why}")));
                    }
                }
                Ok(Err(e)) => {
                    let _ = fatal_tx.send(e);
                }
                Err(_) => {
                    let _ =
                        fatal_tx.send(Error::InvalidArgument("the GPU worker ended while loading".into()));
                }
            }
        });
    }

    let router = router(app.clone());
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let stop = stop_signal(fatal_rx);
    tokio::pin!(stop);
    let failure = loop {
        tokio::select! {
            reason = &mut stop => break reason,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset before it was accepted:
                        // wait a moment rather than spin, and go on.
                        eprintln!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue; // over the cap: dropped, so closed
                };
                let _ = stream.set_nodelay(true);
                let guarded = net::StallGuard::new(stream, WRITE_STALL);
                let io = TokioIo::new(net::JsonErrors::new(guarded, app.metrics.clone()));
                let service = TowerToHyperService::new(router.clone());
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(cfg.header_timeout)
                    .max_buf_size(MAX_HEAD)
                    .max_headers(MAX_HEADERS)
                    .serve_connection(io, service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(slot);
                });
            }
        }
    };
    drop(listener);
    eprintln!("shutting down: {} connection(s) open", graceful.count());
    // (a GPU worker that stops during this drain stops nothing more: the process is ending)
    let grace = if failure.is_some() { FATAL_GRACE } else { SHUTDOWN_GRACE };
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => eprintln!("shutdown: gave up waiting after {grace:?}"),
    }
    failure.map_or(Ok(()), Err)
}

/// Resolves to `None` on SIGTERM or SIGINT, to the error when the models fail to load or the GPU
/// worker stops.
async fn stop_signal(fatal: oneshot::Receiver<Error>) -> Option<Error> {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                eprintln!("SIGTERM handler: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = terminate => None,
        r = tokio::signal::ctrl_c() => {
            if let Err(e) = r {
                eprintln!("SIGINT handler: {e}");
                std::future::pending::<()>().await;
            }
            None
        }
        Ok(e) = fatal => Some(e),
    }
}

fn router(app: Arc<App>) -> Router {
    let mut r = Router::new()
        .route("/health", get(api::health))
        .route("/ready", get(api::ready))
        .route("/health/ready", get(api::ready))
        .route("/metrics", get(api::metrics));
    if app.model.is_some() {
        r = r
            .route("/v1/chat/completions", post(api::chat_completions))
            .route("/v1/completions", post(api::completions))
            .route("/v1/models", get(api::models))
            .route("/v1/models/{*model}", get(api::model))
            .route("/tokenize", post(api::tokenize))
            .route("/detokenize", post(api::detokenize));
    }
    let roots = app.roots.clone();
    r.method_not_allowed_fallback(api::method_not_allowed)
        .fallback(move |req: Request| files::serve(roots.clone(), req))
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .layer(middleware::from_fn_with_state(app.clone(), origin::check_origin))
        .layer(middleware::from_fn_with_state(app.clone(), check_host))
        .layer(middleware::from_fn_with_state(app.clone(), count))
        .with_state(app)
}

/// Counts every request once, by route and status, when its answer has been sent whole, or with
/// [`metrics::CANCELLED`] when its client left first (the handler or the body dropped before
/// the end); error answers also by type.
async fn count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = match req.extensions().get::<MatchedPath>() {
        Some(p) => p.as_str().to_string(),
        None => "other".to_string(),
    };
    let no_body = req.method() == Method::HEAD;
    let mut record = Record { metrics: app.metrics.clone(), route, status: None, counted: false };
    let response = next.run(req).await;
    if let Some(ErrorKind(kind)) = response.extensions().get::<ErrorKind>() {
        app.metrics.error(kind);
    }
    record.status = Some(response.status().as_u16());
    if no_body || response.body().is_end_stream() {
        record.finish();
        return response;
    }
    response.map(|body| {
        let remaining = body.size_hint().exact();
        Body::new(Counted { body, record, remaining })
    })
}

/// A request to count: with its status once the answer is complete, else as cancelled.
struct Record {
    metrics: Arc<Metrics>,
    route: String,
    /// Set when the handler answered.
    status: Option<u16>,
    counted: bool,
}

impl Record {
    fn finish(&mut self) {
        if !self.counted {
            self.counted = true;
            self.metrics.request(&self.route, self.status.unwrap_or(metrics::CANCELLED));
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        // Not counted yet: the client left before the whole answer was sent.
        self.status = None;
        self.finish();
    }
}

/// An answer's body that counts its request when its last frame has been taken (hyper takes
/// no more of a body of known length than that length: the end is its last byte).
struct Counted {
    body: Body,
    record: Record,
    /// Bytes still to come of a body of known length.
    remaining: Option<u64>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let poll = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        let ended = match &poll {
            std::task::Poll::Ready(None) => true,
            std::task::Poll::Ready(Some(Ok(frame))) => {
                let sent = frame.data_ref().map_or(0, |d| d.len() as u64);
                this.remaining = this.remaining.map(|r| r.saturating_sub(sent));
                this.remaining == Some(0) || this.body.is_end_stream()
            }
            _ => false,
        };
        if ended {
            this.record.finish();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether a `Host` header names a loopback host: `127.0.0.1`, `localhost` or `[::1]`, with any port.
fn loopback_host(host: &str) -> bool {
    let port_ok = |port: &str| {
        port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
    };
    let name = if let Some(bracketed) = host.strip_prefix('[') {
        match bracketed.split_once(']') {
            Some((name, port)) if port_ok(port) => name,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The bytes of a request's head as sent: its request line and header lines.
fn head_bytes(req: &Request) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + " HTTP/1.1\r\n".len() + 1;
    let headers: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + 2 + v.len() + 2).sum();
    line + headers + 2
}

/// A request head of at most [`MAX_HEAD`] bytes (431 beyond) carries one `Host` header (an
/// HTTP/1.1 request exactly one), else 400 as RFC 9112 asks; on a loopback bind the host it
/// names (the target's, when the target is absolute) must be a loopback one: a page on another
/// site whose name was rebound to 127.0.0.1 sends its own name.
async fn check_host(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if head_bytes(&req) > MAX_HEAD {
        // hyper's own limit is its read buffer's, which a head arriving at once can pass.
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            net::HEAD_TOO_LARGE.as_str(),
        )
        .with_code("request_header_fields_too_large")
        .into_response();
    }
    let refusal = if hosts.next().is_some() {
        Some("a request carries one Host header; this one has several")
    } else if host.is_none() && req.version() == Version::HTTP_11 {
        Some("an HTTP/1.1 request must carry a Host header")
    } else {
        None
    };
    if let Some(message) = refusal {
        return ApiError::invalid(message).with_code("invalid_host").into_response();
    }
    if app.loopback {
        let named = match req.uri().authority() {
            Some(authority) => Some(authority.host()),
            None => host.and_then(|h| h.to_str().ok()),
        };
        if !named.is_some_and(loopback_host) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "this server listens on a loopback address: the Host header must be 127.0.0.1, localhost or [::1]",
            )
            .with_code("host_not_allowed")
            .into_response();
        }
    }
    next.run(req).await
}

/// With `--api-key`, the API routes want `Authorization: Bearer KEY` (health, readiness,
/// metrics and the static files stay open).
async fn authorize(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let (Some(key), true) = (&app.api_key, origin::api_route(req.uri().path())) {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|h| h.to_str().ok());
        let token = given.and_then(|g| g.strip_prefix("Bearer ")).map(str::trim);
        if !token.is_some_and(|t| same_secret(t.as_bytes(), key.as_bytes())) {
            let message = match given {
                None => "an API key is required: send `Authorization: Bearer KEY`",
                Some(_) => "incorrect API key",
            };
            let mut response = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
                .with_code("invalid_api_key")
                .into_response();
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(req).await
}

/// Compares two secrets in a time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_and_without_ports() {
        for ok in ["127.0.0.1", "127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]", "[::1]:8080"] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:8080",
            "127.0.0.1.evil.com",
            "localhost.evil.com:80",
            "[::2]:80",
            "",
            "[::1]junk",
            "[::1]:80x",
            "[::1",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn model_ids_are_file_stems_and_names() {
        assert_eq!(model_id("/m/tiny.gguf"), "tiny");
        assert_eq!(model_id("smollm2-135m"), "smollm2-135m");
        assert_eq!(model_id("/hf/Qwen2.5-0.5B/"), "Qwen2.5-0.5B");
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
