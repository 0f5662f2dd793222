//! envd's `GET /files`: a file's bytes streamed from disk, identity (with one `Range`) or
//! gzip when the client accepts it.

use std::io;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use super::ctx::Ctx;
use super::encoding::{self, Coding};
use super::files::{path_error, user_of};
use super::signing::{self, FilesQuery, parse_query};
use crate::paths::{self, Last, PathError, Resolved};
use crate::reply::ApiError;

/// Buffer size for streaming a file out (bounded memory whatever the file size).
const READ_CHUNK: usize = 64 * 1024;

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
    let query: FilesQuery = parse_query(request.uri().query());
    if let Err(refused) = signing::authorize(&ctx, &request, &query) {
        return refused.into_response();
    }
    if let Err(error) = user_of(&query) {
        return error.into_response();
    }
    let requested = query.path.clone().unwrap_or_default();
    let fs = ctx.sandbox.fs();
    let resolved = match fs.resolve(&requested, Last::Follow) {
        Ok(resolved) => resolved,
        // The one file outside the sandbox's areas it serves: its own boot id.
        Err(PathError::Outside(virt)) if virt == paths::BOOT_ID => Resolved {
            host: ctx.sandbox.boot_id.clone(),
            area_root: ctx.sandbox.boot_id.clone(),
            virt,
        },
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
    let coding = match negotiate(request.headers()) {
        Ok(coding) => coding,
        Err(refused) => return refused.into_response(),
    };
    let mut file = match open_read(&resolved.host).await {
        Ok(file) => file,
        Err(e) => {
            return ApiError::internal(format!("error opening '{}': {e}", resolved.virt))
                .into_response();
        }
    };
    let name = resolved
        .virt
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    if coding == Coding::Gzip {
        return gzip_response(file, &name);
    }
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
    // Exactly `length` bytes, whatever the file grows to meanwhile (envd's `io.CopyN`).
    let body = tokio::io::AsyncReadExt::take(file, length);
    let stream = tokio_util::io::ReaderStream::with_capacity(body, READ_CHUNK);
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::VARY,
        HeaderValue::from_static("Accept-Encoding"),
    );
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

/// The coding of a download, as envd picks it: gzip when accepted, except for a `Range`
/// or conditional request, which is served as identity (or refused, 406, when identity is
/// not acceptable either).
fn negotiate(headers: &http::HeaderMap) -> Result<Coding, ApiError> {
    let refuse = |text: String| ApiError::new(StatusCode::NOT_ACCEPTABLE, text);
    let coding = encoding::accept_encoding(headers)
        .map_err(|text| refuse(format!("error parsing Accept-Encoding: {text}")))?;
    let ranged_or_conditional = [
        http::header::RANGE,
        http::header::IF_MODIFIED_SINCE,
        http::header::IF_NONE_MATCH,
        http::header::IF_RANGE,
    ]
    .iter()
    .any(|name| headers.contains_key(name));
    if !ranged_or_conditional {
        return Ok(coding);
    }
    if encoding::identity_acceptable(headers) {
        Ok(Coding::Identity)
    } else {
        Err(refuse(
            "identity encoding not acceptable for Range or conditional request".to_owned(),
        ))
    }
}

/// The whole file gzip-coded as it is read (to its end then, as envd's `io.Copy`): no
/// length, no ranges, memory bounded by the encoder's window and one read buffer.
fn gzip_response(file: tokio::fs::File, name: &str) -> Response {
    let reader = tokio::io::BufReader::with_capacity(READ_CHUNK, file);
    let encoder = async_compression::tokio::bufread::GzipEncoder::new(reader);
    let stream = tokio_util::io::ReaderStream::with_capacity(encoder, READ_CHUNK);
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        http::header::VARY,
        HeaderValue::from_static("Accept-Encoding"),
    );
    headers.insert(
        http::header::CONTENT_ENCODING,
        HeaderValue::from_static("gzip"),
    );
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type_for(name)),
    );
    if let Ok(value) = HeaderValue::from_str(&content_disposition(name)) {
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
}
