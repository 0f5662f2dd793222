//! Filesystem types: entries, uploads, capped downloads.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Deserializer};

use crate::error::{Error, TransportStage};
use crate::http::Ctx;
use crate::json;

/// What kind of filesystem entry something is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// Anything else, as sent.
    Other(String),
}

impl<'de> Deserialize<'de> for FileType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<FileType, D::Error> {
        // Proto JSON uses enum names or numbers; `/files` uses lowercase words.
        let raw = serde_json::Value::deserialize(deserializer)?;
        Ok(match &raw {
            serde_json::Value::String(name) => match name.as_str() {
                "FILE_TYPE_FILE" | "file" => FileType::File,
                "FILE_TYPE_DIRECTORY" | "dir" | "directory" => FileType::Directory,
                "FILE_TYPE_SYMLINK" | "symlink" => FileType::Symlink,
                _ => FileType::Other(name.clone()),
            },
            serde_json::Value::Number(number) => match number.as_u64() {
                Some(1) => FileType::File,
                Some(2) => FileType::Directory,
                Some(3) => FileType::Symlink,
                _ => FileType::Other(number.to_string()),
            },
            other => FileType::Other(other.to_string()),
        })
    }
}

/// A filesystem entry as envd reports it. Names and paths come from the sandbox: treat them as
/// untrusted input.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The last path component.
    #[serde(default)]
    pub name: String,
    /// File, directory or symlink.
    #[serde(rename = "type", default = "unspecified")]
    pub kind: FileType,
    /// The absolute path.
    #[serde(default)]
    pub path: String,
    /// Size in bytes.
    #[serde(default, deserialize_with = "json::int")]
    pub size: u64,
    /// Unix mode bits.
    #[serde(default, deserialize_with = "json::int")]
    pub mode: u32,
    /// `ls`-style permissions (`-rw-r--r--`).
    #[serde(default)]
    pub permissions: String,
    /// Owner name.
    #[serde(default)]
    pub owner: String,
    /// Group name.
    #[serde(default)]
    pub group: String,
    /// Last modification.
    #[serde(
        rename = "modifiedTime",
        alias = "modified_time",
        default,
        deserialize_with = "json::opt_rfc3339"
    )]
    pub modified_time: Option<time::OffsetDateTime>,
    /// Set for a symlink: where it leads, resolved to the final path as envd resolves it
    /// (the link's own path when it dangles). `kind` and `mode` are then the target's (no
    /// type for a dangling link); `permissions` are the link's own (`Lrwxrwxrwx`).
    #[serde(rename = "symlinkTarget", alias = "symlink_target", default)]
    pub symlink_target: Option<String>,
    /// Set by envd builds that flag a link here besides `symlink_target` (current envd
    /// does not: read `symlink_target`).
    #[serde(rename = "isSymlink", alias = "is_symlink", default)]
    pub is_symlink: bool,
    /// The file's user-defined metadata (its `user.e2b.*` extended attributes), empty when
    /// none or before envd 0.6.2.
    #[serde(default, deserialize_with = "json::null_default")]
    pub metadata: BTreeMap<String, String>,
}

fn unspecified() -> FileType {
    FileType::Other("FILE_TYPE_UNSPECIFIED".to_owned())
}

/// One file written by an upload, as envd reports it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct WrittenFile {
    /// The absolute path written.
    #[serde(default)]
    pub path: String,
    /// The last path component.
    #[serde(default)]
    pub name: String,
    /// Normally [`FileType::File`].
    #[serde(rename = "type", default = "unspecified")]
    pub kind: FileType,
    /// The metadata the file now has, as envd read it back (empty when none was stored).
    #[serde(default, deserialize_with = "json::null_default")]
    pub metadata: BTreeMap<String, String>,
}

/// The result of [`crate::Sandbox::make_dir`].
#[derive(Clone, Debug)]
// One value per MakeDir call: boxing the entry would change the public variant for nothing.
#[allow(clippy::large_enum_variant)]
pub enum MakeDirOutcome {
    /// Created (with any missing parents).
    Created(EntryInfo),
    /// A directory was already there (Connect `already_exists`).
    AlreadyExists,
}

/// A file for [`crate::Sandbox::write_files`]: its destination and its content.
#[derive(Debug)]
pub struct UploadFile {
    /// The destination, absolute or relative to the user's home; parents are created.
    pub path: String,
    /// The content.
    pub data: UploadData,
}

impl UploadFile {
    /// A file whose content is in memory.
    pub fn bytes(path: String, data: Bytes) -> UploadFile {
        UploadFile {
            path,
            data: UploadData::Bytes(data),
        }
    }

    /// A file whose content is streamed (never held whole in memory).
    pub fn stream(
        path: String,
        data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    ) -> UploadFile {
        UploadFile {
            path,
            data: UploadData::Stream(data.boxed()),
        }
    }
}

/// An upload's content.
pub enum UploadData {
    /// In memory; the request can be retried.
    Bytes(Bytes),
    /// Streamed; the request is sent once (a stream cannot be replayed).
    Stream(BoxStream<'static, io::Result<Bytes>>),
}

impl fmt::Debug for UploadData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UploadData::Bytes(bytes) => write!(f, "Bytes({} bytes)", bytes.len()),
            UploadData::Stream(_) => f.write_str("Stream(..)"),
        }
    }
}

/// Why a path cannot be a multipart filename, if it cannot.
pub(crate) fn multipart_filename_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("the path is empty");
    }
    // Quotes and backslashes are escaped differently by every multipart parser, and line
    // breaks would end the header: refuse rather than guess.
    if path.contains(['"', '\\']) {
        return Some("the path contains a quote or backslash (use write_file for it)");
    }
    if path.chars().any(char::is_control) {
        return Some("the path contains a control character");
    }
    None
}

/// A multipart/form-data body: one `file` part per upload, the filename being its path.
pub(crate) struct Multipart {
    /// The body, either all in memory (replayable) or streamed.
    pub(crate) body: UploadData,
    /// The `Content-Type` header value with the boundary.
    pub(crate) content_type: String,
}

/// Builds the multipart body; paths must have passed [`multipart_filename_problem`].
pub(crate) fn multipart(files: Vec<UploadFile>) -> Multipart {
    let boundary = format!("e2b-client-{:032x}", rand::random::<u128>());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let header = |path: &str| {
        Bytes::from(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        ))
    };
    let closing = Bytes::from(format!("--{boundary}--\r\n"));
    let crlf = Bytes::from_static(b"\r\n");
    let all_in_memory = files
        .iter()
        .all(|file| matches!(file.data, UploadData::Bytes(_)));
    if all_in_memory {
        let mut out = BytesMut::new();
        for file in files {
            out.extend_from_slice(&header(&file.path));
            if let UploadData::Bytes(data) = file.data {
                out.extend_from_slice(&data);
            }
            out.extend_from_slice(&crlf);
        }
        out.extend_from_slice(&closing);
        return Multipart {
            body: UploadData::Bytes(out.freeze()),
            content_type,
        };
    }
    let parts: Vec<BoxStream<'static, io::Result<Bytes>>> = files
        .into_iter()
        .map(|file| {
            let head = stream::iter([Ok(header(&file.path))]);
            let tail = stream::iter([Ok(crlf.clone())]);
            let data = match file.data {
                UploadData::Bytes(data) => stream::iter([Ok(data)]).boxed(),
                UploadData::Stream(data) => data,
            };
            head.chain(data).chain(tail).boxed()
        })
        .collect();
    let body = stream::iter(parts)
        .flatten()
        .chain(stream::iter([Ok(closing)]));
    Multipart {
        body: UploadData::Stream(body.boxed()),
        content_type,
    }
}

/// A range of a file ([`crate::Sandbox::read_file_range`]): its bytes as a [`Download`], and
/// the file's size when the server opened it.
#[derive(Debug)]
#[non_exhaustive]
pub struct FileRange {
    /// The bytes of the range, refused past the length the server announced.
    pub download: Download,
    /// The file's size when the server answered (a file still being written grows past it).
    pub file_size: u64,
}

/// A file's bytes as they arrive, refused the moment they exceed the cap.
///
/// A `Content-Length` above the cap fails before any byte is read; otherwise bytes are
/// counted as they arrive and the chunk that crosses the cap is not delivered: the stream
/// yields [`Error::LimitExceeded`] and ends, closing the connection. The server's declared
/// length is never trusted.
pub struct Download {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, Error>> + Send>>,
    content_length: Option<u64>,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download")
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

impl Download {
    pub(crate) fn new(
        ctx: Ctx,
        path: String,
        body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
        content_length: Option<u64>,
        limit: u64,
        idle: Duration,
    ) -> Download {
        let transport = ctx.clone();
        let body =
            body.map(move |item| item.map_err(|e| transport.transport(TransportStage::Body, e)));
        Download::from_results(ctx, path, body, content_length, limit, idle)
    }

    /// The download of `response`'s body, refused at once when its announced length is
    /// past `limit`.
    pub(crate) fn checked(
        ctx: Ctx,
        path: &str,
        response: reqwest::Response,
        limit: u64,
        idle: Duration,
    ) -> Result<Download, Error> {
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
            idle,
        ))
    }

    /// A download whose body errors are already the crate's (a decoded body).
    pub(crate) fn from_results(
        ctx: Ctx,
        path: String,
        body: impl Stream<Item = Result<Bytes, Error>> + Send + 'static,
        content_length: Option<u64>,
        limit: u64,
        idle: Duration,
    ) -> Download {
        struct State<B> {
            body: Pin<Box<B>>,
            ctx: Ctx,
            path: String,
            received: u64,
            limit: u64,
            idle: Duration,
            finished: bool,
        }
        let state = State {
            body: Box::pin(body),
            ctx,
            path,
            received: 0,
            limit,
            idle,
            finished: false,
        };
        let inner = stream::unfold(state, |mut state| async move {
            if state.finished {
                return None;
            }
            let item = match tokio::time::timeout(state.idle, state.body.next()).await {
                Err(_) => Err(state.ctx.deadline(state.idle)),
                Ok(None) => return None,
                Ok(Some(Err(error))) => Err(error),
                Ok(Some(Ok(chunk))) => {
                    state.received = state
                        .received
                        .saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
                    if state.received > state.limit {
                        Err(state.ctx.limit(Some(&state.path), state.limit))
                    } else {
                        Ok(chunk)
                    }
                }
            };
            state.finished = item.is_err();
            Some((item, state))
        });
        Download {
            inner: Box::pin(inner),
            content_length,
        }
    }

    /// The length the server announced, if any (untrusted; the cap is enforced regardless).
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// Reads the whole file into memory (still capped).
    pub async fn bytes(mut self) -> Result<Bytes, Error> {
        let mut out = BytesMut::new();
        while let Some(chunk) = self.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out.freeze())
    }
}

impl Stream for Download {
    type Item = Result<Bytes, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Operation;
    use crate::http::Target;
    use crate::ids::SandboxId;
    use crate::secret::ApiKey;

    fn ctx() -> Ctx {
        Ctx::new(
            Operation::Download,
            Target::Envd(SandboxId::parse("isbx".to_owned()).expect("valid")),
            ApiKey::new("e2b_key_for_tests_000".to_owned()),
            None,
        )
    }

    #[test]
    fn entry_info_variants() {
        let entry: EntryInfo = serde_json::from_str(
            r#"{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"3",
                "mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user",
                "modifiedTime":"2026-01-01T00:00:00Z","unknown":{"nested":true}}"#,
        )
        .expect("camelCase");
        assert_eq!(entry.kind, FileType::File);
        assert_eq!((entry.size, entry.mode), (3, 420));
        assert!(entry.modified_time.is_some());
        let entry: EntryInfo = serde_json::from_str(
            r#"{"name":"l","type":2,"path":"/l","size":10,"symlink_target":"/x","is_symlink":true,"modified_time":null}"#,
        )
        .expect("snake_case");
        assert_eq!(entry.kind, FileType::Directory);
        assert!(entry.is_symlink);
        assert_eq!(entry.symlink_target.as_deref(), Some("/x"));
        let entry: EntryInfo =
            serde_json::from_str(r#"{"type":"FILE_TYPE_WHATEVER"}"#).expect("unknown type");
        assert_eq!(entry.kind, FileType::Other("FILE_TYPE_WHATEVER".to_owned()));
        let written: Vec<WrittenFile> =
            serde_json::from_str(r#"[{"path":"/home/user/a/b.txt","name":"b.txt","type":"file"}]"#)
                .expect("upload reply");
        assert_eq!(written[0].kind, FileType::File);
    }

    #[test]
    fn filenames_that_multipart_cannot_carry() {
        assert!(multipart_filename_problem("/home/user/a b/é.txt").is_none());
        assert!(multipart_filename_problem("rel/x").is_none());
        for bad in ["", "a\"b", "a\\b", "a\r\nb", "a\0b"] {
            assert!(multipart_filename_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn download_refuses_the_chunk_that_crosses_the_cap() {
        let chunks = (0..10).map(|_| Ok(Bytes::from(vec![7u8; 100])));
        let consumed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = consumed.clone();
        let body = stream::iter(chunks).inspect(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let mut download = Download::new(
            ctx(),
            "/big".to_owned(),
            body,
            None,
            250,
            Duration::from_secs(5),
        );
        let mut delivered = 0;
        let error = loop {
            match download.next().await.expect("an item") {
                Ok(chunk) => delivered += chunk.len(),
                Err(error) => break error,
            }
        };
        assert!(error.is_limit_exceeded());
        assert!(error.to_string().contains("'/big'"), "{error}");
        assert_eq!(delivered, 200);
        // The third chunk crossed the cap; nothing more was read from the body.
        assert_eq!(consumed.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(download.next().await.is_none());
    }

    #[tokio::test]
    async fn multipart_body_layout() {
        let files = vec![
            UploadFile::bytes("/home/user/a/b.txt".to_owned(), Bytes::from_static(b"x")),
            UploadFile::bytes("rel.txt".to_owned(), Bytes::from_static(b"yz")),
        ];
        let multipart = multipart(files);
        let boundary = multipart
            .content_type
            .strip_prefix("multipart/form-data; boundary=")
            .expect("boundary")
            .to_owned();
        let UploadData::Bytes(body) = multipart.body else {
            panic!("in memory")
        };
        let body = body.to_vec();
        let text = String::from_utf8(body).expect("utf-8");
        assert_eq!(
            text,
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nx\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nyz\r\n--{boundary}--\r\n"
            )
        );
    }
}
