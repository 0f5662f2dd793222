//! envd's `/files`: streamed download, multipart and octet-stream upload.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::ctx::Ctx;
use crate::app::App;
use crate::isolation::SandboxUser;
use crate::paths::{self, Last, PathError, Resolved, SandboxFs};
use crate::reply::{ApiError, json_response};

/// Buffer size for streaming a file out (bounded memory whatever the file size).
const READ_CHUNK: usize = 64 * 1024;

/// The query parameters `/files` understands.
#[derive(Debug, Default)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<String>,
}

fn parse_query(query: Option<&str>) -> FilesQuery {
    let mut out = FilesQuery::default();
    for (key, value) in crate::parse::query_pairs(query.unwrap_or_default()) {
        match key.as_str() {
            "path" => out.path = Some(value),
            "username" => out.username = Some(value),
            "signature" => out.signature = Some(value),
            "signature_expiration" => out.signature_expiration = Some(value),
            _ => {}
        }
    }
    out
}

/// The signature the SDK puts in pre-signed URLs.
fn signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = expiration {
        raw.push(':');
        raw.push_str(exp);
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

fn signature_valid(app: &App, token: &str, query: &FilesQuery, operation: &str) -> bool {
    let Some(given) = &query.signature else {
        return false;
    };
    let expected = signature(
        query.path.as_deref().unwrap_or_default(),
        operation,
        query.username.as_deref().unwrap_or_default(),
        token,
        query.signature_expiration.as_deref(),
    );
    if *given != expected {
        return false;
    }
    match query.signature_expiration.as_deref().map(str::parse::<u64>) {
        None => true,
        Some(Ok(expires)) => crate::clock::nanos(app.clock.now()) / 1_000_000_000 <= expires,
        Some(Err(_)) => false,
    }
}

/// `/files` accepts the access-token header or a valid signature.
fn authorized(ctx: &Ctx, headers: &HeaderMap, query: &FilesQuery, operation: &str) -> bool {
    let Some(token) = &ctx.sandbox.token else {
        return true;
    };
    match headers.get("x-access-token").and_then(|v| v.to_str().ok()) {
        Some(given) => given == token,
        None => signature_valid(&ctx.app, token, query, operation),
    }
}

/// For a pre-signed URL without the sandbox header: the running sandbox whose token signs it.
pub(crate) fn find_signed_sandbox(app: &App, request: &Request) -> Option<String> {
    let query = parse_query(request.uri().query());
    query.signature.as_ref()?;
    let operation = if request.method() == http::Method::GET {
        "read"
    } else {
        "write"
    };
    app.store.running_ids().into_iter().find(|id| {
        app.store
            .running(id)
            .and_then(|s| s.token)
            .is_some_and(|token| signature_valid(app, &token, &query, operation))
    })
}

fn unauthorized() -> Response {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    )
    .into_response()
}

fn path_error(error: &PathError) -> Response {
    match error {
        PathError::Outside(_) => {
            ApiError::new(StatusCode::FORBIDDEN, error.message()).into_response()
        }
        PathError::Invalid(_) => ApiError::bad_request(error.message()).into_response(),
    }
}

fn user_of(query: &FilesQuery) -> Result<SandboxUser, ApiError> {
    SandboxUser::parse(query.username.as_deref())
        .map_err(|m| ApiError::new(StatusCode::UNAUTHORIZED, m))
}

fn content_type_for(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "md" => "text/plain; charset=utf-8",
        "json" => "application/json",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "py" => "text/x-python; charset=utf-8",
        "sh" => "text/x-sh; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "xml" => "text/xml; charset=utf-8",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

/// `GET /files?path=`: the file's bytes, streamed from disk, as envd's `http.ServeContent`
/// serves them: the length is the file's size when the request opens it (a file still
/// growing is served up to that size, exactly), and one `Range: bytes=…` is answered with
/// `206` and `Content-Range`, or `416` with `Content-Range: bytes */<size>` when it starts at
/// or past the end. (envd answers several ranges as `multipart/byteranges`; here they are
/// ignored and the whole file served, which RFC 9110 also allows.)
pub(crate) async fn download(ctx: Ctx, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    if !authorized(&ctx, request.headers(), &query, "read") {
        return unauthorized();
    }
    if let Err(error) = user_of(&query) {
        return error.into_response();
    }
    let requested = query.path.clone().unwrap_or_default();
    let fs = SandboxFs {
        home: &ctx.sandbox.home,
        tmp: &ctx.sandbox.tmp,
        virt_home: ctx.sandbox.virt_home,
    };
    let resolved = match fs.resolve(&requested, Last::Follow) {
        Ok(resolved) => resolved,
        Err(error) => return path_error(&error),
    };
    let meta = match tokio::fs::metadata(&resolved.host).await {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", resolved.virt),
            )
            .into_response();
        }
        Err(e) => {
            return ApiError::internal(format!("error reading '{}': {e}", resolved.virt))
                .into_response();
        }
    };
    if meta.is_dir() {
        return ApiError::bad_request(format!("path '{}' is a directory", resolved.virt))
            .into_response();
    }
    let mut file = match open_read(&resolved.host).await {
        Ok(file) => file,
        Err(e) => {
            return ApiError::internal(format!("error opening '{}': {e}", resolved.virt))
                .into_response();
        }
    };
    // The size of the file as opened (envd seeks to its end): what a growing file has now.
    let size = match file.metadata().await {
        Ok(meta) => meta.len(),
        Err(e) => {
            return ApiError::internal(format!("error reading '{}': {e}", resolved.virt))
                .into_response();
        }
    };
    let range = match request.headers().get(http::header::RANGE) {
        None => None,
        Some(value) => match byte_range(value.to_str().unwrap_or_default(), size) {
            Ok(range) => range,
            Err(refused) => return range_not_satisfiable(&refused, size),
        },
    };
    let (status, start, length) = match range {
        Some((start, length)) => (StatusCode::PARTIAL_CONTENT, start, length),
        None => (StatusCode::OK, 0, size),
    };
    if start > 0
        && let Err(e) = tokio::io::AsyncSeekExt::seek(&mut file, io::SeekFrom::Start(start)).await
    {
        return ApiError::internal(format!("error reading '{}': {e}", resolved.virt))
            .into_response();
    }
    let name = resolved
        .virt
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    // Exactly `length` bytes, whatever the file grows to meanwhile (envd's `io.CopyN`).
    let body = tokio::io::AsyncReadExt::take(file, length);
    let stream = tokio_util::io::ReaderStream::with_capacity(body, READ_CHUNK);
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(length));
    headers.insert(
        http::header::ACCEPT_RANGES,
        HeaderValue::from_static("bytes"),
    );
    if status == StatusCode::PARTIAL_CONTENT {
        let last = start + length - 1;
        if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{last}/{size}")) {
            headers.insert(http::header::CONTENT_RANGE, value);
        }
    }
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type_for(&name)),
    );
    if let Ok(value) = HeaderValue::from_str(&content_disposition(&name)) {
        headers.insert(http::header::CONTENT_DISPOSITION, value);
    }
    response
}

/// Why a `Range` header cannot be served (Go's `http.ServeContent` words).
#[derive(Debug, PartialEq, Eq)]
enum RangeRefused {
    /// Not a range envd parses.
    Invalid,
    /// It starts at or past the end of the file.
    NoOverlap,
}

/// The one range of a `Range: bytes=…` header as (start, length) within a file of `size`
/// bytes, as Go's `parseRange` reads it: `a-b` (the end clamped to the file), `a-`, `-n` (the
/// last n bytes). `None`: serve the whole file (several ranges). A start at or past the end,
/// an empty suffix, or bad syntax is refused (`416`).
fn byte_range(header: &str, size: u64) -> Result<Option<(u64, u64)>, RangeRefused> {
    let Some(spec) = header.strip_prefix("bytes=") else {
        return Err(RangeRefused::Invalid);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Err(RangeRefused::Invalid);
    };
    let (first, last) = (first.trim(), last.trim());
    let number = |text: &str| {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RangeRefused::Invalid);
        }
        text.parse::<u64>().map_err(|_| RangeRefused::Invalid)
    };
    if first.is_empty() {
        let suffix = number(last)?.min(size);
        if suffix == 0 {
            return Err(RangeRefused::NoOverlap);
        }
        return Ok(Some((size - suffix, suffix)));
    }
    let start = number(first)?;
    if start >= size {
        return Err(RangeRefused::NoOverlap);
    }
    let end = if last.is_empty() {
        size - 1
    } else {
        let end = number(last)?;
        if end < start {
            return Err(RangeRefused::Invalid);
        }
        end.min(size - 1)
    };
    Ok(Some((start, end - start + 1)))
}

/// `416 Range Not Satisfiable` as envd answers it: with the file's current size when the
/// range starts past its end.
fn range_not_satisfiable(refused: &RangeRefused, size: u64) -> Response {
    let reason = match refused {
        RangeRefused::Invalid => "invalid range",
        RangeRefused::NoOverlap => "invalid range: failed to overlap",
    };
    let mut response = Response::new(Body::from(format!("{reason}\n")));
    *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if *refused == RangeRefused::NoOverlap
        && let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}"))
    {
        headers.insert(http::header::CONTENT_RANGE, value);
    }
    response
}

/// `inline` with the file's name as RFC 6266 has it: a token as is (what envd sends),
/// other ASCII quoted, and a non-ASCII name as RFC 8187 `filename*=UTF-8''…` after an
/// ASCII `filename=` fallback for clients that do not read `filename*`.
fn content_disposition(name: &str) -> String {
    use std::fmt::Write;
    let is_token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b);
    if !name.is_empty() && name.bytes().all(is_token_char) {
        return format!("inline; filename={name}");
    }
    let quoted = |text: &str| {
        let mut out = String::with_capacity(text.len() + 2);
        out.push('"');
        for c in text.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                c if c.is_ascii_control() => out.push('_'),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    };
    if name.is_ascii() {
        return format!("inline; filename={}", quoted(name));
    }
    let fallback: String = name
        .chars()
        .map(|c| if c.is_ascii() { c } else { '_' })
        .collect();
    let mut encoded = String::new();
    for b in name.bytes() {
        // RFC 8187 attr-char: ALPHA / DIGIT / "!#$&+-.^_`|~"; everything else %XX.
        if is_token_char(b) {
            encoded.push(char::from(b));
        } else {
            let _ = write!(encoded, "%{b:02X}");
        }
    }
    format!(
        "inline; filename={}; filename*=UTF-8''{encoded}",
        quoted(&fallback)
    )
}

async fn open_read(path: &std::path::Path) -> io::Result<tokio::fs::File> {
    let mut options = tokio::fs::OpenOptions::new();
    options.read(true).custom_flags(libc::O_NOFOLLOW);
    options.open(path).await
}

/// `POST /files`: multipart (many files) or octet-stream (one file, `?path=`).
pub(crate) async fn upload(ctx: Ctx, request: Request) -> Response {
    let query = parse_query(request.uri().query());
    if !authorized(&ctx, request.headers(), &query, "write") {
        return unauthorized();
    }
    let user = match user_of(&query) {
        Ok(user) => user,
        Err(error) => {
            return error.into_response();
        }
    };
    let headers = request.headers().clone();
    let metadata = upload_metadata(&headers);
    let result = match upload_kind(&headers, &query) {
        Ok(UploadKind::Multipart(boundary)) => {
            upload_multipart(&ctx, user, &query, boundary, request).await
        }
        Ok(UploadKind::Octet(path)) => {
            let body = request.into_body().into_data_stream();
            write_one(&ctx, user, &path, body)
                .await
                .map(|entry| vec![entry])
        }
        Err(error) => Err(error),
    };
    match result {
        Ok(mut entries) => {
            if !metadata.is_empty() {
                for entry in &mut entries {
                    entry["metadata"] = json!(metadata);
                }
            }
            json_response(StatusCode::OK, &Value::Array(entries))
        }
        Err(error) => error.into_response(),
    }
}

/// How an upload body is encoded.
#[derive(Debug)]
enum UploadKind {
    Multipart(String),
    Octet(String),
}

fn upload_kind(headers: &HeaderMap, query: &FilesQuery) -> Result<UploadKind, ApiError> {
    if headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return Err(ApiError::bad_request(
            "compressed uploads are not supported by e2b-local",
        ));
    }
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

/// `X-Metadata-<Key>: value` headers, keys lowercased (accepted, echoed, not stored).
fn upload_metadata(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("x-metadata-")?;
            Some((key.to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

async fn upload_multipart(
    ctx: &Ctx,
    user: SandboxUser,
    query: &FilesQuery,
    boundary: String,
    request: Request,
) -> Result<Vec<Value>, ApiError> {
    let mut multipart = multer::Multipart::new(request.into_body().into_data_stream(), boundary);
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
        let target = match (&query.path, field.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => {
                return Err(ApiError::bad_request(
                    "multipart part has no filename and no path was given",
                ));
            }
        };
        let resolved = resolve_for_write(ctx, &target)?;
        if !seen.insert(resolved.host.clone()) {
            return Err(ApiError::bad_request(format!(
                "cannot upload multiple files to the same path '{}'",
                resolved.virt
            )));
        }
        entries.push(write_resolved(ctx, user, &resolved, field).await?);
    }
    if entries.is_empty() {
        return Err(ApiError::bad_request("no file parts in the multipart body"));
    }
    Ok(entries)
}

fn resolve_for_write(ctx: &Ctx, target: &str) -> Result<Resolved, ApiError> {
    let fs = SandboxFs {
        home: &ctx.sandbox.home,
        tmp: &ctx.sandbox.tmp,
        virt_home: ctx.sandbox.virt_home,
    };
    fs.resolve(target, Last::Follow).map_err(|e| match e {
        PathError::Outside(_) => ApiError::new(StatusCode::FORBIDDEN, e.message()),
        PathError::Invalid(_) => ApiError::bad_request(e.message()),
    })
}

async fn write_one<S, E>(
    ctx: &Ctx,
    user: SandboxUser,
    target: &str,
    body: S,
) -> Result<Value, ApiError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let resolved = resolve_for_write(ctx, target)?;
    write_resolved(ctx, user, &resolved, body).await
}

/// Streams `body` into the resolved file: parents created, file truncated, owned by `user`.
async fn write_resolved<S, E>(
    ctx: &Ctx,
    user: SandboxUser,
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
    let owner = ctx.app.isolation.owner(user);
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
    let name = virt.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(json!({"path": virt, "name": name, "type": "file"}))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_escapes_like_rfc_6266() {
        assert_eq!(content_disposition("a.txt"), "inline; filename=a.txt");
        assert_eq!(
            content_disposition("my \"file\".txt"),
            "inline; filename=\"my \\\"file\\\".txt\""
        );
        assert_eq!(
            content_disposition("résumé 1.txt"),
            "inline; filename=\"r_sum_ 1.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.txt"
        );
    }

    #[test]
    fn byte_ranges_read_as_go_parse_range_reads_them() {
        assert_eq!(byte_range("bytes=0-", 10), Ok(Some((0, 10))));
        assert_eq!(byte_range("bytes=4-", 10), Ok(Some((4, 6))));
        assert_eq!(byte_range("bytes=2-5", 10), Ok(Some((2, 4))));
        // The end is clamped to the file; a suffix longer than the file is the whole file.
        assert_eq!(byte_range("bytes=8-100", 10), Ok(Some((8, 2))));
        assert_eq!(byte_range("bytes=-3", 10), Ok(Some((7, 3))));
        assert_eq!(byte_range("bytes=-30", 10), Ok(Some((0, 10))));
        assert_eq!(byte_range("bytes= 1 - 2 ", 10), Ok(Some((1, 2))));
        // At or past the end: no overlap (a growing file has not reached it yet).
        assert_eq!(byte_range("bytes=10-", 10), Err(RangeRefused::NoOverlap));
        assert_eq!(byte_range("bytes=0-", 0), Err(RangeRefused::NoOverlap));
        for bad in [
            "items=0-1",
            "bytes=5-2",
            "bytes=a-",
            "bytes=-",
            "bytes=1",
            "bytes=--1",
        ] {
            assert_eq!(byte_range(bad, 10), Err(RangeRefused::Invalid), "{bad}");
        }
        assert_eq!(byte_range("bytes=0-1,4-5", 10), Ok(None));
    }

    #[test]
    fn signature_matches_sdk_formula() {
        // sha256("/a:read::tok") in unpadded standard base64, prefixed "v1_".
        let sig = signature("/a", "read", "", "tok", None);
        let expected = format!(
            "v1_{}",
            STANDARD_NO_PAD.encode(Sha256::digest(b"/a:read::tok"))
        );
        assert_eq!(sig, expected);
        assert_ne!(sig, signature("/a", "write", "", "tok", None));
        assert_ne!(sig, signature("/a", "read", "", "tok", Some("10")));
    }
}
