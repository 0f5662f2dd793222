//! `process.Process`: real processes per command, their output streamed as produced.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connect::{self, Code, ConnectError};
use super::{Ctx, de_opt_u32};
use crate::isolation::CommandSpec;
use crate::paths::{Last, SandboxFs};

/// Largest chunk of output in one `data` event (envd reads 32 KiB at a time).
pub(crate) const CHUNK: usize = 32 * 1024;

/// Finished processes kept per sandbox for late `Connect` calls.
const RETAINED: usize = 256;

/// After the main process exited, output still arriving this quickly is forwarded;
/// a pipe held open longer by a background child is abandoned.
const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// Events per subscriber buffered before the producer waits (backpressure).
const SUBSCRIBER_BUFFER: usize = 8;

/// The final state of a process, as envd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndInfo {
    pub(crate) exit_code: i32,
    pub(crate) exited: bool,
    pub(crate) status: String,
    pub(crate) error: Option<String>,
}

impl EndInfo {
    fn from_status(status: std::process::ExitStatus) -> EndInfo {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(0), _) => EndInfo {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            },
            (Some(code), _) => EndInfo {
                exit_code: code,
                exited: true,
                status: format!("exit status {code}"),
                error: Some(format!("exit status {code}")),
            },
            (None, signal) => {
                let text = format!("signal: {}", signal_name(signal.unwrap_or(0)));
                EndInfo {
                    exit_code: -1,
                    exited: false,
                    status: text.clone(),
                    error: Some(text),
                }
            }
        }
    }

    /// The proto3 JSON of the `end` event (defaults omitted).
    fn json(&self) -> serde_json::Value {
        let mut end = serde_json::Map::new();
        if self.exit_code != 0 {
            end.insert("exitCode".into(), json!(self.exit_code));
        }
        if self.exited {
            end.insert("exited".into(), json!(true));
        }
        end.insert("status".into(), json!(self.status));
        if let Some(error) = &self.error {
            end.insert("error".into(), json!(error));
        }
        json!({"event": {"end": end}})
    }
}

/// Go's names for the signals a process is likely to die of.
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        other => format!("signal {other}"),
    }
}

/// One event of a process stream.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    Stdout(Bytes),
    Stderr(Bytes),
    End(EndInfo),
}

impl Event {
    fn json(&self) -> serde_json::Value {
        match self {
            Event::Stdout(b) => json!({"event": {"data": {"stdout": STANDARD.encode(b)}}}),
            Event::Stderr(b) => json!({"event": {"data": {"stderr": STANDARD.encode(b)}}}),
            Event::End(end) => end.json(),
        }
    }
}

/// What List reports about a process.
#[derive(Clone, Debug)]
struct Config {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Proc {
    pid: u32,
    tag: Option<String>,
    config: Config,
    shared: Mutex<Shared>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
}

#[derive(Debug, Default)]
struct Shared {
    subscribers: Vec<mpsc::Sender<Event>>,
    end: Option<EndInfo>,
}

impl Proc {
    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Subscribes to future events; `Err(end)` when the process already finished.
    fn subscribe(&self) -> Result<mpsc::Receiver<Event>, EndInfo> {
        let mut shared = self.shared();
        if let Some(end) = &shared.end {
            return Err(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        shared.subscribers.push(tx);
        Ok(rx)
    }

    /// Delivers an event to every subscriber, waiting for slow ones (backpressure);
    /// subscribers that went away are forgotten.
    async fn broadcast(&self, event: Event) {
        let subscribers = self.shared().subscribers.clone();
        let mut gone = Vec::new();
        for (index, tx) in subscribers.iter().enumerate() {
            if tx.send(event.clone()).await.is_err() {
                gone.push(index);
            }
        }
        if !gone.is_empty() {
            self.shared().subscribers.retain(|tx| !tx.is_closed());
        }
    }
}

/// The processes of one sandbox.
#[derive(Debug)]
pub(crate) struct ProcessTable {
    sandbox_id: String,
    inner: Mutex<TableInner>,
}

#[derive(Debug, Default)]
struct TableInner {
    /// Set when the sandbox paused or died: no new process may start.
    closed: bool,
    running: HashMap<u32, Arc<Proc>>,
    finished: VecDeque<Arc<Proc>>,
}

/// Why a process could not be started.
#[derive(Debug)]
pub(crate) enum SpawnError {
    Closed,
    Io(std::io::Error),
}

impl ProcessTable {
    pub(crate) fn new(sandbox_id: &str) -> ProcessTable {
        ProcessTable {
            sandbox_id: sandbox_id.to_owned(),
            inner: Mutex::new(TableInner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses new processes and kills every process of the sandbox: each command's
    /// process group, plus any descendant that left it but still carries the
    /// sandbox's `E2B_SANDBOX_ID`.
    pub(crate) fn close_and_kill(&self) {
        let pids: Vec<u32> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.running.keys().copied().collect()
        };
        for pid in pids {
            let Ok(pid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        kill_tagged(&self.sandbox_id);
    }

    fn find(&self, selector: &Selector) -> Option<Arc<Proc>> {
        let inner = self.lock();
        let matches = |p: &&Arc<Proc>| match (selector.pid, &selector.tag) {
            (Some(pid), _) => p.pid == pid,
            (None, Some(tag)) => p.tag.as_deref() == Some(tag),
            (None, None) => false,
        };
        inner
            .running
            .values()
            .find(matches)
            .or_else(|| inner.finished.iter().rev().find(matches))
            .cloned()
    }

    fn find_running(&self, selector: &Selector) -> Option<Arc<Proc>> {
        self.find(selector)
            .filter(|p| self.lock().running.contains_key(&p.pid))
    }

    fn finish(&self, pid: u32) {
        let mut inner = self.lock();
        if let Some(proc) = inner.running.remove(&pid) {
            inner.finished.push_back(proc);
            while inner.finished.len() > RETAINED {
                inner.finished.pop_front();
            }
        }
    }

    /// Starts a process and subscribes to its events before any output is read.
    fn spawn(
        self: &Arc<Self>,
        mut command: tokio::process::Command,
        config: Config,
        tag: Option<String>,
        deadline: Option<Instant>,
    ) -> Result<(Arc<Proc>, mpsc::Receiver<Event>), SpawnError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(SpawnError::Closed);
        }
        // Spawned under the table lock so that a concurrent pause/kill either refuses
        // this process or sees it and kills it.
        let mut child = command.spawn().map_err(SpawnError::Io)?;
        let pid = child.id().unwrap_or(0);
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let proc = Arc::new(Proc {
            pid,
            tag,
            config,
            shared: Mutex::new(Shared {
                subscribers: vec![tx],
                end: None,
            }),
            stdin: tokio::sync::Mutex::new(child.stdin.take()),
        });
        inner.running.insert(pid, Arc::clone(&proc));
        drop(inner);
        tokio::spawn(supervise(
            Arc::clone(self),
            Arc::clone(&proc),
            child,
            deadline,
        ));
        Ok((proc, rx))
    }
}

/// Kills every process whose environment names this sandbox.
fn kill_tagged(sandbox_id: &str) {
    let needle = format!("E2B_SANDBOX_ID={sandbox_id}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
            && let Ok(pid) = i32::try_from(pid)
        {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Pumps a process's output to its subscribers until it ends, then reports the end.
async fn supervise(
    table: Arc<ProcessTable>,
    proc: Arc<Proc>,
    mut child: Child,
    deadline: Option<Instant>,
) {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut status = None;
    let mut deadline_fired = false;
    loop {
        if status.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        tokio::select! {
            result = child.wait(), if status.is_none() => {
                status = Some(result);
            }
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match read {
                Some(n) => proc.broadcast(Event::Stdout(Bytes::copy_from_slice(&out_buf[..n]))).await,
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match read {
                Some(n) => proc.broadcast(Event::Stderr(Bytes::copy_from_slice(&err_buf[..n]))).await,
                None => stderr = None,
            },
            () = sleep_until_opt(deadline), if !deadline_fired && status.is_none() => {
                deadline_fired = true;
                // envd cancels the command's context: SIGKILL to the process itself.
                if let Ok(pid) = i32::try_from(proc.pid) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid, libc::SIGKILL); }
                }
            }
            () = tokio::time::sleep(DRAIN_IDLE), if status.is_some() => break,
        }
    }
    let end = match status {
        Some(Ok(status)) => EndInfo::from_status(status),
        _ => EndInfo {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some("waiting for the process failed".into()),
        },
    };
    proc.stdin.lock().await.take();
    proc.shared().end = Some(end.clone());
    proc.broadcast(Event::End(end)).await;
    proc.shared().subscribers.clear();
    table.finish(proc.pid);
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    let reader = reader.as_mut()?;
    match reader.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
    pty: Option<serde_json::Value>,
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Selector {
    #[serde(default, deserialize_with = "de_opt_u32")]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

impl Selector {
    fn describe(&self) -> String {
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
struct InputMsg {
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
        "StreamInput" | "Update" => {
            let error = ConnectError::new(
                Code::Unimplemented,
                format!("process.Process/{method} is not implemented by e2b-local"),
            );
            let stream = connect::is_stream_request(request.headers());
            crate::app::drain(request).await;
            if stream {
                error.stream()
            } else {
                error.unary()
            }
        }
        _ => {
            crate::app::drain(request).await;
            ConnectError::new(
                Code::NotFound,
                format!("unknown method process.Process/{method}"),
            )
            .unary()
        }
    }
}

/// Reads the transport hints envd honours from the request headers.
fn stream_timing(headers: &http::HeaderMap) -> (Option<Instant>, Duration) {
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
    let user = ctx.user(request.headers());
    let req: StartRequest = match connect::read_stream_request(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let user = match user {
        Ok(user) => user,
        Err(error) => return error.stream(),
    };
    if req.pty.is_some() {
        return ConnectError::new(Code::Unimplemented, "pty is not supported by e2b-local")
            .stream();
    }
    let sandbox = &ctx.sandbox;
    let fs = SandboxFs {
        home: &sandbox.home,
        tmp: &sandbox.tmp,
    };
    let cwd_request = req.process.cwd.clone().unwrap_or_default();
    let (cwd_virtual, cwd_host) = match resolve_cwd(&ctx, &fs, &cwd_request) {
        Ok(pair) => pair,
        Err(error) => return error.stream(),
    };
    let spec = CommandSpec {
        sandbox_id: &sandbox.id,
        home: &sandbox.home,
        tmp: &sandbox.tmp,
        user,
        program: &req.process.cmd,
        args: &req.process.args,
        cwd_virtual: &cwd_virtual,
        cwd_host: &cwd_host,
        sandbox_envs: &sandbox.env_vars,
        request_envs: &req.process.envs,
        stdin: req.stdin.unwrap_or(false),
    };
    let command = match ctx.app.isolation.command(&spec) {
        Ok(command) => command,
        Err(e) => {
            return ConnectError::new(Code::Internal, format!("preparing command failed: {e}"))
                .stream();
        }
    };
    let config = Config {
        cmd: req.process.cmd.clone(),
        args: req.process.args.clone(),
        envs: req.process.envs.clone(),
        cwd: req.process.cwd.clone(),
    };
    let (proc, events) = match sandbox
        .procs
        .spawn(command, config, req.tag.clone(), deadline)
    {
        Ok(pair) => pair,
        Err(SpawnError::Closed) => {
            return ConnectError::new(
                Code::Unavailable,
                format!("sandbox {} is not running", sandbox.id),
            )
            .stream();
        }
        Err(SpawnError::Io(e)) => {
            return ConnectError::new(
                Code::Internal,
                format!("error starting process '{}': {e}", req.process.cmd),
            )
            .stream();
        }
    };
    tracing::debug!(sandbox_id = %sandbox.id, pid = proc.pid, "process started");
    stream_events(proc.pid, Ok(events), deadline, keepalive)
}

/// Maps a requested working directory; it must exist and be a directory.
fn resolve_cwd(
    ctx: &Ctx,
    fs: &SandboxFs<'_>,
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
            // Outside the sandbox areas the command sees the host's own tree.
            let host = std::path::PathBuf::from(&virt);
            if ctx.app.isolation_is_namespace() && host.is_dir() {
                Ok((virt, host))
            } else {
                Err(not_found())
            }
        }
        Err(other) => Err(ConnectError::new(Code::InvalidArgument, other.message())),
    }
}

/// Writes `start`, the events, keepalives on silence and the end-stream frame.
fn stream_events(
    pid: u32,
    events: Result<mpsc::Receiver<Event>, EndInfo>,
    deadline: Option<Instant>,
    keepalive: Duration,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        if tx
            .send(connect::frame(&json!({"event": {"start": {"pid": pid}}})))
            .await
            .is_err()
        {
            return;
        }
        let mut events = match events {
            Ok(events) => events,
            Err(end) => {
                let _ = tx.send(connect::frame(&Event::End(end).json())).await;
                let _ = tx.send(connect::end_frame(None)).await;
                return;
            }
        };
        loop {
            let next = tokio::select! {
                () = sleep_until_opt(deadline) => {
                    let error = ConnectError::new(Code::DeadlineExceeded, "context deadline exceeded");
                    let _ = tx.send(connect::end_frame(Some(&error))).await;
                    return;
                }
                next = tokio::time::timeout(keepalive, events.recv()) => next,
            };
            let frame = match next {
                Err(_silence) => connect::frame(&json!({"event": {"keepalive": {}}})),
                Ok(Some(event)) => {
                    let last = matches!(event, Event::End(_));
                    if tx.send(connect::frame(&event.json())).await.is_err() {
                        return;
                    }
                    if last {
                        break;
                    }
                    continue;
                }
                // The process table dropped us without an end (should not happen).
                Ok(None) => break,
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        let _ = tx.send(connect::end_frame(None)).await;
    });
    connect::stream_response(rx)
}

async fn connect_rpc(ctx: Ctx, request: Request) -> Response {
    let (deadline, keepalive) = stream_timing(request.headers());
    let req: SelectorRequest = match connect::read_stream_request(request).await {
        Ok(req) => req,
        Err(response) => return response,
    };
    let Some(proc) = ctx.sandbox.procs.find(&req.process) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).stream();
    };
    stream_events(proc.pid, proc.subscribe(), deadline, keepalive)
}

fn list(ctx: &Ctx) -> Response {
    let inner = ctx.sandbox.procs.lock();
    let mut procs: Vec<&Arc<Proc>> = inner.running.values().collect();
    procs.sort_by_key(|p| p.pid);
    let processes: Vec<serde_json::Value> = procs
        .iter()
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
    let Some(proc) = ctx.sandbox.procs.find_running(&req.process) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).unary();
    };
    let Ok(pid) = i32::try_from(proc.pid) else {
        return ConnectError::new(Code::Internal, "pid out of range").unary();
    };
    // The single pid only, like envd: children of the command survive.
    // SAFETY: kill has no memory-safety preconditions.
    let result = unsafe { libc::kill(pid, signal) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        return ConnectError::new(
            Code::Internal,
            format!("error sending signal to pid {pid}: {error}"),
        )
        .unary();
    }
    connect::unary_ok(&json!({}))
}

async fn send_input(ctx: &Ctx, req: SendInputRequest) -> Response {
    let Some(proc) = ctx.sandbox.procs.find_running(&req.process) else {
        return ConnectError::new(Code::NotFound, req.process.describe()).unary();
    };
    if req.input.pty.is_some() {
        return ConnectError::new(Code::FailedPrecondition, "process has no pty").unary();
    }
    let data = match STANDARD.decode(req.input.stdin.unwrap_or_default()) {
        Ok(data) => data,
        Err(e) => {
            return ConnectError::new(Code::InvalidArgument, format!("invalid stdin bytes: {e}"))
                .unary();
        }
    };
    let mut stdin = proc.stdin.lock().await;
    let Some(pipe) = stdin.as_mut() else {
        return ConnectError::new(Code::Internal, "stdin not enabled or closed").unary();
    };
    if let Err(e) = pipe.write_all(&data).await {
        return ConnectError::new(Code::Internal, format!("error writing to stdin: {e}")).unary();
    }
    connect::unary_ok(&json!({}))
}

async fn close_stdin(ctx: &Ctx, selector: &Selector) -> Response {
    let Some(proc) = ctx.sandbox.procs.find(selector) else {
        return ConnectError::new(Code::NotFound, selector.describe()).unary();
    };
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
        let ok = EndInfo::from_status(std::process::ExitStatus::from_raw(0)).json();
        assert_eq!(
            ok,
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        let three = EndInfo::from_status(std::process::ExitStatus::from_raw(3 << 8)).json();
        assert_eq!(
            three,
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"}}})
        );
        let killed = EndInfo::from_status(std::process::ExitStatus::from_raw(libc::SIGKILL)).json();
        assert_eq!(
            killed,
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}}})
        );
    }
}
