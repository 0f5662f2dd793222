//! `GET /sandboxes/{id}/logs` (v1, deprecated) and `GET /v2/sandboxes/{id}/logs`: the
//! events in the sandbox's ring ([`crate::sandbox_log`]), filtered as the spec says.

use std::sync::Arc;

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::rfc3339;
use crate::parse::query_pairs;
use crate::reply::{ApiError, json_response};
use crate::sandbox_log::{Entry, Level};
use crate::store::parse_sandbox_id;

/// Default and largest `limit`.
const MAX_LIMIT: usize = 1000;

fn entries(app: &Arc<App>, raw_id: &str) -> Result<Vec<Entry>, ApiError> {
    let id = parse_sandbox_id(raw_id)?;
    // A sandbox seen since the server started (killed ones included) has a ring.
    let log = app
        .store
        .logs
        .existing(&id)
        .ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    Ok(log.entries())
}

fn number(name: &str, raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("{name} must be a non-negative integer")))
}

fn timestamp(entry: &Entry) -> String {
    rfc3339(entry.millis.saturating_mul(1_000_000))
}

fn entry_json(entry: &Entry) -> Value {
    json!({
        "timestamp": timestamp(entry),
        "level": entry.level.as_str(),
        "message": entry.message,
        "fields": entry.fields,
    })
}

/// v1: entries from `start` (ms) on, oldest first, at most `limit`.
pub(super) fn v1(app: &Arc<App>, id: &str, query: &str) -> Result<Response, ApiError> {
    let all = entries(app, id)?;
    let mut start = 0;
    let mut limit = MAX_LIMIT;
    for (key, value) in query_pairs(query) {
        match key.as_str() {
            "start" => start = number("start", &value)?,
            "limit" => limit = usize::try_from(number("limit", &value)?).unwrap_or(usize::MAX),
            _ => {}
        }
    }
    let kept: Vec<&Entry> = all
        .iter()
        .filter(|e| e.millis >= start)
        .take(limit)
        .collect();
    let logs: Vec<Value> = kept
        .iter()
        .map(|e| json!({"timestamp": timestamp(e), "line": e.message}))
        .collect();
    let log_entries: Vec<Value> = kept.iter().map(|e| entry_json(e)).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"logs": logs, "logEntries": log_entries}),
    ))
}

/// v2: forward from `cursor` (oldest first) or backward to it (newest first), at most
/// `limit` (≤ 1000), at `level` or above, whose message contains `search`.
pub(super) fn v2(app: &Arc<App>, id: &str, query: &str) -> Result<Response, ApiError> {
    let all = entries(app, id)?;
    let mut cursor = None;
    let mut limit = MAX_LIMIT;
    let mut backward = false;
    let mut level = Level::Debug;
    let mut search = None;
    for (key, value) in query_pairs(query) {
        match key.as_str() {
            "cursor" => cursor = Some(number("cursor", &value)?),
            "limit" => {
                limit = usize::try_from(number("limit", &value)?).unwrap_or(usize::MAX);
                if limit > MAX_LIMIT {
                    return Err(ApiError::bad_request(format!(
                        "limit must be at most {MAX_LIMIT}"
                    )));
                }
            }
            "direction" => {
                backward = match value.as_str() {
                    "forward" => false,
                    "backward" => true,
                    _ => {
                        return Err(ApiError::bad_request(
                            "direction must be forward or backward",
                        ));
                    }
                }
            }
            "level" => {
                level = Level::parse(&value).ok_or_else(|| {
                    ApiError::bad_request("level must be one of debug, info, warn, error")
                })?;
            }
            "search" => search = Some(value),
            _ => {}
        }
    }
    let matches =
        |e: &&Entry| e.level >= level && search.as_deref().is_none_or(|s| e.message.contains(s));
    let kept: Vec<Value> = if backward {
        let cursor = cursor.unwrap_or(u64::MAX);
        all.iter()
            .rev()
            .filter(|e| e.millis <= cursor)
            .filter(matches)
            .take(limit)
            .map(entry_json)
            .collect()
    } else {
        let cursor = cursor.unwrap_or(0);
        all.iter()
            .filter(|e| e.millis >= cursor)
            .filter(matches)
            .take(limit)
            .map(entry_json)
            .collect()
    };
    Ok(json_response(StatusCode::OK, &json!({"logs": kept})))
}
