//! A sandbox file read or written, and a sync asked for outside a command: each admitted
//! like a command (attach, lease, gates, sync; C2, C7).

use std::time::Duration;

use e2b_client::Sandbox;

use super::{Backend, FILE_OPERATION_WINDOW, Inner};
use crate::error::Error;

impl Backend {
    /// Reads a sandbox file, refusing it the moment it passes `max_bytes` (checked while
    /// downloading). Admitted like a command: attach, lease, gates, sync (C2, C7).
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        self.file_operation("read file", FILE_OPERATION_WINDOW, |inner, sandbox| {
            let id = sandbox.id().as_str().to_owned();
            inner
                .block_on(sandbox.read_file(path, max_bytes))
                .map(|bytes| bytes.to_vec())
                .map_err(|source| Error::e2b("read file", Some(&id), source))
        })
    }

    /// Writes a sandbox file (parents created, replaced if present). Admitted like a command.
    pub fn write_file(&self, path: &str, data: Vec<u8>) -> Result<(), Error> {
        self.file_operation("write file", FILE_OPERATION_WINDOW, |inner, sandbox| {
            let id = sandbox.id().as_str().to_owned();
            let file = e2b_client::UploadFile::bytes(path.to_owned(), data.clone().into());
            inner
                .block_on(sandbox.write_files(vec![file]))
                .map(|_| ())
                .map_err(|source| Error::e2b("write file", Some(&id), source))
        })
    }

    /// Runs the per-command admission and sync now, without a command: attach if needed, then
    /// what [`run`](Self::run) does before it starts anything (lease, a reader's gates or
    /// takeover, the writer's or ephemeral owner's push through the [`StateHooks`](crate::StateHooks)). For a
    /// framework that asks for a sync outside a command (Hermes forces one so a file it just
    /// wrote on the host is visible in the sandbox). A reader pushes nothing; a refused reader
    /// gets [`Error::NotReady`].
    ///
    /// It is no use of the sandbox by itself (the command or file operation it comes before
    /// is): it leaves the quiet time running, and a sandbox this process paused (quiet, or
    /// for the limit) is not resumed for it; the next use resumes and syncs it (L17).
    pub fn sync_state(&self) -> Result<(), Error> {
        self.file_operation_for(
            "sync state",
            FILE_OPERATION_WINDOW,
            Operation::Sync(()),
            |_, _| Ok(()),
        )
    }

    /// One file operation admitted like a command: `op` runs on the attached sandbox once
    /// its lease and sync are in place, and once more after the lease is taken again when
    /// the sandbox was found gone; a failure on a gone or stale sandbox detaches it.
    pub(super) fn file_operation<T>(
        &self,
        operation: &'static str,
        window: Duration,
        op: impl Fn(&Inner, &Sandbox) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.file_operation_for(operation, window, Operation::Use, op)
    }

    fn file_operation_for<T>(
        &self,
        operation: &'static str,
        window: Duration,
        kind: Operation<T>,
        op: impl Fn(&Inner, &Sandbox) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let inner = &*self.inner;
        let mut state = inner.lock_state(operation);
        let attached = inner.ensure_attached(&mut state, operation)?;
        match kind {
            Operation::Use => {
                inner.touch();
                attached.used = true;
                attached.paused_for = None;
            }
            Operation::Sync(skipped) => {
                if inner.paused_by_backend(attached).is_some() {
                    return Ok(skipped);
                }
            }
        }
        let result =
            inner
                .prepare(attached, window)
                .and_then(|()| match op(inner, &attached.sandbox) {
                    Err(error) if error.is_sandbox_gone() => {
                        attached.lease.forget();
                        inner.top_up_lease(attached, window)?;
                        op(inner, &attached.sandbox)
                    }
                    other => other,
                });
        if let Err(error) = &result
            && (error.is_sandbox_gone() || attached.stale)
        {
            inner.detach(&mut state);
        }
        result
    }
}

/// Whether a file operation is a use of the sandbox (L17).
enum Operation<T> {
    /// The session's own: it counts as use and resumes a paused sandbox.
    Use,
    /// A sync before something else: it neither counts nor resumes what this process paused
    /// (then it returns the value it carries).
    Sync(T),
}
