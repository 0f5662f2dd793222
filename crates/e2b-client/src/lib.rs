#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod blocking;
mod code;
mod coding;
mod config;
mod connections;
mod control;
mod error;
mod files;
mod framing;
mod git;
mod http;
mod ids;
mod json;
mod process;
mod pty;
mod redact;
mod retry;
mod sandbox;
mod secret;
pub mod template;
mod volume;
mod watch;
#[cfg(test)]
mod wire_tests;

pub use crate::code::{
    CodeContext, CodeLanguage, CodeOutput, CodeResult, CodeRun, CodeTarget, DEFAULT_CODE_TIMEOUT,
    Execution, ExecutionError, OutputMessage, RemoveContextOutcome, RunCodeOptions,
};
pub use crate::coding::{ContentCoding, WriteOptions};
pub use crate::config::{
    CODE_INTERPRETER_PORT, Config, DEFAULT_DOMAIN, ENVD_PORT, Jitter, JitterSource, Limits,
    RetryPolicy,
};
pub use crate::control::{
    ALL_TRAFFIC, Client, ConnectState, Connected, CreateOptions, DeleteOutcome, EgressProxy,
    EgressRules, ForkOptions, HeaderTransform, IamToken, KillOutcome, Lifecycle, ListOrder,
    ListQuery, ListedSandbox, MAX_SECRET_NAME, NetworkConfig, NetworkUpdate, NewSecret, OnResume,
    OnTimeout, PauseMemory, PauseOutcome, SandboxDetail, SandboxInfo, SandboxMetric, SandboxState,
    SecretInfo, SecretQuery, SecretUpdate, SnapshotInfo, SnapshotQuery, StateFilter,
    TransformRules, canonical_secret_name, identity_token_placeholder, secret_placeholder,
};
pub use crate::error::{BuildFailure, Error, Operation, TransportCause, TransportStage};
pub use crate::files::{
    Download, EntryInfo, FileRange, FileType, MakeDirOutcome, UploadData, UploadFile, WrittenFile,
};
pub use crate::git::{
    BranchDeletion, CloneOptions, GitAuthor, GitBranches, GitConfigScope, GitCredentials,
    GitFileStatus, GitStatus, RemoteOptions, ResetMode, RestoreTarget,
};
pub use crate::ids::SandboxId;
pub use crate::process::{
    CommandOutput, END_DRAIN_LIMIT, ProcessConfig, ProcessEnd, ProcessEvent, ProcessInfo,
    ProcessStdin, ProcessStream, Signal, SignalOutcome, StartOptions,
};
pub use crate::pty::{PtyOptions, PtySize};
pub use crate::redact::{REDACTED, redact, redact_with};
pub use crate::sandbox::{EnvdAccess, FileUrl, Git, Health, InputStream, MCP_PORT, Sandbox};
pub use crate::secret::{AccessToken, ApiKey, SecretValue};
pub use crate::template::{BuildInfo, BuildOptions, BuildState, BuildStatus, TemplateSpec};
pub use crate::volume::{
    Volume, VolumeCreate, VolumeEntry, VolumeEntryOptions, VolumeEntryType, VolumeInfo,
    VolumeMetadata, VolumeMountInfo,
};
pub use crate::watch::{
    EventEntries, FsEvent, FsEventKind, WatchDepth, WatchOptions, WatchStream, WatcherId,
};

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Runs the Connect envelope decoder's checks on arbitrary bytes; panics on a violation.
    pub fn envelope_stream(data: &[u8]) {
        crate::framing::check_envelope_stream(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static + std::error::Error>() {}
        assert_bounds::<Error>();
        // Results stay small enough to pass around cheaply.
        assert!(
            std::mem::size_of::<Error>() <= 128,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    #[test]
    fn public_handles_are_send_sync() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Client>();
        assert_bounds::<Sandbox>();
        fn assert_send<T: Send + 'static>() {}
        assert_send::<ProcessStream>();
        assert_send::<Download>();
    }
}
