//! `filesystem.Filesystem`: Stat, MakeDir, ListDir, Remove, Move on the sandbox's areas.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axum::extract::Request;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::connect::{self, Code, ConnectError, de_opt_u32};
use super::ctx::Ctx;
use super::metadata;
use crate::clock::{nanos, rfc3339};
use crate::isolation::{Isolation, SandboxUser};
use crate::paths::{self, Last, PathError, Resolved, SandboxFs};

/// Entries returned by one ListDir at most (a guard against huge trees).
const MAX_LIST_ENTRIES: usize = 100_000;

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default, deserialize_with = "de_opt_u32")]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// Serves `/filesystem.Filesystem/<method>`.
pub(crate) async fn handle(ctx: Ctx, method: &str, request: Request) -> Response {
    let user = match ctx.user(request.headers()) {
        Ok(user) => user,
        Err(error) => {
            return error.unary();
        }
    };
    let result = match method {
        "Stat" => match connect::read_unary::<PathRequest>(request).await {
            Ok(req) => run_blocking(ctx, move |ctx| stat(ctx, &req.path)).await,
            Err(response) => return response,
        },
        "MakeDir" => match connect::read_unary::<PathRequest>(request).await {
            Ok(req) => run_blocking(ctx, move |ctx| make_dir(ctx, user, &req.path)).await,
            Err(response) => return response,
        },
        "ListDir" => match connect::read_unary::<ListDirRequest>(request).await {
            Ok(req) => {
                run_blocking(ctx, move |ctx| {
                    list_dir(ctx, &req.path, req.depth.unwrap_or(1))
                })
                .await
            }
            Err(response) => return response,
        },
        "Remove" => match connect::read_unary::<PathRequest>(request).await {
            Ok(req) => run_blocking(ctx, move |ctx| remove(ctx, &req.path)).await,
            Err(response) => return response,
        },
        "Move" => match connect::read_unary::<MoveRequest>(request).await {
            Ok(req) => {
                run_blocking(ctx, move |ctx| {
                    move_entry(ctx, user, &req.source, &req.destination)
                })
                .await
            }
            Err(response) => return response,
        },
        _ => Err(ConnectError::new(
            Code::NotFound,
            format!("unknown method filesystem.Filesystem/{method}"),
        )),
    };
    match result {
        Ok(value) => connect::unary_ok(&value),
        Err(error) => error.unary(),
    }
}

async fn run_blocking(
    ctx: Ctx,
    work: impl FnOnce(&Ctx) -> Result<Value, ConnectError> + Send + 'static,
) -> Result<Value, ConnectError> {
    tokio::task::spawn_blocking(move || work(&ctx))
        .await
        .unwrap_or_else(|e| {
            Err(ConnectError::new(
                Code::Internal,
                format!("filesystem task failed: {e}"),
            ))
        })
}

fn sandbox_fs(ctx: &Ctx) -> SandboxFs<'_> {
    ctx.sandbox.fs()
}

pub(crate) fn path_error(error: PathError) -> ConnectError {
    match error {
        PathError::Outside(_) => ConnectError::new(Code::PermissionDenied, error.message()),
        PathError::Invalid(_) => ConnectError::new(Code::InvalidArgument, error.message()),
    }
}

fn io_error(operation: &str, virt: &str, error: &io::Error) -> ConnectError {
    let code = match error.kind() {
        io::ErrorKind::NotFound => Code::NotFound,
        io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        io::ErrorKind::AlreadyExists => Code::AlreadyExists,
        io::ErrorKind::NotADirectory
        | io::ErrorKind::IsADirectory
        | io::ErrorKind::InvalidInput => Code::InvalidArgument,
        _ => Code::Internal,
    };
    ConnectError::new(code, format!("error {operation} '{virt}': {error}"))
}

/// Go's `FileMode.String()` for the common cases.
fn permission_string(meta: &fs::Metadata) -> String {
    let kind = if meta.file_type().is_symlink() {
        'L'
    } else if meta.is_dir() {
        'd'
    } else {
        '-'
    };
    let mode = meta.permissions().mode();
    let mut out = String::with_capacity(10);
    out.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

/// The proto3 JSON `EntryInfo` of a host path known to the sandbox as `virt`, as envd
/// builds it: the entry's own size, times and `permissions`; for a symlink, the target's
/// type and mode and `symlinkTarget` the link resolved to its final path (the link's own
/// path when it dangles, with no type then); and the `user.e2b.*` metadata.
pub(crate) fn entry_info(
    isolation: &Isolation,
    areas: &SandboxFs<'_>,
    host: &Path,
    virt: &str,
) -> io::Result<Value> {
    let meta = fs::symlink_metadata(host)?;
    let name = virt.rsplit('/').next().unwrap_or_default();
    let mut entry = json!({
        "name": name,
        "path": virt,
        "size": meta.len().to_string(),
        "permissions": permission_string(&meta),
        "owner": isolation.user_name(meta.uid()),
        "group": isolation.user_name(meta.gid()),
        "modifiedTime": rfc3339(meta.modified().map(nanos).unwrap_or(0)),
    });
    let (kind, mode, metadata) = if meta.file_type().is_symlink() {
        let (target, target_meta, target_host) = follow(areas, virt);
        entry["symlinkTarget"] = json!(target);
        match target_meta {
            Some(target_meta) => (
                file_type(&target_meta),
                target_meta.permissions().mode() & 0o777,
                target_host.map(|h| metadata::read(&h)).unwrap_or_default(),
            ),
            None => (None, 0, Default::default()),
        }
    } else {
        (
            file_type(&meta),
            meta.permissions().mode() & 0o777,
            metadata::read(host),
        )
    };
    // proto3 JSON leaves out zero values: an unknown type, a dangling link's mode.
    if let Some(kind) = kind {
        entry["type"] = json!(kind);
    }
    if mode != 0 {
        entry["mode"] = json!(mode);
    }
    if !metadata.is_empty() {
        entry["metadata"] = json!(metadata);
    }
    Ok(entry)
}

fn file_type(meta: &fs::Metadata) -> Option<&'static str> {
    if meta.is_dir() {
        Some("FILE_TYPE_DIRECTORY")
    } else if meta.is_file() {
        Some("FILE_TYPE_FILE")
    } else {
        None
    }
}

/// Where the link at `virt` leads in the sandbox's view (Go's `EvalSymlinks`): the final
/// path, the metadata there, and its host path when it is inside the sandbox's areas.
/// A target outside them is the host's own path, as the sandbox's commands see it.
fn follow(areas: &SandboxFs<'_>, virt: &str) -> (String, Option<fs::Metadata>, Option<PathBuf>) {
    match areas.resolve(virt, Last::Follow) {
        Ok(resolved) => match fs::metadata(&resolved.host) {
            Ok(meta) => (resolved.virt, Some(meta), Some(resolved.host)),
            Err(_) => (virt.to_owned(), None, None),
        },
        Err(PathError::Outside(outside)) => match std::fs::canonicalize(&outside) {
            Ok(real) => {
                let meta = fs::metadata(&real).ok();
                (real.to_string_lossy().into_owned(), meta, None)
            }
            Err(_) => (virt.to_owned(), None, None),
        },
        Err(PathError::Invalid(_)) => (virt.to_owned(), None, None),
    }
}

fn resolve(ctx: &Ctx, path: &str, last: Last) -> Result<Resolved, ConnectError> {
    sandbox_fs(ctx).resolve(path, last).map_err(path_error)
}

fn stat(ctx: &Ctx, path: &str) -> Result<Value, ConnectError> {
    let resolved = resolve(ctx, path, Last::NoFollow)?;
    let entry = entry_info(
        &ctx.app.isolation,
        &sandbox_fs(ctx),
        &resolved.host,
        &resolved.virt,
    )
    .map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ConnectError::new(
                Code::NotFound,
                format!("file '{}' does not exist", resolved.virt),
            )
        } else {
            io_error("statting", &resolved.virt, &e)
        }
    })?;
    Ok(json!({"entry": entry}))
}

fn make_dir(ctx: &Ctx, user: SandboxUser, path: &str) -> Result<Value, ConnectError> {
    let resolved = resolve(ctx, path, Last::Follow)?;
    match fs::symlink_metadata(&resolved.host) {
        Ok(meta) if meta.is_dir() => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory '{}' already exists", resolved.virt),
            ));
        }
        Ok(_) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!(
                    "path '{}' already exists and is not a directory",
                    resolved.virt
                ),
            ));
        }
        Err(_) => {}
    }
    paths::create_dirs(
        &resolved.area_root,
        &resolved.host,
        ctx.app.isolation.owner(user),
    )
    .map_err(|e| io_error("creating directory", &resolved.virt, &e))?;
    let entry = entry_info(
        &ctx.app.isolation,
        &sandbox_fs(ctx),
        &resolved.host,
        &resolved.virt,
    )
    .map_err(|e| io_error("statting", &resolved.virt, &e))?;
    Ok(json!({"entry": entry}))
}

fn list_dir(ctx: &Ctx, path: &str, depth: u32) -> Result<Value, ConnectError> {
    let depth = depth.max(1);
    let resolved = resolve(ctx, path, Last::Follow)?;
    let meta = fs::metadata(&resolved.host).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ConnectError::new(
                Code::NotFound,
                format!("directory '{}' does not exist", resolved.virt),
            )
        } else {
            io_error("listing", &resolved.virt, &e)
        }
    })?;
    if !meta.is_dir() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("path '{}' is not a directory", resolved.virt),
        ));
    }
    let mut entries = Vec::new();
    walk(ctx, &resolved.host, &resolved.virt, depth, &mut entries)?;
    Ok(json!({"entries": entries}))
}

fn walk(
    ctx: &Ctx,
    host: &Path,
    virt: &str,
    depth: u32,
    out: &mut Vec<Value>,
) -> Result<(), ConnectError> {
    let reader = fs::read_dir(host).map_err(|e| io_error("listing", virt, &e))?;
    let mut names: Vec<_> = reader.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        if out.len() >= MAX_LIST_ENTRIES {
            return Ok(());
        }
        let name = name.to_string_lossy().into_owned();
        let child_host = host.join(&name);
        let child_virt = format!("{}/{name}", virt.trim_end_matches('/'));
        let Ok(entry) = entry_info(
            &ctx.app.isolation,
            &sandbox_fs(ctx),
            &child_host,
            &child_virt,
        ) else {
            continue; // vanished while listing
        };
        out.push(entry);
        // Symlinked directories are listed, not descended into.
        let is_real_dir = fs::symlink_metadata(&child_host).is_ok_and(|m| m.is_dir());
        if depth > 1 && is_real_dir {
            walk(ctx, &child_host, &child_virt, depth - 1, out)?;
        }
    }
    Ok(())
}

fn remove(ctx: &Ctx, path: &str) -> Result<Value, ConnectError> {
    let resolved = resolve(ctx, path, Last::NoFollow)?;
    if resolved.host == resolved.area_root {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            format!("refusing to remove '{}'", resolved.virt),
        ));
    }
    let result = match fs::symlink_metadata(&resolved.host) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&resolved.host),
        Ok(_) => fs::remove_file(&resolved.host),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Ok(json!({})),
        // RemoveAll semantics: removing what is not there succeeds.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(io_error("removing", &resolved.virt, &e)),
    }
}

fn move_entry(
    ctx: &Ctx,
    user: SandboxUser,
    source: &str,
    destination: &str,
) -> Result<Value, ConnectError> {
    let from = resolve(ctx, source, Last::NoFollow)?;
    let to = resolve(ctx, destination, Last::NoFollow)?;
    if fs::symlink_metadata(&from.host).is_err() {
        return Err(ConnectError::new(
            Code::NotFound,
            format!("source file '{}' does not exist", from.virt),
        ));
    }
    if from.host == from.area_root || to.host == to.area_root {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            "cannot move a sandbox area root",
        ));
    }
    if let Some(parent) = to.host.parent() {
        paths::create_dirs(&to.area_root, parent, ctx.app.isolation.owner(user))
            .map_err(|e| io_error("creating parent of", &to.virt, &e))?;
    }
    fs::rename(&from.host, &to.host).map_err(|e| io_error("moving", &from.virt, &e))?;
    let entry = entry_info(&ctx.app.isolation, &sandbox_fs(ctx), &to.host, &to.virt)
        .map_err(|e| io_error("statting", &to.virt, &e))?;
    Ok(json!({"entry": entry}))
}
