//! The crate's one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

mod chain;
mod credential;
mod limit;
mod lost;
mod refusal;
pub use chain::ErrorChain;
pub(crate) use limit::write_census;
use limit::{Census, Running};
pub use limit::{LimitDetail, PausedFor};
pub use lost::LostReason;
pub use refusal::{CheckpointRefusal, FileRefusal};

/// What went wrong in the backend.
///
/// Every variant names the operation and, where there is one, the sandbox. `Display` shows
/// this step only; the lower layer's error is the `source()`, so a caller that shows errors
/// to people renders the whole chain once ([`ErrorChain`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot be used.
    #[error("E2B backend configuration is invalid: {}", Redacted(.reason))]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// An E2B request failed.
    #[error("E2B {operation} failed{}", ForSandbox(.sandbox_id.as_deref()))]
    E2b {
        /// The backend step that sent the request (`connect`, `create`, `start command`, ...).
        operation: &'static str,
        /// The sandbox, once one is known.
        sandbox_id: Option<String>,
        /// The client's error; decide with its `is_*` predicates.
        #[source]
        source: e2b_client::Error,
    },

    /// Creating or resuming a sandbox was refused for the account's limit of concurrently
    /// running sandboxes (E2B's HTTP 429), and no sandbox of this process could be paused
    /// to free a slot within the wait (L14). `running` is how many run on the account, when
    /// one bounded list request at the time of the error could tell.
    #[error(
        "E2B {operation} failed{}: the account's limit of concurrently running sandboxes is reached{}; {} other sandbox(es) of this process run and none could be paused (each has a command running or is busy); {}; waited {} s for a slot",
        ForSandbox(.detail.sandbox_id.as_deref()),
        Running(.detail.running),
        .detail.this_process,
        Census(.detail),
        .detail.waited.as_secs()
    )]
    ConcurrencyLimit {
        /// The backend step (`create`, `connect`).
        operation: &'static str,
        /// The sandbox, how many ran and how long the start waited (boxed: a rare error
        /// keeps `Error` small).
        detail: Box<LimitDetail>,
        /// The client's error (HTTP 429).
        #[source]
        source: e2b_client::Error,
    },

    /// A reader's command was refused by the state gates; it must fail closed. Retrying
    /// later may succeed ([`Error::retry_hint`]).
    #[error(
        "Sandbox {} is not ready: this scope's Hermes state is being rebuilt or is known to be stale ({}). {retry_hint}",
        SandboxName(.sandbox_id.as_deref()),
        Redacted(.reason)
    )]
    NotReady {
        /// The sandbox the reader attached to, if any exists yet.
        sandbox_id: Option<String>,
        /// Why the gate refused.
        reason: String,
        /// What the user can do.
        retry_hint: String,
    },

    /// The host coordination files (writer lease, markers, creation lock) failed.
    #[error("E2B {operation} failed{}", ForSandbox(.sandbox_id.as_deref()))]
    Coordination {
        /// The backend step.
        operation: &'static str,
        /// The sandbox, once one is known.
        sandbox_id: Option<String>,
        /// The writer-lease error.
        #[source]
        source: writer_lease::Error,
    },

    /// Resume recovery failed; the push it guards did not run (contract S11).
    #[error("E2B state recovery failed for sandbox {sandbox_id}")]
    Recovery {
        /// The sandbox recovered from.
        sandbox_id: String,
        /// The recovery error.
        #[source]
        source: recovery::Error,
    },

    /// Moving state in or out of the sandbox failed (plans, archive reading, caps).
    #[error("E2B {operation} failed for sandbox {sandbox_id}")]
    StateSync {
        /// The transport step.
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// The state-sync error.
        #[source]
        source: state_sync::Error,
    },

    /// The caller's state push or pull reported failure, or a transport call made during it
    /// failed (contracts S2, S3).
    #[error("E2B state {operation} failed for sandbox {sandbox_id}: {}", Redacted(.detail))]
    StateHook {
        /// `initial push`, `sync` or `pull`.
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// What failed.
        detail: String,
    },

    /// A command run in the sandbox for the backend's own purposes exited non-zero.
    #[error(
        "E2B {operation} failed for sandbox {sandbox_id}: exit code {exit_code}: {}",
        Redacted(.stderr)
    )]
    SandboxCommand {
        /// The transport step (`delete files`, `state snapshot`, ...).
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// The exit code.
        exit_code: i32,
        /// The start of its standard error.
        stderr: String,
    },

    /// The sandbox answered something the backend refuses to use (e.g. a `$HOME` that is not
    /// an absolute, normalised path): nothing the sandbox sends is trusted.
    #[error("E2B {operation} failed for sandbox {sandbox_id}: {}", Redacted(.reason))]
    UntrustedAnswer {
        /// What the answer was for (`learn the sandbox home`).
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A sandbox file was not delivered to the host ([`crate::Backend::fetch_file`]): it is
    /// missing or not a regular file, or it is larger than the caller's cap. Nothing was left
    /// at the destination.
    #[error(
        "E2B {operation} of {} refused{}: {reason}",
        Redacted(.path),
        ForSandbox(.sandbox_id.as_deref())
    )]
    FileRefused {
        /// The step (`fetch file`, `resolve sandbox path`).
        operation: &'static str,
        /// The sandbox, once one is attached (a path refused before the first attach names none).
        sandbox_id: Option<String>,
        /// The sandbox path asked for.
        path: String,
        /// Why.
        reason: FileRefusal,
    },

    /// A command's output stream ended without an exit status.
    #[error(
        "E2B command output stream failed for sandbox {sandbox_id}: command {sandbox_pid} ended without an exit status"
    )]
    CommandLost {
        /// The sandbox.
        sandbox_id: String,
        /// The command's pid in the sandbox.
        sandbox_pid: u32,
    },

    /// The watchdog ended a call that outlived its time plus the watchdog grace (O7). The
    /// call's work may still finish on its own thread; what it started is then stopped.
    #[error(
        "E2B {operation} stalled{}: waited {} s for {waited_for}",
        ForSandbox(.sandbox_id.as_deref()),
        .waited.as_secs()
    )]
    Stalled {
        /// The call the watchdog ended.
        operation: &'static str,
        /// The sandbox, when one is attached.
        sandbox_id: Option<String>,
        /// How long the call was waited for.
        waited: std::time::Duration,
        /// What it was waiting for (what held the scope, at which step).
        waited_for: String,
    },

    /// A killed command (by its caller, or at its deadline) did not end within
    /// [`KILL_GRACE`](crate::KILL_GRACE): its output stream was given up, so its caller ends
    /// (O7). The kill was sent; whatever still runs in the sandbox is no longer followed.
    #[error(
        "E2B command {sandbox_pid} in sandbox {sandbox_id} did not end within {} s of being killed; its output was given up",
        .waited.as_secs()
    )]
    CommandAbandoned {
        /// The sandbox.
        sandbox_id: String,
        /// The command's pid in the sandbox.
        sandbox_pid: u32,
        /// How long the end was waited for after the kill.
        waited: std::time::Duration,
    },

    /// A live process could not be reached: its sandbox is gone or was replaced.
    #[error("E2B {operation} failed for sandbox {sandbox_id}: {reason}")]
    LiveProcessLost {
        /// The step (`write to a live process`, `signal a live process`).
        operation: &'static str,
        /// The sandbox the process ran in.
        sandbox_id: String,
        /// What happened to it.
        reason: LostReason,
    },

    /// A session kernel could not be started in the sandbox (no `python3`, or it failed).
    #[error("E2B start a session kernel failed for sandbox {sandbox_id}: {}", Redacted(.reason))]
    KernelUnavailable {
        /// The sandbox.
        sandbox_id: String,
        /// What happened, with what the interpreter said.
        reason: String,
    },

    /// A host file could not be read or written.
    #[error("E2B {operation} failed for {}", .path.display())]
    Io {
        /// The step.
        operation: &'static str,
        /// The host path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },

    /// The sandbox's writer record (`writer_arbitration: sandbox`) could not be used: the
    /// script failed or answered something else than its one-line format.
    #[error("E2B {operation} failed for sandbox {sandbox_id}: {}", Redacted(.detail))]
    Arbitration {
        /// The arbitration step (`acquire sandbox writer record`, `commit staged state`, ...).
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// What was wrong.
        detail: String,
    },

    /// This host's writer generation is no longer current in the sandbox's record: another
    /// host holds the role (contract C10). Nothing was written; this session is a reader now.
    #[error(
        "E2B {operation} refused for sandbox {sandbox_id}: this host is no longer the writer ({holder} holds generation {generation}); it continues as a reader"
    )]
    Fenced {
        /// The refused step.
        operation: &'static str,
        /// The sandbox.
        sandbox_id: String,
        /// Who holds the role now, as the record names it.
        holder: String,
        /// The record's generation.
        generation: u64,
    },

    /// The backend was cleaned up; it never attaches again (contract L7).
    #[error("E2B {operation} refused: the backend was cleaned up{}", ForSandbox(.sandbox_id.as_deref()))]
    Closed {
        /// The refused step.
        operation: &'static str,
        /// The sandbox it was attached to, if any.
        sandbox_id: Option<String>,
    },

    /// The scope has no sandbox, and the step never creates one.
    #[error("E2B {operation} refused: this scope has no sandbox")]
    NoSandbox {
        /// The refused step.
        operation: &'static str,
    },

    /// The backend has no sandbox attached, and the step does not attach one.
    #[error("E2B {operation} refused: no sandbox is attached yet")]
    NotAttached {
        /// The refused step.
        operation: &'static str,
    },

    /// A checkpoint, rollback, fork or adoption was refused before it changed anything.
    #[error("E2B {operation} refused{}: {reason}", ForSandbox(.sandbox_id.as_deref()))]
    CheckpointRefused {
        /// The refused step (`checkpoint`, `rollback`, `fork`, `adopt`).
        operation: &'static str,
        /// The scope's sandbox, once one is known.
        sandbox_id: Option<String>,
        /// Why.
        reason: CheckpointRefusal,
    },

    /// An egress rule cannot be used (`allow_out` / `deny_out`); nothing was sent.
    #[error("E2B egress policy is invalid: {list} entry {entry:?} {reason}")]
    InvalidEgress {
        /// The list: `allow_out` or `deny_out`.
        list: &'static str,
        /// The refused entry, as written.
        entry: String,
        /// Why.
        reason: String,
    },

    /// A `credentials` entry was refused: nothing was sent. Never holds a value.
    #[error("E2B credential {name} is invalid: {reason}")]
    InvalidCredential {
        /// The variable name.
        name: String,
        /// Why.
        reason: String,
    },

    /// A configured credential has no value where the host resolves it: no command runs
    /// until it has one (or the setting no longer names it).
    #[error(
        "E2B {operation} refused{}: credential {name} has no value: set {name} in {source_file}",
        credential::for_sandbox(sandbox_id.as_deref())
    )]
    MissingCredential {
        /// The variable name.
        name: String,
        /// Where the value belongs (the profile's `.env`).
        source_file: String,
        /// What needed it: `create`, `attach`, `command`, ...
        operation: &'static str,
        /// The sandbox it was for, once there is one.
        sandbox_id: Option<String>,
    },

    /// `credential_store: secrets`, and the account or server offers no E2B Secrets: no
    /// command runs, rather than putting the values in the sandbox's rules (X22).
    #[error(
        "E2B {operation} refused{}: credential_store is secrets, but {why}; set credential_store to auto or rules",
        credential::for_sandbox(sandbox_id.as_deref())
    )]
    SecretsUnavailable {
        /// What needed the credentials: `create`, `attach`, `command`, ...
        operation: &'static str,
        /// The sandbox it was for, once there is one.
        sandbox_id: Option<String>,
        /// E2B's answer to the probe.
        why: String,
    },

    /// A watcher's poll ([`Purpose::Watch`](crate::Purpose::Watch)) found the sandbox paused
    /// by this process, after its quiet time (L17) or for the account's limit (L14): the
    /// poll is not sent, since it must not resume the sandbox; what runs in it is frozen
    /// with it (E2B keeps memory on such a pause) and goes on once the session's next
    /// command resumes it.
    #[error(
        "E2B poll not sent to sandbox {sandbox_id}: {paused_for}; processes in it are frozen with it and go on when the session's next command resumes it"
    )]
    PausedByBackend {
        /// The paused sandbox.
        sandbox_id: String,
        /// Why this process paused it.
        paused_for: PausedFor,
    },

    /// The API key source gave no key: nothing was sent. The host names where the key
    /// belongs (a Hermes profile's env file), so this error names no file.
    #[error("no E2B API key is configured for this profile")]
    MissingApiKey,
}

impl Error {
    /// The sandbox the error is about, if known.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self {
            Error::E2b { sandbox_id, .. }
            | Error::NotReady { sandbox_id, .. }
            | Error::Coordination { sandbox_id, .. }
            | Error::FileRefused { sandbox_id, .. }
            | Error::CheckpointRefused { sandbox_id, .. }
            | Error::Stalled { sandbox_id, .. }
            | Error::Closed { sandbox_id, .. } => sandbox_id.as_deref(),
            Error::ConcurrencyLimit { detail, .. } => detail.sandbox_id.as_deref(),
            Error::Recovery { sandbox_id, .. }
            | Error::StateSync { sandbox_id, .. }
            | Error::StateHook { sandbox_id, .. }
            | Error::SandboxCommand { sandbox_id, .. }
            | Error::UntrustedAnswer { sandbox_id, .. }
            | Error::CommandLost { sandbox_id, .. }
            | Error::CommandAbandoned { sandbox_id, .. }
            | Error::Arbitration { sandbox_id, .. }
            | Error::Fenced { sandbox_id, .. }
            | Error::LiveProcessLost { sandbox_id, .. }
            | Error::KernelUnavailable { sandbox_id, .. }
            | Error::PausedByBackend { sandbox_id, .. } => Some(sandbox_id),
            Error::InvalidConfig { .. }
            | Error::MissingApiKey
            | Error::InvalidEgress { .. }
            | Error::InvalidCredential { .. }
            | Error::MissingCredential { .. }
            | Error::SecretsUnavailable { .. }
            | Error::Io { .. }
            | Error::NotAttached { .. }
            | Error::NoSandbox { .. } => None,
        }
    }

    /// The retry hint of a refused command ([`Error::NotReady`]).
    pub fn retry_hint(&self) -> Option<&str> {
        match self {
            Error::NotReady { retry_hint, .. } => Some(retry_hint),
            _ => None,
        }
    }

    /// A watcher's poll found the sandbox paused by this process
    /// ([`Error::PausedByBackend`]).
    pub fn is_paused_by_backend(&self) -> bool {
        matches!(self, Error::PausedByBackend { .. })
    }

    /// The API key source gave no key ([`Error::MissingApiKey`]).
    pub fn is_key_missing(&self) -> bool {
        matches!(self, Error::MissingApiKey)
    }

    /// An `allow_out` / `deny_out` entry was refused ([`Error::InvalidEgress`]).
    pub fn is_invalid_egress(&self) -> bool {
        matches!(self, Error::InvalidEgress { .. })
    }

    /// A credential is refused or has no value ([`Error::InvalidCredential`],
    /// [`Error::MissingCredential`]).
    pub fn is_credential(&self) -> bool {
        matches!(
            self,
            Error::InvalidCredential { .. }
                | Error::MissingCredential { .. }
                | Error::SecretsUnavailable { .. }
        )
    }

    /// The sandbox sent an answer the backend refused to use.
    pub fn is_untrusted_answer(&self) -> bool {
        matches!(self, Error::UntrustedAnswer { .. })
    }

    /// A sandbox file was refused for delivery: missing, not a regular file, over the cap, or
    /// asked for by a path that is no absolute sandbox path.
    pub fn is_file_refused(&self) -> bool {
        matches!(self, Error::FileRefused { .. })
    }

    /// A sandbox file was refused for delivery because it is larger than the caller's cap.
    pub fn is_over_fetch_cap(&self) -> bool {
        matches!(
            self,
            Error::FileRefused {
                reason: FileRefusal::OverCap { .. },
                ..
            }
        )
    }

    /// A checkpoint, rollback, fork or adoption was refused before it changed anything.
    pub fn is_checkpoint_refused(&self) -> bool {
        matches!(self, Error::CheckpointRefused { .. })
    }

    /// Refused because commands of the scope were still running after the wait (a snapshot
    /// pauses the sandbox and would cut them); [`Error::running_commands`] says which.
    pub fn is_busy(&self) -> bool {
        !self.running_commands().is_empty()
    }

    /// The commands a busy refusal waited for (`pid N: text`).
    pub fn running_commands(&self) -> &[String] {
        match self {
            Error::CheckpointRefused {
                reason: CheckpointRefusal::CommandsRunning { commands, .. },
                ..
            } => commands,
            _ => &[],
        }
    }

    /// A reader's command refused by the state gates: fail closed, retry later.
    pub fn is_not_ready(&self) -> bool {
        matches!(self, Error::NotReady { .. })
    }

    /// Another host took the writer role over; this session wrote nothing and is a reader now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced { .. })
    }

    /// A session kernel could not be started ([`Error::KernelUnavailable`]).
    pub fn is_kernel_unavailable(&self) -> bool {
        matches!(self, Error::KernelUnavailable { .. })
    }

    /// A live process's sandbox is gone or was replaced ([`Error::LiveProcessLost`]).
    pub fn is_live_process_lost(&self) -> bool {
        matches!(self, Error::LiveProcessLost { .. })
    }

    /// The sandbox is gone (killed, or unknown to E2B).
    pub fn is_sandbox_gone(&self) -> bool {
        self.e2b_source()
            .is_some_and(e2b_client::Error::is_sandbox_gone)
    }

    /// The E2B client's error this one carries, if an E2B request failed.
    fn e2b_source(&self) -> Option<&e2b_client::Error> {
        match self {
            Error::E2b { source, .. } | Error::ConcurrencyLimit { source, .. } => Some(source),
            _ => None,
        }
    }

    /// E2B refused the API key (HTTP 401), or the key lacks access to what was asked (403).
    pub fn is_key_refused(&self) -> bool {
        self.e2b_source()
            .is_some_and(|e| e.is_unauthorized() || e.is_forbidden())
    }

    /// E2B refused a create or resume for the account's limit of concurrently running
    /// sandboxes, and no sandbox of this process could be paused for it in time (L14).
    pub fn is_concurrency_limit(&self) -> bool {
        matches!(self, Error::ConcurrencyLimit { .. })
    }

    /// An E2B answer refusing for a limit (HTTP 429), before the backend judged it.
    pub(crate) fn is_limit_refusal(&self) -> bool {
        matches!(self, Error::E2b { source, .. } if source.is_rate_limited())
    }

    /// How many sandboxes were running when the concurrency limit refused a create, if known.
    pub fn running_sandboxes(&self) -> Option<u64> {
        match self {
            Error::ConcurrencyLimit { detail, .. } => detail.running,
            _ => None,
        }
    }

    /// The configured template does not exist (a create answered 404).
    pub fn is_template_missing(&self) -> bool {
        self.e2b_source()
            .is_some_and(e2b_client::Error::is_template_missing)
    }

    /// The endpoint could not be reached: the connection was never established, for a
    /// network reason (not TLS). [`Error::endpoint`] names it.
    pub fn is_unreachable(&self) -> bool {
        self.e2b_source()
            .is_some_and(|e| e.is_connect() && !e.is_tls())
    }

    /// The TLS handshake with the endpoint failed (an untrusted certificate, most often).
    pub fn is_tls(&self) -> bool {
        self.e2b_source().is_some_and(e2b_client::Error::is_tls)
    }

    /// The endpoint (`scheme://host:port`) a connection failure concerned.
    pub fn endpoint(&self) -> Option<&str> {
        self.e2b_source().and_then(e2b_client::Error::endpoint)
    }

    /// The request deadline that passed, when one did.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.e2b_source().and_then(e2b_client::Error::deadline)
    }

    /// The scope has no sandbox to act on (nothing was created).
    pub fn is_no_sandbox(&self) -> bool {
        matches!(self, Error::NoSandbox { .. })
    }

    /// The backend was cleaned up.
    pub fn is_closed(&self) -> bool {
        matches!(self, Error::Closed { .. })
    }

    /// The watchdog ended the call (O7): it outlived its time plus the watchdog grace.
    pub fn is_stalled(&self) -> bool {
        matches!(self, Error::Stalled { .. })
    }

    /// State could not be moved or established; the command must not run (S2, S3, S11).
    pub fn is_state_failure(&self) -> bool {
        matches!(
            self,
            Error::Recovery { .. }
                | Error::StateSync { .. }
                | Error::StateHook { .. }
                | Error::SandboxCommand { .. }
                | Error::Arbitration { .. }
        )
    }

    /// The teardown pull or snapshot was refused for exceeding its cap (S12).
    pub fn is_over_cap(&self) -> bool {
        match self {
            Error::StateSync { source, .. } => source.is_over_cap(),
            Error::Recovery { source, .. } => source.is_over_cap(),
            _ => false,
        }
    }

    /// A failure that may pass: retrying the same call later can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::NotReady { .. } | Error::Fenced { .. } => true,
            _ => self
                .e2b_source()
                .is_some_and(e2b_client::Error::is_transient),
        }
    }

    pub(crate) fn e2b(
        operation: &'static str,
        sandbox_id: Option<&str>,
        source: e2b_client::Error,
    ) -> Error {
        Error::E2b {
            operation,
            sandbox_id: sandbox_id.map(str::to_owned),
            source,
        }
    }
}

/// Text from outside the crate (sandbox stderr, hook messages, recovery reasons), shown
/// through the redaction pass (X4).
struct Redacted<'a>(&'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&e2b_client::redact(self.0))
    }
}

struct ForSandbox<'a>(Option<&'a str>);

impl fmt::Display for ForSandbox<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, " for sandbox {id}"),
            None => Ok(()),
        }
    }
}

struct SandboxName<'a>(Option<&'a str>);

impl fmt::Display for SandboxName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.unwrap_or("(none yet)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static + std::error::Error>() {}
        assert_bounds::<Error>();
    }

    #[test]
    fn display_shows_its_own_step_and_the_chain_shows_the_cause_once() {
        // contract: O3
        let error = Error::Io {
            operation: "read marker",
            path: PathBuf::from("/x/marker"),
            source: io::Error::other("permission denied"),
        };
        assert_eq!(error.to_string(), "E2B read marker failed for /x/marker");
        let chain = ErrorChain(&error).to_string();
        assert_eq!(
            chain,
            "E2B read marker failed for /x/marker: permission denied"
        );
        assert_eq!(chain.matches("permission denied").count(), 1);
    }

    #[test]
    fn the_chain_does_not_repeat_a_cause_its_parent_printed() {
        // writer-lease's Display prints its io source; the chain still shows it once.
        let error = Error::Coordination {
            operation: "acquire writer role",
            sandbox_id: None,
            source: writer_lease::Error::Io {
                operation: "lock writer lease",
                path: PathBuf::from("/x/lease"),
                source: io::Error::other("permission denied"),
            },
        };
        assert_eq!(
            ErrorChain(&error).to_string(),
            "E2B acquire writer role failed: lock writer lease failed for /x/lease: permission denied"
        );
        // A cause that merely ends like its parent is still shown.
        let error = Error::Io {
            operation: "read",
            path: PathBuf::from("/x/denied"),
            source: io::Error::other("denied"),
        };
        assert_eq!(
            ErrorChain(&error).to_string(),
            "E2B read failed for /x/denied: denied"
        );
    }
}
