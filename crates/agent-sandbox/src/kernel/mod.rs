//! The session kernel: Python cells run in one long-lived interpreter in the sandbox, a live
//! process, so state survives from cell to cell, and a cell's calls to the host travel on the
//! same process's stdin and output, authenticated.
//!
//! [`Backend::start_kernel`](crate::Backend::start_kernel) starts one (any template with
//! `python3`; no Jupyter): a live process running a bootstrap that reads the runner, the key
//! and the frame marker from its stdin (never from its command line or environment, which
//! other processes of the sandbox can read). [`Kernel::run_cell`] sends a cell (one request)
//! and reads its result as it streams back; a call the cell makes (`agent_sandbox_kernel.call`)
//! is answered by the caller's [`CellHost`] on the calling thread, and its answer goes back
//! (one request). Nothing polls. A cell past its time, or interrupted, kills the kernel: there
//! is no safe way to stop one cell in place, and its state is lost ([`CellStatus::Timeout`]).

mod frames;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::command::Shell;
use crate::error::Error;
use crate::live::{LiveEnd, LiveHost, LiveOptions, LiveProcess, LiveRead, LiveSignal};
use frames::{Decoder, Key, Piece};

/// The runner's source: exec'd by the bootstrap with the first message as `BOOT`.
const RUNNER: &str = include_str!("runner.py");

/// The bootstrap on the kernel's command line: reads `<length>\n<json>` from stdin without
/// reading past it (the protocol's messages follow), then execs the runner.
const BOOTSTRAP: &str = r"import os,json
n=b''
while not n.endswith(b'\n'):
    c=os.read(0,1)
    if not c or len(n)>20: raise SystemExit(3)
    n+=c
size=int(n);d=bytearray()
while len(d)<size:
    c=os.read(0,size-len(d))
    if not c: raise SystemExit(3)
    d+=c
BOOT=json.loads(bytes(d))
exec(compile(BOOT['runner'],'<agent-sandbox-kernel>','exec'),{'BOOT':BOOT,'__name__':'agent_sandbox_runner'})
";

/// How long a kernel may take to start (its interpreter, the runner, the modules).
const START_WAIT: Duration = Duration::from_secs(60);

/// How often a waiting cell asks its host whether it was interrupted.
const INTERRUPT_CHECK: Duration = Duration::from_millis(100);

/// How long a killed kernel's end is waited for.
const KILL_WAIT: Duration = Duration::from_secs(20);

/// The largest frame read from a kernel (a call's arguments: a file being written).
const MAX_FRAME: usize = 64 << 20;

/// How to start a kernel. Build with [`KernelOptions::new`]; there is no `Default`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOptions {
    /// The interpreter (`python3`), looked up on the sandbox's `PATH`.
    pub python: String,
    /// Working directory; `None` uses the configured `cwd`, else the sandbox user's home.
    pub cwd: Option<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Modules importable by cells, by name: their source. A module's calls to the host go
    /// through `agent_sandbox_kernel.call(name, args)`.
    pub modules: BTreeMap<String, String>,
    /// What a cell's `print` output (characters) keeps at most; the rest is clipped.
    pub stdout_cap: usize,
    /// What a cell's `sys.stderr` output keeps at most.
    pub stderr_cap: usize,
    /// What a cell's output at the file-descriptor level (a subprocess's) keeps at most.
    pub raw_cap: usize,
    /// How long the kernel waits for its next cell before it exits by itself (a host that
    /// went away leaves nothing running for long).
    pub idle_exit: Duration,
}

impl KernelOptions {
    /// `python`, 50 000 characters of stdout and 10 000 of stderr kept per cell (Hermes'
    /// caps), 50 000 bytes of descriptor-level output, 30 minutes idle before it exits.
    pub fn new(python: impl Into<String>) -> KernelOptions {
        KernelOptions {
            python: python.into(),
            cwd: None,
            env: BTreeMap::new(),
            modules: BTreeMap::new(),
            stdout_cap: 50_000,
            stderr_cap: 10_000,
            raw_cap: 50_000,
            idle_exit: Duration::from_secs(1800),
        }
    }
}

/// What answers a running cell: its calls, and whether it should stop.
pub trait CellHost {
    /// The cell called `name` with `args` (JSON text); the answer (text) goes back to the
    /// cell, or an error, which the call raises there.
    fn call(&mut self, name: &str, args: &str) -> Result<String, String>;
    /// Whether the cell should stop now (asked every 100 ms while it runs).
    fn interrupted(&mut self) -> bool;
}

/// How a cell ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CellStatus {
    /// It ran to its end.
    Ok,
    /// It raised: [`CellOutcome::traceback`].
    Error,
    /// It called `sys.exit()`: the kernel ended with it.
    Exit,
    /// It ran past its time: the kernel was killed, its state lost.
    Timeout,
    /// Its host interrupted it: the kernel was killed, its state lost.
    Interrupted,
    /// The kernel ended while it ran (it was killed, or its sandbox restarted): state lost.
    Ended(LiveEnd),
}

/// What a cell produced.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CellOutcome {
    /// How it ended.
    pub status: CellStatus,
    /// What it printed (clipped at [`KernelOptions::stdout_cap`]).
    pub stdout: String,
    /// Whether `stdout` was clipped.
    pub stdout_clipped: bool,
    /// What it wrote to `sys.stderr`.
    pub stderr: String,
    /// Whether `stderr` was clipped.
    pub stderr_clipped: bool,
    /// The traceback of an [`CellStatus::Error`] (or the `SystemExit` of an exit).
    pub traceback: String,
    /// Output written at the file-descriptor level while it ran (a subprocess's), lossy
    /// UTF-8, clipped at [`KernelOptions::raw_cap`] bytes.
    pub raw: String,
    /// The kernel's count of cells run, this one included (0 when it did not report one).
    pub execution_count: u64,
    /// How many calls the cell made that were answered.
    pub calls: u32,
}

impl CellOutcome {
    fn lost(status: CellStatus, raw: &[u8], calls: u32) -> CellOutcome {
        CellOutcome {
            status,
            stdout: String::new(),
            stdout_clipped: false,
            stderr: String::new(),
            stderr_clipped: false,
            traceback: String::new(),
            raw: String::from_utf8_lossy(raw).into_owned(),
            execution_count: 0,
            calls,
        }
    }
}

/// A session kernel in the sandbox. `Send + Sync`; one cell runs at a time (a second caller
/// waits).
pub struct Kernel {
    process: LiveProcess,
    key: Key,
    host: Weak<dyn LiveHost>,
    raw_cap: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    decoder: Decoder,
    cells: u64,
    ended: Option<LiveEnd>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// Sends the bootstrap message and waits for the runner's first frame.
    pub(crate) fn start(
        process: LiveProcess,
        host: Weak<dyn LiveHost>,
        key: [u8; 32],
        marker: String,
        options: &KernelOptions,
    ) -> Result<Kernel, Error> {
        let key = Key::new(key);
        let boot = json!({
            "key": key.hex(),
            "marker": marker,
            "runner": RUNNER,
            "modules": options.modules,
            "caps": [options.stdout_cap, options.stderr_cap],
            "idle_exit": options.idle_exit.as_secs_f64(),
        });
        let body = boot.to_string();
        let mut message = format!("{}\n", body.len()).into_bytes();
        message.extend_from_slice(body.as_bytes());
        let kernel = Kernel {
            process,
            key: key.clone(),
            host,
            raw_cap: options.raw_cap,
            inner: Mutex::new(Inner {
                decoder: Decoder::new(key, &marker, MAX_FRAME),
                cells: 0,
                ended: None,
            }),
        };
        kernel.process.write(&message)?;
        let deadline = Instant::now() + START_WAIT;
        let mut inner = kernel.lock();
        let mut early = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(inner);
                let _ = kernel.process.signal(LiveSignal::Kill);
                return Err(kernel.unavailable("it did not start within 60 s", &early));
            }
            match kernel.process.read(left.min(INTERRUPT_CHECK)) {
                LiveRead::Output(bytes) => {
                    for piece in inner.decoder.push(&bytes) {
                        match piece {
                            Piece::Output(bytes) => keep(&mut early, &bytes, 4096),
                            Piece::Frame(frame) if frame.get("ready").is_some() => {
                                drop(inner);
                                return Ok(kernel);
                            }
                            Piece::Frame(_) => {}
                        }
                    }
                }
                LiveRead::Ended(end) => {
                    inner.ended = Some(end);
                    drop(inner);
                    return Err(kernel.unavailable("it ended before it was ready", &early));
                }
                _ => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unavailable(&self, what: &str, output: &[u8]) -> Error {
        let said = String::from_utf8_lossy(output);
        let said = said.trim();
        Error::KernelUnavailable {
            sandbox_id: self.process.sandbox_id().to_owned(),
            reason: if said.is_empty() {
                what.to_owned()
            } else {
                format!("{what}: {}", e2b_client::redact(said))
            },
        }
    }

    /// The live process the kernel runs in.
    pub fn process(&self) -> &LiveProcess {
        &self.process
    }

    /// Whether the kernel is known to have ended.
    pub fn is_ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    /// Runs `code` as the next cell, giving it `timeout` (the sandbox's lease is made to
    /// cover it, as for a command). The cell's calls are answered by `host` on this thread.
    /// `Err` when the cell could not be sent: the kernel is gone (its sandbox restarted or
    /// was replaced, [`Error::is_live_process_lost`]); the cell did not run.
    pub fn run_cell(
        &self,
        code: &str,
        timeout: Duration,
        host: &mut dyn CellHost,
    ) -> Result<CellOutcome, Error> {
        let mut inner = self.lock();
        if let Some(end) = inner.ended.clone() {
            return Err(self.gone(end));
        }
        // Output from between cells belongs to no cell.
        self.drain_between_cells(&mut inner);
        if let Some(end) = inner.ended.clone() {
            return Err(self.gone(end));
        }
        inner.cells += 1;
        let cell = inner.cells;
        let Some(live) = self.host.upgrade() else {
            return Err(Error::Closed {
                operation: "run a kernel cell",
                sandbox_id: Some(self.process.sandbox_id().to_owned()),
            });
        };
        let _busy = live.busy(format!("kernel cell {cell}"));
        let message = json!({"cell": cell, "code": code}).to_string();
        self.write_covering(&*live, self.key.message(message.as_bytes()), timeout)?;
        drop(live);
        let deadline = Instant::now() + timeout;
        let mut raw = Vec::new();
        let mut calls = 0;
        loop {
            if Instant::now() >= deadline {
                drop(inner);
                self.kill_and_wait();
                return Ok(CellOutcome::lost(CellStatus::Timeout, &raw, calls));
            }
            if host.interrupted() {
                drop(inner);
                self.kill_and_wait();
                return Ok(CellOutcome::lost(CellStatus::Interrupted, &raw, calls));
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(INTERRUPT_CHECK);
            let bytes = match self.process.read(wait) {
                LiveRead::Output(bytes) => bytes,
                LiveRead::Ended(end) => {
                    inner.ended = Some(end.clone());
                    let status = match end {
                        LiveEnd::Exited { .. } => CellStatus::Exit,
                        other => CellStatus::Ended(other),
                    };
                    return Ok(CellOutcome::lost(status, &raw, calls));
                }
                _ => continue,
            };
            for piece in inner.decoder.push(&bytes) {
                let frame = match piece {
                    Piece::Output(bytes) => {
                        keep(&mut raw, &bytes, self.raw_cap);
                        continue;
                    }
                    Piece::Frame(frame) => frame,
                };
                if frame.get("result").and_then(Value::as_u64) == Some(cell) {
                    let mut outcome = outcome(&frame, &raw, calls);
                    if outcome.status == CellStatus::Exit {
                        // The runner ends with the cell: wait for it, so the next cell
                        // knows.
                        drop(inner);
                        if let Some(end) = self.wait_end(KILL_WAIT) {
                            self.lock().ended = Some(end);
                        }
                        outcome.execution_count = outcome.execution_count.max(1);
                    }
                    return Ok(outcome);
                }
                if let Some(number) = frame.get("call").and_then(Value::as_u64) {
                    let reply = if frame.get("cell").and_then(Value::as_u64) == Some(cell) {
                        let name = frame.get("name").and_then(Value::as_str).unwrap_or("");
                        let args = frame.get("args").cloned().unwrap_or(Value::Null);
                        let answer = host.call(name, &args.to_string());
                        if answer.is_ok() {
                            calls += 1;
                        }
                        match answer {
                            Ok(result) => json!({"reply": number, "result": result}),
                            Err(error) => json!({"reply": number, "error": error}),
                        }
                    } else {
                        // A call of a cell that is over (a thread it left behind): its
                        // authority went with it.
                        json!({"reply": number, "error": "no cell is running: the cell this call belonged to has ended"})
                    };
                    let Some(live) = self.host.upgrade() else {
                        return Ok(CellOutcome::lost(
                            CellStatus::Ended(LiveEnd::Detached),
                            &raw,
                            calls,
                        ));
                    };
                    self.write_covering(
                        &*live,
                        self.key.message(reply.to_string().as_bytes()),
                        deadline.saturating_duration_since(Instant::now()),
                    )?;
                }
            }
        }
    }

    /// Writes a message, the sandbox's lease made to cover `cover` from now.
    fn write_covering(
        &self,
        live: &dyn LiveHost,
        message: Vec<u8>,
        cover: Duration,
    ) -> Result<(), Error> {
        live.input(
            self.process.sandbox_id(),
            self.process.sandbox_pid(),
            self.process.id(),
            &message,
            cover,
        )
    }

    fn gone(&self, end: LiveEnd) -> Error {
        let reason = match end {
            LiveEnd::Lost(reason) => reason,
            _ => crate::live::LostReason::Gone,
        };
        Error::LiveProcessLost {
            operation: "run a kernel cell",
            sandbox_id: self.process.sandbox_id().to_owned(),
            reason,
        }
    }

    /// Reads what arrived since the last cell without waiting (output is dropped, an end
    /// recorded).
    fn drain_between_cells(&self, inner: &mut Inner) {
        loop {
            match self.process.read(Duration::ZERO) {
                LiveRead::Output(bytes) => {
                    let _ = inner.decoder.push(&bytes);
                }
                LiveRead::Ended(end) => {
                    inner.ended = Some(end);
                    return;
                }
                _ => return,
            }
        }
    }

    /// Kills the kernel (its process and what it started) and waits for its end.
    pub fn kill(&self) -> Result<(), Error> {
        if self.is_ended() {
            return Ok(());
        }
        self.process.signal(LiveSignal::Kill)?;
        if let Some(end) = self.wait_end(KILL_WAIT) {
            self.lock().ended = Some(end);
        }
        Ok(())
    }

    fn kill_and_wait(&self) {
        if let Err(error) = self.kill() {
            tracing::debug!(sandbox_id = %self.process.sandbox_id(), "killing kernel {} failed: {}", self.process.id(), crate::error::ErrorChain(&error));
        }
    }

    /// Reads (and drops) output until the end, for at most `wait`.
    fn wait_end(&self, wait: Duration) -> Option<LiveEnd> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            if let LiveRead::Ended(end) = self.process.read(left) {
                return Some(end);
            }
        }
    }
}

/// Appends `bytes` to `kept`, at most `cap` bytes in all.
fn keep(kept: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let room = cap.saturating_sub(kept.len());
    kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// A cell's outcome from its result frame (untrusted: every field optional).
fn outcome(frame: &Value, raw: &[u8], calls: u32) -> CellOutcome {
    let text = |name: &str| {
        frame
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let flag = |name: &str| frame.get(name).and_then(Value::as_bool).unwrap_or(false);
    let status = match frame.get("status").and_then(Value::as_str) {
        Some("ok") => CellStatus::Ok,
        Some("exit") => CellStatus::Exit,
        _ => CellStatus::Error,
    };
    CellOutcome {
        status,
        stdout: text("stdout"),
        stdout_clipped: flag("stdout_clipped"),
        stderr: text("stderr"),
        stderr_clipped: flag("stderr_clipped"),
        traceback: text("traceback"),
        raw: String::from_utf8_lossy(raw).into_owned(),
        execution_count: frame
            .get("execution_count")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        calls,
    }
}

/// The kernel's live process command: the bootstrap run by `python` with unbuffered output.
pub(crate) fn command(python: &str) -> String {
    format!(
        "exec {} -u -c {}",
        crate::subagent::shell_quote(python),
        crate::subagent::shell_quote(BOOTSTRAP)
    )
}

/// The live options of a kernel.
pub(crate) fn live_options(options: &KernelOptions) -> LiveOptions {
    let mut live = LiveOptions::pipes(Shell::Plain);
    live.cwd = options.cwd.clone();
    live.env = options.env.clone();
    live.env
        .insert("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned());
    live.env
        .insert("PYTHONUNBUFFERED".to_owned(), "1".to_owned());
    live
}
