//! The answers every handler shares: the E2B-style error body, JSON replies, and
//! draining an unread request body before an early answer.
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

/// Largest body read and thrown away before an early answer.
const DRAIN_LIMIT: usize = 1024 * 1024;

/// Reads (and discards) a request body before answering without it, so that the
/// connection stays usable: hyper closes a keep-alive connection whose request body
/// was left unread, and clients then fail their next pooled request.
pub(crate) async fn drain(request: axum::extract::Request) {
    let body = request.into_body();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        axum::body::to_bytes(body, DRAIN_LIMIT),
    )
    .await;
}
