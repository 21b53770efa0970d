//! The server's error answer: OpenAI's shape `{"error": {"message", "type", "param", "code"}}`
//! with an HTTP status; the library's [`wgspec::Error`]s are answered as [`ErrorReply`] maps them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use wgspec::openai::ErrorReply;

/// An error answered to a client. Its `kind` is OpenAI's `type` and the label of
/// `wgspec_errors_total` in the metrics.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `rate_limit_exceeded`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

/// The error kind a response carried, read by the metrics layer (a response extension).
#[derive(Clone, Copy, Debug)]
pub struct ErrorKind(pub &'static str);

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message).with_param(param)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 503: no model loaded yet, or the GPU worker is gone.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", message)
    }

    /// 500: logged on the console, answered without detail beyond the message.
    pub fn internal(message: impl Into<String>) -> ApiError {
        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message);
        eprintln!("server error: {}", e.message);
        e
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    /// Names `param` as the field at fault unless a field is named already.
    pub fn with_param_if_none(mut self, param: &str) -> ApiError {
        if self.param.is_none() && self.status == StatusCode::BAD_REQUEST {
            self.param = Some(param.to_string());
        }
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The JSON body ([`ErrorReply::body`]).
    pub fn body(&self) -> serde_json::Value {
        let reply = ErrorReply {
            status: self.status.as_u16(),
            message: self.message.clone(),
            kind: self.kind,
            param: self.param.clone(),
            code: self.code,
        };
        reply.body()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        response.extensions_mut().insert(ErrorKind(self.kind));
        response
    }
}

/// As the library answers it ([`ErrorReply`]); a server error is logged.
impl From<wgspec::Error> for ApiError {
    fn from(e: wgspec::Error) -> ApiError {
        let reply = ErrorReply::from(&e);
        let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            eprintln!("server error: {}", reply.message);
        }
        ApiError { status, message: reply.message, kind: reply.kind, param: reply.param, code: reply.code }
    }
}
