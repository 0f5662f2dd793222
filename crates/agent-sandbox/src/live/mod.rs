//! Live processes: commands that keep running in the sandbox with their stdin open, whose
//! output reaches the host as it is written, exactly once, across pauses and dropped
//! connections.
//!
//! [`Backend::start_live`](crate::Backend::start_live) starts one (admitted like a command:
//! attach, lease, gates, sync); from then on nothing polls. The runner envd started streams the
//! command's output as it is written, and [`LiveProcess::read`] hands it over in order. When
//! that stream is cut (the sandbox paused, quiet or for the account's limit; a dropped
//! connection), a follower thread takes the output up again from the byte it had reached, once
//! the sandbox runs again: at once after a dropped connection, after the session's next use
//! when the sandbox is paused (a live process never resumes a sandbox by itself, so it never
//! keeps a quiet one running). What happened meanwhile is told exactly: the command went on
//! (its output continues), ended (its exit code), or could not survive (a pause without memory,
//! a replaced sandbox: [`LiveEnd::Lost`]).
//!
//! The in-sandbox side is in `script`; the follower thread in `follow`; the backend's side
//! (admission, the target after a cut, input and signals) in `backend/live.rs`.

mod follow;
mod forward;
mod script;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;

use crate::command::Shell;
use crate::error::Error;
pub use crate::error::LostReason;

pub(crate) use follow::{Busy, LiveHost, Target, spawn_follower};
pub use forward::PortForward;
pub(crate) use forward::RELAY;
pub(crate) use script::{Io, LiveShell, runner, signal as signal_script, valid_id};
pub use script::{LIVE_TAG, LiveSignal, TerminalSize};

/// How to start a live process. Build with [`LiveOptions::pipes`] or
/// [`LiveOptions::terminal`]; there is no `Default`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveOptions {
    /// Working directory; `None` uses the configured `cwd`, else the sandbox user's home.
    pub cwd: Option<String>,
    /// Extra environment variables for the command.
    pub env: BTreeMap<String, String>,
    /// Which shell runs the command.
    pub shell: Shell,
    /// `Some`: the command runs on a terminal of this size (`isatty()` is true, Ctrl-C
    /// written to its input interrupts its foreground job); `None`: on pipes, stdout and
    /// stderr merged.
    pub terminal: Option<TerminalSize>,
}

impl LiveOptions {
    /// The command on pipes (stdin from [`LiveProcess::write`], stdout and stderr merged),
    /// in the configured directory, with no extra variables.
    pub fn pipes(shell: Shell) -> LiveOptions {
        LiveOptions {
            cwd: None,
            env: BTreeMap::new(),
            shell,
            terminal: None,
        }
    }

    /// The command on a terminal of `size` (util-linux `script` in the sandbox), in the
    /// configured directory, with no extra variables.
    pub fn terminal(shell: Shell, size: TerminalSize) -> LiveOptions {
        LiveOptions {
            terminal: Some(size),
            ..LiveOptions::pipes(shell)
        }
    }

    pub(crate) fn io(&self) -> Io {
        match self.terminal {
            Some(size) => Io::Terminal(size),
            None => Io::Pipes,
        }
    }

    pub(crate) fn live_shell(&self) -> LiveShell {
        match self.shell {
            Shell::Plain => LiveShell::Plain,
            Shell::Login => LiveShell::Login,
        }
    }
}

/// How a live process ended, as far as the host can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveEnd {
    /// The command exited with this code (a terminal command: its shell's code).
    Exited {
        /// The exit code (128 + n for a command the shell saw die of signal n).
        code: i32,
    },
    /// The command ended without an exit code: a signal ended it (a kill).
    Killed,
    /// The command could not survive what happened to its sandbox; its output up to then was
    /// delivered.
    Lost(LostReason),
    /// The host stopped following it (the backend was cleaned up or dropped): it may still run
    /// in the sandbox, and [`Backend::follow_live`](crate::Backend::follow_live) takes it up
    /// again.
    Detached,
}

/// What [`LiveProcess::read`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LiveRead {
    /// The next output bytes, in order (a terminal's, or stdout and stderr merged).
    Output(Bytes),
    /// The process ended; every byte of its output was read before this.
    Ended(LiveEnd),
    /// Nothing within the wait.
    Pending,
}

/// What the follower hands the reader.
#[derive(Debug)]
pub(crate) enum LiveEvent {
    Output(Bytes),
    End(LiveEnd),
}

/// What a write to a live process asks the sandbox's lease to cover (the write itself; the
/// process runs on as long as the sandbox does).
const INPUT_COVER: Duration = Duration::from_secs(60);

/// How many events wait for the reader at most: a slow reader slows the follower, whose
/// stream then slows the in-sandbox `tail`; the log file keeps the rest.
pub(crate) const QUEUED_EVENTS: usize = 16;

/// A live process in the sandbox. Cheap to clone and `Send + Sync`; the output is read by one
/// reader at a time. Dropping the last clone stops following it (the process keeps running).
#[derive(Clone)]
pub struct LiveProcess {
    handle: Arc<Handle>,
}

impl fmt::Debug for LiveProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.handle.shared;
        f.debug_struct("LiveProcess")
            .field("id", &shared.id)
            .field("sandbox_id", &shared.sandbox_id)
            .field("pid", &shared.pid)
            .field("end", &self.end())
            .finish()
    }
}

/// The consumer's side: dropping the last one stops the follower.
struct Handle {
    shared: Arc<Shared>,
    events: Mutex<Receiver<LiveEvent>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.stop.stop();
    }
}

/// What the follower thread and the handles share.
pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) sandbox_id: String,
    pub(crate) pid: u32,
    pub(crate) host: Weak<dyn LiveHost>,
    pub(crate) stop: Stop,
    end: Mutex<Option<LiveEnd>>,
    delivered: AtomicU64,
}

/// Tells the follower to stop (its reader is gone).
#[derive(Default)]
pub(crate) struct Stop {
    stopped: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Stop {
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Resolves once stopped (cancel-safe).
    pub(crate) async fn stopped(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

impl LiveProcess {
    pub(crate) fn new(
        id: String,
        sandbox_id: String,
        pid: u32,
        host: Weak<dyn LiveHost>,
    ) -> (LiveProcess, Arc<Shared>, SyncSender<LiveEvent>) {
        let (sender, receiver) = std::sync::mpsc::sync_channel(QUEUED_EVENTS);
        let shared = Arc::new(Shared {
            id,
            sandbox_id,
            pid,
            host,
            stop: Stop::default(),
            end: Mutex::new(None),
            delivered: AtomicU64::new(0),
        });
        let process = LiveProcess {
            handle: Arc::new(Handle {
                shared: Arc::clone(&shared),
                events: Mutex::new(receiver),
            }),
        };
        (process, shared, sender)
    }

    /// The process's id: the name of its directory in the sandbox, and what
    /// [`Backend::follow_live`](crate::Backend::follow_live) takes it up by.
    pub fn id(&self) -> &str {
        &self.handle.shared.id
    }

    /// The sandbox it runs in.
    pub fn sandbox_id(&self) -> &str {
        &self.handle.shared.sandbox_id
    }

    /// The pid of its runner inside the sandbox: the process whose stdin is the command's and
    /// whose process group the command leads with it. Deliberately not called `pid`: it is
    /// not a host process.
    pub fn sandbox_pid(&self) -> u32 {
        self.handle.shared.pid
    }

    /// How many output bytes [`read`](Self::read) handed over so far.
    pub fn delivered(&self) -> u64 {
        self.handle.shared.delivered.load(Ordering::SeqCst)
    }

    /// How it ended, once [`read`](Self::read) has reported the end.
    pub fn end(&self) -> Option<LiveEnd> {
        self.handle
            .shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The next output, the end (after the last output), or [`LiveRead::Pending`] when
    /// nothing came within `wait`. Blocks the calling thread.
    pub fn read(&self, wait: Duration) -> LiveRead {
        if let Some(end) = self.end() {
            return LiveRead::Ended(end);
        }
        let events = self
            .handle
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let event = match events.recv_timeout(wait) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => return LiveRead::Pending,
            // The follower is gone without telling an end: nothing follows it any more.
            Err(RecvTimeoutError::Disconnected) => LiveEvent::End(LiveEnd::Detached),
        };
        let shared = &self.handle.shared;
        match event {
            LiveEvent::Output(bytes) => {
                shared
                    .delivered
                    .fetch_add(bytes.len() as u64, Ordering::SeqCst);
                LiveRead::Output(bytes)
            }
            LiveEvent::End(end) => {
                *shared.end.lock().unwrap_or_else(PoisonError::into_inner) = Some(end.clone());
                LiveRead::Ended(end)
            }
        }
    }

    /// Writes `data` to the command's stdin (on a terminal: types it; `\x03` is Ctrl-C). This
    /// is a use of the sandbox: a paused one is resumed first.
    pub fn write(&self, data: &[u8]) -> Result<(), Error> {
        let shared = &self.handle.shared;
        self.host("write to a live process")?.input(
            &shared.sandbox_id,
            shared.pid,
            &shared.id,
            data,
            INPUT_COVER,
        )
    }

    /// Closes the command's stdin: it reads end of file (on a terminal, write `\x04`
    /// instead: a terminal's end of file is a character).
    pub fn close_stdin(&self) -> Result<(), Error> {
        let shared = &self.handle.shared;
        self.host("close a live process's stdin")?.close_input(
            &shared.sandbox_id,
            shared.pid,
            &shared.id,
        )
    }

    /// Sends `signal` to the command (see [`LiveSignal`]); its end, if it ends, arrives through
    /// [`read`](Self::read). A use of the sandbox, like any command.
    pub fn signal(&self, signal: LiveSignal) -> Result<(), Error> {
        let shared = &self.handle.shared;
        self.host("signal a live process")?
            .signal(&shared.sandbox_id, &shared.id, signal)
    }

    fn host(&self, operation: &'static str) -> Result<Arc<dyn LiveHost>, Error> {
        let shared = &self.handle.shared;
        shared.host.upgrade().ok_or_else(|| Error::Closed {
            operation,
            sandbox_id: Some(shared.sandbox_id.clone()),
        })
    }
}
