//! The crate's one error type and the Python exception hierarchy it maps to.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::PyException;

create_exception!(
    _native,
    E2BError,
    PyException,
    "Base class of every error the E2B backend raises. Messages name the operation and the sandbox, never the API key, and never contain the word for a command deadline."
);
create_exception!(
    _native,
    ConfigurationError,
    E2BError,
    "A plugin setting or the API key configuration cannot be used."
);
create_exception!(
    _native,
    NotReadyError,
    E2BError,
    "A reader session's command was refused because the scope's state is being rebuilt or is stale; the message ends with what to do."
);
create_exception!(
    _native,
    SandboxGoneError,
    E2BError,
    "The sandbox no longer exists (killed, or unknown to E2B)."
);
create_exception!(
    _native,
    StateSyncError,
    E2BError,
    "Hermes state could not be moved into or out of the sandbox; the command did not run."
);
create_exception!(
    _native,
    BackendClosedError,
    E2BError,
    "The environment was cleaned up and never attaches again."
);

/// What went wrong in the binding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A plugin setting (`plugins.entries.e2b.settings.<key>`) is invalid.
    #[error("E2B setting {key} is invalid: {reason}")]
    InvalidSetting {
        /// The setting's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An argument handed over by the Python layer cannot be used.
    #[error("E2B {operation} refused: {reason}")]
    InvalidArgument {
        /// The binding call.
        operation: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// The backend reported a failure.
    #[error("{source}")]
    Backend {
        /// The binding call that failed.
        operation: &'static str,
        /// The backend's error; decide with its predicates.
        #[source]
        source: Box<agent_sandbox::Error>,
    },

    /// A running command was lost (its output stream failed); shared by every waiter.
    #[error("{source}")]
    CommandLost {
        /// The backend's error.
        #[source]
        source: std::sync::Arc<agent_sandbox::Error>,
    },

    /// A host file could not be used.
    #[error("E2B {operation} failed for {}: {source}", .path.display())]
    Io {
        /// The binding call.
        operation: &'static str,
        /// The host path.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    fn backend_source(&self) -> Option<&agent_sandbox::Error> {
        match self {
            Error::Backend { source, .. } => Some(source.as_ref()),
            Error::CommandLost { source } => Some(source.as_ref()),
            _ => None,
        }
    }

    /// A configuration problem the user fixes in `config.yaml` or the profile's `.env`.
    pub fn is_configuration(&self) -> bool {
        matches!(self, Error::InvalidSetting { .. })
            || matches!(
                self.backend_source(),
                Some(agent_sandbox::Error::InvalidConfig { .. })
            )
    }

    /// A reader's command refused by the state gates; retrying later may succeed.
    pub fn is_not_ready(&self) -> bool {
        self.backend_source()
            .is_some_and(agent_sandbox::Error::is_not_ready)
    }

    /// The sandbox is gone.
    pub fn is_sandbox_gone(&self) -> bool {
        self.backend_source()
            .is_some_and(agent_sandbox::Error::is_sandbox_gone)
    }

    /// State could not be moved; the command did not run.
    pub fn is_state_failure(&self) -> bool {
        self.backend_source()
            .is_some_and(agent_sandbox::Error::is_state_failure)
    }

    /// The backend was cleaned up.
    pub fn is_closed(&self) -> bool {
        self.backend_source()
            .is_some_and(agent_sandbox::Error::is_closed)
    }

    /// The retry hint of a refused command.
    pub fn retry_hint(&self) -> Option<&str> {
        self.backend_source()
            .and_then(agent_sandbox::Error::retry_hint)
    }

    /// Wraps a backend error with the binding call that hit it.
    pub(crate) fn backend(operation: &'static str, source: agent_sandbox::Error) -> Error {
        Error::Backend {
            operation,
            source: Box::new(source),
        }
    }
}

impl From<Error> for PyErr {
    fn from(error: Error) -> PyErr {
        let message = error.to_string();
        if error.is_configuration() {
            ConfigurationError::new_err(message)
        } else if error.is_not_ready() {
            NotReadyError::new_err(message)
        } else if error.is_sandbox_gone() {
            SandboxGoneError::new_err(message)
        } else if error.is_state_failure() {
            StateSyncError::new_err(message)
        } else if error.is_closed() {
            BackendClosedError::new_err(message)
        } else if let Error::InvalidArgument { .. } = error {
            pyo3::exceptions::PyValueError::new_err(message)
        } else {
            E2BError::new_err(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Error>();
    }

    #[test]
    fn invalid_setting_names_the_key_and_is_configuration() {
        let error = Error::InvalidSetting {
            key: "lease_seconds".to_owned(),
            reason: "must be a positive integer".to_owned(),
        };
        assert!(error.is_configuration());
        assert!(!error.is_not_ready());
        assert_eq!(
            error.to_string(),
            "E2B setting lease_seconds is invalid: must be a positive integer"
        );
    }

    #[test]
    fn backend_predicates_follow_the_backend_error() {
        let error = Error::backend(
            "run",
            agent_sandbox::Error::NotReady {
                sandbox_id: Some("sbx-1".to_owned()),
                reason: "dirty".to_owned(),
                retry_hint: "Retry later.".to_owned(),
            },
        );
        assert!(error.is_not_ready());
        assert_eq!(error.retry_hint(), Some("Retry later."));
        assert!(!error.is_configuration());
        let missing_key = Error::backend(
            "run",
            agent_sandbox::Error::InvalidConfig {
                reason: "no key".to_owned(),
            },
        );
        assert!(missing_key.is_configuration());
    }
}
