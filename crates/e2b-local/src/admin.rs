//! The `/_e2b_local/` admin routes: the clock, the fault knobs and the request counts
//! over HTTP, for clients in other processes (the SDK conformance suite, the CLI).

use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::{nanos, rfc3339};
use crate::fault_state::{DropRule, FailRule, FaultScope, HoldRule, Release};
use crate::faults::Faults;
use crate::parse::parse_body;
use crate::reply::{ApiError, json_response};
use crate::store::parse_sandbox_id;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdvanceBody {
    seconds: f64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LatencyBody {
    ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FailBody {
    #[serde(default = "one")]
    count: u32,
    status: u16,
    scope: Option<String>,
    path_prefix: Option<String>,
    retry_after: Option<u64>,
    should_retry: Option<bool>,
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CountBody {
    #[serde(default = "one")]
    count: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ForkStartBody {
    #[serde(default = "one")]
    count: u32,
    status: u16,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DropBody {
    #[serde(default = "one")]
    count: u32,
    after_bytes: u64,
    scope: Option<String>,
    path_prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HoldBody {
    #[serde(default)]
    skip: u32,
    scope: Option<String>,
    path_prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReleaseBody {
    /// `continue` (handle it) or `fail` (answer 503 unhandled).
    answer: String,
}

/// `{"maxRunning": N|null}`: the key is required so that a typo cannot lift the limit.
fn parse_max_running(body: &Bytes) -> Result<Option<u32>, ApiError> {
    let value: Value = parse_body(body)?;
    let invalid = || ApiError::bad_request("maxRunning must be null or a non-negative integer");
    match value.get("maxRunning") {
        Some(Value::Null) => Ok(None),
        Some(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(invalid),
        None => Err(invalid()),
    }
}

fn limits_json(app: &App) -> Value {
    let (max_running, running) = app.store.running_limit();
    json!({"maxRunning": max_running, "running": running})
}

fn one() -> u32 {
    1
}

fn scope(text: Option<&str>, default: FaultScope) -> Result<FaultScope, ApiError> {
    match text {
        None => Ok(default),
        Some(text) => FaultScope::parse(text)
            .ok_or_else(|| ApiError::bad_request(format!("invalid scope '{text}'"))),
    }
}

fn clock_json(app: &App) -> Value {
    let now = nanos(app.clock.now());
    json!({"now": rfc3339(now), "unixNanos": now})
}

/// What sandboxes are isolated with, and why not more: the mount tier, and whether
/// each sandbox gets its own PID namespace and (offline) network namespace.
fn isolation_json(app: &App) -> Value {
    let capability = app.isolation.ns_capability();
    json!({
        "mode": if app.isolation_is_namespace() { "mount-namespace" } else { "path-mapping" },
        "pidNamespace": capability.pid,
        "networkNamespace": capability.net,
        "rootLayers": capability.layer,
        "missing": app.isolation.ns_missing(),
        "egressRules": app.egress.is_some(),
        "egressMissing": app.store.egress_unavailable(),
    })
}

/// Serves `/_e2b_local/<rest>` (the API key was checked by the caller).
pub(crate) fn route(
    app: &Arc<App>,
    method: &Method,
    rest: &[&str],
    body: &Bytes,
) -> Result<Response, ApiError> {
    let faults = Faults {
        app: Arc::clone(app),
    };
    let no_content = || Ok(StatusCode::NO_CONTENT.into_response());
    match (method.clone(), rest) {
        (Method::GET, ["clock"]) => Ok(json_response(StatusCode::OK, &clock_json(app))),
        (Method::POST, ["clock", "advance"]) => {
            let req: AdvanceBody = parse_body(body)?;
            if !req.seconds.is_finite() || req.seconds < 0.0 {
                return Err(ApiError::bad_request(
                    "seconds must be a non-negative number",
                ));
            }
            app.clock.advance(Duration::from_secs_f64(req.seconds));
            app.store.sweep();
            Ok(json_response(StatusCode::OK, &clock_json(app)))
        }
        (Method::POST, ["faults", "latency"]) => {
            let req: LatencyBody = parse_body(body)?;
            faults.set_latency(Duration::from_millis(req.ms));
            no_content()
        }
        (Method::POST, ["faults", "fail"]) => {
            let req: FailBody = parse_body(body)?;
            if !(100..=599).contains(&req.status) {
                return Err(ApiError::bad_request("status must be an HTTP status code"));
            }
            faults.fail_next(FailRule {
                count: req.count,
                status: req.status,
                scope: scope(req.scope.as_deref(), FaultScope::Any)?,
                path_prefix: req.path_prefix,
                retry_after_secs: req.retry_after,
                should_retry: req.should_retry,
                message: req.message,
            });
            no_content()
        }
        (Method::POST, ["faults", "drop-connections"]) => {
            let req: CountBody = parse_body(body)?;
            faults.drop_next_connections(req.count);
            no_content()
        }
        (Method::POST, ["faults", "drop-stream"]) => {
            let req: DropBody = parse_body(body)?;
            faults.drop_streams(DropRule {
                count: req.count,
                after_bytes: req.after_bytes,
                scope: scope(req.scope.as_deref(), FaultScope::Envd)?,
                path_prefix: req.path_prefix,
            });
            no_content()
        }
        (Method::POST, ["faults", "fork-start"]) => {
            let req: ForkStartBody = parse_body(body)?;
            if !(100..=599).contains(&req.status) {
                return Err(ApiError::bad_request("status must be an HTTP status code"));
            }
            faults.fail_fork_starts(req.count, req.status);
            no_content()
        }
        (Method::POST, ["faults", "fork-vanish-source"]) => {
            let req: CountBody = parse_body(body)?;
            faults.vanish_next_fork_sources(req.count);
            no_content()
        }
        (Method::POST, ["faults", "hold"]) => {
            let req: HoldBody = parse_body(body)?;
            faults.hold_request(HoldRule {
                skip: req.skip,
                scope: scope(req.scope.as_deref(), FaultScope::Any)?,
                path_prefix: req.path_prefix,
            });
            no_content()
        }
        (Method::GET, ["faults", "hold"]) => {
            let (armed, held) = app.faults.hold_status();
            Ok(json_response(
                StatusCode::OK,
                &json!({"armed": armed, "held": held}),
            ))
        }
        (Method::POST, ["faults", "release"]) => {
            let req: ReleaseBody = parse_body(body)?;
            let release = match req.answer.as_str() {
                "continue" => Release::Continue,
                "fail" => Release::Fail,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "answer must be continue or fail, not '{other}'"
                    )));
                }
            };
            faults.release_hold(release);
            no_content()
        }
        (Method::GET, ["limits"]) => Ok(json_response(StatusCode::OK, &limits_json(app))),
        (Method::POST, ["limits"]) => {
            app.store.set_max_running(parse_max_running(body)?);
            Ok(json_response(StatusCode::OK, &limits_json(app)))
        }
        (Method::GET, ["isolation"]) => Ok(json_response(StatusCode::OK, &isolation_json(app))),
        (Method::GET, ["requests"]) => {
            let mut counts = app.requests.snapshot().to_json();
            counts["serverMicros"] = Value::from(app.requests.server_micros());
            counts["inFlight"] = Value::from(app.requests.in_flight());
            counts["runningProcesses"] = Value::from(app.store.running_processes());
            Ok(json_response(StatusCode::OK, &counts))
        }
        (Method::POST, ["requests", "reset"]) => {
            app.requests.reset();
            no_content()
        }
        (Method::POST, ["faults", "clear"]) => {
            faults.clear();
            no_content()
        }
        (Method::POST, ["sandboxes", id, action @ ("vanish" | "pause")]) => {
            let id = parse_sandbox_id(id)?;
            let result = if *action == "vanish" {
                faults.vanish_sandbox(&id)
            } else {
                faults.pause_sandbox(&id)
            };
            match result {
                Ok(()) => no_content(),
                Err(e) => Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string())),
            }
        }
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "Not found")),
    }
}
