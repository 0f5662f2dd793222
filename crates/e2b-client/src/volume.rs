//! E2B volumes: persistent directories that outlive sandboxes. The control plane creates,
//! finds and deletes them ([`Client::create_volume`] and its siblings); a sandbox mounts
//! them at create ([`CreateOptions::volume_mounts`](crate::CreateOptions::volume_mounts));
//! and a [`Volume`] reads and writes their files directly, through E2B's volume content API
//! with the volume's own token, with no sandbox running.
//!
//! Paths are the volume's own: `/` is its root, as in a chroot.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{Error, Operation};
use crate::files::Download;
use crate::http::{Ctx, Http, Pool, Target, UNRESERVED};
use crate::json;
use crate::retry::Idempotency;
use crate::secret::{ApiKey, SecretValue};

#[cfg(doc)]
use crate::Client;

const OCTET_STREAM: &str = "application/octet-stream";

/// A volume as the team's list shows it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct VolumeInfo {
    /// E2B's id (a UUID).
    #[serde(rename = "volumeID", alias = "volumeId", alias = "volume_id")]
    pub volume_id: String,
    /// Its name, unique in the team.
    pub name: String,
}

/// A volume mounted into a sandbox (a sandbox detail's `volumeMounts`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct VolumeMountInfo {
    /// The volume's name.
    pub name: String,
    /// Where the sandbox sees it.
    pub path: String,
}

impl VolumeMountInfo {
    /// The volume named `name`, mounted at `path` (absolute) in the sandbox.
    pub fn new(name: String, path: String) -> VolumeMountInfo {
        VolumeMountInfo { name, path }
    }
}

/// What kind of entry a volume path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum VolumeEntryType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (see [`VolumeEntry::target`]).
    Symlink,
    /// Anything else (a socket, a device), or a type this client does not know.
    #[serde(other)]
    Unknown,
}

/// One entry of a volume (E2B's `VolumeEntryStat`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct VolumeEntry {
    /// Its last path component.
    pub name: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: VolumeEntryType,
    /// Its path in the volume.
    pub path: String,
    /// Its size in bytes.
    #[serde(deserialize_with = "json::int")]
    pub size: u64,
    /// Its permission bits (`0o644`).
    #[serde(deserialize_with = "json::int")]
    pub mode: u32,
    /// Its owner.
    #[serde(deserialize_with = "json::int")]
    pub uid: u32,
    /// Its group.
    #[serde(deserialize_with = "json::int")]
    pub gid: u32,
    /// When it was last read.
    #[serde(deserialize_with = "json::rfc3339")]
    pub atime: time::OffsetDateTime,
    /// When its contents last changed.
    #[serde(deserialize_with = "json::rfc3339")]
    pub mtime: time::OffsetDateTime,
    /// When its metadata last changed.
    #[serde(deserialize_with = "json::rfc3339")]
    pub ctime: time::OffsetDateTime,
    /// Where a symlink points.
    #[serde(default)]
    pub target: Option<String>,
}

/// How a create treats what is already there (E2B's `force`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeCreate {
    /// The parent directory must exist, and an existing entry is refused
    /// ([`Error::is_conflict`]).
    Strict,
    /// Missing parents are made; an existing file is replaced, an existing directory kept.
    Force,
}

/// What [`Volume::make_dir`] and [`Volume::write`] create. Start from
/// [`VolumeEntryOptions::new`]; there is no `Default`.
#[derive(Clone, Debug)]
pub struct VolumeEntryOptions {
    /// How an existing entry or a missing parent is treated.
    pub create: VolumeCreate,
    /// The owner; `None` leaves E2B's (uid 9090).
    pub uid: Option<u32>,
    /// The group; `None` leaves E2B's (gid 9090).
    pub gid: Option<u32>,
    /// The permission bits; `None` leaves E2B's (`0o777` directories, `0o666` files).
    pub mode: Option<u32>,
}

impl VolumeEntryOptions {
    /// `create`, with E2B's owner and mode.
    pub fn new(create: VolumeCreate) -> VolumeEntryOptions {
        VolumeEntryOptions {
            create,
            uid: None,
            gid: None,
            mode: None,
        }
    }

    /// A forced create of what exists succeeds, so only that one repeats safely.
    fn idempotency(&self) -> Idempotency {
        match self.create {
            VolumeCreate::Force => Idempotency::Idempotent,
            VolumeCreate::Strict => Idempotency::NotIdempotent,
        }
    }

    fn query(&self) -> String {
        let mut parts = Vec::new();
        for (key, value) in [("uid", self.uid), ("gid", self.gid), ("mode", self.mode)] {
            if let Some(value) = value {
                parts.push(format!("&{key}={value}"));
            }
        }
        if self.create == VolumeCreate::Force {
            parts.push("&force=true".to_owned());
        }
        parts.concat()
    }
}

/// What [`Volume::update_metadata`] changes; `None` fields are kept.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeMetadata {
    /// The new owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The new group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// The new permission bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// The answer of `POST /volumes` and `GET /volumes/{id}`.
#[derive(Deserialize)]
pub(crate) struct VolumeAndToken {
    #[serde(rename = "volumeID", alias = "volumeId", alias = "volume_id")]
    pub(crate) volume_id: String,
    pub(crate) name: String,
    pub(crate) token: String,
    /// A BYOC cluster's domain: content requests go to `https://api.<domain>`.
    #[serde(default)]
    pub(crate) domain: Option<String>,
}

/// One request of the volume content API.
struct ContentRequest<'a> {
    method: Method,
    /// `path`, `dir` or `file`.
    route: &'a str,
    /// The path in the volume.
    path: &'a str,
    /// More query pairs, each starting with `&`.
    extra_query: &'a str,
    /// The body and its content type.
    body: Option<(reqwest::Body, &'static str)>,
    idempotency: Idempotency,
}

/// A volume's files, reached with its own token through E2B's volume content API. Made by
/// [`Client::create_volume`] or [`Client::connect_volume`]; cheap to clone.
///
/// ```no_run
/// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
/// use bytes::Bytes;
/// use e2b_client::{CreateOptions, VolumeCreate, VolumeEntryOptions};
///
/// let volume = client.create_volume("datasets").await?;
/// let force = VolumeEntryOptions::new(VolumeCreate::Force);
/// volume.write("/raw/a.csv", Bytes::from_static(b"x,y\n1,2\n"), &force).await?;
///
/// // Every sandbox that mounts it sees the same files, and they outlive it.
/// let mut options = CreateOptions::new("base".to_owned());
/// options.volume_mounts = vec![volume.mount_at("/mnt/datasets")];
/// let info = client.create(options).await?;
/// # let _ = info;
/// assert_eq!(volume.read("/raw/a.csv", 1 << 20).await?, "x,y\n1,2\n");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Volume {
    inner: Arc<VolumeInner>,
}

struct VolumeInner {
    http: Arc<Http>,
    /// The content API's base URL (no trailing `/`).
    base: String,
    volume_id: String,
    name: String,
    token: SecretValue,
    authorization: HeaderValue,
    /// Scrubbed from error text too.
    api_key: ApiKey,
}

impl fmt::Debug for Volume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Volume")
            .field("volume_id", &self.inner.volume_id)
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl Volume {
    pub(crate) fn new(
        http: Arc<Http>,
        base: String,
        answer: VolumeAndToken,
        api_key: ApiKey,
    ) -> Result<Volume, Error> {
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", answer.token))
            .map_err(|_| Error::InvalidConfig {
                reason: format!(
                    "volume {}: E2B's token cannot be sent in a header",
                    answer.volume_id
                ),
            })?;
        authorization.set_sensitive(true);
        Ok(Volume {
            inner: Arc::new(VolumeInner {
                http,
                base,
                volume_id: answer.volume_id,
                name: answer.name,
                token: SecretValue::new(answer.token),
                authorization,
                api_key,
            }),
        })
    }

    /// Its id.
    pub fn volume_id(&self) -> &str {
        &self.inner.volume_id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its content token: whoever holds it can read and write the volume's files.
    pub fn token(&self) -> &SecretValue {
        &self.inner.token
    }

    fn ctx(&self, operation: Operation) -> Ctx {
        Ctx::new(
            operation,
            Target::Control(None),
            self.inner.api_key.clone(),
            None,
        )
        .with_secrets(vec![self.inner.token.clone()])
    }

    /// The mount of this volume at `path` in a sandbox, for
    /// [`CreateOptions::volume_mounts`](crate::CreateOptions::volume_mounts).
    pub fn mount_at(&self, path: &str) -> VolumeMountInfo {
        VolumeMountInfo::new(self.inner.name.clone(), path.to_owned())
    }

    async fn send(
        &self,
        ctx: &Ctx,
        request: ContentRequest<'_>,
    ) -> Result<(reqwest::Response, Instant), Error> {
        let ContentRequest {
            method,
            route,
            path,
            extra_query,
            body,
            idempotency,
        } = request;
        if path.is_empty() {
            return Err(ctx.invalid_input(format!(
                "volume {}: the path is empty",
                self.inner.volume_id
            )));
        }
        let url = format!(
            "{}/volumecontent/{}/{route}?path={}{extra_query}",
            self.inner.base,
            utf8_percent_encode(&self.inner.volume_id, UNRESERVED),
            utf8_percent_encode(path, UNRESERVED),
        );
        let url = reqwest::Url::parse(&url)
            .map_err(|error| ctx.invalid_input(format!("bad URL: {error}")))?;
        let mut builder = self
            .inner
            .http
            .request(Pool::Http1, method, url)?
            .header(AUTHORIZATION, self.inner.authorization.clone());
        if let Some((body, content_type)) = body {
            builder = builder.header(CONTENT_TYPE, content_type).body(body);
        }
        let request = ctx.build(builder)?;
        let deadline = self.inner.http.deadline_from_now();
        let response = self
            .inner
            .http
            .send(ctx, Pool::Http1, request, idempotency, deadline)
            .await?;
        Ok((response, deadline))
    }

    async fn entry(
        &self,
        operation: Operation,
        request: ContentRequest<'_>,
    ) -> Result<VolumeEntry, Error> {
        let ctx = self.ctx(operation);
        let (response, deadline) = self.send(&ctx, request).await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// The entry at `path`, a last symlink not followed (`GET /volumecontent/{id}/path`). A
    /// missing path is [`Error::is_not_found`].
    pub async fn stat(&self, path: &str) -> Result<VolumeEntry, Error> {
        self.entry(
            Operation::VolumeStat,
            ContentRequest {
                method: Method::GET,
                route: "path",
                path,
                extra_query: "",
                body: None,
                idempotency: Idempotency::Idempotent,
            },
        )
        .await
    }

    /// Whether `path` exists (a stat that answers 404 is `false`).
    pub async fn exists(&self, path: &str) -> Result<bool, Error> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The entries of directory `path` and, up to `depth` levels (1 to 10; `None`: 1), of
    /// its subdirectories, each directory's entries followed by its children's
    /// (`GET /volumecontent/{id}/dir`).
    pub async fn list(&self, path: &str, depth: Option<u32>) -> Result<Vec<VolumeEntry>, Error> {
        let ctx = self.ctx(Operation::VolumeListDir);
        let extra = depth.map(|d| format!("&depth={d}")).unwrap_or_default();
        let (response, deadline) = self
            .send(
                &ctx,
                ContentRequest {
                    method: Method::GET,
                    route: "dir",
                    path,
                    extra_query: &extra,
                    body: None,
                    idempotency: Idempotency::Idempotent,
                },
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Makes directory `path` (`POST /volumecontent/{id}/dir`). With
    /// [`VolumeCreate::Strict`] an existing entry is [`Error::is_conflict`] and a missing
    /// parent [`Error::is_not_found`].
    pub async fn make_dir(
        &self,
        path: &str,
        options: &VolumeEntryOptions,
    ) -> Result<VolumeEntry, Error> {
        self.entry(
            Operation::VolumeMakeDir,
            ContentRequest {
                method: Method::POST,
                route: "dir",
                path,
                extra_query: &options.query(),
                body: None,
                idempotency: options.idempotency(),
            },
        )
        .await
    }

    /// Writes `data` to file `path` (`PUT /volumecontent/{id}/file`). With
    /// [`VolumeCreate::Strict`] an existing file is kept and the write is
    /// [`Error::is_conflict`].
    pub async fn write(
        &self,
        path: &str,
        data: Bytes,
        options: &VolumeEntryOptions,
    ) -> Result<VolumeEntry, Error> {
        let idempotency = options.idempotency();
        self.put_file(path, reqwest::Body::from(data), options, idempotency)
            .await
    }

    /// [`Volume::write`] from a stream of chunks, never held whole in memory (sent once: a
    /// stream cannot be replayed).
    pub async fn write_stream<S>(
        &self,
        path: &str,
        data: S,
        options: &VolumeEntryOptions,
    ) -> Result<VolumeEntry, Error>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let body = reqwest::Body::wrap_stream(data);
        self.put_file(path, body, options, Idempotency::NotIdempotent)
            .await
    }

    /// `PUT /volumecontent/{id}/file` with `body`.
    async fn put_file(
        &self,
        path: &str,
        body: reqwest::Body,
        options: &VolumeEntryOptions,
        idempotency: Idempotency,
    ) -> Result<VolumeEntry, Error> {
        self.entry(
            Operation::VolumeWrite,
            ContentRequest {
                method: Method::PUT,
                route: "file",
                path,
                extra_query: &options.query(),
                body: Some((body, OCTET_STREAM)),
                idempotency,
            },
        )
        .await
    }

    /// Reads file `path` as a stream refused the moment it exceeds `limit` bytes
    /// (`GET /volumecontent/{id}/file`). A missing file is [`Error::is_not_found`].
    pub async fn read_stream(&self, path: &str, limit: u64) -> Result<Download, Error> {
        let ctx = self.ctx(Operation::VolumeRead);
        let (response, _) = self
            .send(
                &ctx,
                ContentRequest {
                    method: Method::GET,
                    route: "file",
                    path,
                    extra_query: "",
                    body: None,
                    idempotency: Idempotency::Idempotent,
                },
            )
            .await?;
        Download::checked(ctx, path, response, limit, self.inner.http.deadline)
    }

    /// Reads a whole file into memory, capped at `limit` bytes.
    pub async fn read(&self, path: &str, limit: u64) -> Result<Bytes, Error> {
        self.read_stream(path, limit).await?.bytes().await
    }

    /// Changes the owner, group or mode of `path` (`PATCH /volumecontent/{id}/path`).
    pub async fn update_metadata(
        &self,
        path: &str,
        metadata: &VolumeMetadata,
    ) -> Result<VolumeEntry, Error> {
        let ctx = self.ctx(Operation::VolumeUpdateMetadata);
        let body = serde_json::to_vec(metadata)
            .map_err(|error| ctx.invalid_input(format!("cannot encode the body: {error}")))?;
        let (response, deadline) = self
            .send(
                &ctx,
                ContentRequest {
                    method: Method::PATCH,
                    route: "path",
                    path,
                    extra_query: "",
                    body: Some((reqwest::Body::from(body), "application/json")),
                    idempotency: Idempotency::Idempotent,
                },
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Removes `path`, a directory with everything in it
    /// (`DELETE /volumecontent/{id}/path`). A missing path is [`Error::is_not_found`]; the
    /// volume's root cannot be removed ([`Error::is_invalid_request`]).
    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        let ctx = self.ctx(Operation::VolumeRemove);
        self.send(
            &ctx,
            ContentRequest {
                method: Method::DELETE,
                route: "path",
                path,
                extra_query: "",
                body: None,
                idempotency: Idempotency::NotIdempotent,
            },
        )
        .await?;
        Ok(())
    }
}
