//! envd: the in-sandbox daemon's HTTP surface, served for every sandbox on the shared
//! port and selected by the `E2b-Sandbox-Id` header.

pub(crate) mod connect;
pub(crate) mod files;
pub(crate) mod filesystem;
pub(crate) mod process;

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, Method, StatusCode};
use serde::{Deserialize, Deserializer};

use crate::app::{ApiError, App, json_response};
use crate::isolation::SandboxUser;
use crate::store::RunningSandbox;
use connect::{Code, ConnectError};

/// What an envd handler works with.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub(crate) app: Arc<App>,
    pub(crate) sandbox: RunningSandbox,
}

impl Ctx {
    /// The user named by `Authorization: Basic base64(name:)`, else the default `user`.
    pub(crate) fn user(&self, headers: &HeaderMap) -> Result<SandboxUser, ConnectError> {
        let name = basic_username(headers);
        SandboxUser::parse(name.as_deref()).map_err(|m| ConnectError::new(Code::Unauthenticated, m))
    }
}

fn basic_username(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(
        text.split_once(':')
            .map_or(text.as_str(), |(user, _)| user)
            .to_owned(),
    )
}

/// Accepts a uint32 as a JSON number or string (proto3 JSON allows both on input).
pub(crate) fn de_opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flex {
        Num(u32),
        Text(String),
    }
    match Option::<Flex>::deserialize(d)? {
        None => Ok(None),
        Some(Flex::Num(n)) => Ok(Some(n)),
        Some(Flex::Text(s)) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// The proxy's answer for a sandbox that is not running.
pub(crate) fn sandbox_not_found(id: &str) -> Response {
    json_response(
        StatusCode::BAD_GATEWAY,
        &serde_json::json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502}),
    )
}

fn unauthorized() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    )
    .into_response()
}

/// Serves one envd request for the sandbox named in its header.
pub(crate) async fn handle(app: Arc<App>, sandbox_id: String, request: Request) -> Response {
    let Some(sandbox) = app.store.running(&sandbox_id) else {
        crate::app::drain(request).await;
        return sandbox_not_found(&sandbox_id);
    };
    serve(Ctx { app, sandbox }, request).await
}

/// Serves a request already matched to a running sandbox (also used by pre-signed URLs).
pub(crate) async fn serve(ctx: Ctx, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let is_files = path == "/files";
    let exempt = (path == "/health" && method == Method::GET) || is_files;
    if !exempt && !token_ok(&ctx, request.headers()) {
        crate::app::drain(request).await;
        return unauthorized();
    }
    if let Some(rpc) = path.strip_prefix("/process.Process/") {
        if method != Method::POST {
            return method_not_allowed();
        }
        let rpc = rpc.to_owned();
        return process::handle(ctx, &rpc, request).await;
    }
    if let Some(rpc) = path.strip_prefix("/filesystem.Filesystem/") {
        if method != Method::POST {
            return method_not_allowed();
        }
        let rpc = rpc.to_owned();
        return filesystem::handle(ctx, &rpc, request).await;
    }
    match (method, path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::GET, "/files") => files::download(ctx, request).await,
        (Method::POST, "/files") => files::upload(ctx, request).await,
        (Method::GET, "/envs") => {
            json_response(StatusCode::OK, &serde_json::json!(ctx.sandbox.env_vars))
        }
        (_, "/health" | "/files" | "/envs") => {
            crate::app::drain(request).await;
            method_not_allowed()
        }
        _ => {
            crate::app::drain(request).await;
            ApiError::new(StatusCode::NOT_FOUND, format!("path '{path}' not found")).into_response()
        }
    }
}

fn method_not_allowed() -> Response {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed").into_response()
}

/// True when the sandbox has no token or the request carries the right one.
pub(crate) fn token_ok(ctx: &Ctx, headers: &HeaderMap) -> bool {
    match &ctx.sandbox.token {
        None => true,
        Some(token) => headers
            .get("x-access-token")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|given| given == token),
    }
}
