//! Errors of the native API: every failure is a JSON body `{"error": {"kind", "message"}}`
//! with an HTTP status derived from the [`cairn_core::Error`] variant (see [`ApiError::from`])
//! or from the HTTP layer itself (auth, size limit, ranges, media types). A merge that ends
//! in conflicts adds a `conflicts` list next to `error`.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cairn_core::Error;

/// A failed request: status, a stable machine-readable kind, a human-readable message.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable error kind (`not_found`, `guard_mismatch`, ...).
    pub kind: &'static str,
    /// What went wrong, for people.
    pub message: String,
    /// Extra JSON fields next to `error` (e.g. `conflicts`).
    pub extra: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// Extra response headers (e.g. `Content-Range` on a 416).
    pub headers: Option<Box<HeaderMap>>,
}

/// Result of a handler step.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

impl ApiError {
    /// An error with a status, kind and message.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            extra: None,
            headers: None,
        }
    }

    /// 400 `invalid_input`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    /// 401 `unauthorized`: a missing, malformed, stale, replayed or wrong request
    /// signature, or a body that does not match the signed hash.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 415 `unsupported_media_type`: a JSON body sent without `Content-Type:
    /// application/json`. Required of every JSON `POST`, so a web page cannot send one
    /// across sites: a browser sends a `text/plain` POST without asking first, but asks
    /// (a CORS preflight, which this node does not answer) before a JSON one.
    pub fn json_required() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be sent as Content-Type: application/json",
        )
    }

    /// 413 `too_large`.
    pub fn too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is larger than this node accepts ({limit} bytes)"),
        )
    }

    /// 500 `internal` for failures of the node itself (a task that panicked).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Adds a response header.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers
            .get_or_insert_with(Default::default)
            .insert(name, value);
        self
    }

    /// Adds a JSON field next to `error` (one more, or in place of one of that name).
    pub fn with_extra(mut self, field: &'static str, value: serde_json::Value) -> Self {
        self.extra
            .get_or_insert_with(Default::default)
            .insert(field.to_string(), value);
        self
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, kind) = match &e {
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::Decode(_) => (StatusCode::BAD_REQUEST, "decode"),
            Error::InvalidInput(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
            Error::GuardMismatch(_) => (StatusCode::PRECONDITION_FAILED, "guard_mismatch"),
            Error::TypeMismatch(_) => (StatusCode::CONFLICT, "type_mismatch"),
            Error::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::Rejected(_) => (StatusCode::FORBIDDEN, "rejected"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Corrupt(_) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt"),
            Error::Io { source, .. } if cairn_core::error::out_of_space(source.kind()) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
            Error::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "io"),
        };
        if status.is_server_error() {
            tracing::error!(error = %e, "native API request failed");
        }
        ApiError::new(status, kind, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({
            "error": { "kind": self.kind, "message": self.message }
        });
        if let (Some(extra), Some(obj)) = (self.extra, body.as_object_mut()) {
            obj.extend(*extra);
        }
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(h) = self.headers {
            resp.headers_mut().extend(*h);
        }
        resp
    }
}

/// Runs blocking storage work on the blocking pool (storage calls may wait for an fsync).
pub async fn blocking<T, F>(f: F) -> ApiResult<T>
where
    F: FnOnce() -> ApiResult<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("storage task failed: {e}")))?
}
