//! The state hooks bridge: the backend's push and pull requests, forwarded to the Python
//! environment's FileSyncManager glue, over a `_native.Transport`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_sandbox::{HookError, PushKind, StateHooks, StateTransport};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::context::call_in_context;

use crate::chats::Chat;
use crate::error::Error;
use crate::privacy;

/// The state transport of the attached sandbox, handed to the Python sync hooks.
#[pyclass(name = "Transport", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyTransport {
    transport: StateTransport,
    /// The profile's Hermes home on this host, for the never-uploaded table (X7).
    host_home: PathBuf,
    /// The gateway chat the sandbox serves, if it serves one: its per-conversation files
    /// are only those the chat named (X19).
    chat: Option<Chat>,
}

#[pymethods]
impl PyTransport {
    #[getter]
    fn sandbox_id(&self) -> &str {
        self.transport.sandbox_id()
    }

    /// The first call may wait for the attach's home probe: without the GIL, since the
    /// runtime's tasks log through Python (`logging.rs`).
    #[getter]
    fn remote_hermes_home(&self, py: Python<'_>) -> PyResult<String> {
        let transport = self.transport.clone();
        py.detach(move || transport.remote_hermes_home().map(str::to_owned))
            .map_err(|source| Error::from(source).into())
    }

    /// The `(host_path, remote_path)` pairs the privacy table lets into the sandbox, in order;
    /// each one left out is named in a warning (contract X7). Hermes' sync list goes through
    /// this before Hermes stages copies whose host paths no longer say what they are. Without
    /// the GIL: judging by remote path may wait for the home, as above.
    fn uploadable(
        &self,
        py: Python<'_>,
        files: Vec<(PathBuf, String)>,
    ) -> PyResult<Vec<(PathBuf, String)>> {
        let transport = self.transport.clone();
        let host_home = self.host_home.clone();
        let chat = self.chat.clone();
        py.detach(move || keep_uploadable(&transport, &host_home, chat.as_ref(), files))
            .map_err(|source| Error::from(source).into())
    }

    /// Uploads `(host_path, remote_path)` pairs in one request, creating parents; files the
    /// privacy table keeps on the host are left out, each with a warning (contract X7).
    fn upload_many(&self, py: Python<'_>, files: Vec<(PathBuf, String)>) -> PyResult<usize> {
        let transport = self.transport.clone();
        let host_home = self.host_home.clone();
        let chat = self.chat.clone();
        py.detach(move || {
            let files = keep_uploadable(&transport, &host_home, chat.as_ref(), files)?;
            if files.is_empty() {
                return Ok(0);
            }
            transport.upload_many(files)
        })
        .map_err(|source| Error::from(source).into())
    }

    /// Deletes remote paths; already-gone paths are fine.
    fn delete_many(&self, py: Python<'_>, paths: Vec<String>) -> PyResult<()> {
        let transport = self.transport.clone();
        py.detach(move || transport.delete_many(paths))
            .map_err(|source| Error::from(source).into())
    }

    /// Streams the sandbox's Hermes home as a capped tar into `dest`; returns the file count.
    fn download_state(&self, py: Python<'_>, dest: PathBuf) -> PyResult<u64> {
        let transport = self.transport.clone();
        py.detach(move || {
            let mut file = File::create(&dest).map_err(|source| Error::Io {
                operation: "create state archive",
                path: dest.clone(),
                source,
            })?;
            let summary = transport.download_state(&mut file).map_err(Error::from)?;
            for name in &summary.rejected {
                tracing::warn!(
                    sandbox_id = transport.sandbox_id(),
                    "teardown pull skipped an unsafe archive member: {}",
                    // The sandbox chose the name (X4).
                    agent_sandbox::redact(name)
                );
            }
            Ok::<u64, Error>(summary.files)
        })
        .map_err(PyErr::from)
    }
}

/// `files` without those the privacy table keeps on the host, judged by the host path and by
/// where the file would land in the sandbox, each one left out named in a warning; and, for
/// a gateway chat's sandbox, without the per-conversation files its chat never named and,
/// when the operator keeps them out, without skills (X19).
fn keep_uploadable(
    transport: &StateTransport,
    host_home: &Path,
    chat: Option<&Chat>,
    files: Vec<(PathBuf, String)>,
) -> Result<Vec<(PathBuf, String)>, agent_sandbox::Error> {
    let remote_home = transport.remote_hermes_home()?;
    Ok(files
        .into_iter()
        .filter(|(host, remote)| {
            chat.is_none_or(|chat| {
                crate::chats::visible(chat, host_home, host)
                    && !crate::chats::remote_skill_kept_out(chat, remote_home, remote)
            })
        })
        .filter(|(host, remote)| {
            let kept = privacy::never_uploaded(host_home, host)
                .or_else(|| privacy::never_uploaded_remote(remote_home, remote));
            let Some(entry) = kept else {
                return true;
            };
            tracing::warn!(
                sandbox_id = transport.sandbox_id(),
                "not uploading {} (to {remote}): {} ({}) never leaves this host",
                host.display(),
                entry.path,
                entry.holds
            );
            false
        })
        .collect())
}

/// Forwards the backend's push/pull requests to a Python object with `push(transport, kind)`
/// and `pull(transport)` methods (the environment's FileSyncManager glue).
pub(crate) struct PyHooks {
    pub(super) target: Py<PyAny>,
    /// The profile's Hermes home, handed to each transport (X7).
    pub(super) host_home: PathBuf,
    /// The gateway chat the backend serves, handed to each transport (X19).
    pub(super) chat: Option<Chat>,
    /// A KeyboardInterrupt / SystemExit (anything not an `Exception`) raised inside a hook:
    /// the backend finishes its mandatory work first, then the binding re-raises it.
    pub(super) deferred: Deferred,
}

/// Process-control exceptions caught inside hooks, re-raised once the native call returns.
pub(crate) type Deferred = Arc<std::sync::Mutex<Option<PyErr>>>;

pub(crate) fn take_deferred(deferred: &Deferred) -> Option<PyErr> {
    deferred
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

impl PyHooks {
    fn call(
        &self,
        method: &str,
        transport: &StateTransport,
        kind: Option<&str>,
    ) -> Result<(), HookError> {
        let outcome = Python::try_attach(|py| -> PyResult<()> {
            let handle = Py::new(
                py,
                PyTransport {
                    transport: transport.clone(),
                    host_home: self.host_home.clone(),
                    chat: self.chat.clone(),
                },
            )?;
            let callable = self.target.bind(py).getattr(method)?;
            let handle = handle.into_bound(py).into_any();
            let args = match kind {
                Some(kind) => PyTuple::new(py, [handle, PyString::new(py, kind).into_any()])?,
                None => PyTuple::new(py, [handle])?,
            };
            // In the calling Hermes thread's context, though on the watched call's thread.
            call_in_context(py, &callable, args)?;
            Ok(())
        });
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(error)) => {
                let message = error.to_string();
                let control = Python::try_attach(|py| {
                    !error.is_instance_of::<pyo3::exceptions::PyException>(py)
                })
                .unwrap_or(false);
                if control {
                    let mut slot = self
                        .deferred
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    slot.get_or_insert(error);
                }
                Err(message.into())
            }
            None => Err("the Python interpreter is shutting down".into()),
        }
    }
}

impl StateHooks for PyHooks {
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        let kind = match kind {
            PushKind::Initial => "initial",
            PushKind::Incremental => "incremental",
        };
        self.call("push", transport, Some(kind))
    }

    fn pull(&self, transport: &StateTransport) -> Result<(), HookError> {
        self.call("pull", transport, None)
    }
}
