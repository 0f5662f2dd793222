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
    #[error("recover (sandbox {sandbox_id}): the Hermes home {home:?} cannot be opened: {source}")]
    HomeUnusable {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The home as given.
        home: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The snapshot stream itself failed (network, process exit).
    #[error("recover (sandbox {sandbox_id}): reading the snapshot failed: {source}")]
    SnapshotSource {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The stream's error.
        source: io::Error,
    },
    /// The snapshot exceeded its byte cap; reading stopped there.
    #[error(
        "recover (sandbox {sandbox_id}): snapshot exceeds the cap of {limit} bytes (at member {member:?})"
    )]
    SnapshotOverCap {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The cap in bytes.
        limit: u64,
        /// The member being read, if any.
        member: Option<String>,
    },
    /// The snapshot ended early (in a header, in a member, or without its end marker; an empty
    /// stream is truncated too).
    #[error("recover (sandbox {sandbox_id}): snapshot is truncated (at member {member:?})")]
    SnapshotTruncated {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The member being read, or the last one read.
        member: Option<String>,
    },
    /// The snapshot is not a well-formed tar stream.
    #[error(
        "recover (sandbox {sandbox_id}): snapshot is malformed (near member {member:?}): {detail}"
    )]
    SnapshotMalformed {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// The member being read, or the last one read.
        member: Option<String>,
        /// What is wrong.
        detail: String,
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
    #[error("recover (sandbox {sandbox_id}): {operation} {path:?} failed: {source}")]
    HostIo {
        /// The sandbox being recovered.
        sandbox_id: String,
        /// What was being done, e.g. `"write"`.
        operation: &'static str,
        /// The path, relative to the Hermes home.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl Error {
    /// The snapshot could not be read completely (source failure, over the cap, truncated,
    /// malformed): the sandbox's state is unverified (contract S11).
    pub fn is_snapshot_unreadable(&self) -> bool {
        matches!(
            self,
            Self::SnapshotSource { .. }
                | Self::SnapshotOverCap { .. }
                | Self::SnapshotTruncated { .. }
                | Self::SnapshotMalformed { .. }
        )
    }

    /// The snapshot was bigger than the cap.
    pub fn is_over_cap(&self) -> bool {
        matches!(self, Self::SnapshotOverCap { .. })
    }

    /// The snapshot ended early.
    pub fn is_truncated(&self) -> bool {
        matches!(self, Self::SnapshotTruncated { .. })
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

    /// Whether the caller must not push the host snapshot over the sandbox. Always true: every
    /// recovery error leaves sandbox files that were neither verified nor preserved.
    pub fn blocks_push(&self) -> bool {
        true
    }

    /// The sandbox this error concerns, if it names one.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self {
            Self::InvalidRemoteHome { .. } => None,
            Self::InvalidSandboxId { sandbox_id }
            | Self::HomeUnusable { sandbox_id, .. }
            | Self::SnapshotSource { sandbox_id, .. }
            | Self::SnapshotOverCap { sandbox_id, .. }
            | Self::SnapshotTruncated { sandbox_id, .. }
            | Self::SnapshotMalformed { sandbox_id, .. }
            | Self::QuarantineRefused { sandbox_id, .. }
            | Self::HostIo { sandbox_id, .. } => Some(sandbox_id),
        }
    }
}
