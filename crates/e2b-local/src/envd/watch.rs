//! `filesystem.Filesystem` watches: `WatchDir` (a stream of events) and the polling
//! watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) the sync SDK uses.
//!
//! A polling watcher belongs to its sandbox's process table (a [`Weak`] to it): it dies with
//! the sandbox, and a pause (which keeps no memory) ends it, as a restarted envd would. The
//! registry is process-wide so that the store stays unaware of watchers; ids are random.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use rand::Rng;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::connect::{self, BreakOff, Code, ConnectError, Outgoing};
use super::ctx::Ctx;
use crate::isolation::Isolation;
use crate::paths::{Last, SandboxFs};
use crate::process_table::{ProcessTable, sleep_until_opt};
use crate::watch::{DirWatch, FsEvent};

/// Events a polling watcher keeps between two `GetWatcherEvents` calls; past this it fails
/// (the next call says so) rather than grow without bound or drop events silently.
const POLLED_EVENTS: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, alias = "include_entry")]
    include_entry: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherIdRequest {
    #[serde(default, alias = "watcher_id")]
    watcher_id: String,
}

/// A directory to watch, resolved and checked as envd does.
struct Target {
    host: PathBuf,
    virt: String,
    include_entry: bool,
    recursive: bool,
    /// The sandbox, for its areas (the entries' symlink targets).
    sandbox: crate::store::RunningSandbox,
}

impl Target {
    fn fs(&self) -> SandboxFs<'_> {
        self.sandbox.fs()
    }
}

fn target(ctx: &Ctx, req: &WatchRequest) -> Result<Target, ConnectError> {
    let fs = ctx.sandbox.fs();
    let resolved = fs
        .resolve(&req.path, Last::Follow)
        .map_err(super::filesystem::path_error)?;
    match std::fs::metadata(&resolved.host) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConnectError::new(
            Code::NotFound,
            format!("path {} not found: {e}", resolved.virt),
        )),
        Err(e) => Err(ConnectError::new(
            Code::Internal,
            format!("error statting path {}: {e}", resolved.virt),
        )),
        Ok(meta) if !meta.is_dir() => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("path {} not a directory", resolved.virt),
        )),
        Ok(_) => Ok(Target {
            host: resolved.host,
            virt: resolved.virt,
            include_entry: req.include_entry,
            recursive: req.recursive,
            sandbox: ctx.sandbox.clone(),
        }),
    }
}

fn start_watch(target: &Target) -> Result<DirWatch, ConnectError> {
    DirWatch::new(&target.host, target.recursive).map_err(|e| {
        ConnectError::new(
            Code::Internal,
            format!("error adding path {} to watcher: {e}", target.virt),
        )
    })
}

/// The proto3 JSON `FilesystemEvent`, with the entry's `EntryInfo` when asked and it exists.
fn event_json(isolation: &Isolation, target: &Target, event: &FsEvent) -> Value {
    let mut json = json!({"name": event.name, "type": event.kind.wire_name()});
    if target.include_entry && event.kind.leaves_entry() {
        let host = target.host.join(&event.name);
        let virt = format!("{}/{}", target.virt.trim_end_matches('/'), event.name);
        if let Ok(entry) = super::filesystem::entry_info(isolation, &target.fs(), &host, &virt) {
            json["entry"] = entry;
        }
    }
    json
}

/// Serves `WatchDir`: `start`, then events as they happen, keepalives on silence, until the
/// client goes away or the request's deadline passes.
pub(crate) async fn watch_dir(ctx: Ctx, request: Request) -> Response {
    let (deadline, keepalive) = super::process::stream_timing(request.headers());
    let break_off = BreakOff::of(&request);
    let req: WatchRequest = match connect::read_stream_request(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let target = match target(&ctx, &req) {
        Ok(target) => target,
        Err(error) => return error.stream(),
    };
    let mut watch = match start_watch(&target) {
        Ok(watch) => watch,
        Err(error) => return error.stream(),
    };
    let mut pauses = ctx.sandbox.procs.pause_watch();
    let (tx, rx) = mpsc::channel::<Outgoing>(2);
    tokio::spawn(async move {
        let send = |frame: Bytes| tx.send(Outgoing::Frame(frame));
        if send(connect::frame(&json!({"start": {}}))).await.is_err() {
            return;
        }
        loop {
            let frame = tokio::select! {
                () = sleep_until_opt(deadline) => {
                    let error = ConnectError::new(Code::DeadlineExceeded, "context deadline exceeded");
                    let _ = send(connect::end_frame(Some(&error))).await;
                    return;
                }
                () = tx.closed() => return,
                // Gone with the paused VM's connections, as on E2B.
                () = pauses.paused() => {
                    let _ = tx.send(Outgoing::Cut).await;
                    return;
                }
                next = tokio::time::timeout(keepalive, watch.next()) => match next {
                    // Gone with its sandbox, as envd is: the response breaks off.
                    Err(_silence) if ctx.sandbox.procs.is_closed() => {
                        let _ = tx.send(Outgoing::Cut).await;
                        return;
                    }
                    Err(_silence) => connect::frame(&json!({"keepalive": {}})),
                    Ok(Ok(event)) => connect::frame(&json!({"filesystem": event_json(&ctx.app.isolation, &target, &event)})),
                    Ok(Err(error)) => {
                        let error = ConnectError::new(Code::Internal, error.to_string());
                        let _ = send(connect::end_frame(Some(&error))).await;
                        return;
                    }
                },
            };
            if send(frame).await.is_err() {
                return;
            }
        }
    });
    connect::stream_response(rx, break_off)
}

/// A polling watcher: its events so far, or why it stopped.
struct Polled {
    table: Weak<ProcessTable>,
    state: Arc<Mutex<PolledState>>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct PolledState {
    events: Vec<Value>,
    error: Option<String>,
}

static WATCHERS: LazyLock<Mutex<HashMap<String, Polled>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn watchers() -> std::sync::MutexGuard<'static, HashMap<String, Polled>> {
    WATCHERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Ends the watchers whose sandbox is gone or paused without its memory (a pause that
/// keeps it keeps envd's watchers too, as on E2B).
fn prune(all: &mut HashMap<String, Polled>) {
    all.retain(|_, polled| {
        let alive = polled
            .table
            .upgrade()
            .is_some_and(|table| !table.is_closed());
        if !alive {
            polled.task.abort();
        }
        alive
    });
}

/// The watcher `id` of this sandbox, or envd's not-found error.
fn find<'a>(
    all: &'a mut HashMap<String, Polled>,
    ctx: &Ctx,
    id: &str,
) -> Result<&'a Polled, ConnectError> {
    prune(all);
    all.get(id)
        .filter(|polled| std::ptr::eq(polled.table.as_ptr(), Arc::as_ptr(&ctx.sandbox.procs)))
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("watcher with id {id} not found")))
}

/// Serves the polling watcher RPCs.
pub(crate) async fn handle_polling(ctx: Ctx, method: &str, request: Request) -> Response {
    let result = match method {
        "CreateWatcher" => match connect::read_unary::<WatchRequest>(request).await {
            Ok(req) => create_watcher(&ctx, &req),
            Err(response) => return response,
        },
        "GetWatcherEvents" => match connect::read_unary::<WatcherIdRequest>(request).await {
            Ok(req) => get_events(&ctx, &req.watcher_id),
            Err(response) => return response,
        },
        _ => match connect::read_unary::<WatcherIdRequest>(request).await {
            Ok(req) => remove_watcher(&ctx, &req.watcher_id),
            Err(response) => return response,
        },
    };
    match result {
        Ok(value) => connect::unary_ok(&value),
        Err(error) => error.unary(),
    }
}

fn create_watcher(ctx: &Ctx, req: &WatchRequest) -> Result<Value, ConnectError> {
    let target = target(ctx, req)?;
    let mut watch = start_watch(&target)?;
    let id = format!("w{:016x}", rand::rng().random::<u64>());
    let state = Arc::new(Mutex::new(PolledState::default()));
    let table = Arc::downgrade(&ctx.sandbox.procs);
    // Not the Ctx: it holds the sandbox's table, which must be free to go with the sandbox.
    let isolation = Arc::clone(&ctx.app.isolation);
    let sink = Arc::clone(&state);
    let task = tokio::spawn(async move {
        loop {
            let next = watch.next().await;
            let mut state = sink.lock().unwrap_or_else(PoisonError::into_inner);
            match next {
                Ok(_) if state.events.len() >= POLLED_EVENTS => {
                    state.error = Some(format!(
                        "watcher error: more than {POLLED_EVENTS} events not yet fetched"
                    ));
                    return;
                }
                Ok(event) => state.events.push(event_json(&isolation, &target, &event)),
                Err(error) => {
                    state.error = Some(error.to_string());
                    return;
                }
            }
        }
    });
    let mut all = watchers();
    prune(&mut all);
    all.insert(
        id.clone(),
        Polled {
            table,
            state,
            task: task.abort_handle(),
        },
    );
    Ok(json!({"watcherId": id}))
}

fn get_events(ctx: &Ctx, id: &str) -> Result<Value, ConnectError> {
    let mut all = watchers();
    let polled = find(&mut all, ctx, id)?;
    let mut state = polled.state.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(error) = &state.error {
        return Err(ConnectError::new(Code::Internal, error.clone()));
    }
    Ok(json!({"events": std::mem::take(&mut state.events)}))
}

fn remove_watcher(ctx: &Ctx, id: &str) -> Result<Value, ConnectError> {
    let mut all = watchers();
    find(&mut all, ctx, id)?;
    if let Some(polled) = all.remove(id) {
        polled.task.abort();
    }
    Ok(json!({}))
}
