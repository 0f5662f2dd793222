//! Secrets routes: `GET`/`POST /secrets` and `GET`/`POST`/`DELETE /secrets/{id or name}`,
//! answered as E2B's spec has them; no answer carries a value.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::Value;

use crate::app::App;
use crate::parse::query_pairs;
use crate::reply::{ApiError, json_response};

/// The body as JSON. Its parse error is not passed on: it could quote the value.
fn body_json(body: &Bytes) -> Result<Value, ApiError> {
    match serde_json::from_slice(body) {
        Ok(value @ Value::Object(_)) => Ok(value),
        _ => Err(ApiError::bad_request(
            "Invalid request body: expected a JSON object",
        )),
    }
}

/// `POST /secrets`.
pub(super) fn create(app: &App, body: &Bytes) -> Result<Response, ApiError> {
    let info = app.secrets.create(&body_json(body)?)?;
    Ok(json_response(StatusCode::CREATED, &info))
}

/// `GET /secrets`.
pub(super) fn list(app: &App, query: &str) -> Result<Response, ApiError> {
    let mut limit = 100;
    let mut token = None;
    for (key, value) in query_pairs(query) {
        match key.as_str() {
            "nextToken" if !value.is_empty() => token = Some(value),
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|limit| (1..=100).contains(limit))
                    .ok_or_else(|| ApiError::bad_request("limit: must be between 1 and 100"))?;
            }
            _ => {}
        }
    }
    let (items, next) = app.secrets.list(limit, token.as_deref())?;
    let mut response = json_response(StatusCode::OK, &Value::Array(items));
    if let Some(token) = next
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// `GET /secrets/{id or name}`.
pub(super) fn get(app: &App, selector: &str) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &app.secrets.get(selector)?))
}

/// `POST /secrets/{id or name}`.
pub(super) fn update(app: &App, selector: &str, body: &Bytes) -> Result<Response, ApiError> {
    let info = app.secrets.update(selector, &body_json(body)?)?;
    Ok(json_response(StatusCode::OK, &info))
}

/// `DELETE /secrets/{id or name}`.
pub(super) fn delete(app: &App, selector: &str) -> Result<Response, ApiError> {
    app.secrets.delete(selector)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
