//! The server's error answer: OpenAI's shape `{"error": {"message", "type", "param", "code"}}`
//! with an HTTP status; the library's [`wgspec::Error`]s are answered as [`ErrorReply`] maps them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use wgspec::openai::ErrorReply;

/// An error answered to a client: the library's [`ErrorReply`] (its `kind` is OpenAI's `type`
/// and the label of `wgspec_errors_total` in the metrics) with the server's constructors.
#[derive(Clone, Debug)]
pub struct ApiError(pub ErrorReply);

/// The error kind a response carried, read by the metrics layer (a response extension).
#[derive(Clone, Copy, Debug)]
pub struct ErrorKind(pub &'static str);

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError(ErrorReply::new(status.as_u16(), kind, message))
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
        eprintln!("server error: {}", e.0.message);
        e
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.0.param = Some(param.to_string());
        self
    }

    /// Names `param` as the field at fault of a 400 that names none.
    pub fn with_param_if_none(self, param: &str) -> ApiError {
        ApiError(self.0.with_param_if_none(param))
    }

    /// A refusal of prompt `index` of a list names it (`prompt[2]: ...`); `None`: as it is.
    pub fn of_prompt(mut self, index: Option<usize>) -> ApiError {
        if let Some(i) = index {
            self.0.message = format!("`prompt[{i}]`: {}", self.0.message);
        }
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.0.code = Some(code);
        self
    }

    /// OpenAI's `type` (the metrics' error label).
    pub fn kind(&self) -> &'static str {
        self.0.kind
    }

    /// The JSON body ([`ErrorReply::body`]).
    pub fn body(&self) -> serde_json::Value {
        self.0.body()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self.body())).into_response();
        response.extensions_mut().insert(ErrorKind(self.0.kind));
        response
    }
}

/// As the library answers it ([`ErrorReply`]); a server error is logged.
impl From<wgspec::Error> for ApiError {
    fn from(e: wgspec::Error) -> ApiError {
        let reply = ErrorReply::from(&e);
        if reply.status >= 500 && reply.status != 503 {
            eprintln!("server error: {}", reply.message);
        }
        ApiError(reply)
    }
}
