//! Why a change of the scope (checkpoint, rollback, fork, adoption) or a file fetch was
//! refused.

use std::fmt;

/// Why a checkpoint, rollback, fork or adoption was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointRefusal {
    /// This session does not hold the scope's writer role (R1).
    NotWriter,
    /// The backend has no scope of its own to change (attach mode, the probe scope).
    NoScope(&'static str),
    /// Commands of the scope still ran after the wait (R2).
    CommandsRunning {
        /// Each one as `pid N: text`.
        commands: Vec<String>,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// No checkpoint of the scope matches.
    NoCheckpoint {
        /// What was asked for.
        target: String,
    },
    /// The branch is not one of the fork's started branches.
    NotABranch {
        /// The sandbox asked for.
        sandbox_id: String,
    },
}

impl fmt::Display for CheckpointRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointRefusal::NotWriter => f.write_str(
                "this session is not the scope's writer; only the session holding the writer role may do this",
            ),
            CheckpointRefusal::NoScope(what) => write!(f, "{what} has no scope of its own to change"),
            CheckpointRefusal::CommandsRunning { commands, waited } => {
                let n = commands.len();
                write!(
                    f,
                    "{n} command{} still running after waiting {} s ({}); E2B pauses the sandbox to snapshot it, which would cut {}: let {} finish or stop {} first",
                    if n == 1 { " is" } else { "s are" },
                    waited.as_secs(),
                    commands.join("; "),
                    if n == 1 { "it" } else { "them" },
                    if n == 1 { "it" } else { "them" },
                    if n == 1 { "it" } else { "them" },
                )
            }
            CheckpointRefusal::NoCheckpoint { target } => {
                write!(f, "no checkpoint of this scope matches {target}")
            }
            CheckpointRefusal::NotABranch { sandbox_id } => {
                write!(f, "sandbox {sandbox_id} is not a started branch of this fork")
            }
        }
    }
}

/// Why [`crate::Backend::fetch_file`] refused a sandbox file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileRefusal {
    /// Missing, or not a regular file once links are followed (a directory, a device, a fifo).
    NotRegularFile,
    /// The path asked for is no absolute sandbox path; nothing was contacted.
    InvalidPath(&'static str),
    /// More than `max_bytes` bytes: refused at the first byte past the cap.
    OverCap {
        /// The cap.
        max_bytes: u64,
    },
}

impl fmt::Display for FileRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileRefusal::NotRegularFile => f.write_str("missing or not a regular file"),
            FileRefusal::InvalidPath(reason) => f.write_str(reason),
            FileRefusal::OverCap { max_bytes } => {
                write!(f, "larger than the cap of {max_bytes} bytes")
            }
        }
    }
}
