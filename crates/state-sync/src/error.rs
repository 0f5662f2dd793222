//! The one error type of this crate.

use capped_tar::describe_member;
use std::io;
use std::path::PathBuf;

use capped_tar::RejectReason;

/// Everything that can go wrong while planning a transfer or reading or writing an archive.
///
/// Every variant names the operation and, where there is one, the remote path or archive member
/// it concerns. The wording of `Display` is for people; callers decide with the `is_*()`
/// predicates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A remote path given to a plan or to the teardown writer is not an absolute, normalised
    /// path.
    #[error("{operation}: remote path {path:?} is invalid: {reason}")]
    InvalidRemotePath {
        /// The operation that was refused, e.g. `"plan upload"`.
        operation: &'static str,
        /// The offending path, lossily rendered.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Two different host files were planned for the same remote path (E2B refuses a multipart
    /// upload whose parts resolve to one path).
    #[error(
        "plan upload: remote path {path:?} is the destination of both {first:?} and {second:?}"
    )]
    DuplicateRemotePath {
        /// The remote path named twice.
        path: String,
        /// The first host file planned for it.
        first: PathBuf,
        /// The second host file planned for it.
        second: PathBuf,
    },
    /// A remote path is planned both as a file and as the parent directory of another file.
    #[error("plan upload: remote path {path:?} is planned as a file and as a directory")]
    FileAndDirectory {
        /// The remote path used both ways.
        path: String,
    },
    /// The archive could not be read to its end: over the cap, truncated, malformed, or the
    /// stream underneath failed.
    #[error("{operation} failed")]
    Archive {
        /// The operation, e.g. `"read archive"`.
        operation: &'static str,
        /// What the reader found.
        #[source]
        source: capped_tar::Error,
    },
    /// A member broke a member rule and the configuration says to refuse the whole archive.
    #[error("{operation}: archive member {member:?} refused: {reason}")]
    UnsafeMember {
        /// The operation, e.g. `"read archive"`.
        operation: &'static str,
        /// The member name, lossily rendered.
        member: String,
        /// The rule it broke.
        reason: RejectReason,
    },
    /// The destination of accepted members (a directory, an output archive) failed.
    #[error("{operation}: writing {} failed", describe_member(.member))]
    Sink {
        /// The operation, e.g. `"write teardown archive"`.
        operation: &'static str,
        /// The member being written, if any.
        member: Option<String>,
        /// The error the destination returned.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The archive was bigger than the configured cap.
    pub fn is_over_cap(&self) -> bool {
        self.archive_error()
            .is_some_and(capped_tar::Error::is_over_cap)
    }

    /// The archive ended early (a partial transfer is never a success).
    pub fn is_truncated(&self) -> bool {
        self.archive_error()
            .is_some_and(capped_tar::Error::is_truncated)
    }

    /// The archive was not a well-formed tar stream.
    pub fn is_malformed(&self) -> bool {
        self.archive_error()
            .is_some_and(capped_tar::Error::is_malformed)
    }

    /// A member broke a member rule under [`UnsafeMembers::Refuse`](crate::UnsafeMembers::Refuse).
    pub fn is_unsafe_member(&self) -> bool {
        matches!(self, Self::UnsafeMember { .. })
    }

    /// A plan was refused because of its input paths (nothing was sent anywhere).
    pub fn is_invalid_plan(&self) -> bool {
        matches!(
            self,
            Self::InvalidRemotePath { .. }
                | Self::DuplicateRemotePath { .. }
                | Self::FileAndDirectory { .. }
        )
    }

    /// The stream from the sandbox failed underneath the archive reader.
    pub fn is_source_failure(&self) -> bool {
        self.archive_error()
            .is_some_and(capped_tar::Error::is_source_failure)
    }

    /// The host-side destination failed (disk full, permissions, ...).
    pub fn is_sink_failure(&self) -> bool {
        matches!(self, Self::Sink { .. })
    }

    /// The archive content cannot be trusted as complete: over the cap, truncated, malformed or
    /// refused. A caller must not treat anything it received as the sandbox's whole state.
    pub fn is_archive_unusable(&self) -> bool {
        self.is_over_cap() || self.is_truncated() || self.is_malformed() || self.is_unsafe_member()
    }

    /// The archive member this error concerns, if any.
    pub fn member(&self) -> Option<&str> {
        match self {
            Self::Archive { source, .. } => source.member(),
            Self::Sink { member, .. } => member.as_deref(),
            Self::UnsafeMember { member, .. } => Some(member),
            _ => None,
        }
    }

    /// The reader's error, when the archive itself is what failed.
    pub fn archive_error(&self) -> Option<&capped_tar::Error> {
        match self {
            Self::Archive { source, .. } => Some(source),
            _ => None,
        }
    }
}
