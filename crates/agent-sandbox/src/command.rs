//! Running one command: options, the handle, and the pump that forwards its output.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
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
    pump_slot.handed.store(true, Ordering::Release);
    match PUMPS.submit(pump_slot) {
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

/// The process's pump threads.
static PUMPS: Pumps = Pumps::new();

/// How long an idle pump thread waits for the next command before it exits.
const PUMP_IDLE_EXIT: Duration = Duration::from_secs(30);

/// A command's whole forwarding, to its end.
type PumpJob = Box<dyn FnOnce() + Send>;

/// A command's pump, run once by whichever comes first: a pump thread or a caller that waits.
#[derive(Default)]
struct PumpSlot {
    job: Mutex<Option<PumpJob>>,
    /// Given to the pump threads already (at most once).
    handed: AtomicBool,
}

impl PumpSlot {
    fn put(&self, job: PumpJob) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
    }

    fn take(&self) -> Option<PumpJob> {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn is_taken(&self) -> bool {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Has a pump thread run the job unless it has been taken up (or handed) already.
    fn hand_to_thread(self: &Arc<Self>) {
        if self.is_taken() || self.handed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(error) = PUMPS.submit(Arc::clone(self)) {
            // No thread could be made: the job stays for a caller that waits, and the next
            // hand-over tries again.
            self.handed.store(false, Ordering::Release);
            tracing::warn!("no output thread could be started: {error}");
        }
    }
}

/// How long a started command waits for its caller to take its pump up (by waiting) before
/// a pump thread does.
const HAND_OFF_DELAY: Duration = Duration::from_millis(20);

/// The commands started but not yet taken up, until [`HAND_OFF_DELAY`] has passed.
static DEFERRED: Deferred = Deferred::new();

/// One thread, made on demand, that hands a command's pump to the pump threads when its
/// caller has not taken it up in time. It looks at most once per [`HAND_OFF_DELAY`] while
/// commands come (a push wakes it only when it sleeps without a time limit), so under load
/// it costs a fraction of a wake-up per command instead of one.
struct Deferred {
    state: Mutex<DeferredQueue>,
    work: Condvar,
}

struct DeferredQueue {
    slots: std::collections::VecDeque<(Arc<PumpSlot>, std::time::Instant)>,
    /// Whether the thread runs, and whether it sleeps with no time limit (only then does a
    /// push wake it).
    thread: DeferThread,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DeferThread {
    None,
    Timed,
    Untimed,
}

impl Deferred {
    const fn new() -> Deferred {
        Deferred {
            state: Mutex::new(DeferredQueue {
                slots: std::collections::VecDeque::new(),
                thread: DeferThread::None,
            }),
            work: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeferredQueue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&'static self, slot: Arc<PumpSlot>) {
        let mut queue = self.lock();
        queue
            .slots
            .push_back((slot, std::time::Instant::now() + HAND_OFF_DELAY));
        match queue.thread {
            DeferThread::Timed => {}
            DeferThread::Untimed => {
                queue.thread = DeferThread::Timed;
                drop(queue);
                self.work.notify_one();
            }
            DeferThread::None => {
                let spawned = std::thread::Builder::new()
                    .name("e2b-command-handoff".to_owned())
                    .spawn(move || self.serve());
                match spawned {
                    Ok(_) => queue.thread = DeferThread::Timed,
                    Err(error) => {
                        // Without the thread, hand the command over now.
                        let slots: Vec<_> = queue.slots.drain(..).map(|(slot, _)| slot).collect();
                        drop(queue);
                        tracing::warn!("no command hand-off thread could be started: {error}");
                        for slot in slots {
                            slot.hand_to_thread();
                        }
                    }
                }
            }
        }
    }

    fn serve(&self) {
        let mut queue = self.lock();
        loop {
            let now = std::time::Instant::now();
            let mut due = Vec::new();
            while let Some((slot, at)) = queue.slots.front() {
                if slot.is_taken() || slot.handed.load(Ordering::Acquire) {
                    queue.slots.pop_front();
                } else if *at <= now {
                    due.push(queue.slots.pop_front().map(|(slot, _)| slot));
                } else {
                    break;
                }
            }
            if !due.is_empty() {
                drop(queue);
                for slot in due.into_iter().flatten() {
                    slot.hand_to_thread();
                }
                queue = self.lock();
                continue;
            }
            // Commands are still coming (or just came): look again after the delay without
            // being woken by each push. Only a whole idle period lets the thread sleep until a
            // push wakes it, and a longer one ends it.
            let (limit, thread) = match queue.slots.front() {
                Some((_, at)) => (at.saturating_duration_since(now), DeferThread::Timed),
                None if queue.thread == DeferThread::Timed => (HAND_OFF_DELAY, DeferThread::Timed),
                None => (PUMP_IDLE_EXIT, DeferThread::Untimed),
            };
            let was_idle = queue.slots.is_empty();
            queue.thread = thread;
            let (next, waited) = self
                .work
                .wait_timeout(queue, limit)
                .unwrap_or_else(PoisonError::into_inner);
            queue = next;
            if was_idle && queue.slots.is_empty() && waited.timed_out() {
                match queue.thread {
                    // A quiet period: sleep until the next push.
                    DeferThread::Timed => queue.thread = DeferThread::Untimed,
                    // A long quiet: the thread ends; the next push makes another.
                    DeferThread::Untimed | DeferThread::None => {
                        queue.thread = DeferThread::None;
                        return;
                    }
                }
            }
        }
    }
}

/// Threads for the pumps, kept for reuse: a command in steady state hands its pump to a
/// thread that is waiting for one instead of creating a thread (and its stack) per command.
/// Each job still has a thread to itself for as long as it runs (a job is queued only when a
/// thread is idle to take it), so a blocked sink delays nothing else. An idle thread exits
/// after [`PUMP_IDLE_EXIT`].
struct Pumps {
    state: Mutex<PumpQueue>,
    work: Condvar,
}

struct PumpQueue {
    jobs: std::collections::VecDeque<Arc<PumpSlot>>,
    /// Threads waiting for a job.
    idle: usize,
}

impl Pumps {
    const fn new() -> Pumps {
        Pumps {
            state: Mutex::new(PumpQueue {
                jobs: std::collections::VecDeque::new(),
                idle: 0,
            }),
            work: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PumpQueue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `job` on an idle thread, or on a new one when every thread is busy.
    fn submit(&'static self, job: Arc<PumpSlot>) -> std::io::Result<()> {
        let mut queue = self.lock();
        // Every queued job has an idle thread of its own coming for it.
        if queue.idle > queue.jobs.len() {
            queue.jobs.push_back(job);
            drop(queue);
            self.work.notify_one();
            return Ok(());
        }
        drop(queue);
        std::thread::Builder::new()
            .name("e2b-command".to_owned())
            .spawn(move || self.serve(job))
            .map(drop)
    }

    fn serve(&self, first: Arc<PumpSlot>) {
        let run = |slot: Arc<PumpSlot>| {
            // Empty when a waiting caller took the job up first.
            if let Some(job) = slot.take() {
                job();
            }
        };
        run(first);
        let mut queue = self.lock();
        loop {
            if let Some(slot) = queue.jobs.pop_front() {
                drop(queue);
                // Woken by the submit, this thread may have preempted the caller on its CPU
                // just before it waits: letting it run first lets it take its command up
                // itself (one hand-over less at the command's end). Only a matter of speed.
                std::thread::yield_now();
                run(slot);
                queue = self.lock();
                continue;
            }
            queue.idle += 1;
            let (next, waited) = self
                .work
                .wait_timeout_while(queue, PUMP_IDLE_EXIT, |queue| queue.jobs.is_empty())
                .unwrap_or_else(PoisonError::into_inner);
            queue = next;
            queue.idle -= 1;
            if waited.timed_out() && queue.jobs.is_empty() {
                return;
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;
    use std::thread::ThreadId;
    use std::time::Instant;

    use super::*;

    fn pool() -> &'static Pumps {
        Box::leak(Box::new(Pumps::new()))
    }

    fn slot(job: impl FnOnce() + Send + 'static) -> Arc<PumpSlot> {
        let slot = Arc::new(PumpSlot::default());
        slot.put(Box::new(job));
        slot
    }

    /// Waits (bounded) until `count` threads of `pumps` are idle.
    fn await_idle(pumps: &Pumps, count: usize) {
        let limit = Instant::now() + Duration::from_secs(10);
        while pumps.lock().idle != count {
            assert!(Instant::now() < limit, "{count} idle pump threads");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_command_nobody_takes_up_goes_to_a_pump_thread_after_the_delay_and_one_taken_never_does() {
        let (tx, rx) = std_mpsc::channel::<ThreadId>();
        let taken = {
            let tx = tx.clone();
            slot(move || tx.send(std::thread::current().id()).expect("sent"))
        };
        let left = slot(move || tx.send(std::thread::current().id()).expect("sent"));
        let pushed = Instant::now();
        DEFERRED.push(Arc::clone(&taken));
        DEFERRED.push(Arc::clone(&left));
        // The caller waits at once: it runs its command itself.
        taken.take().expect("not taken yet")();
        assert_eq!(rx.recv().expect("ran"), std::thread::current().id());
        // The other one's caller never comes: a pump thread forwards it, after the delay.
        let ran_on = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("handed over");
        assert_ne!(ran_on, std::thread::current().id());
        assert!(pushed.elapsed() >= HAND_OFF_DELAY);
        // Pushed before it, the taken command was looked at first and never handed over.
        assert!(left.handed.load(Ordering::Acquire));
        assert!(!taken.handed.load(Ordering::Acquire));
    }

    #[test]
    fn commands_one_after_another_reuse_one_pump_thread() {
        let pumps = pool();
        let (tx, rx) = std_mpsc::channel::<ThreadId>();
        let mut threads = Vec::new();
        for _ in 0..3 {
            let tx = tx.clone();
            pumps
                .submit(slot(move || {
                    tx.send(std::thread::current().id()).expect("sent")
                }))
                .expect("submitted");
            threads.push(rx.recv().expect("ran"));
            await_idle(pumps, 1);
        }
        assert!(threads.iter().all(|id| *id == threads[0]), "{threads:?}");
        assert_ne!(threads[0], std::thread::current().id());
    }

    #[test]
    fn a_blocked_pump_delays_no_other_command() {
        let pumps = pool();
        let (release, blocked) = std_mpsc::channel::<()>();
        let (tx, rx) = std_mpsc::channel::<&str>();
        let first = tx.clone();
        pumps
            .submit(slot(move || {
                first.send("first started").expect("sent");
                // A sink nobody drains: blocked until the test releases it.
                blocked.recv().expect("released");
                first.send("first done").expect("sent");
            }))
            .expect("submitted");
        assert_eq!(rx.recv().expect("ran"), "first started");
        pumps
            .submit(slot(move || tx.send("second done").expect("sent")))
            .expect("submitted");
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).expect("ran"),
            "second done"
        );
        release.send(()).expect("released");
        assert_eq!(rx.recv().expect("ran"), "first done");
    }
}
