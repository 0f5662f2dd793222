//! The crate's one error type and the Python exception hierarchy it maps to.

use std::path::{Path, PathBuf};

use agent_sandbox::ErrorChain;
use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

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
    CredentialError,
    ConfigurationError,
    "A configured credential has no value (or an unusable one): the profile's `.env` fixes it, no new session needed."
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
    StalledError,
    E2BError,
    "The plugin's watchdog ended a call that outlived its time plus `watchdog_grace_seconds` (contract O7); the message names the sandbox and what the call waited for."
);
create_exception!(
    _native,
    LiveProcessLostError,
    E2BError,
    "A live process (a background process, a session kernel) could not survive what happened to its sandbox: it restarted (a pause without memory) or was replaced; its state is lost."
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
    #[error("E2B setting {key}{} is invalid: {}", InFile(.file.as_deref(), SETTINGS_PATH), Redacted(.reason))]
    InvalidSetting {
        /// The setting's key.
        key: String,
        /// What is wrong with it and what is valid.
        reason: String,
        /// The profile's `config.yaml`, when the caller named it.
        file: Option<PathBuf>,
    },

    /// A Hermes setting the backend uses (`terminal.timeout`) has a value it cannot use.
    #[error("Hermes setting {key}{} is {value}: {reason}", InFile(.file.as_deref(), ""))]
    InvalidHermesSetting {
        /// The setting's dotted key in `config.yaml`.
        key: &'static str,
        /// The value as Hermes handed it over.
        value: String,
        /// What is valid.
        reason: &'static str,
        /// The profile's `config.yaml`, when the caller named it.
        file: Option<PathBuf>,
    },

    /// The profile has no E2B API key. Names the env file it belongs in (contract O5).
    #[error("no E2B API key for this profile: E2B_API_KEY is missing or empty in {}", .env_file.display())]
    MissingApiKey {
        /// The active profile's env file (`<HERMES_HOME>/.env`).
        env_file: PathBuf,
    },

    /// An argument handed over by the Python layer cannot be used.
    #[error("E2B {operation} refused: {}", Redacted(.reason))]
    InvalidArgument {
        /// The binding call.
        operation: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// The backend reported a failure: shown as the backend's error itself (its own step,
    /// its causes through `source()`); decide with its predicates.
    #[error(transparent)]
    Backend(Box<agent_sandbox::Error>),

    /// A running command was lost (its output stream failed); shared by every waiter. Shown
    /// like [`Error::Backend`].
    #[error(transparent)]
    CommandLost(std::sync::Arc<agent_sandbox::Error>),

    /// A host file could not be used.
    #[error("E2B {operation} failed for {}", .path.display())]
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
            Error::Backend(source) => Some(source.as_ref()),
            Error::CommandLost(source) => Some(source.as_ref()),
            _ => None,
        }
    }

    /// A configuration problem the user fixes in `config.yaml` or the profile's `.env`.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            Error::InvalidSetting { .. }
                | Error::InvalidHermesSetting { .. }
                | Error::MissingApiKey { .. }
        ) || matches!(
            self.backend_source(),
            Some(
                agent_sandbox::Error::InvalidConfig { .. }
                    | agent_sandbox::Error::MissingApiKey
                    | agent_sandbox::Error::InvalidCredential { .. }
                    | agent_sandbox::Error::MissingCredential { .. }
            )
        )
    }

    /// The error, naming `config_file` (the profile's `config.yaml`) when it is about a
    /// setting written there.
    pub fn in_config_file(self, config_file: PathBuf) -> Error {
        match self {
            Error::InvalidSetting { key, reason, .. } => Error::InvalidSetting {
                key,
                reason,
                file: Some(config_file),
            },
            Error::InvalidHermesSetting {
                key, value, reason, ..
            } => Error::InvalidHermesSetting {
                key,
                value,
                reason,
                file: Some(config_file),
            },
            other => other,
        }
    }

    /// The backend's error, with what only the profile knows added: a missing API key names
    /// the profile's env file (`profile_home` is the Hermes home).
    pub fn in_profile(source: agent_sandbox::Error, profile_home: &Path) -> Error {
        if source.is_key_missing() {
            Error::MissingApiKey {
                env_file: env_file(profile_home),
            }
        } else {
            Error::from(source)
        }
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

    /// The watchdog ended the call (O7).
    pub fn is_stalled(&self) -> bool {
        self.backend_source()
            .is_some_and(agent_sandbox::Error::is_stalled)
    }

    /// The retry hint of a refused command.
    pub fn retry_hint(&self) -> Option<&str> {
        self.backend_source()
            .and_then(agent_sandbox::Error::retry_hint)
    }

    /// The text a Python exception carries: this error and every cause below it, each once
    /// ([`ErrorChain`], which also redacts credentials, contract X4), with the words Hermes
    /// reads as a command time-out rewritten ([`without_time_words`]). The one place Rust
    /// errors become Hermes-facing text.
    ///
    /// An E2B failure a person can act on ends with one hint in the plugin's words
    /// ([`hint`], contract O5): `<reason>. Hint: <hint>`.
    pub fn message(&self) -> String {
        match self.reason_and_hint() {
            (reason, Some(hint)) => with_hint(&reason, &hint),
            (reason, None) => reason,
        }
    }

    /// [`Error::message`] in its two parts, for a host that shows a hint apart (Hermes'
    /// degraded result has `reason` and `retry_hint`).
    pub fn reason_and_hint(&self) -> (String, Option<String>) {
        // The backend's own error heads the chain, so its step and the client's error below
        // it are read together (each operation named once).
        let chain = match self.backend_source() {
            Some(backend) => ErrorChain(backend).to_string(),
            None => ErrorChain(self).to_string(),
        };
        let hint = self
            .backend_source()
            .and_then(hint)
            .or_else(|| self.own_hint());
        if let Error::InvalidHermesSetting { .. } = self {
            // The setting is `terminal.timeout` and must be named as written. It is refused
            // only where Hermes reads no time-out into a message (environment creation,
            // doctor rows), never while a command runs.
            return (chain, hint);
        }
        (
            without_time_words(&chain),
            hint.as_deref().map(without_time_words),
        )
    }

    /// What to do about a configuration error of this crate's own (contract O5): which line
    /// of which file to fix, then the check that works everywhere (`hermes e2b doctor`; Hermes'
    /// own doctor hides plugin rows inside containers).
    fn own_hint(&self) -> Option<String> {
        let file = |file: &Option<PathBuf>, fallback: &str| {
            file.as_deref()
                .map_or_else(|| fallback.to_owned(), |f| f.display().to_string())
        };
        match self {
            Error::InvalidSetting {
                key, file: path, ..
            } => Some(format!(
                "fix {SETTINGS_PATH}.{key} in {} (or remove it for the default), then run \
                 `hermes e2b doctor`",
                file(path, "the profile's config.yaml")
            )),
            Error::InvalidHermesSetting {
                key, file: path, ..
            } => Some(format!(
                "fix {key} in {} (or remove it for Hermes' default; TERMINAL_TIMEOUT in the \
                 environment Hermes runs in is the same setting), then run `hermes e2b doctor`",
                file(path, "the profile's config.yaml")
            )),
            Error::MissingApiKey { env_file } => Some(format!(
                "add the line E2B_API_KEY=e2b_... to {} (keys are at https://e2b.dev/dashboard), \
                 then run `hermes e2b doctor`",
                env_file.display()
            )),
            _ => None,
        }
    }
}

/// Where the plugin's settings live in `config.yaml`.
pub(crate) const SETTINGS_PATH: &str = "plugins.entries.e2b.settings";

/// A Hermes profile's env file (Hermes' `get_env_path()`: `<HERMES_HOME>/.env`).
pub(crate) fn env_file(profile_home: &Path) -> PathBuf {
    profile_home.join(".env")
}

/// A Hermes profile's `config.yaml` (Hermes' `get_config_path()`).
pub(crate) fn config_file(profile_home: &Path) -> PathBuf {
    profile_home.join("config.yaml")
}

/// ` (<section> in <file>)` (` in <file>` without a section), or nothing when the file is
/// not known.
struct InFile<'a>(Option<&'a Path>, &'a str);

impl std::fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.0, self.1) {
            (Some(file), "") => write!(f, " in {}", file.display()),
            (Some(file), section) => write!(f, " ({section} in {})", file.display()),
            (None, _) => Ok(()),
        }
    }
}

/// `<reason>. Hint: <hint>`: how every message with a hint reads.
pub(crate) fn with_hint(reason: &str, hint: &str) -> String {
    format!("{}. Hint: {hint}", reason.trim_end_matches('.'))
}

/// What a Hermes user does about an E2B failure, in the plugin's words (the Rust core's
/// errors only classify: `is_key_refused`, `is_concurrency_limit`, ...). `None` when there
/// is nothing better to do than read the error.
pub fn hint(error: &agent_sandbox::Error) -> Option<String> {
    if let agent_sandbox::Error::CheckpointRefused { reason, .. } = error {
        return checkpoint_hint(reason);
    }
    if error.is_stalled() {
        return Some(
            "the plugin's watchdog gave up on this call (`watchdog_grace_seconds` past its own \
             time) and stopped what it had started in the sandbox; retry, and if it happens \
             again run `hermes e2b doctor` and look at the hermes_e2b lines of Hermes' log"
                .to_owned(),
        );
    }
    if error.is_concurrency_limit() {
        return Some(
            "E2B limits how many sandboxes run at once per account, and paused sandboxes do \
             not count; the plugin pauses this process's idle sandboxes to make room, but none \
             was idle. `hermes e2b list` shows this profile's sandboxes and `hermes e2b rm` \
             removes unused ones; `slot_wait_seconds` waits longer for a slot, and \
             `max_running` keeps this process below the account's limit on its own"
                .to_owned(),
        );
    }
    if error.is_template_missing() {
        return Some(
            "the `template` setting (plugins.entries.e2b.settings.template) names a template \
             this key's team does not have; fix or remove it (`base` is the default), then \
             run `hermes e2b doctor --live`"
                .to_owned(),
        );
    }
    if error.is_key_refused() {
        return Some(
            "E2B refused the API key: check E2B_API_KEY in this profile's .env (or the \
             environment Hermes runs in), then run `hermes e2b doctor`"
                .to_owned(),
        );
    }
    let endpoint = error.endpoint().unwrap_or("the E2B endpoint");
    if error.is_tls() {
        return Some(format!(
            "the TLS certificate of {endpoint} is not trusted; behind a TLS-inspecting proxy, \
             set SSL_CERT_FILE to its CA bundle, then run `hermes e2b doctor`"
        ));
    }
    if error.is_unreachable() {
        return Some(format!(
            "{endpoint} could not be reached; check the network and the endpoint settings \
             (domain, api_url, or E2B_DOMAIN / E2B_API_URL), then run `hermes e2b doctor`"
        ));
    }
    if let Some(deadline) = error.deadline() {
        return Some(format!(
            "E2B did not answer within the {} s request deadline; retry, or run `hermes e2b doctor`",
            deadline.as_secs_f64()
        ));
    }
    None
}

/// What to do about a refused checkpoint, rollback or turn restore (R1, R2).
fn checkpoint_hint(reason: &agent_sandbox::CheckpointRefusal) -> Option<String> {
    use agent_sandbox::CheckpointRefusal as Why;
    match reason {
        Why::NotWriter => Some(
            "a Hermes session holds the writer role for this scope; run this in that session \
             (/sandbox-checkpoint, /sandbox-checkpoints, /sandbox-rollback) or end it first"
                .to_owned(),
        ),
        Why::CommandsRunning { commands, .. } => Some(format!(
            "let {} finish, or stop {} (Ctrl-C in the session, or /stop), then retry",
            commands.join("; "),
            if commands.len() == 1 { "it" } else { "them" }
        )),
        Why::NoCheckpoint { .. } => Some(
            "`hermes e2b checkpoints` (or /sandbox-checkpoints) lists this scope's checkpoints"
                .to_owned(),
        ),
        _ => None,
    }
}

impl From<agent_sandbox::Error> for Error {
    fn from(source: agent_sandbox::Error) -> Error {
        Error::Backend(Box::new(source))
    }
}

/// Rewrites the words Hermes reads as a command time-out, in any letter case: "timeout"
/// anywhere (also inside `set_timeout`) and the word "time-out" (`time_out`, `time out`)
/// become "deadline"; "timedout" and the words "timed out" (`timed-out`, `timed_out`) become
/// "ran out of time". Hermes' terminal tool reports any failure whose message contains them as
/// a command time-out and does not retry it; an infrastructure failure must not read like
/// one. Command time-outs are Hermes' own to report.
pub fn without_time_words(text: &str) -> String {
    // ASCII lowercasing keeps byte offsets, so indices found in `lower` are valid in `text`.
    let lower = text.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let ends_word = |at: usize| bytes.get(at).is_none_or(|b| !b.is_ascii_alphanumeric());
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = lower[from..].find("time") {
        let start = from + found;
        let mut end = start + "time".len();
        let timed = bytes.get(end) == Some(&b'd');
        if timed {
            end += 1;
        }
        let separated = matches!(bytes.get(end), Some(b' ' | b'_' | b'-'));
        if separated {
            end += 1;
        }
        let out_at = end + "out".len();
        // A separated form must end a word ("runtime output" is no time-out); a plural `s`
        // stays in the text.
        let plural = usize::from(bytes.get(out_at) == Some(&b's'));
        if lower[end..].starts_with("out") && (!separated || ends_word(out_at + plural)) {
            out.push_str(&text[copied..start]);
            out.push_str(if timed { "ran out of time" } else { "deadline" });
            copied = out_at;
            from = out_at;
        } else {
            from = start + "time".len();
        }
    }
    out.push_str(&text[copied..]);
    out
}

impl From<Error> for PyErr {
    /// The exception carries the whole message; when there is a hint, also `reason` and
    /// `hint` attributes, so the Python layer can hand them to Hermes apart.
    fn from(error: Error) -> PyErr {
        let message = error.message();
        let (reason, hint) = error.reason_and_hint();
        let exception = if error
            .backend_source()
            .is_some_and(agent_sandbox::Error::is_credential)
        {
            CredentialError::new_err(message)
        } else if error.is_configuration() {
            ConfigurationError::new_err(message)
        } else if error.is_not_ready() {
            NotReadyError::new_err(message)
        } else if error
            .backend_source()
            .is_some_and(agent_sandbox::Error::is_live_process_lost)
        {
            LiveProcessLostError::new_err(message)
        } else if error.is_sandbox_gone() {
            SandboxGoneError::new_err(message)
        } else if error.is_state_failure() {
            StateSyncError::new_err(message)
        } else if error.is_closed() {
            BackendClosedError::new_err(message)
        } else if error.is_stalled() {
            StalledError::new_err(message)
        } else if let Error::InvalidArgument { .. } = error {
            return pyo3::exceptions::PyValueError::new_err(message);
        } else {
            E2BError::new_err(message)
        };
        if let Some(hint) = hint {
            Python::attach(|py| {
                let value = exception.value(py);
                // Setting an attribute on a fresh exception instance cannot fail in practice;
                // if it did, the message still carries both parts.
                let _ = value.setattr("reason", reason);
                let _ = value.setattr("hint", hint);
            });
        }
        exception
    }
}

/// Text the caller handed over (a setting's value may be a URL with credentials), shown
/// through the redaction pass (X4).
struct Redacted<'a>(&'a str);

impl std::fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&agent_sandbox::redact(self.0))
    }
}

#[cfg(test)]
mod tests;
