//! Every call ends (contract O7): [`Backend::within`] runs a blocking call on a thread of its
//! own and gives up on it at its deadline, naming what it waited for.
//!
//! A blocking call cannot be cancelled from outside (it may hold the scope's state lock, be
//! inside the host's sync hooks, or wait for an answer), so the watchdog stops *waiting*: the
//! caller gets [`Error::Stalled`] and goes on; the call finishes on its own thread, and what it
//! started after its caller left (a command) is stopped there. While such a call is still
//! running, the next call waits only [`STALLED_RETRY`] for its own turn: a caller's retries
//! (Hermes retries a failed command three times) then fail fast instead of each waiting a
//! whole deadline behind the same stuck step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Backend, Inner};
use crate::error::Error;

/// How long a call waits while an earlier call of the same backend that the watchdog gave up
/// on is still running.
pub const STALLED_RETRY: Duration = Duration::from_secs(2);

/// When a call must have ended: its own time plus the backend's watchdog grace, counted from
/// [`Backend::call_deadline`]. Copy it to every step of one call (admission, start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadline {
    at: Instant,
    granted: Duration,
}

impl CallDeadline {
    /// What is left of it now (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The whole time the call was granted: its own time plus the grace.
    pub fn granted(&self) -> Duration {
        self.granted
    }
}

/// A call the watchdog gave up on, until it ends.
#[derive(Debug)]
pub(super) struct Stall {
    operation: &'static str,
    ended: Arc<AtomicBool>,
    waited_for: String,
}

/// The backend's memory of its last abandoned call (leaf lock).
#[derive(Debug, Default)]
pub(super) struct Stalls {
    last: Mutex<Option<Stall>>,
}

impl Stalls {
    /// The abandoned call still running, if any: `(operation, what it waited for)`.
    fn running(&self) -> Option<(&'static str, String)> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match last.as_ref() {
            Some(stall) if !stall.ended.load(Ordering::Acquire) => {
                Some((stall.operation, stall.waited_for.clone()))
            }
            Some(_) => {
                *last = None;
                None
            }
            None => None,
        }
    }

    fn record(&self, stall: Stall) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(stall);
    }
}

/// Whether the caller still waits for the call's result (under one lock with the worker's
/// hand-over, so a result is either taken by the caller or handled by the worker, never both
/// or neither).
enum Waiter {
    Waiting,
    GaveUp,
}

impl Backend {
    /// The deadline of a call given `time` of its own (Hermes' command time, or the
    /// environment's): `time` plus the configured watchdog grace, from now.
    pub fn call_deadline(&self, time: Duration) -> CallDeadline {
        let granted = time.saturating_add(self.inner.config.watchdog_grace);
        let now = Instant::now();
        CallDeadline {
            at: now.checked_add(granted).unwrap_or(now),
            granted,
        }
    }

    /// Runs `call` on a thread of its own and returns what it returns, unless `deadline`
    /// passes first: then [`Error::Stalled`] naming `operation`, the sandbox and what held the
    /// scope ([`Backend::holder`]). A result that arrives after that is handed to `late` (a
    /// started command is killed there). While an earlier abandoned call still runs, this
    /// call waits at most [`STALLED_RETRY`].
    pub fn within<T, F, L>(
        &self,
        operation: &'static str,
        deadline: CallDeadline,
        call: F,
        late: L,
    ) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Backend) -> Result<T, Error> + Send + 'static,
        L: FnOnce(T) + Send + 'static,
    {
        let earlier = self.inner.stalls.running();
        let budget = match &earlier {
            Some(_) => deadline.remaining().min(STALLED_RETRY),
            None => deadline.remaining(),
        };
        let started = Instant::now();
        let (sender, receiver) = mpsc::sync_channel::<Result<T, Error>>(1);
        let waiter = Arc::new(Mutex::new(Waiter::Waiting));
        let ended = Arc::new(AtomicBool::new(false));
        let worker = Backend {
            inner: Arc::clone(&self.inner),
        };
        let worker_waiter = Arc::clone(&waiter);
        let worker_ended = Arc::clone(&ended);
        let spawned = std::thread::Builder::new()
            .name("e2b-call".to_owned())
            .spawn(move || {
                let result = call(&worker);
                let waiter = worker_waiter.lock().unwrap_or_else(PoisonError::into_inner);
                match *waiter {
                    // The channel holds one result and this is the only send: never blocks.
                    Waiter::Waiting => drop(sender.send(result)),
                    Waiter::GaveUp => {
                        drop(waiter);
                        if let Ok(value) = result {
                            late(value);
                        }
                    }
                }
                worker_ended.store(true, Ordering::Release);
            });
        if let Err(source) = spawned {
            return Err(Error::Io {
                operation: "start watchdog thread",
                path: std::path::PathBuf::new(),
                source,
            });
        }
        match receiver.recv_timeout(budget) {
            Ok(result) => return result,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The worker panicked before handing anything over.
                return Err(self.inner.stalled(operation, started.elapsed(), None));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let mut state = waiter.lock().unwrap_or_else(PoisonError::into_inner);
        // The result may have arrived between the timeout and the lock.
        if let Ok(result) = receiver.try_recv() {
            return result;
        }
        *state = Waiter::GaveUp;
        drop(state);
        let error = self.inner.stalled(operation, started.elapsed(), earlier);
        if let Error::Stalled { waited_for, .. } = &error {
            self.inner.stalls.record(Stall {
                operation,
                ended,
                waited_for: waited_for.clone(),
            });
        }
        Err(error)
    }
}

impl Inner {
    /// The error of a call given up on after `waited`: what held the scope then, or the
    /// earlier abandoned call this one queued behind.
    fn stalled(
        &self,
        operation: &'static str,
        waited: Duration,
        earlier: Option<(&'static str, String)>,
    ) -> Error {
        let waited_for = match (self.holder.current(), earlier) {
            (Some(holder), None) => format!("the scope's state, held by {holder}"),
            (Some(holder), Some((earlier, _))) => format!(
                "the scope's state, held by {holder}, behind an earlier `{earlier}` the watchdog ended"
            ),
            (None, Some((earlier, what))) => {
                format!("an earlier `{earlier}` the watchdog ended, which waited for {what}")
            }
            (None, None) => "the sandbox's answer".to_owned(),
        };
        // Never the state lock here: this is what a caller reads when that lock is stuck.
        let sandbox_id = self
            .handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|transport| transport.sandbox_id().to_owned());
        Error::Stalled {
            operation,
            sandbox_id,
            waited,
            waited_for,
        }
    }
}
