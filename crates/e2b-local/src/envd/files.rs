//! envd's `POST /files`: multipart (many files) or octet-stream (one file), optionally
//! gzip-coded, with `X-Metadata-*` headers stored as the files' metadata; and what
//! `GET /files` shares with it (the query, path and user errors).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::PathBuf;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::ctx::Ctx;
use super::encoding::{self, Coding};
use super::metadata;
use super::signing::{self, FilesQuery, parse_query};
use crate::isolation::SandboxUser;
use crate::paths::{self, Last, PathError, Resolved};
use crate::reply::{ApiError, json_response};

pub(super) fn path_error(error: &PathError) -> Response {
    match error {
        PathError::Outside(_) => {
            ApiError::new(StatusCode::FORBIDDEN, error.message()).into_response()
        }
        PathError::Invalid(_) => ApiError::bad_request(error.message()).into_response(),
    }
}

pub(super) fn user_of(query: &FilesQuery) -> Result<SandboxUser, ApiError> {
    SandboxUser::parse(query.username.as_deref())
        .map_err(|m| ApiError::new(StatusCode::UNAUTHORIZED, m))
}

/// `POST /files`: multipart (many files) or octet-stream (one file, `?path=`), in envd's
/// order of checks: access, user, coding (400), metadata (400), content type (400).
pub(crate) async fn upload(ctx: Ctx, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    if let Err(refused) = signing::authorize(&ctx, &request, &query) {
        return refused.into_response();
    }
    let user = match user_of(&query) {
        Ok(user) => user,
        Err(error) => {
            return error.into_response();
        }
    };
    let headers = request.headers().clone();
    let coding = match encoding::content_encoding(&headers) {
        Ok(coding) => coding,
        Err(text) => {
            return ApiError::bad_request(format!("error decompressing request body: {text}"))
                .into_response();
        }
    };
    let metadata = metadata::from_headers(&headers);
    if let Err(text) = metadata::validate(&metadata) {
        return ApiError::bad_request(format!("invalid metadata: {text}")).into_response();
    }
    let body = decoded_body(request, coding);
    let target = Target {
        ctx: &ctx,
        user,
        metadata: &metadata,
    };
    let result = match upload_kind(&headers, &query) {
        Ok(UploadKind::Multipart(boundary)) => {
            upload_multipart(&target, &query, boundary, body).await
        }
        Ok(UploadKind::Octet(path)) => write_one(&target, &path, body)
            .await
            .map(|entry| vec![entry]),
        Err(error) => Err(error),
    };
    match result {
        Ok(entries) => json_response(StatusCode::OK, &Value::Array(entries)),
        Err(error) => error.into_response(),
    }
}

/// The request body as bytes of the files: gunzipped when it is gzip-coded (several
/// members read as one, as Go's reader reads them), streamed either way.
fn decoded_body(request: Request, coding: Coding) -> BoxStream<'static, io::Result<Bytes>> {
    let raw = request
        .into_body()
        .into_data_stream()
        .map_err(io::Error::other);
    match coding {
        Coding::Identity => raw.boxed(),
        Coding::Gzip => {
            let mut decoder = async_compression::tokio::bufread::GzipDecoder::new(
                tokio_util::io::StreamReader::new(raw),
            );
            decoder.multiple_members(true);
            tokio_util::io::ReaderStream::new(decoder)
                .map_err(|e| io::Error::new(e.kind(), format!("gzip: {e}")))
                .boxed()
        }
    }
}

/// Where uploaded files go and what they carry.
struct Target<'a> {
    ctx: &'a Ctx,
    user: SandboxUser,
    metadata: &'a BTreeMap<String, String>,
}

/// How an upload body is encoded.
#[derive(Debug)]
enum UploadKind {
    Multipart(String),
    Octet(String),
}

fn upload_kind(headers: &HeaderMap, query: &FilesQuery) -> Result<UploadKind, ApiError> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let lower = content_type.to_ascii_lowercase();
    if lower.starts_with("multipart/form-data") {
        multer::parse_boundary(content_type)
            .map(UploadKind::Multipart)
            .map_err(|e| ApiError::bad_request(format!("invalid multipart content type: {e}")))
    } else if lower.starts_with("application/octet-stream") {
        query.path.clone().map(UploadKind::Octet).ok_or_else(|| {
            ApiError::bad_request("path query parameter is required for octet-stream uploads")
        })
    } else {
        Err(ApiError::bad_request(format!(
            "unsupported content type '{content_type}'"
        )))
    }
}

async fn upload_multipart(
    target: &Target<'_>,
    query: &FilesQuery,
    boundary: String,
    body: BoxStream<'static, io::Result<Bytes>>,
) -> Result<Vec<Value>, ApiError> {
    let mut multipart = multer::Multipart::new(body, boundary);
    let mut entries = Vec::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "error parsing multipart body: {e}"
                )));
            }
        };
        if field.name() != Some("file") {
            continue;
        }
        let path = match (&query.path, field.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => {
                return Err(ApiError::bad_request(
                    "multipart part has no filename and no path was given",
                ));
            }
        };
        let resolved = resolve_for_write(target.ctx, &path)?;
        if !seen.insert(resolved.host.clone()) {
            return Err(ApiError::bad_request(format!(
                "cannot upload multiple files to the same path '{}'",
                resolved.virt
            )));
        }
        entries.push(write_resolved(target, &resolved, field).await?);
    }
    if entries.is_empty() {
        return Err(ApiError::bad_request("no file parts in the multipart body"));
    }
    Ok(entries)
}

pub(super) fn resolve_for_write(ctx: &Ctx, target: &str) -> Result<Resolved, ApiError> {
    let fs = ctx.sandbox.fs();
    fs.resolve(target, Last::Follow).map_err(|e| match e {
        PathError::Outside(_) => ApiError::new(StatusCode::FORBIDDEN, e.message()),
        PathError::Invalid(_) => ApiError::bad_request(e.message()),
    })
}

async fn write_one<S, E>(target: &Target<'_>, path: &str, body: S) -> Result<Value, ApiError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let resolved = resolve_for_write(target.ctx, path)?;
    write_resolved(target, &resolved, body).await
}

/// Streams `body` into the resolved file: parents created, file truncated, owned by the
/// user, its metadata replaced by the upload's (read back for the answer, as envd does).
async fn write_resolved<S, E>(
    target: &Target<'_>,
    resolved: &Resolved,
    mut body: S,
) -> Result<Value, ApiError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let virt = resolved.virt.clone();
    if resolved.host == resolved.area_root
        || tokio::fs::metadata(&resolved.host)
            .await
            .is_ok_and(|m| m.is_dir())
    {
        return Err(ApiError::bad_request(format!(
            "path '{virt}' is a directory"
        )));
    }
    let owner = target.ctx.app.isolation.owner(target.user);
    if let Some(parent) = resolved.host.parent() {
        let (area_root, parent) = (resolved.area_root.clone(), parent.to_path_buf());
        tokio::task::spawn_blocking(move || paths::create_dirs(&area_root, &parent, owner))
            .await
            .map_err(|e| ApiError::internal(format!("creating parents of '{virt}' failed: {e}")))?
            .map_err(|e| write_error(&virt, &e))?;
    }
    let mut options = tokio::fs::OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW);
    let mut file = options
        .open(&resolved.host)
        .await
        .map_err(|e| write_error(&virt, &e))?;
    paths::chown(&resolved.host, owner).map_err(|e| write_error(&virt, &e))?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("error reading upload of '{virt}': {e}")))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| write_error(&virt, &e))?;
    }
    file.flush().await.map_err(|e| write_error(&virt, &e))?;
    if let Err(e) = metadata::write(&file, target.metadata) {
        if metadata::unsupported(&e) {
            tracing::warn!(path = %virt, "filesystem keeps no extended attributes; metadata not stored");
        } else if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
            return Err(ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                format!("not enough space for file metadata: {e}"),
            ));
        } else {
            return Err(ApiError::internal(format!(
                "error writing file metadata: {e}"
            )));
        }
    }
    let name = virt.rsplit('/').next().unwrap_or_default().to_owned();
    let mut entry = json!({"path": virt, "name": name, "type": "file"});
    let stored = metadata::read(&resolved.host);
    if !stored.is_empty() {
        entry["metadata"] = json!(stored);
    }
    Ok(entry)
}

fn write_error(virt: &str, error: &io::Error) -> ApiError {
    if error.raw_os_error() == Some(libc::ENOSPC) {
        return ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("not enough disk space to write '{virt}'"),
        );
    }
    match error.kind() {
        // A name component over the filesystem's limit is the caller's input, like a file
        // on the way (found by the multipart fuzz target: it was a 500).
        io::ErrorKind::NotADirectory
        | io::ErrorKind::IsADirectory
        | io::ErrorKind::InvalidFilename => {
            ApiError::bad_request(format!("error writing '{virt}': {error}"))
        }
        io::ErrorKind::PermissionDenied => ApiError::new(
            StatusCode::FORBIDDEN,
            format!("error writing '{virt}': {error}"),
        ),
        _ => ApiError::internal(format!("error writing '{virt}': {error}")),
    }
}
