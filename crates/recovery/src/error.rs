//! The one error type of this crate. Every error blocks the caller's push.

use std::io;
use std::path::PathBuf;

/// Why a recovery failed. Every variant names the sandbox.
///
/// Any error means the sandbox's state was not verified and must not be overwritten: the caller
/// fails bring-up closed and retries on the next use (contract S8, S11). Per-file problems are
/// not errors; they are outcomes in the [`RecoveryReport`](crate::RecoveryReport).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The sandbox id cannot name a quarantine directory.
    #[error(
        "recover: sandbox id {sandbox_id:?} is not a plain name ([A-Za-z0-9._-], 1-128 bytes, not . or ..)"
    )]
    InvalidSandboxId {
        /// The refused id.
        sandbox_id: String,
    },
    /// The remote Hermes home given for the snapshot command is not an absolute path.
    #[error("snapshot command: remote Hermes home {path:?} is not an absolute path without NUL")]
    InvalidRemoteHome {
        /// The refused path.
        path: String,
    },
    /// The host Hermes home cannot be resolved or opened.
    #[error("recover (sandbox {sandbox_id}): the Hermes home {home:?} cannot be opened")]
    HomeUnusable {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The home as given.
        home: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// The snapshot could not be read to its end: over the cap, truncated, malformed, or the
    /// stream underneath failed (network, process exit). An empty stream is truncated too.
    #[error("recover (sandbox {sandbox_id}): the snapshot cannot be read")]
    Snapshot {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// What the snapshot reader found.
        #[source]
        source: capped_tar::Error,
    },
    /// The quarantine tree or a destination in it cannot be used safely; recovery fails closed
    /// rather than write through it (contract S8).
    #[error("recover (sandbox {sandbox_id}): refusing to quarantine at {path:?}: {reason}")]
    QuarantineRefused {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The refused path, relative to the Hermes home.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A host write or read failed in a way that costs more than one file (disk full, I/O
    /// error): the sandbox copy may not have been preserved.
    #[error("recover (sandbox {sandbox_id}): {operation} {path:?} failed")]
    HostIo {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// What was being done, e.g. `"write"`.
        operation: &'static str,
        /// The path, relative to the Hermes home.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The push base record could not be written after a push. Not a recovery failure and
    /// it blocks nothing: the caller logs it, and the next recovery compares the files
    /// concerned as if there were no base (every difference a conflict, S6).
    #[error("push base (sandbox {sandbox_id}): writing {path:?} failed")]
    BaseRecord {
        /// The sandbox the record describes.
        sandbox_id: String,
        /// The record file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The snapshot could not be read completely (source failure, over the cap, truncated,
    /// malformed): the sandbox's state is unverified (contract S11).
    pub fn is_snapshot_unreadable(&self) -> bool {
        matches!(self, Self::Snapshot { .. })
    }

    /// The snapshot was bigger than the cap.
    pub fn is_over_cap(&self) -> bool {
        self.snapshot_error()
            .is_some_and(capped_tar::Error::is_over_cap)
    }

    /// The snapshot ended early.
    pub fn is_truncated(&self) -> bool {
        self.snapshot_error()
            .is_some_and(capped_tar::Error::is_truncated)
    }

    /// The snapshot reader's error, when the snapshot is what could not be read.
    pub fn snapshot_error(&self) -> Option<&capped_tar::Error> {
        match self {
            Self::Snapshot { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The quarantine tree was redirected or a destination in it is host-owned (contract S8).
    pub fn is_quarantine_refused(&self) -> bool {
        matches!(self, Self::QuarantineRefused { .. })
    }

    /// The host side failed (home unusable, disk full, I/O error).
    pub fn is_host_failure(&self) -> bool {
        matches!(self, Self::HomeUnusable { .. } | Self::HostIo { .. })
    }

    /// The caller passed something unusable (sandbox id, remote home).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::InvalidSandboxId { .. } | Self::InvalidRemoteHome { .. }
        )
    }

    /// The push base record could not be written (it is only an aid to the next recovery).
    pub fn is_base_record(&self) -> bool {
        matches!(self, Self::BaseRecord { .. })
    }

    /// Whether the caller must not push the host snapshot over the sandbox. True for every
    /// recovery error, which leaves sandbox files that were neither verified nor preserved;
    /// false only for a push base that could not be written after a push.
    pub fn blocks_push(&self) -> bool {
        !self.is_base_record()
    }

    /// The sandbox this error concerns, if it names one.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self {
            Self::InvalidRemoteHome { .. } => None,
            Self::InvalidSandboxId { sandbox_id }
            | Self::HomeUnusable { sandbox_id, .. }
            | Self::Snapshot { sandbox_id, .. }
            | Self::QuarantineRefused { sandbox_id, .. }
            | Self::HostIo { sandbox_id, .. }
            | Self::BaseRecord { sandbox_id, .. } => Some(sandbox_id),
        }
    }
}
