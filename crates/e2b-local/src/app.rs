//! The state shared by every handler, and the E2B-style error answer.

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use crate::ApiKeyPolicy;
use crate::clock::Clock;
use crate::faults::FaultState;
use crate::isolation::Isolation;
use crate::requests::RequestCounter;
use crate::store::Store;

/// Everything a request handler needs.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) store: Store,
    pub(crate) clock: Clock,
    pub(crate) faults: FaultState,
    pub(crate) api_key: ApiKeyPolicy,
    pub(crate) templates: Vec<String>,
    pub(crate) isolation: Arc<Isolation>,
    pub(crate) requests: RequestCounter,
}

impl App {
    /// Checks an `X-API-Key` value against the configured policy.
    pub(crate) fn key_accepted(&self, key: Option<&str>) -> bool {
        match (key, &self.api_key) {
            (None, _) => false,
            (Some(k), ApiKeyPolicy::AnyNonEmpty) => !k.trim().is_empty(),
            (Some(k), ApiKeyPolicy::Exact(expected)) => constant_time_eq(k, expected),
        }
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

impl App {
    /// True when commands run in a private mount namespace.
    pub(crate) fn isolation_is_namespace(&self) -> bool {
        matches!(*self.isolation, Isolation::Namespace { .. })
    }
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
