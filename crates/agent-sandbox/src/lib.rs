//! The framework-neutral E2B sandbox backend for agents: lazy attach, leases, admission, sync, recovery and cleanup.
//!
//! ```
//! use std::sync::{Arc, mpsc};
//! use std::time::Duration;
//!
//! use agent_sandbox::{
//!     ApiKeySource, Backend, ChannelSink, Config, Endpoints, NoStateHooks, RunOptions, Scope,
//!     Services,
//! };
//! use e2b_client::ApiKey;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // An E2B-compatible server on this machine (real E2B: leave the endpoints alone).
//! let runtime = tokio::runtime::Runtime::new()?;
//! let server = runtime.block_on(e2b_local::Server::start_loopback())?;
//!
//! let mut config = Config::new(ApiKeySource::Key(ApiKey::new("local-key".to_owned())));
//! config.endpoints = Endpoints::single(server.url());
//! let home = tempfile::tempdir()?;
//! let scope = Scope { profile_home: home.path().to_path_buf(), task_id: "default".to_owned() };
//! let backend = Backend::new(config, scope, Services::new(runtime.handle().clone()), Arc::new(NoStateHooks))?;
//! assert!(backend.info().is_none(), "nothing happens before first use");
//!
//! // First use attaches (here: creates the scope's persistent sandbox as the writer).
//! let (tx, rx) = mpsc::sync_channel(16);
//! let command = backend.run("echo hello", RunOptions::new(Duration::from_secs(30)), Box::new(ChannelSink::bounded(tx)))?;
//! let exit = command.wait()?;
//! assert_eq!(exit.exit_code, 0);
//! let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
//! assert_eq!(output, b"hello\n");
//!
//! // Persistent cleanup leaves the sandbox to E2B's lease (it pauses), and is idempotent.
//! let report = backend.cleanup();
//! assert!(!report.repeated);
//! assert!(backend.cleanup().repeated);
//! runtime.block_on(server.shutdown())?;
//! # Ok(()) }
//! ```
//!
//! # What it guarantees
//!
//! - **Lazy, found by metadata** (L1, L2, I1, I3, I4, I5, I6): nothing happens at
//!   construction. On first use a persistent backend lists its scope's sandboxes by the scope
//!   digest, adopts the newest exact match (warning once with the count), connects to it (which
//!   resumes a paused one) or, only as the writer and under the cross-process creation lock,
//!   creates it with on-timeout pause. Ephemeral and probe backends always create, with
//!   on-timeout kill (L4, L11). Attach mode connects to a given id (L12).
//! - **Leases** (L5): before every command, counted from the end of its sync, the known
//!   expiry must cover `max(lease, deadline + grace)`; when it already does, no request is
//!   sent. Otherwise an extend-only
//!   connect asks for that, plus [`LEASE_HEADROOM`] (60 s) on a persistent or ephemeral
//!   sandbox, so in steady state a command costs one request (its start). Set-timeout
//!   is never used.
//! - **Commands** (O1, O4, L6): output goes chunk by chunk to the caller's [`OutputSink`] from a
//!   thread the backend owns; no copy is kept. Each command leads a process group of its own;
//!   the [`RunningCommand`] can be waited on, polled and killed from any thread, and the kill
//!   reaches that group (what the command started) and its pid, nothing else. A deadline that
//!   passes kills the same way. [`RunOptions::stdin`] of any size is staged as one upload and
//!   read by the shell as stdin, never put on a command line. [`Backend::read_file`] and
//!   [`Backend::write_file`] are admitted like commands; reads are capped while downloading;
//!   [`Backend::sync_state`] runs the per-command admission and sync without a command.
//! - **Roles** (C1-C5, S2, S3, S11): a persistent scope has one writer per host. The writer's
//!   bring-up marks the scope dirty, invalidates the stamp, recovers skills/ and memories/
//!   from the sandbox, pushes (the caller's [`StateHooks`]), stamps prepared and clears dirty;
//!   any failure releases the role. After each successful push the backend stores the push
//!   base (`<scope key>.push-base` next to the coordination files: a digest per uploaded
//!   file), so the next recovery lets a sandbox copy that is only the last push give way to
//!   the host's edit instead of quarantining it (S15). Readers run commands only when the
//!   gates pass and fail closed with a retry hint ([`Error::NotReady`]); a reader takes the
//!   role over when it is released. A failed per-command sync aborts the command and marks the scope dirty.
//! - **Transport** ([`StateTransport`], S4, S12): many files in one upload, parents created;
//!   idempotent deletes; the teardown tar pull capped while it downloads. Every failure is also
//!   recorded, so a sync engine that swallows exceptions still fails closed.
//! - **Cleanup** (L3, L7, L8, L9): waits for running commands; persistent: pull, release,
//!   never pause or kill; ephemeral: pull, kill; probe: kill; repeated or after the sandbox
//!   vanished: harmless, and never creates. [`Backend::finalize`] releases locally and kills
//!   only ephemeral and probe sandboxes.
//! - **A vanished sandbox** fails the command that finds it (naming it); the backend lets it
//!   go, and the next use attaches afresh (the writer recreates it with a full bring-up) and
//!   reports the replaced id in [`AttachInfo::replaced`]. Cleanup never does this.
//! - **Inventory** ([`Inventory`]): a profile's sandboxes as E2B lists them (owner by the
//!   `hermes.profile` label, or by this host's scope files for sandboxes made before it;
//!   duplicates marked, newest kept) with this host's view of each scope (task id, writer pid,
//!   dirty, prepared, last pull and recovery, from the scope note the backend keeps); removal
//!   planned before it acts (another profile's: refused; a live writer here or an unknown
//!   owner: refused unless forced; already gone: success); an on-demand pull
//!   ([`Backend::pull_now`]: recovery as the writer, never a create, never a push); a live
//!   create/run/kill round trip.
//! - **Progress** ([`ProgressObserver`] in [`Services`]): the teardown pull, resume recovery,
//!   uploads and creation report done/total (bytes, files or steps); long transfers log at
//!   INFO every [`PROGRESS_LOG_INTERVAL`] (5 s), never per chunk.
//! - **Errors** ([`Error`], O3): name the E2B operation and the sandbox id. `Display` shows
//!   that step only and the lower layer's error is its `source()`; [`ErrorChain`] renders the
//!   whole chain, each cause once, for people. Words a framework must not show (Hermes:
//!   "timeout") are that framework's boundary to rewrite.
//!
//! # Known limits
//!
//! - [`Shell::Plain`] runs `/bin/bash -c <command>` (the command is one argv entry, nothing
//!   quoted), so no login profile is read; [`Shell::Login`] is the SDK's `bash -l -c`. Both
//!   start under a short bash launcher that makes the command lead its own process group
//!   (`setsid`, when the template has it) and execs the shell under the same pid.
//! - envd signals single pids only: a kill runs one short command for the group (one request
//!   per kill), then signals the pid.
//! - The command deadline kills using real time (tokio timers), not the injected clock.
//! - [`Stats`] counts this backend's own requests; it is not a server-side request counter
//!   (e2b-local's `Server::requests` is one; this crate's `tests/it/requests.rs`
//!   uses it to prove one request per steady-state command).
//! - The prompt probe keeps its exact lease before every command, so once any time has
//!   passed since the last extension each of its commands also sends a connect.
//! - `sandbox-session` (a binary of this package) drives one backend from standard input for
//!   multi-process tests, through the hidden `line_driver` module (the campaign's host
//!   process shares it).

#![deny(missing_docs)]

mod arbitration;
mod backend;
mod command;
mod config;
mod error;
mod home;
mod hooks;
mod inventory;
#[doc(hidden)]
pub mod line_driver;
mod note;
mod progress;
mod report;
mod sink;
mod transport;
pub mod warn_once;

pub use arbitration::{DEFAULT_WRITER_TERM, renewal_period};
pub use backend::{Backend, LEASE_HEADROOM, RETRY_HINT, TRANSFER_WINDOW};
pub use command::{CommandExit, CommandResult, RunOptions, RunningCommand, Shell, Termination};
pub use config::{
    ApiKeySource, CREATION_LOCK_WAIT, Config, DEFAULT_COMMAND_GRACE, DEFAULT_INTERNET,
    DEFAULT_LEASE, DEFAULT_SECURITY, DEFAULT_STATE_CAP, DEFAULT_TEMPLATE, E2B_DEFAULT_HOME,
    Endpoints, KeyResolver, MAX_SETTING_SECONDS, PROBE_TASK_ID, SETTINGS, SandboxMode, Scope,
    Services, Setting, SettingDefault, SettingKind, WriterArbitration,
};
// The types `Config` is built from, so a framework binding needs no e2b-client dependency.
pub use e2b_client::{ApiKey, SandboxId};
// The one redaction pass (X4), for bindings that log or show text of their own.
pub use e2b_client::{REDACTED, redact};
pub use error::{Error, ErrorChain};
pub use home::{MAX_HOME_BYTES, SandboxHome};
pub use hooks::{HookError, NoStateHooks, PushKind, StateHooks};
pub use inventory::{
    EntryState, Force, HostScope, Inventory, Listing, LiveStep, Loss, Owner, PlannedRemoval,
    Refusal, RemovalOutcome, RemovalTarget, Removed, SandboxEntry, Verdict, WriterHolder,
};
pub use progress::{PROGRESS_LOG_INTERVAL, Progress, ProgressObserver, ProgressUnit};
pub use report::{
    AttachInfo, CleanupReport, KillOutcomeReport, Origin, PullOutcome, RecoverySummary, RoleKind,
    Stats, TeardownRecovery,
};
pub use sandbox_identity::{Clock, InternetAccess, ManualClock, Mode, Security, SystemClock};
pub use sink::{ChannelSink, Chunk, DiscardSink, FnSink, OutputSink, OutputStream, WriteSink};
pub use transport::{PullSummary, StateTransport, host_state_files};

#[cfg(test)]
mod tests {
    #[test]
    fn handles_are_shareable_across_threads() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<crate::Backend>();
        assert_bounds::<crate::RunningCommand>();
        assert_bounds::<crate::StateTransport>();
        assert_bounds::<crate::Error>();
    }
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
