//! envd's `/files` endpoint: multipart and streamed uploads, capped downloads.

use std::io;

use bytes::Bytes;
use futures::Stream;
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use reqwest::header::{ACCEPT_ENCODING, CONTENT_TYPE};

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::files::{Download, UploadFile, WrittenFile, multipart, multipart_filename_problem};
use crate::http::{Ctx, Pool, UNRESERVED};
use crate::retry::Idempotency;

impl Sandbox {
    /// Uploads many files in one `multipart/form-data` request to `/files`, each part's filename
    /// being its destination path; envd creates parent directories and overwrites files.
    /// Retried like any idempotent request when every file is in memory; sent once when any is
    /// a stream.
    pub async fn write_files(&self, files: Vec<UploadFile>) -> Result<Vec<WrittenFile>, Error> {
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
        let body = multipart(files);
        let query = self.user_query(None);
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, body.content_type)
            .body(body.body);
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
        self.write_octets(path, reqwest::Body::from(data)).await
    }

    /// Streams one file as `application/octet-stream` to `/files?path=…`, never holding it whole;
    /// sent once (a stream cannot be replayed).
    pub async fn write_file_stream(
        &self,
        path: &str,
        data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    ) -> Result<WrittenFile, Error> {
        self.write_octets(path, reqwest::Body::wrap_stream(data))
            .await
    }

    async fn write_octets(&self, path: &str, body: reqwest::Body) -> Result<WrittenFile, Error> {
        let ctx = self.ctx(Operation::Upload);
        if path.is_empty() {
            return Err(ctx.invalid_input("the path is empty"));
        }
        let query = self.user_query(Some(path));
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(body);
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
        let request = Self::build(ctx, builder)?;
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
        let ctx = self.ctx(Operation::Download);
        let http = &self.http;
        let query = self.user_query(Some(path));
        let builder = self
            .request(&ctx, Pool::Http1, Method::GET, &format!("/files{query}"))?
            .header(ACCEPT_ENCODING, "identity");
        let request = Self::build(&ctx, builder)?;
        let deadline = http.deadline_from_now();
        let response = http
            .send(
                &ctx,
                Pool::Http1,
                request,
                Idempotency::Idempotent,
                deadline,
            )
            .await?;
        let content_length = response.content_length();
        if content_length.is_some_and(|len| len > limit) {
            return Err(ctx.limit(Some(path), limit));
        }
        Ok(Download::new(
            ctx,
            path.to_owned(),
            response.bytes_stream(),
            content_length,
            limit,
            http.deadline,
        ))
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
