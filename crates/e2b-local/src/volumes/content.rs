//! The volume content API (`spec/openapi-volumecontent.yml`): `/volumecontent/{volumeID}/`
//! `path` (stat, change owner and mode, delete), `dir` (list, make) and `file` (download,
//! upload), each with a `path` inside the volume and the volume's token as a bearer.
//!
//! Paths are taken as in a chroot: `/` is the volume's root, `..` stops there, and a symlink
//! resolves inside the volume ([`crate::paths::resolve_in_volume`]). File bodies stream in
//! both directions. New entries belong to uid and gid 9090 unless asked otherwise, with
//! modes 0777 (directories) and 0666 (files), as on E2B; only a server running as root can
//! give files away, so one running as another user keeps them as its own.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::app::App;
use crate::clock::rfc3339;
use crate::parse::query_pairs;
use crate::paths::{Last, Resolved, resolve_in_volume};
use crate::reply::{ApiError, json_response};

/// E2B's defaults for what the content API creates.
const DEFAULT_OWNER: u32 = 9090;
const DEFAULT_DIR_MODE: u32 = 0o777;
const DEFAULT_FILE_MODE: u32 = 0o666;

/// E2B's bounds on a listing's depth.
const MAX_DEPTH: u32 = 10;

/// Largest metadata update body accepted.
const MAX_PATCH_BODY: usize = 64 * 1024;

/// Whether a request is for the volume content API.
pub(crate) fn is_for(path: &str) -> bool {
    path.starts_with("/volumecontent/")
}

/// What the query of a content request carries.
#[derive(Default)]
struct Query {
    path: Option<String>,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: bool,
}

impl Query {
    fn parse(query: &str) -> Result<Query, ApiError> {
        let mut parsed = Query::default();
        let number = |key: &str, value: &str| {
            value
                .parse::<u32>()
                .map_err(|_| ApiError::bad_request(format!("{key}: not a whole number: '{value}'")))
        };
        for (key, value) in query_pairs(query) {
            match key.as_str() {
                "path" => parsed.path = Some(value),
                "depth" => parsed.depth = Some(number("depth", &value)?),
                "uid" => parsed.uid = Some(number("uid", &value)?),
                "gid" => parsed.gid = Some(number("gid", &value)?),
                "mode" => parsed.mode = Some(number("mode", &value)?),
                "force" => {
                    parsed.force = match value.as_str() {
                        "true" | "True" | "1" => true,
                        "false" | "False" | "0" => false,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "force: not a boolean: '{other}'"
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(parsed)
    }

    fn path(&self) -> Result<&str, ApiError> {
        self.path
            .as_deref()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| ApiError::bad_request("path is required"))
    }
}

/// One content request, for the messages of its errors.
struct Op<'a> {
    what: &'static str,
    volume: &'a str,
    path: &'a str,
}

impl Op<'_> {
    fn io(&self, error: &io::Error) -> ApiError {
        let status = match error.kind() {
            io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
            io::ErrorKind::AlreadyExists => StatusCode::CONFLICT,
            io::ErrorKind::NotADirectory | io::ErrorKind::IsADirectory => StatusCode::BAD_REQUEST,
            io::ErrorKind::DirectoryNotEmpty => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, self.message(error))
    }

    fn message(&self, reason: impl std::fmt::Display) -> String {
        format!(
            "{} '{}' in volume {}: {reason}",
            self.what, self.path, self.volume
        )
    }

    fn bad(&self, reason: impl std::fmt::Display) -> ApiError {
        ApiError::bad_request(self.message(reason))
    }

    fn resolve(&self, root: &Path, last: Last) -> Result<Resolved, ApiError> {
        resolve_in_volume(root, self.path, last).map_err(|e| self.bad(e.message()))
    }
}

/// Serves one content request.
pub(crate) async fn handle(app: Arc<App>, request: Request) -> Response {
    match serve(&app, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn serve(app: &App, request: Request) -> Result<Response, ApiError> {
    let segments: Vec<String> = request
        .uri()
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let [_, volume, kind] = segments.as_slice() else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "Not found"));
    };
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let root = app.volumes.authorize(volume, token)?;
    let query = Query::parse(request.uri().query().unwrap_or_default())?;
    let path = query.path()?.to_owned();
    let method = request.method().clone();
    match (method, kind.as_str()) {
        (Method::GET, "file") => download(volume, &path, &root).await,
        (Method::PUT, "file") => upload(volume, &path, &root, &query, request.into_body()).await,
        (Method::PATCH, "path") => {
            let body = axum::body::to_bytes(request.into_body(), MAX_PATCH_BODY)
                .await
                .map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?;
            let update: MetadataUpdate = serde_json::from_slice(&body).map_err(|e| {
                ApiError::bad_request(format!(
                    "Invalid request body: expected uid, gid, mode: {e}"
                ))
            })?;
            let volume = volume.clone();
            blocking(move || update_metadata(&volume, &path, &root, &update)).await
        }
        (method, kind @ ("path" | "dir")) => {
            let volume = volume.clone();
            let kind = kind.to_owned();
            blocking(move || match (method, kind.as_str()) {
                (Method::GET, "path") => stat(&volume, &path, &root),
                (Method::DELETE, "path") => remove(&volume, &path, &root),
                (Method::GET, "dir") => list(&volume, &path, &root, query.depth),
                (Method::POST, "dir") => make_dir(&volume, &path, &root, &query),
                (_, "path") => Ok(crate::reply::method_not_allowed(
                    "Method not allowed",
                    "GET, PATCH, DELETE",
                )),
                _ => Ok(crate::reply::method_not_allowed(
                    "Method not allowed",
                    "GET, POST",
                )),
            })
            .await
        }
        (_, "file") => Ok(crate::reply::method_not_allowed(
            "Method not allowed",
            "GET, PUT",
        )),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "Not found")),
    }
}

/// Runs filesystem work off the async workers.
async fn blocking<F>(work: F) -> Result<Response, ApiError>
where
    F: FnOnce() -> Result<Response, ApiError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("volume task failed: {e}"))))
}

/// The `VolumeEntryStat` of `host` (not following a last symlink), named `virt`.
fn entry_json(virt: &str, host: &Path) -> io::Result<Value> {
    let meta = fs::symlink_metadata(host)?;
    let kind = if meta.file_type().is_symlink() {
        "symlink"
    } else if meta.is_dir() {
        "directory"
    } else if meta.is_file() {
        "file"
    } else {
        "unknown"
    };
    let name = virt.rsplit('/').find(|p| !p.is_empty()).unwrap_or("/");
    let time = |secs: i64, nanos: i64| {
        let total = i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        rfc3339(u64::try_from(total).unwrap_or(0))
    };
    let mut entry = json!({
        "name": name,
        "type": kind,
        "path": virt,
        "size": meta.size(),
        "mode": meta.mode() & 0o777,
        "uid": meta.uid(),
        "gid": meta.gid(),
        "atime": time(meta.atime(), meta.atime_nsec()),
        "mtime": time(meta.mtime(), meta.mtime_nsec()),
        "ctime": time(meta.ctime(), meta.ctime_nsec()),
    });
    if meta.file_type().is_symlink()
        && let Ok(target) = fs::read_link(host)
    {
        entry["target"] = Value::String(target.to_string_lossy().into_owned());
    }
    Ok(entry)
}

fn stat(volume: &str, path: &str, root: &Path) -> Result<Response, ApiError> {
    let op = Op {
        what: "stat",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::NoFollow)?;
    let entry = entry_json(&resolved.virt, &resolved.host).map_err(|e| op.io(&e))?;
    Ok(json_response(StatusCode::OK, &entry))
}

fn remove(volume: &str, path: &str, root: &Path) -> Result<Response, ApiError> {
    let op = Op {
        what: "delete",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::NoFollow)?;
    if resolved.virt == "/" {
        return Err(op.bad("cannot delete root"));
    }
    let meta = fs::symlink_metadata(&resolved.host).map_err(|e| op.io(&e))?;
    if meta.is_dir() {
        fs::remove_dir_all(&resolved.host)
    } else {
        fs::remove_file(&resolved.host)
    }
    .map_err(|e| op.io(&e))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn list(volume: &str, path: &str, root: &Path, depth: Option<u32>) -> Result<Response, ApiError> {
    let op = Op {
        what: "list",
        volume,
        path,
    };
    let depth = depth.unwrap_or(1).max(1);
    if depth > MAX_DEPTH {
        return Err(op.bad(format!("depth must be between 1 and {MAX_DEPTH}")));
    }
    let resolved = op.resolve(root, Last::Follow)?;
    let mut entries = Vec::new();
    walk(&resolved.virt, &resolved.host, depth, &mut entries).map_err(|e| op.io(&e))?;
    Ok(json_response(StatusCode::OK, &Value::Array(entries)))
}

/// Appends the entries of `host` (and, while `depth` lasts, of its directories) in name
/// order; a directory that vanishes during the walk is skipped, as on E2B.
fn walk(virt: &str, host: &Path, depth: u32, out: &mut Vec<Value>) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(host)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().into_owned();
        let child_virt = if virt == "/" {
            format!("/{name}")
        } else {
            format!("{virt}/{name}")
        };
        let child_host = host.join(&name);
        let Ok(entry) = entry_json(&child_virt, &child_host) else {
            continue;
        };
        let is_dir = entry["type"] == "directory";
        out.push(entry);
        if is_dir && depth > 1 {
            match walk(&child_virt, &child_host, depth - 1, out) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// Gives `host` its owner (only a root server can) and mode, past the umask.
fn own(host: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    if is_root() {
        std::os::unix::fs::chown(host, Some(uid), Some(gid))?;
    }
    fs::set_permissions(host, fs::Permissions::from_mode(mode & 0o7777))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Makes the missing directories above `host` (inside the volume) for a forced create.
fn make_parents(root: &Path, host: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let Some(parent) = host.parent() else {
        return Ok(());
    };
    crate::paths::create_dirs_with(root, parent, |made| own(made, uid, gid, DEFAULT_DIR_MODE))
}

fn make_dir(volume: &str, path: &str, root: &Path, query: &Query) -> Result<Response, ApiError> {
    let op = Op {
        what: "make directory",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::Follow)?;
    let uid = query.uid.unwrap_or(DEFAULT_OWNER);
    let gid = query.gid.unwrap_or(DEFAULT_OWNER);
    if query.force {
        make_parents(root, &resolved.host, uid, gid).map_err(|e| op.io(&e))?;
    }
    match fs::create_dir(&resolved.host) {
        Ok(()) => own(
            &resolved.host,
            uid,
            gid,
            query.mode.unwrap_or(DEFAULT_DIR_MODE),
        )
        .map_err(|e| op.io(&e))?,
        // A forced create of a directory that exists leaves it as it is.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && query.force => {
            if !resolved.host.is_dir() {
                return Err(op.io(&e));
            }
        }
        Err(e) => return Err(op.io(&e)),
    }
    let entry = entry_json(&resolved.virt, &resolved.host).map_err(|e| op.io(&e))?;
    Ok(json_response(StatusCode::CREATED, &entry))
}

#[derive(Deserialize)]
struct MetadataUpdate {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

fn update_metadata(
    volume: &str,
    path: &str,
    root: &Path,
    update: &MetadataUpdate,
) -> Result<Response, ApiError> {
    let op = Op {
        what: "update metadata of",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::Follow)?;
    if let Some(mode) = update.mode {
        fs::set_permissions(&resolved.host, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| op.io(&e))?;
    }
    if update.uid.is_some() || update.gid.is_some() {
        if !is_root() {
            fs::metadata(&resolved.host).map_err(|e| op.io(&e))?;
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                op.message("e2b-local runs as another user than root, so it cannot change owners"),
            ));
        }
        std::os::unix::fs::chown(&resolved.host, update.uid, update.gid).map_err(|e| op.io(&e))?;
    }
    let entry = entry_json(&resolved.virt, &resolved.host).map_err(|e| op.io(&e))?;
    Ok(json_response(StatusCode::OK, &entry))
}

async fn download(volume: &str, path: &str, root: &Path) -> Result<Response, ApiError> {
    let op = Op {
        what: "read",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::Follow)?;
    let file = tokio::fs::File::open(&resolved.host)
        .await
        .map_err(|e| op.io(&e))?;
    let meta = file.metadata().await.map_err(|e| op.io(&e))?;
    if meta.is_dir() {
        return Err(op.bad("it is a directory"));
    }
    let mut response = Response::new(Body::from_stream(tokio_util::io::ReaderStream::new(file)));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(http::header::CONTENT_LENGTH, meta.len().into());
    Ok(response)
}

/// Writes a request's body into a new file `temp`; a failure says whether the body or the
/// disk failed.
async fn receive(temp: &Path, mode: u32, body: Body, op: &Op<'_>) -> Result<(), ApiError> {
    let fail = |e: io::Error| op.io(&e);
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o777)
        .open(temp)
        .await
        .map_err(fail)?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::bad_request(op.message(format!("reading the body: {e}"))))?;
        file.write_all(&chunk).await.map_err(fail)?;
    }
    file.sync_all().await.map_err(fail)
}

async fn upload(
    volume: &str,
    path: &str,
    root: &Path,
    query: &Query,
    body: Body,
) -> Result<Response, ApiError> {
    let op = Op {
        what: "write",
        volume,
        path,
    };
    let resolved = op.resolve(root, Last::Follow)?;
    if resolved.virt == "/" {
        return Err(op.bad("the volume's root is a directory"));
    }
    let uid = query.uid.unwrap_or(DEFAULT_OWNER);
    let gid = query.gid.unwrap_or(DEFAULT_OWNER);
    let mode = query.mode.unwrap_or(DEFAULT_FILE_MODE);
    if query.force {
        let (root, host) = (root.to_path_buf(), resolved.host.clone());
        tokio::task::spawn_blocking(move || make_parents(&root, &host, uid, gid))
            .await
            .map_err(|e| ApiError::internal(format!("volume task failed: {e}")))?
            .map_err(|e| op.io(&e))?;
    }
    // The body goes to a temporary file beside the target first, so a body that breaks off
    // leaves the old file (or none) in place, never half a file.
    let parent = resolved
        .host
        .parent()
        .ok_or_else(|| op.bad("no parent directory"))?
        .to_path_buf();
    let temp = parent.join(format!(
        ".e2b-upload-{:016x}",
        rand::Rng::random::<u64>(&mut rand::rng())
    ));
    if let Err(error) = receive(&temp, mode, body, &op).await {
        let _ = tokio::fs::remove_file(&temp).await;
        return Err(error);
    }
    let (virt, host, force) = (resolved.virt.clone(), resolved.host.clone(), query.force);
    let placed = tokio::task::spawn_blocking(move || {
        let placed = (|| {
            if force {
                if host.is_dir() {
                    return Err(io::Error::from(io::ErrorKind::IsADirectory));
                }
                fs::rename(&temp, &host)
            } else {
                // Without force an existing file is not replaced (409), as on E2B.
                fs::hard_link(&temp, &host).and_then(|()| fs::remove_file(&temp))
            }
        })();
        if placed.is_err() {
            let _ = fs::remove_file(&temp);
        }
        placed?;
        own(&host, uid, gid, mode)?;
        entry_json(&virt, &host)
    })
    .await
    .map_err(|e| ApiError::internal(format!("volume task failed: {e}")))?;
    let entry = placed.map_err(|e| op.io(&e))?;
    Ok(json_response(StatusCode::CREATED, &entry))
}
