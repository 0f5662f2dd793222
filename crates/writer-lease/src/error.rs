//! The crate's one error type.

use std::io;
use std::path::{Path, PathBuf};

use crate::phase::WriterPhase;

/// What went wrong while coordinating a scope on this host.
///
/// Every variant names the operation; those about a file also name its path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{operation} failed for {}", path.display())]
    Io {
        /// What was being done, e.g. "write dirty marker".
        operation: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A coordination file exists but does not hold what this crate writes.
    #[error("{operation} failed for {}: the file is corrupt ({detail})", path.display())]
    Corrupt {
        /// What was being done, e.g. "read prepared stamp".
        operation: &'static str,
        /// The file involved.
        path: PathBuf,
        /// What is wrong with its content.
        detail: &'static str,
    },
    /// A writer step was called out of protocol order (a caller bug).
    #[error("{operation} refused: the writer is {phase}")]
    OutOfOrder {
        /// The step that was refused.
        operation: &'static str,
        /// The phase the writer was in.
        phase: WriterPhase,
    },
    /// A sandbox id is not something E2B issues, so it cannot be stamped.
    #[error(
        "{operation} refused: a sandbox id must be 1 to 128 ASCII letters, digits, '-', '_' or '.' (got {length} bytes)"
    )]
    InvalidSandboxId {
        /// The step that was refused.
        operation: &'static str,
        /// Length in bytes of the rejected id.
        length: usize,
    },
    /// A scope key was not 64 lowercase hex characters.
    #[error("parse scope key failed: expected 64 lowercase hex characters, got {length} bytes")]
    MalformedScopeKey {
        /// Length in bytes of the rejected value.
        length: usize,
    },
}

impl Error {
    pub(crate) fn io(operation: &'static str, path: &Path, source: io::Error) -> Self {
        Error::Io {
            operation,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The operation that failed.
    pub fn operation(&self) -> &'static str {
        match self {
            Error::Io { operation, .. }
            | Error::Corrupt { operation, .. }
            | Error::OutOfOrder { operation, .. }
            | Error::InvalidSandboxId { operation, .. } => operation,
            Error::MalformedScopeKey { .. } => "parse scope key",
        }
    }

    /// The file or directory involved, if the error is about one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::Io { path, .. } | Error::Corrupt { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Whether the filesystem failed (the host, not the caller, is at fault).
    pub fn is_io(&self) -> bool {
        matches!(self, Error::Io { .. })
    }

    /// Whether a coordination file held unexpected content.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }

    /// Whether the caller broke the writer protocol or passed a bad argument.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            Error::OutOfOrder { .. }
                | Error::InvalidSandboxId { .. }
                | Error::MalformedScopeKey { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static_and_names_operation_and_path() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();

        let err = Error::io(
            "write dirty marker",
            Path::new("/tmp/x.dirty"),
            io::Error::from(io::ErrorKind::PermissionDenied),
        );
        let text = err.to_string();
        assert!(text.contains("write dirty marker"), "{text}");
        assert!(text.contains("/tmp/x.dirty"), "{text}");
        assert!(err.is_io() && !err.is_caller_error());
        assert_eq!(err.path(), Some(Path::new("/tmp/x.dirty")));
        assert_eq!(err.operation(), "write dirty marker");

        let misuse = Error::OutOfOrder {
            operation: "complete push",
            phase: WriterPhase::Idle,
        };
        assert!(misuse.is_caller_error());
        assert!(misuse.to_string().contains("idle"));
    }
}
