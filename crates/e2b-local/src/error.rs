//! The crate's one error type.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong when starting, driving or stopping an e2b-local [`crate::Server`].
///
/// Protocol-level failures seen by clients (404, 409, Connect errors, ...) are HTTP
/// answers, not values of this type: this enum only covers what the embedding code
/// itself asked for. `Display` names the failed step only; the operating-system cause
/// is [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("e2b-local: binding the listener on {addr} failed")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// The operating-system error.
        source: io::Error,
    },
    /// The state directory (or a file in it) could not be created, read or written.
    #[error("e2b-local: {operation} failed for {}", path.display())]
    StateDir {
        /// What was being done, e.g. "create state directory".
        operation: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating-system error.
        source: io::Error,
    },
    /// The configuration is not usable.
    #[error("e2b-local: invalid configuration: {reason}")]
    InvalidConfig {
        /// Why the configuration was refused.
        reason: String,
    },
    /// A knob named a sandbox that does not exist (or is not in the required state).
    #[error("e2b-local: {operation} failed: sandbox {sandbox_id} {reason}")]
    Sandbox {
        /// The knob that was used, e.g. "vanish sandbox".
        operation: &'static str,
        /// The sandbox the knob named.
        sandbox_id: String,
        /// Why the operation could not be applied, e.g. "does not exist".
        reason: &'static str,
    },
    /// The HTTP server task failed or could not be joined.
    #[error("e2b-local: {operation} failed")]
    Serve {
        /// What was being done, e.g. "serve connections".
        operation: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

impl Error {
    /// True when the listener could not be bound (port in use, bad address).
    pub fn is_bind(&self) -> bool {
        matches!(self, Error::Bind { .. })
    }

    /// True when a knob named a sandbox that does not exist or is in the wrong state.
    pub fn is_sandbox_not_found(&self) -> bool {
        matches!(self, Error::Sandbox { .. })
    }

    /// True when the configuration was refused before anything was started.
    pub fn is_invalid_config(&self) -> bool {
        matches!(self, Error::InvalidConfig { .. })
    }

    /// True for failures of the state directory (disk full, permissions, corrupt record).
    pub fn is_state_dir(&self) -> bool {
        matches!(self, Error::StateDir { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();
        let e = Error::Sandbox {
            operation: "vanish sandbox",
            sandbox_id: "iabc".into(),
            reason: "does not exist",
        };
        assert!(e.is_sandbox_not_found());
        assert!(!e.is_bind());
        assert!(e.to_string().contains("iabc"));
    }

    #[test]
    fn display_leaves_the_cause_to_source() {
        let e = Error::Bind {
            addr: "127.0.0.1:1".parse().unwrap(),
            source: io::Error::new(io::ErrorKind::AddrInUse, "port taken"),
        };
        assert_eq!(
            e.to_string(),
            "e2b-local: binding the listener on 127.0.0.1:1 failed"
        );
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("port taken"));
        let e = Error::StateDir {
            operation: "create state directory",
            path: PathBuf::from("/nowhere"),
            source: io::Error::other("read-only file system"),
        };
        assert!(!e.to_string().contains("read-only"));
        assert!(std::error::Error::source(&e).is_some());
    }
}
