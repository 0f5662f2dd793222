//! The state transport: what Hermes' FileSyncManager (or any caller's sync) moves state with.
//!
//! `push` holds the uploads and deletes (with the fenced writer's staging and the push-base
//! bookkeeping), `pull` the teardown pull and, beside it, the recovery snapshot (both stream
//! a sandbox's Hermes state to the host), `stream` the blocking readers over a command's
//! output or a download, and `host_files` the host-side walk callers push from.

mod host_files;
mod pull;
mod push;
mod stream;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use e2b_client::{Client, Sandbox, SandboxId};

use crate::error::{Error, ErrorChain};
use crate::home::RemoteHome;
use crate::progress::{Meter, ProgressObserver, ProgressUnit};

pub use host_files::host_state_files;
pub(crate) use push::Staging;

/// Failures recorded by transport calls, shared with the backend that checks them after each
/// push or pull (Hermes' FileSyncManager swallows exceptions, contracts S2, S3).
pub(crate) type FailureLog = Arc<Mutex<Vec<(Transfer, String)>>>;

/// Which kind of transport call recorded a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// Uploads and deletes: any failure spoils the push it belongs to.
    Push,
    /// The teardown pull: Hermes retries it, so a later success supersedes earlier failures.
    Pull,
}

/// Moves state in and out of one attached sandbox. Cheap to clone; every method blocks the
/// calling thread (which must not be driving async tasks).
///
/// Every failure is returned and also recorded, so a caller whose sync machinery hides
/// exceptions still fails closed: the backend checks the record after each push or pull.
#[derive(Clone)]
pub struct StateTransport {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: tokio::runtime::Handle,
    client: Client,
    sandbox: Mutex<Sandbox>,
    sandbox_id: SandboxId,
    /// Known at once when configured or cached, else once the attach's home probe answers
    /// (the first transfer that needs it waits for it).
    remote_home: RemoteHome,
    cap: u64,
    transfer_lease: Duration,
    failures: FailureLog,
    progress: Option<ProgressObserver>,
    slots: std::sync::Weak<dyn crate::fleet::Member>,
    /// A fenced writer's staging (`writer_arbitration: sandbox`): uploads under the Hermes
    /// home go to the staging directory and deletes wait, until a commit applies both under
    /// the generation check (contract C10).
    staging: Mutex<Option<Staging>>,
    /// What the uploads of this attachment put in the sandbox (recovery's push base), once
    /// the backend starts tracking at bring-up; `changed` says it needs storing.
    push_base: Mutex<Option<(recovery::PushBase, bool)>>,
    /// Set by each transfer reconnect, taken by the teardown recovery: after the teardown
    /// pull reconnected, the recovery that follows needs no connect of its own.
    transfer_connected: AtomicBool,
}

impl fmt::Debug for StateTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateTransport")
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("remote_home", &self.inner.remote_home.peek())
            .field("cap", &self.inner.cap)
            .finish_non_exhaustive()
    }
}

/// What a teardown pull delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PullSummary {
    /// Regular files written to the destination archive.
    pub files: u64,
    /// Bytes of file content.
    pub file_bytes: u64,
    /// Members refused (links, devices, unsafe names), by name.
    pub rejected: Vec<String>,
}

pub(crate) struct TransportParts {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) client: Client,
    pub(crate) sandbox: Sandbox,
    pub(crate) remote_home: RemoteHome,
    pub(crate) cap: u64,
    pub(crate) transfer_lease: Duration,
    pub(crate) failures: FailureLog,
    pub(crate) progress: Option<ProgressObserver>,
    /// The backend whose sandbox this is: a transfer's reconnect resumes within the
    /// account's limit as the backend's own starts do (L14).
    pub(crate) slots: std::sync::Weak<dyn crate::fleet::Member>,
}

impl StateTransport {
    pub(crate) fn new(parts: TransportParts) -> StateTransport {
        let sandbox_id = parts.sandbox.id().clone();
        StateTransport {
            inner: Arc::new(Inner {
                runtime: parts.runtime,
                client: parts.client,
                sandbox: Mutex::new(parts.sandbox),
                sandbox_id,
                remote_home: parts.remote_home,
                cap: parts.cap,
                transfer_lease: parts.transfer_lease,
                failures: parts.failures,
                progress: parts.progress,
                slots: parts.slots,
                staging: Mutex::new(None),
                push_base: Mutex::new(None),
                transfer_connected: AtomicBool::new(false),
            }),
        }
    }

    /// The sandbox this transport moves state for.
    pub fn sandbox_id(&self) -> &str {
        self.inner.sandbox_id.as_str()
    }

    /// Where Hermes' state lives in the sandbox. The first call may wait for the attach's
    /// home probe (contract L13), and fails as it does when the sandbox's answer is refused.
    pub fn remote_hermes_home(&self) -> Result<&str, Error> {
        self.inner.remote_home.get()
    }

    pub(crate) fn replace_sandbox(&self, sandbox: Sandbox) {
        *self
            .inner
            .sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sandbox;
    }

    pub(super) fn sandbox(&self) -> Sandbox {
        self.inner
            .sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn id(&self) -> String {
        self.inner.sandbox_id.as_str().to_owned()
    }

    pub(super) fn record<T>(&self, kind: Transfer, result: Result<T, Error>) -> Result<T, Error> {
        let mut failures = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &result {
            Err(error) => failures.push((kind, ErrorChain(error).to_string())),
            // A pull that succeeds after failed attempts has delivered the state.
            Ok(_) if kind == Transfer::Pull => failures.retain(|(k, _)| *k != Transfer::Pull),
            Ok(_) => {}
        }
        drop(failures);
        result
    }

    pub(super) fn meter(
        &self,
        operation: &'static str,
        unit: ProgressUnit,
        total: Option<u64>,
    ) -> Meter {
        Meter::start(
            self.inner.progress.clone(),
            operation,
            Some(self.inner.sandbox_id.as_str()),
            unit,
            total,
        )
    }
}
