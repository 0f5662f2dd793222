//! envd's `/files` endpoint: multipart and streamed uploads, capped downloads, either
//! gzip-coded on request, uploads with metadata.

use std::io;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use reqwest::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_RANGE, CONTENT_TYPE, RANGE};

use super::Sandbox;
use crate::coding::{
    ContentCoding, WriteOptions, gunzip_body, gzip_bytes, gzip_stream, metadata_headers,
};
use crate::error::{Error, Operation};
use crate::files::{
    Download, FileRange, UploadData, UploadFile, WrittenFile, multipart, multipart_filename_problem,
};
use crate::http::{Ctx, Pool, UNRESERVED};
use crate::retry::Idempotency;

impl Sandbox {
    /// Uploads many files in one `multipart/form-data` request to `/files`, each part's filename
    /// being its destination path; envd creates parent directories and overwrites files.
    /// Retried like any idempotent request when every file is in memory; sent once when any is
    /// a stream.
    pub async fn write_files(&self, files: Vec<UploadFile>) -> Result<Vec<WrittenFile>, Error> {
        self.write_files_with(files, &WriteOptions::new(ContentCoding::Identity))
            .await
    }

    /// [`Sandbox::write_files`] with a coding for the whole body and metadata stored with
    /// every file.
    pub async fn write_files_with(
        &self,
        files: Vec<UploadFile>,
        options: &WriteOptions,
    ) -> Result<Vec<WrittenFile>, Error> {
        let ctx = self.ctx(Operation::Upload);
        if files.is_empty() {
            return Ok(Vec::new());
        }
        for file in &files {
            if let Some(problem) = multipart_filename_problem(&file.path) {
                return Err(ctx.invalid_input(format!("cannot upload '{}': {problem}", file.path)));
            }
        }
        let expected = files.len();
        let multipart = multipart(files);
        let query = self.user_query(None);
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, multipart.content_type);
        let builder = with_options(&ctx, builder, options)?
            .body(coded_body(&ctx, multipart.body, options.coding).await?);
        let written = self.send_upload(&ctx, builder).await?;
        if written.len() != expected {
            return Err(ctx.protocol(format!(
                "uploaded {expected} files but the server reported {}",
                written.len()
            )));
        }
        Ok(written)
    }

    /// Uploads one file from memory as `application/octet-stream` to `/files?path=…`.
    pub async fn write_file(&self, path: &str, data: Bytes) -> Result<WrittenFile, Error> {
        self.write_file_with(path, data, &WriteOptions::new(ContentCoding::Identity))
            .await
    }

    /// [`Sandbox::write_file`] with a coding (gzip is compressed in memory, so the request
    /// can still be retried) and metadata.
    pub async fn write_file_with(
        &self,
        path: &str,
        data: Bytes,
        options: &WriteOptions,
    ) -> Result<WrittenFile, Error> {
        self.write_octets(path, UploadData::Bytes(data), options)
            .await
    }

    /// Streams one file as `application/octet-stream` to `/files?path=…`, never holding it whole;
    /// sent once (a stream cannot be replayed).
    pub async fn write_file_stream(
        &self,
        path: &str,
        data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    ) -> Result<WrittenFile, Error> {
        self.write_file_stream_with(path, data, &WriteOptions::new(ContentCoding::Identity))
            .await
    }

    /// [`Sandbox::write_file_stream`] with a coding (gzip compresses as the stream is read:
    /// memory stays bounded) and metadata.
    pub async fn write_file_stream_with(
        &self,
        path: &str,
        data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
        options: &WriteOptions,
    ) -> Result<WrittenFile, Error> {
        self.write_octets(path, UploadData::Stream(data.boxed()), options)
            .await
    }

    async fn write_octets(
        &self,
        path: &str,
        data: UploadData,
        options: &WriteOptions,
    ) -> Result<WrittenFile, Error> {
        let ctx = self.ctx(Operation::Upload);
        if path.is_empty() {
            return Err(ctx.invalid_input("the path is empty"));
        }
        let query = self.user_query(Some(path));
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, "application/octet-stream");
        let builder = with_options(&ctx, builder, options)?
            .body(coded_body(&ctx, data, options.coding).await?);
        let mut written = self.send_upload(&ctx, builder).await?;
        match written.len() {
            1 => Ok(written.remove(0)),
            n => Err(ctx.protocol(format!("uploaded 1 file but the server reported {n}"))),
        }
    }

    async fn send_upload(
        &self,
        ctx: &Ctx,
        builder: reqwest::RequestBuilder,
    ) -> Result<Vec<WrittenFile>, Error> {
        let http = &self.http;
        let request = ctx.build(builder)?;
        let deadline = http.deadline_from_now();
        let response = http
            .send(
                ctx,
                Pool::Default,
                request,
                Idempotency::Idempotent,
                deadline,
            )
            .await?;
        http.read_json(ctx, response, deadline).await
    }

    /// Downloads a file (`GET /files?path=…`) as a byte stream refused the moment it exceeds
    /// `limit` bytes. Uses HTTP/1.1 like the official SDK (E2B's proxy pads downloads with empty
    /// HTTP/2 frames). A missing file is an error with [`Error::is_not_found`].
    pub async fn read_file_stream(&self, path: &str, limit: u64) -> Result<Download, Error> {
        self.read_file_stream_with(path, limit, ContentCoding::Identity)
            .await
    }

    /// [`Sandbox::read_file_stream`] asking for a coding: with [`ContentCoding::Gzip`] the
    /// file travels compressed and is decompressed as it arrives, `limit` counting the
    /// decompressed bytes (a server that answers uncompressed is read as is).
    pub async fn read_file_stream_with(
        &self,
        path: &str,
        limit: u64,
        coding: ContentCoding,
    ) -> Result<Download, Error> {
        let ctx = self.ctx(Operation::Download);
        let http = &self.http;
        let response = self.send_download(&ctx, path, None, coding).await?;
        let sent_coding = response
            .headers()
            .get(CONTENT_ENCODING)
            .map(|value| value.to_str().unwrap_or("?").to_ascii_lowercase());
        match sent_coding.as_deref() {
            None | Some("identity") => {}
            Some("gzip") if coding == ContentCoding::Gzip => {
                let body = gunzip_body(ctx.clone(), response.bytes_stream());
                return Ok(Download::from_results(
                    ctx,
                    path.to_owned(),
                    body,
                    None,
                    limit,
                    http.deadline,
                ));
            }
            Some(other) => {
                return Err(ctx.protocol(format!(
                    "the download came with Content-Encoding '{other}', which was not asked for"
                )));
            }
        }
        Download::checked(ctx, path, response, limit, http.deadline)
    }

    /// Sends `GET /files` for `path` (on the HTTP/1.1 pool) asking for `coding`, for bytes
    /// `start..=end` when a range is given.
    async fn send_download(
        &self,
        ctx: &Ctx,
        path: &str,
        range: Option<(u64, u64)>,
        coding: ContentCoding,
    ) -> Result<reqwest::Response, Error> {
        let query = self.user_query(Some(path));
        let accept = match coding {
            ContentCoding::Identity => "identity",
            ContentCoding::Gzip => "gzip",
        };
        let mut builder = self
            .request(ctx, Pool::Http1, Method::GET, &format!("/files{query}"))?
            .header(ACCEPT_ENCODING, accept);
        if let Some((start, end)) = range {
            builder = builder.header(RANGE, format!("bytes={start}-{end}"));
        }
        let request = ctx.build(builder)?;
        let deadline = self.http.deadline_from_now();
        self.http
            .send(ctx, Pool::Http1, request, Idempotency::Idempotent, deadline)
            .await
    }

    /// Downloads bytes `start..=end` of a file (`GET /files` with `Range: bytes=start-end`),
    /// the end clamped to the file's size when envd opens it: of a file still being written,
    /// what it holds by then, and its size then. `Ok(None)` when the file does not reach
    /// `start` yet (envd's `416`). The body is refused past the length the answer announced.
    /// A missing file is an error with [`Error::is_not_found`].
    pub async fn read_file_range(
        &self,
        path: &str,
        start: u64,
        end: u64,
    ) -> Result<Option<FileRange>, Error> {
        let ctx = self.ctx(Operation::Download);
        if end < start {
            return Err(ctx.invalid_input(format!("the range {start}-{end} is empty")));
        }
        let http = &self.http;
        let sent = self
            .send_download(&ctx, path, Some((start, end)), ContentCoding::Identity)
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.status() == Some(416) => return Ok(None),
            Err(error) => return Err(error),
        };
        if response.status().as_u16() != 206 {
            return Err(ctx.protocol(format!(
                "asked for bytes {start}-{end}, the server answered {} without a range",
                response.status().as_u16()
            )));
        }
        let announced = response
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_content_range);
        let Some((first, last, file_size)) = announced else {
            return Err(ctx.protocol("a partial answer without a valid Content-Range"));
        };
        if first != start || last > end || last >= file_size {
            return Err(ctx.protocol(format!(
                "asked for bytes {start}-{end}, the server sent {first}-{last} of {file_size}"
            )));
        }
        let length = last - first + 1;
        if response.content_length().is_some_and(|len| len != length) {
            return Err(ctx.protocol(format!(
                "the range {first}-{last} announced a body of {:?} bytes",
                response.content_length()
            )));
        }
        Ok(Some(FileRange {
            download: Download::new(
                ctx,
                path.to_owned(),
                response.bytes_stream(),
                Some(length),
                length,
                http.deadline,
            ),
            file_size,
        }))
    }

    /// Downloads a whole file into memory, capped at `limit` bytes.
    pub async fn read_file(&self, path: &str, limit: u64) -> Result<Bytes, Error> {
        self.read_file_stream(path, limit).await?.bytes().await
    }

    /// `?path=…&username=…` as the official SDK encodes them (or empty).
    fn user_query(&self, path: Option<&str>) -> String {
        let mut parts = Vec::new();
        if let Some(path) = path {
            parts.push(format!("path={}", utf8_percent_encode(path, UNRESERVED)));
        }
        if let Some(user) = &self.user {
            parts.push(format!(
                "username={}",
                utf8_percent_encode(user, UNRESERVED)
            ));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("?{}", parts.join("&"))
        }
    }
}

/// Adds the coding's `Content-Encoding` and the metadata headers to an upload.
fn with_options(
    ctx: &Ctx,
    mut builder: reqwest::RequestBuilder,
    options: &WriteOptions,
) -> Result<reqwest::RequestBuilder, Error> {
    if options.coding == ContentCoding::Gzip {
        builder = builder.header(CONTENT_ENCODING, "gzip");
    }
    for (name, value) in metadata_headers(ctx, &options.metadata)? {
        builder = builder.header(name, value);
    }
    Ok(builder)
}

/// The request body of an upload in its coding: in memory stays in memory (replayable),
/// a stream stays a stream.
async fn coded_body(
    ctx: &Ctx,
    data: UploadData,
    coding: ContentCoding,
) -> Result<reqwest::Body, Error> {
    Ok(match (data, coding) {
        (UploadData::Bytes(bytes), ContentCoding::Identity) => reqwest::Body::from(bytes),
        (UploadData::Bytes(bytes), ContentCoding::Gzip) => {
            reqwest::Body::from(gzip_bytes(ctx, &bytes).await?)
        }
        (UploadData::Stream(stream), ContentCoding::Identity) => reqwest::Body::wrap_stream(stream),
        (UploadData::Stream(stream), ContentCoding::Gzip) => {
            reqwest::Body::wrap_stream(gzip_stream(stream))
        }
    })
}

/// `bytes <first>-<last>/<size>` (a satisfied range; no `*` for an unknown size).
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let (range, size) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let number = |text: &str| {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        text.parse::<u64>().ok()
    };
    let (first, last, size) = (number(first)?, number(last)?, number(size)?);
    (first <= last).then_some((first, last, size))
}

#[cfg(test)]
mod tests {
    use super::parse_content_range;

    #[test]
    fn content_ranges_are_read_strictly() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, 10)));
        assert_eq!(parse_content_range("bytes 4-4/100"), Some((4, 4, 100)));
        for bad in [
            "bytes */10",
            "bytes 0-9/*",
            "bytes 5-4/10",
            "bytes 0-9",
            "items 0-9/10",
            "bytes +1-9/10",
            "bytes 0-9/10 ",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }
}
