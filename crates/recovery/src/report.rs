//! What recovery did with every file: the report the caller logs and shows.

use std::fmt;
use std::path::PathBuf;

use capped_tar::RejectReason;

/// What happened to one sandbox file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The host lacked the file; it was written in place (contract S5).
    Restored,
    /// The host already had identical content; nothing was written.
    Unchanged,
    /// The sandbox copy is exactly what this host last pushed there, and the host has changed
    /// the file since: the host's newer version stays, nothing was written, and nothing the
    /// sandbox wrote is lost (contract S15).
    Superseded,
    /// The sandbox copy was saved in the quarantine tree; the host path was left alone
    /// (contract S6, S7, S9).
    Quarantined {
        /// Where the copy is, relative to the Hermes home
        /// (`cache/e2b-recovered/<sandbox id>/skills/...`).
        at: PathBuf,
        /// Why it was not restored in place.
        reason: QuarantineReason,
    },
    /// The file was not recovered and stays in the sandbox (contract S10, X5).
    Skipped {
        /// Why.
        reason: SkipReason,
    },
}

impl Outcome {
    /// True for outcomes a person should be told about (quarantined or skipped).
    pub fn needs_warning(&self) -> bool {
        matches!(self, Self::Quarantined { .. } | Self::Skipped { .. })
    }
}

/// Why a sandbox file went to quarantine instead of its place.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// Both sides have the file with different content; the host copy stays.
    Conflict,
    /// The host copy exists but could not be read, so it could not be compared.
    HostUnreadable,
    /// The host path holds something other than a regular file (a directory, a symlink, ...).
    HostNotRegularFile,
    /// The host directory could not be written.
    HostUnwritable,
    /// The recoverable root (`skills` or `memories`) is a symlink: the whole tree is redirected.
    RedirectedRoot {
        /// The root, `skills` or `memories`.
        root: String,
    },
    /// A directory on the way is a symlink (or was swapped for one during recovery).
    SymlinkedDirectory {
        /// That directory, relative to the Hermes home.
        at: String,
    },
    /// The destination is a host-only path (a credential, config, ...): never written from
    /// sandbox data (contract S9).
    HostOnlyPath,
}

impl fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Conflict => f.write_str("the host has a different version"),
            Self::HostUnreadable => f.write_str("the host copy cannot be read"),
            Self::HostNotRegularFile => f.write_str("the host path is not a regular file"),
            Self::HostUnwritable => f.write_str("the host directory cannot be written"),
            Self::RedirectedRoot { root } => write!(f, "{root}/ is a symlink (redirected root)"),
            Self::SymlinkedDirectory { at } => write!(f, "{at} is a symlinked directory"),
            Self::HostOnlyPath => f.write_str("the destination is a host-only (credential) path"),
        }
    }
}

/// Why a sandbox file was not recovered at all.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The snapshot reader rejected the member: its name, its type (links, devices, fifos, ...)
    /// or its place in the snapshot (a duplicate, a member below a file member).
    Rejected(RejectReason),
    /// The name cannot be represented on this host (refused by the filesystem).
    Unrepresentable,
    /// A name component is longer than the host allows (255 bytes).
    NameTooLong,
    /// The full destination path is longer than the host allows (4095 bytes).
    PathTooLong,
    /// An ancestor of the destination is a regular file (or other non-directory) on the host.
    AncestorIsFile {
        /// That ancestor, relative to the Hermes home.
        at: String,
    },
    /// The member is outside `skills/` and `memories/` (only those trees are recovered).
    OutsideRecoverableTrees,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected(reason) => write!(f, "{reason}"),
            Self::Unrepresentable => f.write_str("the name cannot be represented on this host"),
            Self::NameTooLong => f.write_str("a name component is too long for this host"),
            Self::PathTooLong => f.write_str("the path is too long for this host"),
            Self::AncestorIsFile { at } => write!(f, "{at} is a file on the host"),
            Self::OutsideRecoverableTrees => f.write_str("outside skills/ and memories/"),
        }
    }
}

/// One sandbox file and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// The member name as it appeared in the snapshot (lossily rendered as UTF-8), relative to
    /// the sandbox's Hermes home, e.g. `skills/x/SKILL.md`.
    pub member: String,
    /// What happened.
    pub outcome: Outcome,
}

/// Whether the sandbox had anything to recover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    /// The snapshot was a complete, empty archive: the sandbox verifiably has neither
    /// `skills/` nor `memories/` (contract S11: proceed).
    NothingToRecover,
    /// The snapshot had members; every one is in [`RecoveryReport::files`].
    Recovered,
}

/// The result of one recovery: every sandbox file with its outcome; nothing is silently dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The sandbox recovered from.
    pub sandbox_id: String,
    /// Whether there was anything to recover.
    pub state: SnapshotState,
    /// Every file member (and every member not recovered), in snapshot order.
    pub files: Vec<FileReport>,
}

impl RecoveryReport {
    /// Number of files whose outcome matches `predicate`.
    pub fn count(&self, predicate: impl Fn(&Outcome) -> bool) -> usize {
        self.files.iter().filter(|f| predicate(&f.outcome)).count()
    }

    /// The outcome recorded for `member`, if any.
    pub fn outcome_of(&self, member: &str) -> Option<&Outcome> {
        self.files
            .iter()
            .find(|f| f.member == member)
            .map(|f| &f.outcome)
    }

    /// One warning line per quarantined or skipped file, naming the sandbox and the file.
    pub fn warnings(&self) -> Vec<String> {
        let id = &self.sandbox_id;
        self.files
            .iter()
            .filter_map(|file| match &file.outcome {
                Outcome::Quarantined { at, reason } => Some(format!(
                    "E2B recovery (sandbox {id}): {} not restored in place ({reason}); the sandbox copy is saved at {}",
                    file.member,
                    at.display()
                )),
                Outcome::Skipped { reason } => Some(format!(
                    "E2B recovery (sandbox {id}): {} not recovered ({reason}); it stays in the sandbox",
                    file.member
                )),
                Outcome::Restored | Outcome::Unchanged | Outcome::Superseded => None,
            })
            .collect()
    }
}
