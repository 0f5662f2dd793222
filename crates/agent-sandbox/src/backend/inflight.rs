//! The scope's commands and fetches in flight: counted, so a checkpoint can wait for them,
//! and described, so a refusal can name them.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The scope's running commands (and fetches): counted, and described for a checkpoint that
/// must say which ones it waited for.
#[derive(Default)]
pub(super) struct Inflight {
    running: Mutex<Running>,
    idle: Condvar,
}

#[derive(Default)]
struct Running {
    next: u64,
    what: std::collections::BTreeMap<u64, String>,
}

impl Inflight {
    /// Counts one more; `what` describes it (already redacted) and `leave` takes the token.
    pub(super) fn enter(&self, what: String) -> u64 {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.next += 1;
        let token = running.next;
        running.what.insert(token, what);
        token
    }

    pub(super) fn leave(&self, token: u64) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.what.remove(&token);
        if running.what.is_empty() {
            self.idle.notify_all();
        }
    }

    /// Whether nothing runs now.
    pub(super) fn is_idle(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .what
            .is_empty()
    }

    pub(super) fn wait_idle(&self) {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let _idle = self
            .idle
            .wait_while(running, |running| !running.what.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// Waits up to `wait` for nothing to run; what still runs then, if anything.
    pub(super) fn wait_idle_for(&self, wait: Duration) -> Result<(), Vec<String>> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let (running, _timeout) = self
            .idle
            .wait_timeout_while(running, wait, |running| !running.what.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        if running.what.is_empty() {
            Ok(())
        } else {
            Err(running.what.values().cloned().collect())
        }
    }
}

/// How a running command reads in a refusal: its sandbox pid and the start of its text.
pub(super) fn describe_command(pid: u32, command: &str) -> String {
    const SHOWN: usize = 60;
    let text: String = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut shown: String = text.chars().take(SHOWN).collect();
    if text.chars().count() > SHOWN {
        shown.push('…');
    }
    format!("pid {pid}: {}", e2b_client::redact(&shown))
}
