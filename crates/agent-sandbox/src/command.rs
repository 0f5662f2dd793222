//! Running one command: options, the handle, and the pump that forwards its output.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{ProcessEvent, ProcessStream, Sandbox, StartOptions};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::error::{Error, ErrorChain};
use crate::sink::{OutputSink, OutputStream};

/// Which shell runs the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shell {
    /// `bash -c <command>`: no login profile for the command itself.
    Plain,
    /// `bash -l -c <command>`: a login shell (Hermes' session snapshot bootstrap).
    Login,
}

/// How to run one command. Build with [`RunOptions::new`]; there is no `Default`.
#[derive(Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// The command's deadline. The lease is made to cover it plus the configured grace before
    /// the command starts (L5); when it passes, the command is killed with its process group (L6).
    pub deadline: Duration,
    /// Working directory; `None` uses the configured `cwd`.
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    pub env: BTreeMap<String, String>,
    /// Which shell.
    pub shell: Shell,
    /// Standard input for the command, of any size. Staged as a sandbox file (one upload)
    /// that the shell opens as its stdin and unlinks before the command runs, so it never
    /// travels on a command line (Linux caps one argument at 128 KiB). `None` or empty: the
    /// command's stdin is envd's default (empty).
    pub stdin: Option<Bytes>,
}

impl RunOptions {
    /// A plain-shell command in the configured directory with no extra variables.
    pub fn new(deadline: Duration) -> RunOptions {
        RunOptions {
            deadline,
            cwd: None,
            env: BTreeMap::new(),
            shell: Shell::Plain,
            stdin: None,
        }
    }
}

impl fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The stdin payload is the caller's data (file contents): its size only.
        f.debug_struct("RunOptions")
            .field("deadline", &self.deadline)
            .field("cwd", &self.cwd)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("shell", &self.shell)
            .field("stdin_bytes", &self.stdin.as_ref().map(Bytes::len))
            .finish()
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Termination {
    /// It exited by itself.
    Exited,
    /// It was killed through [`RunningCommand::kill`].
    Killed,
    /// Its deadline passed and the backend killed it.
    DeadlineExceeded,
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommandExit {
    /// Its pid inside the sandbox.
    pub sandbox_pid: u32,
    /// The exit code; `-1` when a signal ended it.
    pub exit_code: i32,
    /// Why it ended.
    pub termination: Termination,
    /// Output bytes forwarded to the sink.
    pub forwarded_bytes: u64,
    /// Set when the sink failed; output after that point was not forwarded.
    pub sink_error: Option<String>,
}

/// What [`RunningCommand::wait`] and [`RunningCommand::poll`] return: the exit, or the
/// infrastructure failure that lost the command (shared, because many threads may ask).
pub type CommandResult = Result<CommandExit, Arc<Error>>;

/// A command running in the sandbox.
///
/// Cheap to clone and `Send + Sync`: one thread can wait while another polls or kills. The
/// output is forwarded by a thread the backend owns, independently of whether anyone waits.
#[derive(Clone)]
pub struct RunningCommand {
    shared: Arc<Shared>,
    kill: mpsc::UnboundedSender<Kill>,
    sandbox_pid: u32,
    sandbox_id: Arc<str>,
}

impl fmt::Debug for RunningCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningCommand")
            .field("sandbox_id", &self.sandbox_id)
            .field("sandbox_pid", &self.sandbox_pid)
            .field("finished", &self.poll().is_some())
            .finish()
    }
}

impl RunningCommand {
    /// The command's pid inside the sandbox. Deliberately not called `pid`: it is not a host
    /// process, and Hermes kills `handle.pid` on the host.
    pub fn sandbox_pid(&self) -> u32 {
        self.sandbox_pid
    }

    /// The sandbox it runs in.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    /// The result, if the command has finished (and its output has been handed to the sink).
    pub fn poll(&self) -> Option<CommandResult> {
        self.shared.lock().clone()
    }

    /// Blocks until the command finishes.
    pub fn wait(&self) -> CommandResult {
        let mut state = self.shared.lock();
        loop {
            if let Some(result) = state.as_ref() {
                return result.clone();
            }
            state = self
                .shared
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Blocks until the command finishes or `limit` passes (real time); `None` if it is
    /// still running.
    pub fn wait_for(&self, limit: Duration) -> Option<CommandResult> {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .done
            .wait_timeout_while(state, limit, |state| state.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        state.clone()
    }

    /// Asks for the command to be killed: `SIGKILL` to the process group it leads (what it
    /// started), then to its pid; the sandbox and other commands' processes keep running
    /// (contract L6). Returns at once; [`wait`](Self::wait)
    /// reports [`Termination::Killed`]. Does nothing once the command has finished.
    pub fn kill(&self) {
        // A closed channel means the pump has finished: nothing to kill.
        let _ = self.kill.send(Kill);
    }
}

struct Kill;

struct Shared {
    result: Mutex<Option<CommandResult>>,
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CommandResult>> {
        self.result.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Everything the pump thread needs.
pub(crate) struct Launch {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) sandbox: Sandbox,
    pub(crate) stream: ProcessStream,
    pub(crate) sandbox_pid: u32,
    pub(crate) deadline: Duration,
    pub(crate) sink: Box<dyn OutputSink>,
    /// Called once when the command is over, after the result is published.
    pub(crate) on_done: Box<dyn FnOnce() + Send>,
}

/// Starts the pump on its own thread and returns the handle.
pub(crate) fn spawn(launch: Launch) -> Result<RunningCommand, Error> {
    let shared = Arc::new(Shared {
        result: Mutex::new(None),
        done: Condvar::new(),
    });
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let sandbox_id: Arc<str> = Arc::from(launch.sandbox.id().as_str());
    let handle = RunningCommand {
        shared: Arc::clone(&shared),
        kill: kill_tx,
        sandbox_pid: launch.sandbox_pid,
        sandbox_id,
    };
    let Launch {
        runtime,
        sandbox,
        stream,
        sandbox_pid,
        deadline,
        mut sink,
        on_done,
    } = launch;
    // Its own OS thread, because the sink may block (a pipe nobody drains yet); blocking a
    // runtime worker would stall every other request of the process.
    let spawned = std::thread::Builder::new()
        .name(format!("e2b-command-{sandbox_pid}"))
        .spawn(move || {
            let result = runtime.block_on(pump(
                &sandbox,
                stream,
                sandbox_pid,
                deadline,
                &mut *sink,
                kill_rx,
            ));
            if let Err(error) = sink.finish() {
                tracing::debug!(sandbox_id = %sandbox.id(), "output sink failed to finish: {}", e2b_client::redact(&error.to_string()));
            }
            *shared.lock() = Some(result.map_err(Arc::new));
            shared.done.notify_all();
            on_done();
        });
    match spawned {
        Ok(_) => Ok(handle),
        Err(source) => Err(Error::Io {
            operation: "start output thread",
            path: std::path::PathBuf::new(),
            source,
        }),
    }
}

async fn pump(
    sandbox: &Sandbox,
    mut stream: ProcessStream,
    sandbox_pid: u32,
    deadline: Duration,
    sink: &mut dyn OutputSink,
    mut kill_rx: mpsc::UnboundedReceiver<Kill>,
) -> Result<CommandExit, Error> {
    let id = sandbox.id().as_str().to_owned();
    let mut termination = Termination::Exited;
    let mut forwarded: u64 = 0;
    let mut sink_error: Option<String> = None;
    let mut kill_open = true;
    let expiry = tokio::time::sleep(deadline);
    tokio::pin!(expiry);
    loop {
        let kill_now = tokio::select! {
            event = stream.next() => {
                let (which, bytes) = match event {
                    Some(Ok(ProcessEvent::Stdout(bytes) | ProcessEvent::Pty(bytes))) => {
                        (OutputStream::Stdout, bytes)
                    }
                    Some(Ok(ProcessEvent::Stderr(bytes))) => (OutputStream::Stderr, bytes),
                    Some(Ok(ProcessEvent::End(end))) => {
                        return Ok(CommandExit {
                            sandbox_pid,
                            exit_code: end.exit_code,
                            termination,
                            forwarded_bytes: forwarded,
                            sink_error,
                        });
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(source)) => {
                        return Err(Error::e2b("command output stream", Some(&id), source));
                    }
                    None => {
                        return Err(Error::CommandLost {
                            sandbox_id: id,
                            sandbox_pid,
                        });
                    }
                };
                if sink_error.is_none() {
                    // The chunk is moved in and dropped right after: no copy is kept (O1).
                    match sink.chunk(which, &bytes) {
                        Ok(()) => {
                            forwarded = forwarded.saturating_add(bytes.len() as u64);
                        }
                        Err(error) => sink_error = Some(error.to_string()),
                    }
                }
                None
            }
            request = kill_rx.recv(), if kill_open => match request {
                Some(Kill) if termination == Termination::Exited => Some(Termination::Killed),
                Some(Kill) => None,
                None => {
                    kill_open = false;
                    None
                }
            },
            () = &mut expiry, if termination == Termination::Exited => {
                Some(Termination::DeadlineExceeded)
            }
        };
        if let Some(reason) = kill_now {
            termination = reason;
            // The command's process group first (what it started: `sleep` under its shell),
            // then its pid, which also covers a command that could not lead a group. The
            // sandbox and processes of other commands survive (L6). The stream then delivers
            // the End event; a failed signal leaves the stream to report what happened.
            kill_group(sandbox, sandbox_pid).await;
            if let Err(source) = sandbox.kill_process(sandbox_pid).await {
                tracing::warn!(
                    sandbox_id = %id,
                    "E2B kill of command {sandbox_pid} failed: {}",
                    ErrorChain(&source)
                );
            }
        }
    }
}

/// How long the group kill may take before the pid kill goes ahead without it.
const GROUP_KILL_LIMIT: Duration = Duration::from_secs(10);

/// `SIGKILL` to the process group the command leads (see the start path's launcher), sent by
/// a short command in the sandbox, since envd signals single pids only. When the command does
/// not lead a group (no `setsid` in the template) there is no such group: nothing happens, and
/// the pid kill that follows is all there is.
async fn kill_group(sandbox: &Sandbox, sandbox_pid: u32) {
    let script = format!(
        "read -r _ _ _ _ group _ < /proc/{sandbox_pid}/stat || exit 0; \
         [ \"$group\" = {sandbox_pid} ] || exit 0; exec kill -KILL -- -{sandbox_pid}"
    );
    let mut options = StartOptions::exec("/bin/bash".to_owned(), vec!["-c".to_owned(), script]);
    options.timeout = Some(GROUP_KILL_LIMIT);
    let outcome =
        tokio::time::timeout(GROUP_KILL_LIMIT, sandbox.run(options, GROUP_KILL_OUTPUT)).await;
    match outcome {
        Ok(Ok(output)) if output.end.exit_code == 0 => {}
        Ok(Ok(output)) => tracing::debug!(
            sandbox_id = %sandbox.id(),
            "E2B kill of process group {sandbox_pid} ended with {}: {}",
            output.end.status,
            e2b_client::redact(&String::from_utf8_lossy(&output.stderr))
        ),
        Ok(Err(source)) => tracing::debug!(
            sandbox_id = %sandbox.id(),
            "E2B kill of process group {sandbox_pid} failed: {}",
            ErrorChain(&source)
        ),
        Err(_) => tracing::debug!(
            sandbox_id = %sandbox.id(),
            "E2B kill of process group {sandbox_pid} did not finish in {GROUP_KILL_LIMIT:?}"
        ),
    }
}

/// Output kept from the group kill (an error message at most).
const GROUP_KILL_OUTPUT: u64 = 4096;
