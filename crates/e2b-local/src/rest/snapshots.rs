//! Snapshot and fork routes: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `DELETE /templates/{id}` and `POST /sandboxes/{id}/fork`, answered as E2B's spec and
//! API handlers answer them.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{sandbox_json, validate_timeout};
use crate::app::App;
use crate::parse::{parse_body, query_pairs};
use crate::reply::{ApiError, json_response};
use crate::snapshots::{Reference, SnapshotQuery, parse_name};
use crate::store::{CreateParams, Cursor, SbState, parse_sandbox_id};

/// E2B's cap on forks per request.
const MAX_FORKS: i64 = 100;

#[derive(Debug, Deserialize)]
struct SnapshotBody {
    name: Option<String>,
    // `memory` is accepted and ignored: e2b-local never keeps memory.
}

#[derive(Debug, Deserialize)]
struct ForkBody {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// `POST /sandboxes/{id}/snapshots`.
pub(super) fn create(app: &App, id: &str, body: &Bytes) -> Result<Response, ApiError> {
    let req: SnapshotBody = parse_body(body)?;
    let name = req
        .name
        .as_deref()
        .filter(|name| !name.is_empty())
        .map(parse_name)
        .transpose()?;
    let id = parse_sandbox_id(id)?;
    let source = app.store.snapshot_source(&id)?;
    // E2B snapshots only sandboxes its orchestrator runs; a paused one is not found there.
    if source.record.state != SbState::Running {
        return Err(ApiError::sandbox_not_found(&id));
    }
    let capture = app
        .snapshots
        .capture(source)
        .map_err(|error| gone_or(app, &id, error))?;
    tracing::info!(
        sandbox_id = %id,
        files = capture.stats.files,
        bytes = capture.stats.bytes,
        reflinked = capture.stats.reflinked,
        "snapshot captured"
    );
    let info = app.snapshots.commit(capture, name.as_ref())?;
    Ok(json_response(StatusCode::CREATED, &info))
}

/// A failed copy of a sandbox that went away meanwhile is a 404, as if it had gone first.
fn gone_or(app: &App, id: &str, error: ApiError) -> ApiError {
    match app.store.get(id) {
        Ok(_) => error,
        Err(gone) => gone,
    }
}

/// `GET /snapshots`.
pub(super) fn list(app: &App, query: &str) -> Result<Response, ApiError> {
    let mut parsed = SnapshotQuery {
        sandbox_id: None,
        name: None,
        cursor: None,
        limit: 100,
    };
    for (key, value) in query_pairs(query) {
        match key.as_str() {
            // E2B shortens a legacy `<id>-<clientID>` too.
            "sandboxID" => {
                parsed.sandbox_id = Some(
                    value
                        .split_once('-')
                        .map_or(value.as_str(), |(id, _)| id)
                        .to_owned(),
                );
            }
            "name" if !value.is_empty() => parsed.name = Some(value),
            "nextToken" if !value.is_empty() => {
                parsed.cursor = Some(
                    Cursor::decode(&value)
                        .ok_or_else(|| ApiError::bad_request("Invalid next token"))?,
                );
            }
            "limit" => {
                let limit: usize = value
                    .parse()
                    .map_err(|_| ApiError::bad_request("limit must be an integer"))?;
                if !(1..=100).contains(&limit) {
                    return Err(ApiError::bad_request("limit must be between 1 and 100"));
                }
                parsed.limit = limit;
            }
            _ => {}
        }
    }
    let (items, next) = app.snapshots.list(&parsed);
    let mut response = json_response(StatusCode::OK, &Value::Array(items));
    if let Some(token) = next
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// `DELETE /templates/{id}`: the SDK's `delete_snapshot`, with the id or name as one
/// percent-encoded path segment.
pub(super) fn delete(app: &App, raw: &str) -> Result<Response, ApiError> {
    let reference =
        percent_decode(raw).ok_or_else(|| ApiError::bad_request("invalid template ID encoding"))?;
    app.snapshots.delete(&reference)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /templates/aliases/{alias}` (the SDK's `Template.exists`): a built-in template
/// (public) or a snapshot by name (the team's) answers `{templateID, public}`; anything else
/// 404.
pub(super) fn alias(app: &App, raw: &str) -> Result<Response, ApiError> {
    let alias = percent_decode(raw)
        .ok_or_else(|| ApiError::bad_request("invalid template alias encoding"))?;
    let builtin = app.templates.contains(&alias) || alias == crate::paths::OTHER_HOME_TEMPLATE;
    if builtin {
        return Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"templateID": alias, "public": true}),
        ));
    }
    // A name with a tag exists when that tag does; a bare alias when the template does
    // (a built template need not have the `default` tag).
    match app.snapshots.exists(&Reference::parse(&alias)) {
        Some(template_id) => Ok(json_response(
            StatusCode::OK,
            &serde_json::json!({"templateID": template_id, "public": false}),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template alias '{alias}' not found"),
        )),
    }
}

/// `%XX` decoding of a path segment (`+` stays a plus there).
pub(super) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `POST /sandboxes/{id}/fork`: one capture of the source (which keeps running, with its
/// id and lease), then `count` sandboxes from it, each reported on its own.
pub(super) fn fork(app: &App, id: &str, body: &Bytes) -> Result<Response, ApiError> {
    let req: ForkBody = parse_body(body)?;
    let id = parse_sandbox_id(id)?;
    let timeout = validate_timeout(req.timeout.unwrap_or(15))?;
    let count = req.count.unwrap_or(1);
    if count < 1 {
        return Err(ApiError::bad_request("Count must be at least 1"));
    }
    if count > MAX_FORKS {
        return Err(ApiError::bad_request(format!(
            "Count cannot be greater than {MAX_FORKS}"
        )));
    }
    let source = app.store.snapshot_source(&id)?;
    if source.record.state != SbState::Running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Sandbox '{id}' is paused and cannot be forked; resume it first"),
        ));
    }
    let capture = app
        .snapshots
        .capture(source)
        .map_err(|error| gone_or(app, &id, error))?;
    // Fault knob: the source goes away after its state was captured; the forks start
    // from the capture all the same, as E2B's do from its snapshot.
    if app.faults.take_fork_source_vanish() {
        tracing::info!(sandbox_id = %id, "fault: the fork's source vanishes");
        let _ = app.store.vanish(&id);
    }
    let record = &capture.source().record;
    let results: Vec<Value> = (0..count)
        .map(|_| {
            if let Some(status) = app.faults.take_fork_start_failure() {
                return json!({"error": {"code": status, "message": "injected fault"}});
            }
            let created = app.store.create(CreateParams {
                template: record.template.clone(),
                timeout_secs: timeout,
                metadata: record.metadata.clone(),
                env_vars: record.env_vars.clone(),
                auto_pause: record.auto_pause,
                auto_pause_memory: record.auto_pause_memory,
                auto_resume: record.auto_resume,
                allow_internet_access: record.allow_internet_access,
                secure: record.secure,
                with_token: record.secure,
                origin: record.origin.clone(),
                files_from: Some(capture.files().to_path_buf()),
                network: record.network.clone(),
                // A fork mounts the volumes its source has: they are shared storage.
                volume_mounts: record.volume_mounts.clone(),
                iam_tokens: record.iam_tokens.clone(),
                build_of: None,
                // A fork has its source's defaults; its processes, the start command's
                // among them, are not forked (e2b-local keeps no memory).
                defaults: record.defaults.clone(),
            });
            match created {
                Ok(fork) => {
                    tracing::info!(sandbox_id = %fork.id, source = %id, "sandbox forked");
                    json!({"sandbox": sandbox_json(&fork)})
                }
                Err(error) => {
                    json!({"error": {"code": error.status.as_u16(), "message": error.message}})
                }
            }
        })
        .collect();
    Ok(json_response(StatusCode::CREATED, &Value::Array(results)))
}
