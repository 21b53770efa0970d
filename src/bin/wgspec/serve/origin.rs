//! Browser origins: which web pages may call the API, and the CORS answers that let them.
//!
//! A browser marks a page's request with `Origin`. The API (the routes [`api_route`] names)
//! answers a request that carries one only if it is the server's own origin (the page it serves)
//! or one of `--allow-origin`'s; any other is refused with 403 before its body is read. That
//! closes the path CORS leaves open: a page on any site may send a "simple" POST (a `text/plain`
//! body, no preflight) to a server on the user's machine, and without this check it would run a
//! generation, though the page could not read the answer. Requests without `Origin` (curl, the
//! SDKs, other servers) are not browsers' and pass. An allowed origin gets CORS headers: its
//! preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered 204 before the API key
//! is checked (a preflight never carries one), and its answers, errors included, name it in
//! `Access-Control-Allow-Origin`. Every API answer varies by `Origin`, and says so.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::App;

/// How long a browser may keep a preflight's answer (seconds).
const PREFLIGHT_MAX_AGE: &str = "600";

/// The origins `--allow-origin` names, in the form browsers send (`scheme://host[:port]`,
/// lower case, without http(s)'s default port).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origins {
    /// `*`: every origin, `null` included.
    any: bool,
    listed: Vec<String>,
}

impl Origins {
    /// Parses `--allow-origin` values: `*`, `null` (sandboxed frames, `file:` and `data:` pages
    /// on any site) or `scheme://host[:port]` (no path; an IPv6 host in brackets): a web page's
    /// `http(s)`, or an extension's or app's own (`chrome-extension://ID`, `tauri://localhost`).
    pub fn parse(values: &[String]) -> wgspec::Result<Origins> {
        let mut origins = Origins::default();
        for value in values {
            if value == "*" {
                origins.any = true;
            } else {
                let origin = normalize_or_null(value).ok_or_else(|| {
                    wgspec::Error::InvalidArgument(format!(
                        "--allow-origin {value:?}: an origin is `*`, `null` or SCHEME://HOST[:PORT] \
                         (http(s) for a web page), without a path (as a browser's Origin header gives it)"
                    ))
                })?;
                origins.listed.push(origin);
            }
        }
        Ok(origins)
    }

    fn allows(&self, origin: &str) -> bool {
        self.any || normalize_or_null(origin).is_some_and(|o| self.listed.contains(&o))
    }
}

/// `null`, or the origin normalized.
fn normalize_or_null(origin: &str) -> Option<String> {
    if origin == "null" {
        Some(origin.to_string())
    } else {
        normalize(origin)
    }
}

/// `scheme://host[:port]` in lower case without http(s)'s default port, or `None` when `origin`
/// is not of that form (a path, user info, a character no host has).
fn normalize(origin: &str) -> Option<String> {
    let (scheme, authority) = origin.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_lowercase())
        && scheme.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(&b));
    let authority = authority.to_ascii_lowercase();
    let valid = |b: u8| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b);
    if !scheme_ok || authority.is_empty() || !authority.bytes().all(valid) || authority.starts_with(':') {
        return None;
    }
    let authority = match scheme.as_str() {
        "http" => authority.strip_suffix(":80").unwrap_or(&authority),
        "https" => authority.strip_suffix(":443").unwrap_or(&authority),
        _ => &authority,
    };
    Some(format!("{scheme}://{authority}"))
}

/// Whether `origin` is the server's own: its host and port are the ones the request was sent to
/// (`Host`), whatever its scheme (a TLS proxy in front keeps the `Host` it was given).
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let (Some(origin), Some(host)) = (normalize(origin), host) else {
        return false;
    };
    // (the Host normalized as an origin of the same scheme: the same default port dropped)
    match origin.split_once("://") {
        Some((scheme @ ("http" | "https"), _)) => normalize(&format!("{scheme}://{host}")) == Some(origin),
        _ => false,
    }
}

/// The routes that want the API key, and that only the server's own and allowed origins may call.
pub fn api_route(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize"
}

/// Checks a browser's request to the API against the allowed origins, answers an allowed one's
/// preflight, and names an allowed origin on its answer.
pub async fn check_origin(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if !api_route(req.uri().path()) {
        return next.run(req).await;
    }
    let mut response = answer(&app, req, next).await;
    response.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
    response
}

/// The answer to an API request: refused, a preflight's, or the route's.
async fn answer(app: &App, req: Request, next: Next) -> Response {
    let mut given = req.headers().get_all(header::ORIGIN).iter();
    let Some(origin) = given.next() else {
        return next.run(req).await;
    };
    let origin = origin.clone();
    let text = match (origin.to_str(), given.next()) {
        (Ok(text), None) => text,
        _ => return refused("a request carries one ASCII Origin header"),
    };
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    let listed = app.origins.allows(text);
    if !listed && !same_origin(text, host) {
        return refused(&format!(
            "the origin {text:?} may not call this API: start the server with --allow-origin {text} to allow it"
        ));
    }
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight { preflight_answer(req.headers()) } else { next.run(req).await };
    if listed {
        response.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    }
    response
}

/// 204 for an allowed origin's preflight: the methods the API has, the headers it asked to send
/// (the OpenAI SDKs send their own `x-stainless-*` ones besides `Authorization`), and Chromium's
/// Private Network Access when it asks (a public page calling a server on the user's machine).
fn preflight_answer(request: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST"));
    if let Some(asked) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(PREFLIGHT_MAX_AGE));
    if request.get("access-control-request-private-network").is_some_and(|v| v == "true") {
        headers.insert("access-control-allow-private-network", HeaderValue::from_static("true"));
    }
    headers.insert(header::VARY, HeaderValue::from_static("Access-Control-Request-Headers"));
    response
}

fn refused(message: &str) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
        .with_code("origin_not_allowed")
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_as_browsers_send_them() {
        let given = [
            "HTTP://App.Example:80",
            "https://ui.example:8443",
            "http://[::1]:5173",
            "null",
            "chrome-extension://abc",
        ];
        let origins = Origins::parse(&given.map(String::from)).expect("valid origins");
        for ok in [
            "http://app.example",
            "https://ui.example:8443",
            "http://[::1]:5173",
            "null",
            "chrome-extension://abc",
        ] {
            assert!(origins.allows(ok), "{ok}");
        }
        let others = [
            "http://app.example:8080",
            "https://app.example",
            "http://ui.example:8443",
            "chrome-extension://abd",
        ];
        for bad in others {
            assert!(!origins.allows(bad), "{bad}");
        }
        assert!(Origins::parse(&["*".into()]).expect("any").allows("null"));
        let malformed = [
            "app.example",
            "1x://app.example",
            "http://app.example/",
            "http://",
            "http://a b",
            "http://:80",
            "http://u@h",
        ];
        for invalid in malformed {
            assert!(Origins::parse(&[invalid.into()]).is_err(), "{invalid}");
        }
    }

    #[test]
    fn the_same_origin_is_the_host_the_request_names() {
        assert!(same_origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(same_origin("http://LocalHost:8080", Some("localhost:8080")));
        assert!(same_origin("http://example.com", Some("example.com:80")));
        assert!(same_origin("https://example.com", Some("example.com")));
        assert!(!same_origin("http://127.0.0.1:8081", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://localhost:8080", Some("127.0.0.1:8080")));
        assert!(!same_origin("null", Some("127.0.0.1:8080")));
        assert!(!same_origin("tauri://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://127.0.0.1:8080", None));
    }
}
