//! Running one command: options, the handle, and the pump that forwards its output.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{ProcessEvent, ProcessStream, Sandbox, StartOptions};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::command_threads::{DEFERRED, PumpSlot};
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
    /// How long the command's end is waited for once it is killed (its kill requests
    /// included) before its output is given up ([`Error::CommandAbandoned`], O7).
    pub kill_grace: Duration,
    /// Whether the command is the session's own use of the sandbox or a watcher's poll.
    pub purpose: Purpose,
    /// For a [`Purpose::Watch`] command that finds the sandbox paused by this process: the
    /// output it answers with (exit 0) without running, in place of
    /// [`Error::PausedByBackend`](crate::Error::PausedByBackend), so a watcher that takes any
    /// failure for the process's death reads "still running" (what is frozen with the
    /// sandbox goes on when it resumes). `None`: the error.
    pub answer_while_paused: Option<Bytes>,
}

/// Why a command runs: what decides whether it counts as the session's use (L17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Purpose {
    /// The session's own command: it keeps the sandbox from its quiet pause and resumes a
    /// paused one.
    Use,
    /// A poll of a process an earlier command started (a framework's background-process
    /// watcher): it does not count as use, so a quiet sandbox is still paused on time, and
    /// it never resumes a sandbox this process paused, while quiet or for the account's
    /// limit ([`Error::PausedByBackend`]).
    ///
    /// [`Error::PausedByBackend`]: crate::Error::PausedByBackend
    Watch,
}

impl RunOptions {
    /// A plain-shell command in the configured directory with no extra variables, and
    /// [`KILL_GRACE`] to end once killed.
    pub fn new(deadline: Duration) -> RunOptions {
        RunOptions {
            deadline,
            cwd: None,
            env: BTreeMap::new(),
            shell: Shell::Plain,
            stdin: None,
            kill_grace: KILL_GRACE,
            purpose: Purpose::Use,
            answer_while_paused: None,
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
            .field("kill_grace", &self.kill_grace)
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
/// output is forwarded by a thread the backend owns, independently of whether anyone waits (a
/// caller that waits before that thread took the command up forwards it itself, and is woken
/// by the command's end directly). A command read on its forwarding thread's own connection
/// ([`crate::CommandReads::OwnThread`]) is given to that thread only when its caller has
/// not waited within 20 ms, or at once when the caller polls, waits with a limit or kills:
/// a caller that waits at once wakes no other thread.
#[derive(Clone)]
pub struct RunningCommand {
    shared: Arc<Shared>,
    pump: Arc<PumpSlot>,
    kill: Killer,
    sandbox_pid: u32,
    sandbox_id: Arc<str>,
}

impl fmt::Debug for RunningCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningCommand")
            .field("sandbox_id", &self.sandbox_id)
            .field("sandbox_pid", &self.sandbox_pid)
            .field("finished", &self.shared.lock().is_some())
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
        // A caller that polls does not forward the output itself: a pump thread does.
        self.pump.hand_to_thread();
        self.shared.lock().clone()
    }

    /// Blocks until the command finishes.
    pub fn wait(&self) -> CommandResult {
        // A pump no thread has taken up yet runs right here: the waiting thread is woken by
        // the command's end directly, not by a pump thread's hand-over. Never inside a
        // runtime, where blocking on the pump is not allowed.
        if tokio::runtime::Handle::try_current().is_err() {
            if let Some(job) = self.pump.take() {
                job();
            }
        } else {
            self.pump.hand_to_thread();
        }
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
        self.pump.hand_to_thread();
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
        // The end of a killed command is read by a pump thread unless a caller waits.
        self.pump.hand_to_thread();
        match &self.kill {
            // A closed channel means the pump has finished: nothing to kill.
            Killer::Channel(channel) => {
                let _ = channel.send(Kill);
            }
            Killer::Blocking(killing) => killing.start(Termination::Killed),
        }
    }
}

struct Kill;

/// How a kill reaches the command's pump.
#[derive(Clone)]
enum Killer {
    /// An async pump selects over this channel.
    Channel(mpsc::UnboundedSender<Kill>),
    /// A blocking pump is in a read: the kill is sent from here, and the read interrupted if
    /// the end does not come within the grace.
    Blocking(Arc<Killing>),
}

/// The kill of a command whose output a thread reads from its socket
/// ([`e2b_client::blocking`]): that thread cannot also wait for a kill, so whoever kills
/// sends the signals (on the runtime), and when the end has not come within the grace the
/// read is interrupted and the command abandoned (O7), as the async pump does.
struct Killing {
    state: Mutex<KillState>,
    /// Wakes the reader waiting for the kill's signals to have gone out.
    signalled: Condvar,
    /// Wakes the grace timer once the command is over.
    over: tokio::sync::Notify,
    runtime: tokio::runtime::Handle,
    sandbox: Sandbox,
    sandbox_pid: u32,
    grace: Duration,
    interrupter: e2b_client::blocking::Interrupter,
}

struct KillState {
    termination: Termination,
    finished: bool,
    abandoned: bool,
    /// The kill's signals were sent (or gave up at the grace).
    signals_sent: bool,
}

impl Killing {
    fn lock(&self) -> std::sync::MutexGuard<'_, KillState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Kills the command for `reason`, unless it is over or being killed already.
    fn start(self: &Arc<Self>, reason: Termination) {
        {
            let mut state = self.lock();
            if state.finished || state.termination != Termination::Exited {
                return;
            }
            state.termination = reason;
        }
        let killing = Arc::clone(self);
        self.runtime.spawn(async move {
            let give_up = tokio::time::Instant::now() + killing.grace;
            let (sandbox, sandbox_pid) = (&killing.sandbox, killing.sandbox_pid);
            let signals = async {
                kill_group(sandbox, sandbox_pid).await;
                sandbox.kill_process(sandbox_pid).await
            };
            if let Ok(Err(source)) = tokio::time::timeout_at(give_up, signals).await {
                tracing::warn!(
                    sandbox_id = %sandbox.id(),
                    "E2B kill of command {sandbox_pid} failed: {}",
                    ErrorChain(&source)
                );
            }
            killing.lock().signals_sent = true;
            killing.signalled.notify_all();
            tokio::select! {
                () = tokio::time::sleep_until(give_up) => {}
                () = killing.over.notified() => return,
            }
            let mut state = killing.lock();
            if !state.finished {
                state.abandoned = true;
                drop(state);
                killing.interrupter.interrupt();
            }
        });
    }

    /// Whether a kill has started (its deadline no longer applies).
    fn started(&self) -> bool {
        self.lock().termination != Termination::Exited
    }

    /// Marks the command over; how it ended, as far as kills go. A killed command is over
    /// once its kill's signals are out too (as on the async pump, which sends them before it
    /// reads on): nothing of the kill is still on its way when the caller learns the end.
    fn finish(&self) -> Termination {
        let mut state = self.lock();
        state.finished = true;
        let termination = state.termination;
        if termination != Termination::Exited {
            self.over.notify_one();
            // The signals give up at the grace themselves; the bound only guards a runtime
            // that stopped running them.
            let _ = self
                .signalled
                .wait_timeout_while(state, self.grace + KILL_GRACE_MARGIN, |state| {
                    !state.signals_sent
                })
                .unwrap_or_else(PoisonError::into_inner);
        }
        termination
    }

    fn abandoned(&self) -> bool {
        self.lock().abandoned
    }
}

/// A started command's events: read on the runtime, or on the pump's own thread.
pub(crate) enum Events {
    /// Read by the runtime's connection task ([`Sandbox::start`]).
    Async(ProcessStream),
    /// Read from the socket by the thread that pumps ([`Sandbox::start_blocking`]).
    Blocking(e2b_client::blocking::BlockingProcessStream),
}

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
    pub(crate) stream: Events,
    pub(crate) sandbox_pid: u32,
    pub(crate) deadline: Duration,
    pub(crate) kill_grace: Duration,
    pub(crate) sink: Box<dyn OutputSink>,
    /// Called once when the command is over, after the result is published.
    pub(crate) on_done: Box<dyn FnOnce() + Send>,
}

/// A command that did not run: `output` stands for what it printed, handed to `sink` now,
/// and it has finished with exit code 0 (pid 0: no process).
pub(crate) fn answered(
    sandbox_id: &str,
    output: &[u8],
    mut sink: Box<dyn OutputSink>,
) -> RunningCommand {
    let sink_error = sink
        .chunk(OutputStream::Stdout, output)
        .and_then(|()| sink.finish())
        .err()
        .map(|error| e2b_client::redact(&error.to_string()));
    let exit = CommandExit {
        sandbox_pid: 0,
        exit_code: 0,
        termination: Termination::Exited,
        forwarded_bytes: if sink_error.is_none() {
            output.len() as u64
        } else {
            0
        },
        sink_error,
    };
    let (kill, _) = mpsc::unbounded_channel();
    RunningCommand {
        shared: Arc::new(Shared {
            result: Mutex::new(Some(Ok(exit))),
            done: Condvar::new(),
        }),
        pump: Arc::new(PumpSlot::default()),
        kill: Killer::Channel(kill),
        sandbox_pid: 0,
        sandbox_id: Arc::from(sandbox_id),
    }
}

/// Starts the pump on its own thread and returns the handle.
pub(crate) fn spawn(launch: Launch) -> Result<RunningCommand, Error> {
    let shared = Arc::new(Shared {
        result: Mutex::new(None),
        done: Condvar::new(),
    });
    let sandbox_id: Arc<str> = Arc::from(launch.sandbox.id().as_str());
    let pump_slot = Arc::new(PumpSlot::default());
    let Launch {
        runtime,
        sandbox,
        stream,
        sandbox_pid,
        deadline,
        kill_grace,
        mut sink,
        on_done,
    } = launch;
    let stream = match stream {
        Events::Async(stream) => stream,
        Events::Blocking(stream) => {
            let killing = Arc::new(Killing {
                state: Mutex::new(KillState {
                    termination: Termination::Exited,
                    finished: false,
                    abandoned: false,
                    signals_sent: false,
                }),
                signalled: Condvar::new(),
                over: tokio::sync::Notify::new(),
                runtime,
                sandbox,
                sandbox_pid,
                grace: kill_grace,
                interrupter: stream.interrupter(),
            });
            let handle = RunningCommand {
                shared: Arc::clone(&shared),
                pump: Arc::clone(&pump_slot),
                kill: Killer::Blocking(Arc::clone(&killing)),
                sandbox_pid,
                sandbox_id,
            };
            // The deadline counts from the start, however late a thread takes the pump up.
            let expiry = std::time::Instant::now() + deadline;
            pump_slot.put(Box::new(move || {
                let mut stream = stream;
                let outcome = pump_blocking(&mut stream, &killing, expiry, &mut *sink);
                publish(&shared, outcome, &mut *sink, &killing.sandbox, on_done);
                // The rest of the response (the end-of-stream message, right behind the end
                // event) is read after the result is out, and the connection kept for the
                // next command.
                if !stream.finish(e2b_client::END_DRAIN_LIMIT) {
                    tracing::debug!(sandbox_id = %killing.sandbox.id(), "the output stream of command {sandbox_pid} did not end cleanly after its exit");
                }
            }));
            // A caller that waits at once reads its command itself; a pump thread takes it
            // up only when nobody did within HAND_OFF_DELAY, or when the caller polls, waits
            // with a limit or kills. No thread is woken for a command its caller waits for.
            DEFERRED.push(pump_slot);
            return Ok(handle);
        }
    };
    let (kill_tx, kill_rx) = mpsc::unbounded_channel();
    let handle = RunningCommand {
        shared: Arc::clone(&shared),
        pump: Arc::clone(&pump_slot),
        kill: Killer::Channel(kill_tx),
        sandbox_pid,
        sandbox_id,
    };
    // An OS thread of its own while it runs (a pump thread's, or a waiting caller's),
    // because the sink may block (a pipe nobody drains yet); blocking a runtime worker would
    // stall every other request of the process.
    pump_slot.put(Box::new(move || {
        let outcome = runtime.block_on(pump(
            &sandbox,
            stream,
            sandbox_pid,
            (deadline, kill_grace),
            &mut *sink,
            kill_rx,
        ));
        let (outcome, rest) = match outcome {
            Ok((exit, rest)) => (Ok(exit), Some(rest)),
            Err(error) => (Err(error), None),
        };
        publish(&shared, outcome, &mut *sink, &sandbox, on_done);
        // The rest of the response (the end-of-stream message, right behind the end event)
        // is read on the runtime, next to the connection, after the result is out: off the
        // waiter's path. Reading it to its end lets a later command reuse the connection
        // instead of opening one.
        if let Some(rest) = rest {
            let id = sandbox.id().clone();
            runtime.spawn(async move {
                if !rest.drain(e2b_client::END_DRAIN_LIMIT).await {
                    tracing::debug!(sandbox_id = %id, "the output stream of command {sandbox_pid} did not end cleanly after its exit");
                }
            });
        }
    }));
    submit(pump_slot, handle)
}

/// Hands the command's pump to a pump thread (a caller that waits first takes it up itself).
fn submit(pump_slot: Arc<PumpSlot>, handle: RunningCommand) -> Result<RunningCommand, Error> {
    match pump_slot.hand_over() {
        Ok(()) => Ok(handle),
        Err(source) => Err(Error::Io {
            operation: "start output thread",
            path: std::path::PathBuf::new(),
            source,
        }),
    }
}

/// The command is over: the sink finished, the backend told (`on_done`), then the result
/// published and its waiters woken.
fn publish(
    shared: &Shared,
    outcome: Result<CommandExit, Error>,
    sink: &mut dyn OutputSink,
    sandbox: &Sandbox,
    on_done: Box<dyn FnOnce() + Send>,
) {
    if let Err(error) = sink.finish() {
        tracing::debug!(sandbox_id = %sandbox.id(), "output sink failed to finish: {}", e2b_client::redact(&error.to_string()));
    }
    // Counted out before anyone learns of the end: a caller that saw its command finish
    // and then asks for a checkpoint must not find it still in flight (R2).
    on_done();
    *shared.lock() = Some(outcome.map_err(Arc::new));
    shared.done.notify_all();
}

async fn pump(
    sandbox: &Sandbox,
    mut stream: ProcessStream,
    sandbox_pid: u32,
    (deadline, kill_grace): (Duration, Duration),
    sink: &mut dyn OutputSink,
    mut kill_rx: mpsc::UnboundedReceiver<Kill>,
) -> Result<(CommandExit, ProcessStream), Error> {
    let id = sandbox.id().as_str().to_owned();
    let mut termination = Termination::Exited;
    let mut forwarded: u64 = 0;
    let mut sink_error: Option<String> = None;
    let mut kill_open = true;
    let expiry = tokio::time::sleep(deadline);
    tokio::pin!(expiry);
    // Armed by the kill: the end is waited for at most KILL_GRACE after it (O7).
    let abandon = tokio::time::sleep(Duration::MAX);
    tokio::pin!(abandon);
    let end = loop {
        let kill_now = tokio::select! {
            event = stream.next() => {
                let (which, bytes) = match event {
                    Some(Ok(ProcessEvent::Stdout(bytes) | ProcessEvent::Pty(bytes))) => {
                        (OutputStream::Stdout, bytes)
                    }
                    Some(Ok(ProcessEvent::Stderr(bytes))) => (OutputStream::Stderr, bytes),
                    Some(Ok(ProcessEvent::End(end))) => break end,
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
            () = &mut abandon, if termination != Termination::Exited => {
                return Err(Error::CommandAbandoned {
                    sandbox_id: id,
                    sandbox_pid,
                    waited: kill_grace,
                });
            }
        };
        if let Some(reason) = kill_now {
            termination = reason;
            let give_up = tokio::time::Instant::now() + kill_grace;
            abandon.as_mut().reset(give_up);
            // The command's process group and pid (what it started: `sleep` under its shell),
            // then its pid through envd, which also covers a sandbox where the group kill
            // cannot run. The
            // sandbox and processes of other commands survive (L6). The stream then delivers
            // the End event; a failed signal leaves the stream to report what happened. Both
            // signals count against the grace: a sandbox that answers nothing cannot hold the
            // caller (O7).
            let signals = async {
                kill_group(sandbox, sandbox_pid).await;
                sandbox.kill_process(sandbox_pid).await
            };
            match tokio::time::timeout_at(give_up, signals).await {
                Ok(Ok(_)) => {}
                Ok(Err(source)) => tracing::warn!(
                    sandbox_id = %id,
                    "E2B kill of command {sandbox_pid} failed: {}",
                    ErrorChain(&source)
                ),
                Err(_) => {
                    return Err(Error::CommandAbandoned {
                        sandbox_id: id,
                        sandbox_pid,
                        waited: kill_grace,
                    });
                }
            }
        }
    };
    let exit = CommandExit {
        sandbox_pid,
        exit_code: end.exit_code,
        termination,
        forwarded_bytes: forwarded,
        sink_error,
    };
    Ok((exit, stream))
}

/// The pump of a command read on this thread: output to the sink as it comes, the deadline
/// as the read's limit (then the kill), to the end event. A kill from elsewhere is sent by
/// [`Killing`], which interrupts this read when the end does not come in time.
fn pump_blocking(
    stream: &mut e2b_client::blocking::BlockingProcessStream,
    killing: &Arc<Killing>,
    expiry: std::time::Instant,
    sink: &mut dyn OutputSink,
) -> Result<CommandExit, Error> {
    use e2b_client::blocking::Next;

    let sandbox_pid = killing.sandbox_pid;
    let mut forwarded: u64 = 0;
    let mut sink_error: Option<String> = None;
    let end = loop {
        // Once killed, the deadline is spent: the end (or the grace's interrupt) comes next.
        let until = (!killing.started()).then_some(expiry);
        let (which, bytes) = match stream.next_event(until) {
            Ok(Next::Event(ProcessEvent::Stdout(bytes) | ProcessEvent::Pty(bytes))) => {
                (OutputStream::Stdout, bytes)
            }
            Ok(Next::Event(ProcessEvent::Stderr(bytes))) => (OutputStream::Stderr, bytes),
            Ok(Next::Event(ProcessEvent::End(end))) => break end,
            Ok(Next::Event(_)) => continue,
            Ok(Next::Waited) => {
                // The deadline passed: killed as by a caller (the signals go on the runtime).
                killing.start(Termination::DeadlineExceeded);
                continue;
            }
            Err(source) => {
                let id = killing.sandbox.id().as_str().to_owned();
                killing.finish();
                if killing.abandoned() {
                    return Err(Error::CommandAbandoned {
                        sandbox_id: id,
                        sandbox_pid,
                        waited: killing.grace,
                    });
                }
                return Err(Error::e2b("command output stream", Some(&id), source));
            }
        };
        if sink_error.is_none() {
            // The chunk is moved in and dropped right after: no copy is kept (O1).
            match sink.chunk(which, &bytes) {
                Ok(()) => forwarded = forwarded.saturating_add(bytes.len() as u64),
                Err(error) => sink_error = Some(error.to_string()),
            }
        }
    };
    Ok(CommandExit {
        sandbox_pid,
        exit_code: end.exit_code,
        termination: killing.finish(),
        forwarded_bytes: forwarded,
        sink_error,
    })
}

/// How long a killed command's end is waited for (its kill requests included) before its
/// output stream is given up and its caller told so (O7): a command ends at most this long
/// after its kill or its deadline, whatever the sandbox does.
pub const KILL_GRACE: Duration = Duration::from_secs(20);

/// How much longer than the grace a blocking pump waits for its kill's signals to be out,
/// should the runtime sending them have stopped.
const KILL_GRACE_MARGIN: Duration = Duration::from_secs(1);

/// How long the group kill may take before the pid kill goes ahead without it.
const GROUP_KILL_LIMIT: Duration = Duration::from_secs(10);

/// `SIGKILL` to the process group the command leads (see the start path's launcher), to its
/// pid, and to the group again, sent by a short command in the sandbox, since envd signals
/// single pids only. A group's id is the pid of the process that made it, and no pid is
/// reused while a group holds it, so `-pid` names the command's own group or none (the
/// command does not lead one: no `setsid` in the template, or not yet). The second group kill
/// closes the race with a launcher that makes its group and starts the command's children
/// between the first and the pid kill; once the pid is dead nothing new joins the group.
async fn kill_group(sandbox: &Sandbox, sandbox_pid: u32) {
    let script = format!(
        "kill -KILL -- -{sandbox_pid} 2>/dev/null; kill -KILL {sandbox_pid} 2>/dev/null; \
         kill -KILL -- -{sandbox_pid} 2>/dev/null; exit 0"
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
