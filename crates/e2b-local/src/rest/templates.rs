//! Template build routes (E2B's build API, [`crate::builder`]) and template tags:
//! `POST /v3/templates`, `GET /templates/{id}/files/{hash}` and the upload it links,
//! `POST /v2/templates/{id}/builds/{build}`, `GET /templates/{id}/builds/{build}/status`,
//! `POST` and `DELETE /templates/tags`, `GET /templates/{id}/tags`.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt as _;

use super::snapshots::percent_decode;
use crate::app::App;
use crate::parse::{parse_body, query_pairs};
use crate::reply::{ApiError, json_response};
use crate::snapshots::check_tags;

#[derive(Debug, Deserialize)]
struct AssignTags {
    target: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RemoveTags {
    name: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
}

fn decoded(raw: &str) -> Result<String, ApiError> {
    percent_decode(raw).ok_or_else(|| ApiError::bad_request("invalid path encoding"))
}

/// `POST /v3/templates` (202).
pub(super) fn request(app: &App, body: &Bytes) -> Result<Response, ApiError> {
    let answer = crate::builder::request(&app.snapshots, &app.builds, parse_body(body)?)?;
    Ok(json_response(StatusCode::ACCEPTED, &answer))
}

/// `GET /templates/{id}/files/{hash}` (201).
pub(super) fn file_link(app: &App, template_id: &str, hash: &str) -> Result<Response, ApiError> {
    let answer = app.builds.file_link(&decoded(template_id)?, hash)?;
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// `POST /v2/templates/{id}/builds/{build}` (202, no body).
pub(super) fn start(
    app: &Arc<App>,
    template_id: &str,
    build_id: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    crate::builder::start(app, &decoded(template_id)?, build_id, parse_body(body)?)?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=&limit=` (200).
pub(super) fn status(
    app: &App,
    template_id: &str,
    build_id: &str,
    query: &str,
) -> Result<Response, ApiError> {
    let mut offset = 0usize;
    let mut limit = 100usize;
    for (key, value) in query_pairs(query) {
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid {key}: {value}")))
        };
        match key.as_str() {
            "logsOffset" => offset = number()?,
            "limit" => limit = number()?,
            _ => {}
        }
    }
    let answer = crate::builder::status(app, &decoded(template_id)?, build_id, offset, limit)?;
    Ok(json_response(StatusCode::OK, &answer))
}

fn checked_tags(tags: &[String]) -> Result<Vec<String>, ApiError> {
    if tags.is_empty() {
        return Err(ApiError::bad_request("At least one tag is required"));
    }
    check_tags(tags.iter().map(String::as_str))
}

/// `POST /templates/tags` (201).
pub(super) fn assign_tags(app: &App, body: &Bytes) -> Result<Response, ApiError> {
    let req: AssignTags = parse_body(body)?;
    let target = req
        .target
        .ok_or_else(|| ApiError::bad_request("target is required"))?;
    let tags = checked_tags(&req.tags)?;
    let build_id = app.snapshots.assign_tags(&target, &tags)?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"tags": tags, "buildID": build_id}),
    ))
}

/// `DELETE /templates/tags` (204), its body naming the template and the tags.
pub(super) fn remove_tags(app: &App, body: &Bytes) -> Result<Response, ApiError> {
    let req: RemoveTags = parse_body(body)?;
    let name = req
        .name
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    let tags = checked_tags(&req.tags)?;
    if tags.iter().any(|tag| tag == "default") {
        return Err(ApiError::bad_request("Cannot delete the 'default' tag"));
    }
    app.snapshots.remove_tags(&name, &tags)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /templates/{id}/tags` (200).
pub(super) fn tags(app: &App, template: &str) -> Result<Response, ApiError> {
    let rows = app.snapshots.tags(&decoded(template)?)?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::Value::Array(rows),
    ))
}

/// `PUT /_e2b_local/template-files/{hash}?token=`: an upload link's target. Its token
/// stands in for the API key (clients send none there, as to E2B's storage); the body is
/// streamed to a part file and renamed over the archive once whole.
pub(super) async fn upload(app: Arc<App>, hash: &str, query: &str, request: Request) -> Response {
    let token = query_pairs(query)
        .into_iter()
        .find(|(key, _)| key == "token")
        .map(|(_, value)| value);
    if !app.builds.upload_allowed(token.as_deref()) {
        return ApiError::new(StatusCode::FORBIDDEN, "invalid upload token").into_response();
    }
    let (part, archive) = match app.builds.upload_paths(hash) {
        Ok(paths) => paths,
        Err(error) => return error.into_response(),
    };
    let failed = |error: std::io::Error| {
        ApiError::internal(format!("uploading the files of {hash} failed: {error}"))
    };
    let written = async {
        let mut file = tokio::fs::File::create(&part).await.map_err(failed)?;
        let mut body = request.into_body().into_data_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request(format!("reading the upload of {hash} failed: {e}"))
            })?;
            file.write_all(&chunk).await.map_err(failed)?;
        }
        file.sync_all().await.map_err(failed)?;
        tokio::fs::rename(&part, &archive).await.map_err(failed)
    }
    .await;
    match written {
        Ok(()) => StatusCode::OK.into_response(),
        Err(error) => {
            let _ = tokio::fs::remove_file(&part).await;
            error.into_response()
        }
    }
}
