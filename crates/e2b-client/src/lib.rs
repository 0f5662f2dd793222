//! A native async client for E2B: the control-plane REST API and the in-sandbox envd
//! Connect-JSON protocol.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use e2b_client::{
//!     ApiKey, Client, Config, CreateOptions, OnTimeout, PauseMemory, ProcessEvent, StartOptions,
//!     UploadFile,
//! };
//! use futures::StreamExt;
//!
//! # async fn demo() -> Result<(), e2b_client::Error> {
//! // E2B_DOMAIN, E2B_API_URL and E2B_SANDBOX_URL are honoured like the official SDK;
//! // point them at e2b-local to run this on one machine.
//! let key = ApiKey::from_env().expect("E2B_API_KEY is set");
//! let client = Client::new(Config::from_env(key))?;
//!
//! let mut options = CreateOptions::new("base".to_owned());
//! options.timeout = Some(Duration::from_secs(300));
//! options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
//! options.metadata.insert("purpose".to_owned(), "demo".to_owned());
//! let info = client.create(options).await?;
//! let sandbox = client.sandbox(info.envd_access())?;
//!
//! // Output arrives chunk by chunk while the command runs.
//! let mut events = sandbox.start(StartOptions::shell("echo hello; echo oops >&2".to_owned())).await?;
//! while let Some(event) = events.next().await {
//!     match event? {
//!         ProcessEvent::Stdout(chunk) => print!("{}", String::from_utf8_lossy(&chunk)),
//!         ProcessEvent::Stderr(chunk) => eprint!("{}", String::from_utf8_lossy(&chunk)),
//!         ProcessEvent::End(end) => println!("exit code {}", end.exit_code),
//!         _ => {}
//!     }
//! }
//!
//! // Many files in one request; parents are created.
//! sandbox
//!     .write_files(vec![
//!         UploadFile::bytes("/home/user/a/one.txt".to_owned(), "1".into()),
//!         UploadFile::bytes("/home/user/b/two.txt".to_owned(), "2".into()),
//!     ])
//!     .await?;
//! let text = sandbox.read_file("/home/user/a/one.txt", 1 << 20).await?;
//! assert_eq!(&text[..], b"1");
//!
//! client.kill(&info.sandbox_id).await?;
//! # Ok(()) }
//! ```
//!
//! # What it guarantees
//!
//! - **Streaming, bounded memory.** Command output ([`ProcessStream`]) and downloads
//!   ([`Download`]) are decoded as bytes arrive; at most one frame plus one network chunk is
//!   held. Frame lengths are capped ([`Limits`]) before anything is buffered, and a download is
//!   refused the moment it passes the caller's cap, never after.
//! - **Deadlines everywhere.** Every request is bounded by [`Config::request_deadline`],
//!   retries included; streams are bounded by it until the response arrives and then by the
//!   allowed silence between events.
//! - **Retries that cannot duplicate work.** Transient failures (429/502/503/504, broken
//!   connections) are retried with bounded, jittered backoff honouring `Should-Retry` and
//!   `Retry-After` ([`RetryPolicy`]); creating a sandbox, starting a process and moving a file
//!   are retried only when the connection could not even be established.
//! - **Typed outcomes.** 404 and 409 are [`KillOutcome`], [`PauseOutcome`], [`SignalOutcome`],
//!   [`MakeDirOutcome`] or [`Error`] predicates (`is_not_found`, `is_conflict`,
//!   `is_sandbox_gone`, `is_transient`), never string matching by the caller.
//! - **No secrets in errors.** The API key and access tokens are [`ApiKey`] and
//!   [`AccessToken`] (redacted `Debug`/`Display`); every text stored in an [`Error`] went through
//!   [`redact`]. The client's own wording says "deadline exceeded"; text from the server is kept
//!   as sent (redacted), so a caller with rules about words rewrites them at its own boundary.
//! - **Nothing from the server is trusted.** Ids are validated before they reach a URL, JSON
//!   decoders accept camelCase or snake_case and integers as numbers or strings and ignore
//!   unknown fields, and names and sizes are data, not instructions.
//!
//! Only this crate knows HTTP and E2B's wire formats; it knows nothing about Hermes, scopes or
//! leases.

#![deny(missing_docs)]

mod config;
mod control;
mod error;
mod files;
mod framing;
mod http;
mod ids;
mod json;
mod process;
mod redact;
mod retry;
mod sandbox;
mod secret;
#[cfg(test)]
mod wire_tests;

pub use crate::config::{
    Config, DEFAULT_DOMAIN, ENVD_PORT, Jitter, JitterSource, Limits, RetryPolicy,
};
pub use crate::control::{
    Client, ConnectState, Connected, CreateOptions, KillOutcome, Lifecycle, ListQuery,
    ListedSandbox, OnTimeout, PauseMemory, PauseOutcome, SandboxDetail, SandboxInfo, SandboxState,
    StateFilter,
};
pub use crate::error::{Error, Operation, TransportStage};
pub use crate::files::{
    Download, EntryInfo, FileType, MakeDirOutcome, UploadData, UploadFile, WrittenFile,
};
pub use crate::ids::SandboxId;
pub use crate::process::{
    CommandOutput, END_DRAIN_LIMIT, ProcessConfig, ProcessEnd, ProcessEvent, ProcessInfo,
    ProcessStream, Signal, SignalOutcome, StartOptions,
};
pub use crate::redact::{REDACTED, redact, redact_with};
pub use crate::sandbox::{EnvdAccess, Health, Sandbox};
pub use crate::secret::{AccessToken, ApiKey};

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
