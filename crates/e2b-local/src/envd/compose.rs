//! envd's `POST /files/compose`: concatenates source files, in order, into a destination
//! (kernel-side copies), then removes the sources. The destination is written under a
//! temporary name and renamed into place, so a failure midway leaves any earlier file at
//! the destination as it was, and the sources are removed only after the rename.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::ctx::Ctx;
use super::files::resolve_for_write;
use crate::isolation::SandboxUser;
use crate::paths::{self, Resolved};
use crate::reply::{ApiError, json_response};

/// The largest request body (a list of paths) read.
const MAX_BODY: usize = 1 << 20;

#[derive(Debug, Deserialize)]
struct ComposeRequest {
    source_paths: Vec<String>,
    destination: String,
    #[serde(default)]
    username: Option<String>,
}

/// Serves `POST /files/compose`, with envd's checks in envd's order and its texts.
pub(crate) async fn compose(ctx: Ctx, request: Request) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(error) => {
            return ApiError::bad_request(format!("invalid request body: {error}")).into_response();
        }
    };
    let request: ComposeRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return ApiError::bad_request(format!("invalid request body: {error}")).into_response();
        }
    };
    match plan(&ctx, &request) {
        Ok((user, sources, destination)) => {
            let owner = ctx.app.isolation.owner(user);
            let virt = destination.virt.clone();
            let joined =
                tokio::task::spawn_blocking(move || write(&sources, &destination, owner)).await;
            match joined {
                Ok(Ok(())) => {
                    let name = virt.rsplit('/').next().unwrap_or_default().to_owned();
                    json_response(
                        StatusCode::OK,
                        &json!({"path": virt, "name": name, "type": "file"}),
                    )
                }
                Ok(Err(error)) => error.into_response(),
                Err(error) => ApiError::internal(format!("composing '{virt}' failed: {error}"))
                    .into_response(),
            }
        }
        Err(error) => error.into_response(),
    }
}

/// The user, the resolved sources (each a regular file, none the destination) and the
/// resolved destination.
fn plan(
    ctx: &Ctx,
    request: &ComposeRequest,
) -> Result<(SandboxUser, Vec<Resolved>, Resolved), ApiError> {
    if request.source_paths.is_empty() {
        return Err(ApiError::bad_request("source_paths must not be empty"));
    }
    if request.destination.is_empty() {
        return Err(ApiError::bad_request("destination is required"));
    }
    let user = SandboxUser::parse(request.username.as_deref())
        .map_err(|message| ApiError::new(StatusCode::UNAUTHORIZED, message))?;
    let destination = resolve_for_write(ctx, &request.destination)?;
    let mut sources = Vec::with_capacity(request.source_paths.len());
    for source in &request.source_paths {
        let resolved = resolve_for_write(ctx, source)?;
        if resolved.host == destination.host {
            return Err(ApiError::bad_request(format!(
                "source path {source:?} cannot be the same as destination"
            )));
        }
        match fs::metadata(&resolved.host) {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("source file not found: {source}"),
                ));
            }
            Ok(meta) if !meta.is_file() => {
                return Err(ApiError::bad_request(format!(
                    "source path is not a regular file: {source}"
                )));
            }
            Ok(_) => sources.push(resolved),
        }
    }
    Ok((user, sources, destination))
}

/// Copies every source into a temporary file beside the destination, renames it into
/// place, then removes the sources.
fn write(
    sources: &[Resolved],
    destination: &Resolved,
    owner: Option<(u32, u32)>,
) -> Result<(), ApiError> {
    let virt = &destination.virt;
    if let Some(parent) = destination.host.parent() {
        paths::create_dirs(&destination.area_root, parent, owner)
            .map_err(|error| ApiError::internal(format!("error ensuring directories: {error}")))?;
    }
    let temporary = temporary_beside(&destination.host);
    let written = (|| {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        paths::chown(&temporary, owner)?;
        for source in sources {
            // `io::copy` between two files is `copy_file_range` on Linux: no bytes
            // through this process.
            io::copy(&mut fs::File::open(&source.host)?, &mut out)?;
        }
        out.sync_data()?;
        fs::rename(&temporary, &destination.host)
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(if error.raw_os_error() == Some(libc::ENOSPC) {
            ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "not enough disk space available",
            )
        } else {
            ApiError::internal(format!("error composing '{virt}': {error}"))
        });
    }
    for source in sources {
        let _ = fs::remove_file(&source.host);
    }
    Ok(())
}

/// A name beside `path` no other compose uses at the same time.
fn temporary_beside(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".e2b-compose.{}.{n}.tmp", std::process::id()));
    PathBuf::from(name)
}
