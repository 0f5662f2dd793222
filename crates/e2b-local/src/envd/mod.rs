//! envd: the in-sandbox daemon's HTTP surface, served for every sandbox on the shared
//! port and selected by the `E2b-Sandbox-Id` header.

mod compose;
pub(crate) mod connect;
mod ctx;
mod download;
mod encoding;
pub(crate) mod files;
pub(crate) mod filesystem;
mod metadata;
pub(crate) mod process;
pub(crate) mod signing;
mod stream_input;
mod watch;

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode};

use crate::app::App;
use crate::reply::{ApiError, json_response};
use crate::store::RunningSandbox;
pub(crate) use ctx::Ctx;

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

/// envd's port in every sandbox (`E2b-Sandbox-Port`; requests without the header mean it).
const ENVD_PORT: u16 = 49983;

/// The header traffic to a sandbox's own ports carries its traffic access token in.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Serves one request for the sandbox named in its header: envd's, or one for another of
/// the sandbox's ports (the code interpreter's is routed before, by `server`).
pub(crate) async fn handle(app: Arc<App>, sandbox_id: String, request: Request) -> Response {
    let Some(sandbox) = app.store.running(&sandbox_id) else {
        return sandbox_not_found(&sandbox_id);
    };
    let port = request
        .headers()
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    match port {
        None => {}
        Some(port) if port.parse::<u16>() == Ok(ENVD_PORT) => {}
        Some(port) => return own_port(&sandbox, port, request.headers()),
    }
    serve(Ctx { app, sandbox }, request).await
}

/// Traffic to one of the sandbox's own ports (not envd's, nor the code interpreter's), as
/// E2B's proxy judges it: see [`traffic_denied`]; e2b-local relays nothing to the
/// sandbox's ports, so what passes is told the port is not open.
fn own_port(sandbox: &RunningSandbox, port: &str, headers: &HeaderMap) -> Response {
    if let Some(denied) = traffic_denied(sandbox, headers) {
        return denied;
    }
    json_response(
        StatusCode::BAD_GATEWAY,
        &serde_json::json!({
            "sandboxId": sandbox.id,
            "message": "The sandbox is running but port is not open",
            "port": port,
        }),
    )
}

/// A sandbox created with `allowPublicTraffic: false` wants its traffic access token on
/// its own ports: E2B's proxy's 403 without it or with another.
pub(crate) fn traffic_denied(sandbox: &RunningSandbox, headers: &HeaderMap) -> Option<Response> {
    if let Some(token) = &sandbox.traffic_token {
        let given = headers
            .get(TRAFFIC_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok());
        let message = match given {
            None => Some(format!(
                "Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
            )),
            Some(given) if !signing::same_secret(given, token.expose()) => Some(format!(
                "Sandbox is secured with traffic access token. Provided token in header '{TRAFFIC_TOKEN_HEADER}' is invalid"
            )),
            Some(_) => None,
        };
        if let Some(message) = message {
            return Some(json_response(
                StatusCode::FORBIDDEN,
                &serde_json::json!({"sandboxId": sandbox.id, "message": message, "code": 403}),
            ));
        }
    }
    None
}

/// Serves a request already matched to a running sandbox (also used by pre-signed URLs).
pub(crate) async fn serve(ctx: Ctx, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let is_files = path == "/files";
    let exempt = (path == "/health" && method == Method::GET) || is_files;
    if !exempt && !token_ok(&ctx, request.headers()) {
        return unauthorized();
    }
    if let Some(rpc) = path.strip_prefix("/process.Process/") {
        if method != Method::POST {
            return method_not_allowed("POST");
        }
        // StreamInput is served over process's input writing, so it is routed here.
        if rpc == "StreamInput" {
            return stream_input::handle(ctx, request).await;
        }
        let rpc = rpc.to_owned();
        return process::handle(ctx, &rpc, request).await;
    }
    if let Some(rpc) = path.strip_prefix("/filesystem.Filesystem/") {
        if method != Method::POST {
            return method_not_allowed("POST");
        }
        // Watches borrow filesystem's paths and entries, so they are routed here.
        match rpc {
            "WatchDir" => return watch::watch_dir(ctx, request).await,
            "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
                let rpc = rpc.to_owned();
                return watch::handle_polling(ctx, &rpc, request).await;
            }
            _ => {}
        }
        let rpc = rpc.to_owned();
        return filesystem::handle(ctx, &rpc, request).await;
    }
    match (method, path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::GET, "/files") => download::download(ctx, request).await,
        (Method::POST, "/files") => files::upload(ctx, request).await,
        (Method::POST, "/files/compose") => compose::compose(ctx, request).await,
        (Method::GET, "/envs") => {
            json_response(StatusCode::OK, &serde_json::json!(ctx.sandbox.env_vars))
        }
        (_, "/files") => method_not_allowed("GET, POST"),
        (_, "/files/compose") => method_not_allowed("POST"),
        (Method::GET, "/metrics") => json_response(
            StatusCode::OK,
            &crate::metrics::envd(&ctx.app, &ctx.sandbox.id).await,
        ),
        (_, "/health" | "/envs" | "/metrics") => method_not_allowed("GET"),
        _ => {
            ApiError::new(StatusCode::NOT_FOUND, format!("path '{path}' not found")).into_response()
        }
    }
}

fn method_not_allowed(allow: &'static str) -> Response {
    crate::reply::method_not_allowed("method not allowed", allow)
}

/// True when the sandbox has no token or the request carries the right one.
pub(crate) fn token_ok(ctx: &Ctx, headers: &HeaderMap) -> bool {
    match &ctx.sandbox.token {
        None => true,
        Some(token) => headers
            .get("x-access-token")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|given| signing::same_secret(given, token.expose())),
    }
}
