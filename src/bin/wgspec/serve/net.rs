//! A connection's socket: with a write stall timeout ([`StallGuard`]: a client that stops reading
//! a response, a stalled download or a stream nobody drains, has its connection closed after a
//! while instead of holding it, and the buffers behind it, for ever), and with hyper's own error
//! answers turned into JSON ones ([`JsonErrors`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Sleep};

use super::error::ApiError;
use super::metrics::{Metrics, UNPARSED};

/// `inner` whose writes fail with `TimedOut` once one has made no progress for `limit`.
pub struct StallGuard<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write is pending; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    pub fn new(inner: S, limit: Duration) -> StallGuard<S> {
        StallGuard { inner, limit, stalled: None }
    }

    /// Passes `poll` through, timing how long it stays pending.
    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {limit:?}"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// Reads pass through these wrappers of a connection untouched (they watch or rewrite writes).
macro_rules! reads_pass_through {
    ($($wrapper:ident),*) => {$(
        impl<S: AsyncRead + Unpin> AsyncRead for $wrapper<S> {
            fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_read(cx, buf)
            }
        }
    )*};
}
reads_pass_through!(StallGuard, JsonErrors);

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, poll)
    }
}

/// hyper's own answers: a request head that does not parse (400), a request target over its
/// limit (414), a head over [`super::MAX_HEAD`] bytes or [`super::MAX_HEADERS`] headers (431).
/// Their status lines as hyper writes them.
const HYPER_ANSWERS: [(&[u8], u16); 3] = [
    (b"HTTP/1.1 400 Bad Request\r\n", 400),
    (b"HTTP/1.1 414 URI Too Long\r\n", 414),
    (b"HTTP/1.1 431 Request Header Fields Too Large\r\n", 431),
];

/// The answer hyper writes by itself at the start of `buf`, as (its length, its status): one of
/// [`HYPER_ANSWERS`] with only the headers hyper gives a bodiless answer (`content-length: 0`,
/// `date`, `connection: close`). The server's own answers always carry a `content-type`.
fn hyper_answer(buf: &[u8]) -> Option<(usize, u16)> {
    let (line, status) = HYPER_ANSWERS.iter().find(|(line, _)| buf.starts_with(line))?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let headers = buf.get(line.len()..end - 4)?;
    let mut empty = false;
    for header in headers.split(|&b| b == b'\n') {
        let header = header.strip_suffix(b"\r").unwrap_or(header).to_ascii_lowercase();
        match header.as_slice() {
            b"content-length: 0" => empty = true,
            b"connection: close" => {}
            h if h.starts_with(b"date: ") => {}
            _ => return None,
        }
    }
    empty.then_some((end, *status))
}

/// The message of a 431 answer.
pub static HEAD_TOO_LARGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "the request head is too large: at most {} KiB and {} header lines",
        super::MAX_HEAD >> 10,
        super::MAX_HEADERS
    )
});

/// Where hyper's own answer ends `buf` (it is the last thing hyper writes on a connection: a
/// pipelined answer before it may share the buffer), as (its offset, its status).
fn hyper_answer_at_end(buf: &[u8]) -> Option<(usize, u16)> {
    // The answer is a status line and two or three short headers.
    let window = buf.len().saturating_sub(256);
    (window..buf.len()).filter(|&at| buf[at..].starts_with(b"HTTP/1.1 ")).find_map(|at| {
        hyper_answer(&buf[at..]).filter(|(len, _)| at + len == buf.len()).map(|(_, status)| (at, status))
    })
}

/// The JSON answer that replaces hyper's empty one of `status`.
fn json_answer(status: u16) -> Vec<u8> {
    let (reason, message, code) = match status {
        414 => ("URI Too Long", "the request target is too long".to_string(), "uri_too_long"),
        431 => ("Request Header Fields Too Large", HEAD_TOO_LARGE.clone(), "request_header_fields_too_large"),
        _ => (
            "Bad Request",
            "the request is not valid HTTP/1.1: a malformed request line or header (a control \
             character, a repeated, negative or invalid Content-Length, ...)"
                .to_string(),
            "invalid_http_request",
        ),
    };
    let body = ApiError::invalid(message).with_code(code).body().to_string();
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body.into_bytes()].concat()
}

/// How long a connection that got one of hyper's answers reads on (and discards) what its client
/// still sends before it closes: closing with unread bytes would reset the connection, and a
/// reset can throw away the answer before the client reads it (a lingering close, as nginx's).
const LINGER: Duration = Duration::from_secs(2);

/// A connection's socket on which hyper's own error answers (see [`HYPER_ANSWERS`]) go out as
/// OpenAI-style JSON errors, counted in the metrics, instead of empty bodies. hyper writes such
/// an answer when it cannot read a request head, as the last bytes it writes (no answer is in
/// progress then, and it closes the connection after).
pub struct JsonErrors<S> {
    inner: S,
    metrics: Arc<Metrics>,
    /// The replacement answer, and how much of it is written.
    pending: Vec<u8>,
    written: usize,
    /// Set once an answer was replaced: the end of the lingering close.
    linger: Option<Pin<Box<Sleep>>>,
    /// The write half is shut.
    shut: bool,
}

impl<S> JsonErrors<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> JsonErrors<S> {
        JsonErrors { inner, metrics, pending: Vec::new(), written: 0, linger: None, shut: false }
    }
}

impl<S: AsyncRead + Unpin> JsonErrors<S> {
    /// Reads and discards until the client closes or [`LINGER`] has passed.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(deadline) = self.linger.as_mut() else {
            return Poll::Ready(());
        };
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let mut scratch = [0u8; 4096];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes what is left of a replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.pending = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        match hyper_answer_at_end(buf) {
            // What comes before it first.
            Some((at, _)) if at > 0 => Pin::new(&mut this.inner).poll_write(cx, &buf[..at]),
            Some((_, status)) => {
                this.metrics.request(UNPARSED, status);
                this.metrics.error("invalid_request_error");
                this.pending = json_answer(status);
                this.linger = Some(Box::pin(sleep(LINGER)));
                // hyper's answer counts as written; the replacement goes out before anything else.
                Poll::Ready(Ok(buf.len()))
            }
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    /// hyper then writes each answer whole from one buffer, so that an answer of its own
    /// begins a write.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        if !self.shut {
            ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
            self.shut = true;
        }
        ready!(self.poll_linger(cx));
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hyper_answers_are_recognised() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Thu, 03 Dec 2026 10:00:00 GMT\r\n\r\n";
        assert_eq!(hyper_answer(hyper), Some((hyper.len(), 431)));
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_answer(bare), Some((bare.len(), 400)));
        for ours in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n{\"error\": 1}",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"xHTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
        ] {
            assert_eq!(hyper_answer(ours), None, "{}", String::from_utf8_lossy(ours));
        }
        let pipelined = [&b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"[..], bare].concat();
        assert_eq!(hyper_answer_at_end(&pipelined), Some((pipelined.len() - bare.len(), 400)));
        assert_eq!(hyper_answer_at_end(bare), Some((0, 400)));
        assert_eq!(hyper_answer_at_end(&[bare, &b"x"[..]].concat()), None);
        let answer = String::from_utf8(json_answer(431)).expect("utf8");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
        assert!(
            head.starts_with("HTTP/1.1 431 ") && head.contains(&format!("content-length: {}", body.len()))
        );
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(v["error"]["code"], "request_header_fields_too_large");
    }
}
