//! The Python-facing classes: settings, the backend, a running command, the state transport.
//! Each is a thin conversion layer over agent-sandbox; every blocking call releases the GIL.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{
    ApiKey, ApiKeySource, Backend, CleanupReport, CommandResult, HookError, KillOutcomeReport,
    PullOutcome, PushKind, RoleKind, RunOptions, RunningCommand, Scope, Services, Shell,
    StateHooks, StateTransport, TeardownRecovery, Termination, WriteSink,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};

use crate::error::{Error, without_time_words};
use crate::runtime;
use crate::settings::{Persistence, Settings, Value, idle_lifetime};

/// How often a blocking wait wakes up to let Python deliver Ctrl-C.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// How far a command's sandbox deadline trails Hermes' own timeout, so that Hermes' timeout
/// path (exit 124, "timed out") is the one that reports it.
const DEADLINE_MARGIN: Duration = Duration::from_secs(10);

fn to_value(object: &Bound<'_, PyAny>) -> PyResult<Value> {
    // bool before int: Python's bool is an int subclass.
    if object.is_none() {
        Ok(Value::Null)
    } else if object.is_instance_of::<PyBool>() {
        Ok(Value::Bool(object.extract()?))
    } else if object.is_instance_of::<PyInt>() {
        Ok(object
            .extract::<i64>()
            .map(Value::Int)
            .unwrap_or_else(|_| Value::Other("an integer out of range".to_owned())))
    } else if object.is_instance_of::<PyFloat>() {
        Ok(Value::Float(object.extract()?))
    } else if object.is_instance_of::<PyString>() {
        Ok(Value::Str(object.extract()?))
    } else if let Ok(mapping) = object.cast::<PyDict>() {
        let mut entries = BTreeMap::new();
        for (key, value) in mapping.iter() {
            entries.insert(key.str()?.to_string(), to_value(&value)?);
        }
        Ok(Value::Map(entries))
    } else {
        Ok(Value::Other(format!("a {}", object.get_type().name()?)))
    }
}

/// Validated plugin settings (`plugins.entries.e2b.settings`).
#[pyclass(name = "Settings", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PySettings {
    pub(crate) settings: Settings,
}

#[pymethods]
impl PySettings {
    /// Validates the raw mapping; raises ConfigurationError naming the bad key.
    #[new]
    #[pyo3(signature = (raw, *, lifetime_seconds = None))]
    fn new(raw: &Bound<'_, PyAny>, lifetime_seconds: Option<u64>) -> PyResult<PySettings> {
        let raw = match to_value(raw)? {
            Value::Map(entries) => entries,
            Value::Null => BTreeMap::new(),
            other => {
                return Err(Error::InvalidSetting {
                    key: "settings".to_owned(),
                    reason: format!("must be a mapping, not {other:?}"),
                }
                .into());
            }
        };
        let env = |name: &str| std::env::var(name).ok();
        let settings = Settings::parse_with_env(&raw, lifetime_seconds, &env)?;
        settings.warn_unknown_keys_once();
        Ok(PySettings { settings })
    }

    #[getter]
    fn template(&self) -> &str {
        &self.settings.config.template
    }

    #[getter]
    fn cwd(&self) -> Option<&str> {
        self.settings.config.cwd.as_deref()
    }

    #[getter]
    fn lease_seconds(&self) -> u64 {
        self.settings.config.lease.as_secs()
    }

    #[getter]
    fn command_grace_seconds(&self) -> u64 {
        self.settings.config.command_grace.as_secs()
    }

    #[getter]
    fn allow_internet_access(&self) -> bool {
        self.settings.config.internet == agent_sandbox::InternetAccess::Allowed
    }

    #[getter]
    fn secure(&self) -> bool {
        self.settings.config.security == agent_sandbox::Security::Secure
    }

    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.settings.config.metadata.clone()
    }

    #[getter]
    fn sandbox_id(&self) -> Option<&str> {
        self.settings.sandbox_id.as_ref().map(|id| id.as_str())
    }

    #[getter]
    fn unknown_keys(&self) -> Vec<String> {
        self.settings.unknown_keys.clone()
    }

    /// One line per unknown setting key, with the nearest known key (for doctor rows).
    fn unknown_key_notes(&self) -> Vec<String> {
        self.settings.unknown_key_notes()
    }

    /// One line naming where requests go (for doctor rows); never contains the key.
    fn endpoint_summary(&self) -> String {
        self.settings.endpoint_summary()
    }

    /// One line naming who picks the one writer (for doctor rows).
    fn arbitration_summary(&self) -> String {
        self.settings.arbitration_summary()
    }

    /// The directory a cwd Hermes hands over means (see `Settings::session_cwd`).
    #[pyo3(signature = (requested, current = None))]
    fn session_cwd(&self, requested: &str, current: Option<&str>) -> Option<String> {
        self.settings.session_cwd(requested, current)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.settings)
    }
}

/// The state transport of the attached sandbox, handed to the Python sync hooks.
#[pyclass(name = "Transport", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyTransport {
    transport: StateTransport,
}

#[pymethods]
impl PyTransport {
    #[getter]
    fn sandbox_id(&self) -> &str {
        self.transport.sandbox_id()
    }

    #[getter]
    fn remote_hermes_home(&self) -> &str {
        self.transport.remote_hermes_home()
    }

    /// Uploads `(host_path, remote_path)` pairs in one request, creating parents.
    fn upload_many(&self, py: Python<'_>, files: Vec<(PathBuf, String)>) -> PyResult<usize> {
        let transport = self.transport.clone();
        py.detach(move || transport.upload_many(files))
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

/// Forwards the backend's push/pull requests to a Python object with `push(transport, kind)`
/// and `pull(transport)` methods (the environment's FileSyncManager glue).
struct PyHooks {
    target: Py<PyAny>,
    /// A KeyboardInterrupt / SystemExit (anything not an `Exception`) raised inside a hook:
    /// the backend finishes its mandatory work first, then the binding re-raises it.
    deferred: Deferred,
}

/// Process-control exceptions caught inside hooks, re-raised once the native call returns.
type Deferred = Arc<std::sync::Mutex<Option<PyErr>>>;

fn take_deferred(deferred: &Deferred) -> Option<PyErr> {
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
                },
            )?;
            match kind {
                Some(kind) => self.target.call_method1(py, method, (handle, kind))?,
                None => self.target.call_method1(py, method, (handle,))?,
            };
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

fn role_name(role: RoleKind) -> &'static str {
    match role {
        RoleKind::Writer => "writer",
        RoleKind::Reader => "reader",
        RoleKind::Owner => "owner",
        RoleKind::Probe => "probe",
        RoleKind::External => "external",
    }
}

fn cleanup_dict<'py>(py: Python<'py>, report: &CleanupReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("sandbox_id", report.sandbox_id.clone())?;
    dict.set_item("repeated", report.repeated)?;
    let (pull, pull_error) = match &report.pull {
        PullOutcome::NotAttempted => ("not_attempted", None),
        PullOutcome::Pulled => ("pulled", None),
        PullOutcome::Failed(reason) => ("failed", Some(without_time_words(reason))),
    };
    dict.set_item("pull", pull)?;
    dict.set_item("pull_error", pull_error)?;
    let (recovery, recovery_error) = match &report.recovery {
        TeardownRecovery::NotAttempted => ("not_attempted", None),
        TeardownRecovery::Recovered(summary) => {
            let counts = PyDict::new(py);
            counts.set_item("restored", summary.restored)?;
            counts.set_item("unchanged", summary.unchanged)?;
            counts.set_item("superseded", summary.superseded)?;
            counts.set_item("quarantined", summary.quarantined)?;
            counts.set_item("skipped", summary.skipped)?;
            dict.set_item("recovered", counts)?;
            ("recovered", None)
        }
        TeardownRecovery::Failed(reason) => ("failed", Some(without_time_words(reason))),
    };
    dict.set_item("recovery", recovery)?;
    dict.set_item("recovery_error", recovery_error)?;
    let (sandbox, kill_error) = match &report.sandbox {
        KillOutcomeReport::LeftRunning => ("left_running", None),
        KillOutcomeReport::Killed => ("killed", None),
        KillOutcomeReport::AlreadyGone => ("already_gone", None),
        KillOutcomeReport::Failed(reason) => ("kill_failed", Some(without_time_words(reason))),
    };
    dict.set_item("sandbox", sandbox)?;
    dict.set_item("kill_error", kill_error)?;
    Ok(dict)
}

/// The API key source for a Python `key_resolver()` (the profile's secret lookup), asked on
/// first use.
pub(crate) fn python_key_resolver(key_resolver: Py<PyAny>) -> agent_sandbox::KeyResolver {
    Arc::new(move || -> Option<ApiKey> {
        Python::try_attach(|py| match key_resolver.call0(py) {
            Ok(value) => value
                .extract::<Option<String>>(py)
                .ok()
                .flatten()
                .filter(|key| !key.is_empty())
                .map(ApiKey::new),
            Err(error) => {
                // The error text is Python's; it names no key (resolvers never put it there).
                tracing::warn!(
                    "E2B API key lookup failed: {}",
                    error
                        .get_type(py)
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                );
                None
            }
        })
        .flatten()
    })
}

/// One Hermes environment's backend (one scope).
#[pyclass(name = "Backend", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyBackend {
    backend: Arc<Backend>,
    deferred: Deferred,
    /// The sandbox whose replacement of a gone one was last handed to Hermes: an attachment
    /// keeps its `replaced` for its whole life, Hermes must hear of it once.
    replacement_reported: std::sync::Mutex<Option<String>>,
}

#[pymethods]
impl PyBackend {
    /// Builds the backend; contacts nothing (the first `run` attaches). `key_resolver()` is
    /// called on first use and returns the profile's API key or None (unconfigured).
    /// `lifetime_seconds` is Hermes' `terminal.lifetime_seconds` (None: the default lease).
    #[new]
    #[pyo3(signature = (settings, *, profile_home, task_id, mode, lifetime_seconds, key_resolver, hooks, host_only))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        settings: &PySettings,
        profile_home: PathBuf,
        task_id: String,
        mode: &str,
        lifetime_seconds: Option<u64>,
        key_resolver: Py<PyAny>,
        hooks: Py<PyAny>,
        host_only: Vec<PathBuf>,
    ) -> PyResult<PyBackend> {
        let persistence = Persistence::parse(mode)?;
        let mut config = settings.settings.to_config(
            ApiKeySource::Resolver(python_key_resolver(key_resolver)),
            persistence,
            idle_lifetime(lifetime_seconds),
        );
        config.host_only = host_only;
        let services = Services::new(runtime::handle()?);
        let scope = Scope {
            profile_home,
            task_id,
        };
        let deferred = Deferred::default();
        let hooks = Arc::new(PyHooks {
            target: hooks,
            deferred: Arc::clone(&deferred),
        });
        let backend = Backend::new(config, scope, services, hooks).map_err(Error::from)?;
        Ok(PyBackend {
            backend: Arc::new(backend),
            deferred,
            replacement_reported: std::sync::Mutex::new(None),
        })
    }

    /// The scope digest stamped into the sandbox metadata.
    fn scope_digest(&self) -> String {
        self.backend.scope_digest()
    }

    /// Attaches now if not yet attached; returns what was found.
    fn attach<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let backend = Arc::clone(&self.backend);
        let attached = py.detach(move || backend.attach());
        if let Some(interrupt) = take_deferred(&self.deferred) {
            return Err(interrupt);
        }
        let info = attached.map_err(Error::from)?;
        let dict = PyDict::new(py);
        dict.set_item("sandbox_id", info.sandbox_id)?;
        dict.set_item("resumed", info.resumed)?;
        dict.set_item("role", role_name(info.role))?;
        dict.set_item("degradation", info.degradation)?;
        dict.set_item("replaced", info.replaced)?;
        dict.set_item("home", info.home.home)?;
        dict.set_item("user", info.home.user)?;
        dict.set_item("remote_hermes_home", info.remote_hermes_home)?;
        dict.set_item("default_cwd", info.default_cwd)?;
        Ok(dict)
    }

    /// The id of the gone sandbox the current attachment replaced, once per replacement (then
    /// None, also while nothing is attached): the environment passes it on to Hermes' `_mark_recreated()`. Contacts nothing.
    fn take_replaced(&self) -> Option<String> {
        let info = self.backend.info()?;
        // A stale reader let go of a sandbox and found the same one again: nothing was lost.
        let replaced = info.replaced.filter(|old| *old != info.sandbox_id)?;
        let mut reported = self
            .replacement_reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if reported.as_deref() == Some(info.sandbox_id.as_str()) {
            return None;
        }
        *reported = Some(info.sandbox_id);
        Some(replaced)
    }

    /// Hermes asked for a sync outside a command (`env._sync_manager.sync()`): the backend's
    /// admission and push, exactly as before a command; attaches if needed. A reader pushes
    /// nothing. A Ctrl-C raised inside the push is re-raised after the backend finished.
    fn sync_state(&self, py: Python<'_>) -> PyResult<()> {
        let backend = Arc::clone(&self.backend);
        let synced = py.detach(move || backend.sync_state());
        if let Some(interrupt) = take_deferred(&self.deferred) {
            return Err(interrupt);
        }
        synced.map_err(|error| Error::from(error).into())
    }

    /// The attached sandbox id, if any.
    #[getter]
    fn sandbox_id(&self) -> Option<String> {
        self.backend.info().map(|info| info.sandbox_id)
    }

    /// Starts `command` (`bash -c`, or `bash -l -c` when `login`: Hermes' own `_run_bash`
    /// flag, passed straight through), writing its merged output into `fd` as it arrives.
    /// `timeout_seconds` is Hermes' timeout; the sandbox deadline trails it by
    /// [`DEADLINE_MARGIN`]. Takes ownership of `fd` in every case (closed at the end of the
    /// output, or at once if the command cannot start). `stdin` (bytes, any size) becomes the
    /// command's standard input without passing through its command line (Hermes' payload
    /// stdin mode).
    #[pyo3(signature = (command, *, fd, timeout_seconds, login = false, cwd = None, stdin = None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, not a Rust API
    fn run(
        &self,
        py: Python<'_>,
        command: String,
        fd: i32,
        timeout_seconds: f64,
        login: bool,
        cwd: Option<String>,
        stdin: Option<Bound<'_, PyBytes>>,
    ) -> PyResult<PyCommand> {
        if fd < 0 {
            return Err(Error::InvalidArgument {
                operation: "start command",
                reason: format!("{fd} is not a file descriptor"),
            }
            .into());
        }
        // SAFETY: the caller hands over a valid open file descriptor it no longer uses
        // (documented on this method and done by hermes_e2b.environment); from here the fd
        // is owned, and closed, by exactly this value.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let Ok(timeout) = Duration::try_from_secs_f64(timeout_seconds) else {
            return Err(Error::InvalidArgument {
                operation: "start command",
                reason: "the deadline must be a finite, non-negative number of seconds".to_owned(),
            }
            .into());
        };
        let mut options = RunOptions::new(timeout.saturating_add(DEADLINE_MARGIN));
        options.shell = if login { Shell::Login } else { Shell::Plain };
        options.cwd = cwd;
        options.stdin = stdin.map(|data| data.as_bytes().to_vec().into());
        let backend = Arc::clone(&self.backend);
        let sink = Box::new(WriteSink::new(File::from(owned)));
        let started = py.detach(move || backend.run(&command, options, sink));
        if let Some(interrupt) = take_deferred(&self.deferred) {
            if let Ok(command) = &started {
                command.kill();
            }
            return Err(interrupt);
        }
        let command = started.map_err(Error::from)?;
        Ok(PyCommand { command })
    }

    /// Cleanup (session close, reaper, exit): waits for running commands, then pulls, releases
    /// or kills by mode; returns a report dict. Failures are reported, not raised; a Ctrl-C
    /// (or SystemExit) raised inside the pull is re-raised only after cleanup completed.
    fn cleanup<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let backend = Arc::clone(&self.backend);
        let report = py.detach(move || backend.cleanup());
        if let Some(interrupt) = take_deferred(&self.deferred) {
            return Err(interrupt);
        }
        cleanup_dict(py, &report)
    }

    /// The finalizer path: releases locally, never pulls state.
    fn finalize(&self, py: Python<'_>) {
        let backend = Arc::clone(&self.backend);
        py.detach(move || backend.finalize());
    }
}

/// A command running in the sandbox. Deliberately has no `pid`: Hermes would kill that pid
/// on the host.
#[pyclass(name = "Command", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyCommand {
    command: RunningCommand,
}

fn exit_code(result: CommandResult) -> PyResult<i32> {
    match result {
        Ok(exit) => {
            if let Some(error) = &exit.sink_error {
                tracing::debug!(
                    sandbox_pid = exit.sandbox_pid,
                    "output forwarding stopped early: {error}"
                );
            }
            Ok(exit.exit_code)
        }
        Err(source) => Err(PyErr::from(Error::CommandLost(source))),
    }
}

#[pymethods]
impl PyCommand {
    /// The pid inside the sandbox (not a host process).
    #[getter]
    fn sandbox_pid(&self) -> u32 {
        self.command.sandbox_pid()
    }

    /// The sandbox the command runs in.
    #[getter]
    fn sandbox_id(&self) -> &str {
        self.command.sandbox_id()
    }

    /// The exit code once finished (its output is then complete in the pipe), else None.
    fn poll(&self) -> PyResult<Option<i32>> {
        self.command.poll().map(exit_code).transpose()
    }

    /// Waits up to `timeout` seconds (forever if None); None if still running. Ctrl-C
    /// interrupts the wait, not the command.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<i32>> {
        let limit = timeout
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(Duration::from_secs_f64);
        let started = std::time::Instant::now();
        loop {
            let step = match limit {
                Some(limit) => limit.saturating_sub(started.elapsed()).min(SIGNAL_CHECK),
                None => SIGNAL_CHECK,
            };
            let command = self.command.clone();
            if let Some(result) = py.detach(move || command.wait_for(step)) {
                return exit_code(result).map(Some);
            }
            py.check_signals()?;
            if limit.is_some_and(|limit| started.elapsed() >= limit) {
                return Ok(None);
            }
        }
    }

    /// Kills the command by its sandbox pid; the sandbox and its other processes survive.
    fn kill(&self) {
        self.command.kill();
    }

    /// How the command ended: "exited", "killed", "deadline", or None while running.
    #[getter]
    fn termination(&self) -> Option<&'static str> {
        match self.command.poll()? {
            Ok(exit) => Some(match exit.termination {
                Termination::Exited => "exited",
                Termination::Killed => "killed",
                Termination::DeadlineExceeded => "deadline",
            }),
            Err(_) => Some("lost"),
        }
    }
}
