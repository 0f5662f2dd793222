//! `process.Process`: the Connect RPCs over the sandbox's process table, and the
//! proto3 JSON of process events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connect::{self, BreakOff, Code, ConnectError, Outgoing, de_opt_u32};
use super::ctx::Ctx;
use crate::isolation::{CommandSpec, CommandStdio, EgressSpec, SystemView};
use crate::paths::{Last, SandboxFs};
use crate::process_table::{
    EndInfo, Event, Listing, PauseWatch, Proc, ProcConfig, ProcessTable, SpawnError,
    sleep_until_opt,
};
use crate::pty::{self, TermSize};

/// The proto3 JSON of the `end` event (defaults omitted).
fn end_json(end: &EndInfo) -> serde_json::Value {
    let mut json_end = serde_json::Map::new();
    if end.exit_code != 0 {
        json_end.insert("exitCode".into(), json!(end.exit_code));
    }
    if end.exited {
        json_end.insert("exited".into(), json!(true));
    }
    json_end.insert("status".into(), json!(end.status));
    if let Some(error) = &end.error {
        json_end.insert("error".into(), json!(error));
    }
    json!({"event": {"end": json_end}})
}

/// The proto3 JSON of one event; `None` for the sandbox's death, which has none.
fn event_json(event: &Event) -> Option<serde_json::Value> {
    Some(match event {
        Event::Stdout(b) => json!({"event": {"data": {"stdout": STANDARD.encode(b)}}}),
        Event::Stderr(b) => json!({"event": {"data": {"stderr": STANDARD.encode(b)}}}),
        Event::Pty(b) => json!({"event": {"data": {"pty": STANDARD.encode(b)}}}),
        Event::End(end) => end_json(end),
        Event::SandboxGone => return None,
    })
}

// ---- messages -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct ProcessConfigMsg {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfigMsg,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
    #[serde(default)]
    pty: Option<PtyMsg>,
}

/// `PTY`: a terminal of `size` (a missing size, or a missing field, is 0 as in proto3).
#[derive(Debug, Default, Deserialize)]
struct PtyMsg {
    #[serde(default)]
    size: Option<PtySizeMsg>,
}

#[derive(Debug, Default, Deserialize)]
struct PtySizeMsg {
    #[serde(default, deserialize_with = "de_opt_u32")]
    cols: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_u32")]
    rows: Option<u32>,
}

impl PtyMsg {
    /// The size as the kernel stores it (envd truncates to 16 bits the same way).
    fn size(&self) -> TermSize {
        let size = self.size.as_ref();
        let cell = |v: Option<u32>| u16::try_from(v.unwrap_or(0) & 0xffff).unwrap_or(u16::MAX);
        TermSize {
            cols: cell(size.and_then(|s| s.cols)),
            rows: cell(size.and_then(|s| s.rows)),
        }
    }
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    pty: Option<PtyMsg>,
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Selector {
    #[serde(default, deserialize_with = "de_opt_u32")]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

impl Selector {
    fn find(&self, table: &ProcessTable) -> Option<Arc<Proc>> {
        table.find(self.pid, self.tag.as_deref())
    }

    pub(super) fn find_running(&self, table: &ProcessTable) -> Option<Arc<Proc>> {
        table.find_running(self.pid, self.tag.as_deref())
    }

    pub(super) fn describe(&self) -> String {
        match (self.pid, &self.tag) {
            (Some(pid), _) => format!("process with pid {pid} not found"),
            (None, Some(tag)) => format!("process with tag {tag} not found"),
            (None, None) => "process selector is empty".to_owned(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct SelectorRequest {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: serde_json::Value,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct InputMsg {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: InputMsg,
}

// ---- handlers -------------------------------------------------------------------

/// Serves `/process.Process/<method>`.
pub(crate) async fn handle(ctx: Ctx, method: &str, request: Request) -> Response {
    match method {
        "Start" => start(ctx, request).await,
        "Connect" => connect_rpc(ctx, request).await,
        "List" => match connect::read_unary::<serde_json::Value>(request).await {
            Ok(_) => list(&ctx),
            Err(response) => response,
        },
        "SendSignal" => match connect::read_unary::<SendSignalRequest>(request).await {
            Ok(req) => send_signal(&ctx, &req),
            Err(response) => response,
        },
        "SendInput" => match connect::read_unary::<SendInputRequest>(request).await {
            Ok(req) => send_input(&ctx, req).await,
            Err(response) => response,
        },
        "CloseStdin" => match connect::read_unary::<SelectorRequest>(request).await {
            Ok(req) => close_stdin(&ctx, &req.process).await,
            Err(response) => response,
        },
        "Update" => match connect::read_unary::<UpdateRequest>(request).await {
            Ok(req) => update(&ctx, &req),
            Err(response) => response,
        },
        _ => ConnectError::new(
            Code::NotFound,
            format!("unknown method process.Process/{method}"),
        )
        .unary(),
    }
}

/// Reads the transport hints envd honours from the request headers.
pub(super) fn stream_timing(headers: &http::HeaderMap) -> (Option<Instant>, Duration) {
    let header_u64 = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let deadline = header_u64("connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let keepalive = header_u64("keepalive-ping-interval")
        .filter(|s| *s > 0)
        .map_or(Duration::from_secs(90), Duration::from_secs);
    (deadline, keepalive)
}

async fn start(ctx: Ctx, request: Request) -> Response {
    let (deadline, keepalive) = stream_timing(request.headers());
    let break_off = BreakOff::of(&request);
    let user = ctx.user(request.headers());
    let req: StartRequest = match connect::read_stream_request(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let user = match user {
        Ok(user) => user,
        Err(error) => return error.stream(),
    };
    let terminal = match req
        .pty
        .as_ref()
        .map(|pty| pty::open(pty.size()))
        .transpose()
    {
        Ok(terminal) => terminal,
        Err(e) => {
            return ConnectError::new(
                Code::InvalidArgument,
                format!("error starting pty with command '{}': {e}", req.process.cmd),
            )
            .stream();
        }
    };
    // Before the spawn: a pause from then on breaks the stream off.
    let pauses = ctx.sandbox.procs.pause_watch();
    let launched = launch(
        &ctx,
        Launch {
            user,
            cmd: &req.process.cmd,
            args: &req.process.args,
            envs: &req.process.envs,
            cwd: req.process.cwd.as_deref(),
            tag: req.tag.clone(),
            stdin: req.stdin.unwrap_or(false),
            terminal,
            deadline,
            listing: Listing::Listed,
        },
    );
    let (proc, events) = match launched {
        Ok(pair) => pair,
        Err(error) => return error.stream(),
    };
    tracing::debug!(sandbox_id = %ctx.sandbox.id, pid = proc.pid, "process started");
    stream_events(proc.pid, Ok(events), pauses, deadline, keepalive, break_off)
}

/// What [`launch`] starts: a process of the sandbox, as `Start` describes one.
pub(crate) struct Launch<'a> {
    pub(crate) user: crate::isolation::SandboxUser,
    pub(crate) cmd: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) envs: &'a BTreeMap<String, String>,
    pub(crate) cwd: Option<&'a str>,
    pub(crate) tag: Option<String>,
    /// Whether its stdin is a pipe the server writes (else /dev/null).
    pub(crate) stdin: bool,
    pub(crate) terminal: Option<(crate::pty::PtyMaster, std::os::fd::OwnedFd)>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) listing: Listing,
}

/// Starts a process in the sandbox (its user, working directory, namespaces and egress
/// filter), as envd's `Start` does; the code-interpreter's kernels start here too.
pub(crate) fn launch(
    ctx: &Ctx,
    launch: Launch<'_>,
) -> Result<(Arc<Proc>, mpsc::Receiver<Event>), ConnectError> {
    let sandbox = &ctx.sandbox;
    let fs = sandbox.fs();
    // A built template's working directory is the default of a request naming none.
    let cwd_request = launch
        .cwd
        .or_else(|| sandbox.defaults.as_ref()?.workdir.as_deref())
        .unwrap_or_default();
    let (cwd_virtual, cwd_host) = resolve_cwd(ctx, &fs, &sandbox.system, cwd_request)?;
    // A sandbox with egress rules starts every command under the filter (crate::egress).
    let egress = sandbox.procs.egress();
    let handoff = match (&egress, &ctx.app.egress) {
        (Some(_), Some(_)) => match crate::egress::Handoff::new() {
            Ok(handoff) => Some(handoff),
            Err(e) => {
                return Err(ConnectError::new(
                    Code::Internal,
                    format!("preparing egress filter failed: {e}"),
                ));
            }
        },
        (Some(_), None) => {
            return Err(ConnectError::new(
                Code::Unavailable,
                format!(
                    "sandbox {} has egress rules this host cannot enforce",
                    sandbox.id
                ),
            ));
        }
        (None, _) => None,
    };
    let spec = CommandSpec {
        sandbox_id: &sandbox.id,
        home: &sandbox.home,
        virt_home: sandbox.virt_home,
        tmp: &sandbox.tmp,
        user: launch.user,
        program: launch.cmd,
        args: launch.args,
        cwd_virtual: &cwd_virtual,
        cwd_host: &cwd_host,
        sandbox_envs: &sandbox.env_vars,
        request_envs: launch.envs,
        stdio: match &launch.terminal {
            Some((_, slave)) => CommandStdio::Terminal(slave),
            None => CommandStdio::Pipes {
                stdin: launch.stdin,
            },
        },
        own_pid_namespace: sandbox.procs.own_pid_namespace(),
        volumes: &sandbox.volumes,
        egress: handoff.as_ref().map(|handoff| EgressSpec {
            handoff: handoff.child_end(),
            resolv_conf: ctx
                .app
                .egress
                .as_ref()
                .and_then(|e| e.resolv_conf.as_deref()),
        }),
        trust: ctx.app.egress.as_ref().map(|e| &e.trust),
        boot_id: Some(&sandbox.boot_id),
        system: &sandbox.system,
    };
    let command =
        ctx.app.isolation.command(&spec).map_err(|e| {
            ConnectError::new(Code::Internal, format!("preparing command failed: {e}"))
        })?;
    let config = ProcConfig {
        cmd: launch.cmd.to_owned(),
        args: launch.args.to_vec(),
        envs: launch.envs.clone(),
        cwd: launch.cwd.map(str::to_owned),
        listing: launch.listing,
    };
    // The slave stays open here until the command has been spawned (and dropped with it):
    // from then on only the process holds it, so the master reads EOF when it is gone.
    let (master, _slave) = launch.terminal.unzip();
    let (proc, events) = match sandbox.procs.spawn(
        command,
        config,
        launch.tag,
        master,
        launch.deadline,
        egress.as_ref(),
    ) {
        Ok(pair) => pair,
        Err(SpawnError::Closed) => {
            return Err(ConnectError::new(
                Code::Unavailable,
                format!("sandbox {} is not running", sandbox.id),
            ));
        }
        Err(SpawnError::Io(e)) => {
            return Err(ConnectError::new(
                Code::Internal,
                format!("error starting process '{}': {e}", launch.cmd),
            ));
        }
    };
    if let (Some(handoff), Some(policy), Some(machinery)) = (handoff, egress, &ctx.app.egress)
        && let Err(e) = handoff.supervise(policy, Arc::clone(&machinery.proxy))
    {
        // Its connects would wait forever on a listener nobody serves.
        if let Ok(pid) = i32::try_from(proc.host_pid) {
            // SAFETY: kill has no memory-safety preconditions; the pid is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        return Err(ConnectError::new(
            Code::Internal,
            format!("starting the egress filter of '{}' failed: {e}", launch.cmd),
        ));
    }
    Ok((proc, events))
}

/// Maps a requested working directory; it must exist and be a directory.
fn resolve_cwd(
    ctx: &Ctx,
    fs: &SandboxFs<'_>,
    system: &SystemView,
    cwd: &str,
) -> Result<(String, std::path::PathBuf), ConnectError> {
    let not_found =
        || ConnectError::new(Code::InvalidArgument, format!("cwd '{cwd}' does not exist"));
    match fs.resolve(cwd, Last::Follow) {
        Ok(resolved) => {
            if resolved.host.is_dir() {
                Ok((resolved.virt, resolved.host))
            } else {
                Err(not_found())
            }
        }
        Err(crate::paths::PathError::Outside(virt)) => {
            // Outside the sandbox areas the command sees the host's own tree, under the
            // sandbox's layer when it has one.
            let host = std::path::PathBuf::from(&virt);
            let is_dir = match system {
                SystemView::Layered(layer) => layer.is_dir(&virt),
                SystemView::Shared | SystemView::ReadOnly => host.is_dir(),
            };
            if ctx.app.isolation_is_namespace() && is_dir {
                Ok((virt, host))
            } else {
                Err(not_found())
            }
        }
        Err(other) => Err(ConnectError::new(Code::InvalidArgument, other.message())),
    }
}

/// Writes `start`, the events, keepalives on silence and the end-stream frame; breaks the
/// response off instead when the sandbox dies under the process (envd dies with it) or
/// pauses (envd's connections go with the paused VM; the process lives on, frozen).
fn stream_events(
    pid: u32,
    events: Result<mpsc::Receiver<Event>, EndInfo>,
    mut pauses: PauseWatch,
    deadline: Option<Instant>,
    keepalive: Duration,
    break_off: BreakOff,
) -> Response {
    let (tx, rx) = mpsc::channel::<Outgoing>(2);
    tokio::spawn(async move {
        let send = |frame: Bytes| tx.send(Outgoing::Frame(frame));
        if send(connect::frame(&json!({"event": {"start": {"pid": pid}}})))
            .await
            .is_err()
        {
            return;
        }
        let mut events = match events {
            Ok(events) => events,
            Err(end) => {
                let _ = send(connect::frame(&end_json(&end))).await;
                let _ = send(connect::end_frame(None)).await;
                return;
            }
        };
        loop {
            let next = tokio::select! {
                () = sleep_until_opt(deadline) => {
                    let error = ConnectError::new(Code::DeadlineExceeded, "context deadline exceeded");
                    let _ = send(connect::end_frame(Some(&error))).await;
                    return;
                }
                () = pauses.paused() => {
                    // Unsubscribed first: after the resume the process's output must not
                    // wait for a client that may never read this response again.
                    drop(events);
                    let _ = tx.send(Outgoing::Cut).await;
                    return;
                }
                next = tokio::time::timeout(keepalive, events.recv()) => next,
            };
            let frame = match next {
                Err(_silence) => connect::frame(&json!({"event": {"keepalive": {}}})),
                Ok(Some(event)) => {
                    let Some(json) = event_json(&event) else {
                        let _ = tx.send(Outgoing::Cut).await;
                        return;
                    };
                    if send(connect::frame(&json)).await.is_err() {
                        return;
                    }
                    if matches!(event, Event::End(_)) {
                        break;
                    }
                    continue;
                }
                // The process table dropped us without an end (should not happen).
                Ok(None) => break,
            };
            if send(frame).await.is_err() {
                return;
            }
        }
        let _ = send(connect::end_frame(None)).await;
    });
    connect::stream_response(rx, break_off)
}

async fn connect_rpc(ctx: Ctx, request: Request) -> Response {
    let (deadline, keepalive) = stream_timing(request.headers());
    let break_off = BreakOff::of(&request);
    let req: SelectorRequest = match connect::read_stream_request(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let Some(proc) = req.process.find(&ctx.sandbox.procs) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).stream();
    };
    let pauses = ctx.sandbox.procs.pause_watch();
    stream_events(
        proc.pid,
        proc.subscribe(),
        pauses,
        deadline,
        keepalive,
        break_off,
    )
}

fn list(ctx: &Ctx) -> Response {
    let procs = ctx.sandbox.procs.running();
    let processes: Vec<serde_json::Value> = procs
        .iter()
        .filter(|p| p.config.listing == Listing::Listed)
        .map(|p| {
            let mut config =
                json!({"cmd": p.config.cmd, "args": p.config.args, "envs": p.config.envs});
            if let Some(cwd) = &p.config.cwd {
                config["cwd"] = json!(cwd);
            }
            let mut info = json!({"config": config, "pid": p.pid});
            if let Some(tag) = &p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    connect::unary_ok(&json!({"processes": processes}))
}

fn send_signal(ctx: &Ctx, req: &SendSignalRequest) -> Response {
    let signal = match &req.signal {
        serde_json::Value::String(s) if s == "SIGNAL_SIGKILL" => libc::SIGKILL,
        serde_json::Value::String(s) if s == "SIGNAL_SIGTERM" => libc::SIGTERM,
        serde_json::Value::Number(n) if n.as_i64() == Some(9) => libc::SIGKILL,
        serde_json::Value::Number(n) if n.as_i64() == Some(15) => libc::SIGTERM,
        other => {
            return ConnectError::new(Code::Unimplemented, format!("invalid signal: {other}"))
                .unary();
        }
    };
    let Some(proc) = req.process.find_running(&ctx.sandbox.procs) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).unary();
    };
    let Ok(pid) = i32::try_from(proc.host_pid) else {
        return ConnectError::new(Code::Internal, "pid out of range").unary();
    };
    // The single pid only, like envd: children of the command survive.
    // SAFETY: kill has no memory-safety preconditions.
    let result = unsafe { libc::kill(pid, signal) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        return ConnectError::new(
            Code::Internal,
            format!("error sending signal to pid {}: {error}", proc.pid),
        )
        .unary();
    }
    connect::unary_ok(&json!({}))
}

async fn send_input(ctx: &Ctx, req: SendInputRequest) -> Response {
    let Some(proc) = req.process.find_running(&ctx.sandbox.procs) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).unary();
    };
    match write_input(&proc, &req.input).await {
        Ok(()) => connect::unary_ok(&json!({})),
        Err(error) => error.unary(),
    }
}

/// Writes one `ProcessInput` (base64 bytes for the terminal or for stdin) to `proc`, with
/// envd's errors (`SendInput` and `StreamInput` share it).
pub(super) async fn write_input(proc: &Proc, input: &InputMsg) -> Result<(), ConnectError> {
    if let Some(bytes) = &input.pty {
        return write_tty(proc, bytes).await;
    }
    if proc.tty.is_some() {
        return Err(ConnectError::new(
            Code::Internal,
            "error writing to stdin: tty assigned to process — input should be written to the pty, not the stdin",
        ));
    }
    let data = STANDARD
        .decode(input.stdin.as_deref().unwrap_or_default())
        .map_err(|e| {
            ConnectError::new(Code::InvalidArgument, format!("invalid stdin bytes: {e}"))
        })?;
    let mut stdin = proc.stdin.lock().await;
    let Some(pipe) = stdin.as_mut() else {
        return Err(ConnectError::new(
            Code::Internal,
            "stdin not enabled or closed",
        ));
    };
    pipe.write_all(&data)
        .await
        .map_err(|e| ConnectError::new(Code::Internal, format!("error writing to stdin: {e}")))
}

/// Types `input` (base64) on the process's terminal.
async fn write_tty(proc: &Proc, input: &str) -> Result<(), ConnectError> {
    let Some(tty) = &proc.tty else {
        return Err(ConnectError::new(
            Code::Internal,
            "error writing to tty: tty not assigned to process — input should be written to the stdin, not the tty",
        ));
    };
    let data = STANDARD
        .decode(input)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("invalid pty bytes: {e}")))?;
    tty.write_all(&data).await.map_err(|e| {
        ConnectError::new(
            Code::Internal,
            format!(
                "error writing to tty: error writing to tty of process '{}': {e}",
                proc.pid
            ),
        )
    })
}

/// `Update`: resizes the process's terminal (nothing else can be updated).
fn update(ctx: &Ctx, req: &UpdateRequest) -> Response {
    let Some(proc) = req.process.find_running(&ctx.sandbox.procs) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).unary();
    };
    let Some(pty) = &req.pty else {
        return connect::unary_ok(&json!({}));
    };
    let resized = match &proc.tty {
        Some(tty) => tty.resize(pty.size()).map_err(|e| e.to_string()),
        None => Err("tty not assigned to process".to_owned()),
    };
    match resized {
        Ok(()) => connect::unary_ok(&json!({})),
        Err(e) => ConnectError::new(Code::Internal, format!("error resizing tty: {e}")).unary(),
    }
}

async fn close_stdin(ctx: &Ctx, selector: &Selector) -> Response {
    let Some(proc) = selector.find(&ctx.sandbox.procs) else {
        return ConnectError::new(Code::NotFound, selector.describe()).unary();
    };
    if proc.tty.is_some() {
        return ConnectError::new(
            Code::Unknown,
            "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
        )
        .unary();
    }
    proc.stdin.lock().await.take();
    connect::unary_ok(&json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn end_events_match_envd() {
        // contract: L6 (a killed command reports -1 / "signal: killed")
        let ok = end_json(&EndInfo::from_status(std::process::ExitStatus::from_raw(0)));
        assert_eq!(
            ok,
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        let three = end_json(&EndInfo::from_status(std::process::ExitStatus::from_raw(
            3 << 8,
        )));
        assert_eq!(
            three,
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"}}})
        );
        let killed = end_json(&EndInfo::from_status(std::process::ExitStatus::from_raw(
            libc::SIGKILL,
        )));
        assert_eq!(
            killed,
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}}})
        );
    }
}
