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
    what: std::collections::BTreeMap<u64, What>,
}

/// What runs, as a refusal names it: text already redacted, or a command whose description
/// is redacted only when it is read (a command's start pays no redaction: a refusal that
/// names it is rare, a start is not).
enum What {
    Described(String),
    Command { pid: u32, shown: String },
}

impl What {
    fn describe(&self) -> String {
        match self {
            What::Described(text) => text.clone(),
            What::Command { pid, shown } => format!("pid {pid}: {}", e2b_client::redact(shown)),
        }
    }
}

impl Inflight {
    /// Counts one more; `what` describes it (already redacted) and `leave` takes the token.
    pub(super) fn enter(&self, what: String) -> u64 {
        self.enter_what(What::Described(what))
    }

    /// Counts one more command: described as [`describe_command`] words it, when asked.
    pub(super) fn enter_command(&self, pid: u32, command: &str) -> u64 {
        self.enter_what(What::Command {
            pid,
            shown: shown_command(command),
        })
    }

    fn enter_what(&self, what: What) -> u64 {
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
            Err(running.what.values().map(What::describe).collect())
        }
    }
}

/// How a running command reads in a refusal: its sandbox pid and the start of its text.
#[cfg(test)]
pub(super) fn describe_command(pid: u32, command: &str) -> String {
    What::Command {
        pid,
        shown: shown_command(command),
    }
    .describe()
}

/// The start of a command's text as a refusal shows it (before redaction): its words joined
/// by single spaces, cut at [`SHOWN`] characters with `…` when there are more. Only as much
/// of the command is read as is shown.
fn shown_command(command: &str) -> String {
    const SHOWN: usize = 60;
    let mut shown = String::new();
    let mut count = 0;
    for (index, word) in command.split_whitespace().enumerate() {
        for c in (index > 0).then_some(' ').into_iter().chain(word.chars()) {
            if count == SHOWN {
                shown.push('…');
                return shown;
            }
            shown.push(c);
            count += 1;
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shown text is the words joined by single spaces, cut at 60 characters with `…`
    /// only when more follow: what joining every word first and cutting then gave.
    #[test]
    fn a_command_is_shown_as_its_first_words_and_redacted_when_read() {
        let old = |command: &str| {
            let text: String = command.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut shown: String = text.chars().take(60).collect();
            if text.chars().count() > 60 {
                shown.push('…');
            }
            shown
        };
        let sixty = "a".repeat(60);
        for command in [
            "",
            "   ",
            "true",
            "  echo   hi \n\t there ",
            sixty.as_str(),
            &format!("{sixty} "),
            &format!("{sixty}b"),
            &format!("{} {}", "x".repeat(59), "y"),
            &format!("{} {}", "x".repeat(60), "y"),
            &format!("{} {}", "é".repeat(30), "ü".repeat(40)),
        ] {
            assert_eq!(shown_command(command), old(command), "{command:?}");
        }
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let described = describe_command(7, &format!("curl -H 'X-API-Key: {key}'"));
        assert!(described.starts_with("pid 7: curl"), "{described}");
        assert!(!described.contains("0123456789abcdef"), "{described}");
    }
}
