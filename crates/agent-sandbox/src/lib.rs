#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod arbitration;
mod backend;
mod checkpoint;
mod command;
mod command_threads;
mod config;
mod credentials;
mod egress;
mod error;
mod fleet;
mod home;
mod hooks;
mod inventory;
mod kernel;
#[doc(hidden)]
pub mod line_driver;
mod live;
mod note;
mod progress;
mod report;
mod secret_store;
mod sink;
mod stand_in;
pub use stand_in::{RandomSource, STAND_IN_PREFIX, SystemRandom};
mod subagent;
mod transport;
pub mod warn_once;

pub use arbitration::{DEFAULT_WRITER_TERM, renewal_period};
pub use backend::{
    Backend, BranchBack, BringBack, CallDeadline, ChildSandbox, LEASE_HEADROOM, MAX_BRANCHES,
    MAX_TURN_KEEP, RETRY_HINT, STALLED_RETRY, SharedPort, StateBack, TRANSFER_WINDOW, TURN_STORE,
    TurnCheckpoint, TurnRequest, TurnRestore,
};
pub use checkpoint::{
    Branch, Checkpoint, CheckpointRequest, CheckpointTarget, DEFAULT_CHECKPOINT_WAIT, Discarded,
    Fork, RollbackReport, utc,
};
pub use command::{
    CommandExit, CommandResult, KILL_GRACE, Purpose, RunOptions, RunningCommand, Shell, Termination,
};
pub use config::{
    ApiKeySource, CREATION_LOCK_WAIT, CommandReads, Config, DEFAULT_COMMAND_GRACE,
    DEFAULT_INTERNET, DEFAULT_LEASE, DEFAULT_SECURITY, DEFAULT_SLOT_WAIT, DEFAULT_STATE_CAP,
    DEFAULT_TEMPLATE, DEFAULT_WATCHDOG_GRACE, E2B_DEFAULT_HOME, Endpoints, KeyResolver,
    PROBE_TASK_ID, SandboxMode, Scope, Services, WriterArbitration,
};
pub use credentials::{
    Credential, CredentialValues, Credentials, DEFAULT_CREDENTIAL_FORMAT,
    DEFAULT_CREDENTIAL_HEADER, MAX_CREDENTIAL_HOSTS, MAX_HEADER_NAME, MAX_HEADER_VALUE,
    MAX_HEADERS_PER_HOST, MAX_VARIABLE_NAME, VALUE_PLACEHOLDER,
};
pub use sandbox_identity::CheckpointReason;
// The types `Config` is built from, so a framework binding needs no e2b-client dependency.
pub use e2b_client::{ApiKey, SandboxId};
// The one redaction pass (X4), for bindings that log or show text of their own.
pub use e2b_client::{REDACTED, redact};
pub use egress::{
    ALL_TRAFFIC, EGRESS_KEY, EgressList, EgressPolicy, EgressProxySetting, MAX_EGRESS_ENTRIES,
};
pub use error::{CheckpointRefusal, Error, ErrorChain, FileRefusal, LimitDetail, PausedFor};
pub use fleet::Fleet;
pub use home::{MAX_HOME_BYTES, SandboxHome};
pub use hooks::{HookError, NoStateHooks, PushKind, StateHooks};
pub use inventory::{
    ACCESS_CHECK_DEADLINE, Access, Activity, CredentialHeaders, EgressApplied, EgressOutcome,
    EntryState, Force, HostScope, Inventory, Listing, LiveStep, Loss, Owner, PausedSelection,
    PlannedRemoval, Refusal, RemovalOutcome, RemovalTarget, Removed, SandboxEntry, TEMPLATE_TOOLS,
    Usage, UseSource, Verdict, WriterHolder,
};
pub use kernel::{CellHost, CellOutcome, CellStatus, Kernel, KernelOptions};
pub use live::{
    LIVE_TAG, LiveEnd, LiveOptions, LiveProcess, LiveRead, LiveSignal, LostReason, PortForward,
    TerminalSize,
};
pub use progress::{PROGRESS_LOG_INTERVAL, Progress, ProgressObserver, ProgressUnit};
/// The directories of the Hermes home that come back from a sandbox (`skills`, `memories`).
pub use recovery::RECOVERABLE_ROOTS;
pub use report::{
    AttachInfo, CleanupReport, KillOutcomeReport, Origin, PullOutcome, RecoverySummary, RoleKind,
    ScopeHolder, Stats, TeardownRecovery,
};
pub use sandbox_identity::{Clock, InternetAccess, ManualClock, Mode, Security, SystemClock};
pub use secret_store::{
    CredentialStore, SECRET_NAME_PREFIX, SECRET_VARIABLE_KEY, StoreInForce, StoreReport,
    StoredSecret, secret_name,
};
pub use sink::{ChannelSink, Chunk, DiscardSink, FnSink, OutputSink, OutputStream, WriteSink};
pub use subagent::{
    CONFLICT_SUFFIX, ChildChanges, ChildId, Conflict, ELSEWHERE, Elsewhere, MAX_MANIFEST_ENTRIES,
    Manifest, Mark, NOT_BROUGHT_BACK, Plan, SUBAGENT_BRANCH_PREFIX, SUBAGENT_KEY, Sides, Stamp,
    is_within, may_be_root, parse_digests, roots,
};
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
