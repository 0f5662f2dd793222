//! The answers every handler shares: the E2B-style error body and JSON replies.
//!
//! Depends on no other module of the crate, so that the store, the fault layer and
//! every handler can use it without importing each other.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

/// A control-plane or plain-HTTP error: `{"code": <status>, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn sandbox_not_found(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"),
        )
    }

    /// A route of E2B's published API that e2b-local does not implement (501, not
    /// 404: SDKs read a 404 as "sandbox not found").
    pub(crate) fn not_supported(route: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{route} is not supported by e2b-local"),
        )
    }

    /// E2B's answer to a create or resume past the account's concurrency limit, word
    /// for word (its API's orchestrator), so SDKs raise their own rate-limit error.
    pub(crate) fn concurrency_limit(max_running: u32) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "you have reached the maximum number of concurrent E2B sandboxes ({max_running}). \
                 If you need more, please visit 'https://e2b.dev/docs/billing'"
            ),
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(
            self.status,
            &serde_json::json!({"code": self.status.as_u16(), "message": self.message}),
        )
    }
}

/// A JSON response with the given status.
pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

/// A 405 with the `Allow` header HTTP requires (RFC 9110 §15.5.6): `allow` lists the
/// methods the path does serve.
pub(crate) fn method_not_allowed(message: &str, allow: &'static str) -> Response {
    let mut response = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message).into_response();
    response
        .headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    response
}
