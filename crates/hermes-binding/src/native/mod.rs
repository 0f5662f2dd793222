//! The Python-facing classes: settings, the backend, a running command, the state transport.
//! Each is a thin conversion layer over agent-sandbox; every blocking call releases the GIL.

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{
    ApiKeySource, Backend, CallDeadline, CheckpointReason, CheckpointRequest, CheckpointTarget,
    DEFAULT_CHECKPOINT_WAIT, RunOptions, RunningCommand, Scope, Services, Shell, TurnRequest,
    WriteSink,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use context::CallerContext;

use crate::chats::{Chat, ChatSkills};
use crate::error::{Error, without_time_words};
use crate::runtime;
use crate::settings::{Persistence, idle_lifetime};

mod command;
mod context;
mod hooks;
mod live;
mod reports;
mod resolvers;
mod settings;
mod subagents;

pub(crate) use command::PyCommand;
pub(crate) use hooks::PyTransport;
pub(crate) use hooks::{Deferred, PyHooks, take_deferred};
pub(crate) use live::{PyKernel, PyLiveProcess, PySharedPort};
pub(crate) use settings::PySettings;
pub(crate) use settings::{command_timeout, missing_key_message, note_chat_texts};
pub(crate) use subagents::{PyChild, report_dict};

use reports::{checkpoint_dict, cleanup_dict, role_name, turn_dict};
pub(crate) use resolvers::{credential_source, python_credential_values, python_key_resolver};

/// The cap of a fetch whose caller names none (a Hermes whose gateway leaves the cap to the
/// backend): Hermes' own delivery limit, the 50 MB a Telegram bot may upload.
pub(crate) const DEFAULT_FETCH_CAP: u64 = 50 * 1024 * 1024;

/// A sandbox path as Hermes means it: absolute as given; relative to the environment's
/// working directory otherwise (its own fetch runs in a command started there).
fn sandbox_path(path: String, cwd: Option<&str>) -> String {
    match cwd {
        Some(cwd) if !path.starts_with('/') && cwd.starts_with('/') => {
            format!("{}/{path}", cwd.trim_end_matches('/'))
        }
        _ => path,
    }
}

/// How often a blocking wait wakes up to let Python deliver Ctrl-C.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// How far a command's sandbox deadline trails Hermes' own timeout, so that Hermes' timeout
/// path (exit 124, "timed out") is the one that reports it.
const DEADLINE_MARGIN: Duration = Duration::from_secs(10);

/// The time of a watched call whose caller names none (a sync Hermes asks for outside a
/// command): Hermes' default command time.
const DEFAULT_CALL_TIME: Duration = Duration::from_secs(180);

/// When one tool call must have ended (O7): its time plus the watchdog grace, from when it
/// was made. The environment takes one per Hermes `execute` and hands it to every step.
#[pyclass(name = "Deadline", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyDeadline {
    deadline: CallDeadline,
}

#[pymethods]
impl PyDeadline {
    /// Seconds left (0 once passed).
    #[getter]
    fn remaining(&self) -> f64 {
        self.deadline.remaining().as_secs_f64()
    }
}

/// How long a checkpoint step waits for running commands: the caller's seconds, else the
/// core's default.
fn checkpoint_wait(wait_seconds: Option<f64>) -> Duration {
    wait_seconds
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(DEFAULT_CHECKPOINT_WAIT, Duration::from_secs_f64)
}

/// One Hermes environment's backend (one scope).
#[pyclass(name = "Backend", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyBackend {
    backend: Arc<Backend>,
    /// The Hermes home: errors name its files (a missing key, its `.env`).
    profile_home: PathBuf,
    deferred: Deferred,
    /// The sandbox whose replacement of a gone one was last handed to Hermes: an attachment
    /// keeps its `replaced` for its whole life, Hermes must hear of it once.
    replacement_reported: std::sync::Mutex<Option<String>>,
    /// The credential names taken from Hermes' egress firewall, kept when the `credentials`
    /// setting is re-read.
    hermes_credentials: Vec<String>,
    /// The task (Hermes' container key: a gateway chat's `session:<key>`), named by every
    /// log line of a call on this backend.
    task_id: Arc<str>,
}

impl PyBackend {
    /// A Python backend around a core one made elsewhere (a subagent's fork).
    pub(super) fn around(
        backend: Arc<Backend>,
        profile_home: PathBuf,
        task_id: String,
    ) -> PyBackend {
        PyBackend {
            backend,
            profile_home,
            deferred: Deferred::default(),
            replacement_reported: std::sync::Mutex::new(None),
            hermes_credentials: Vec::new(),
            task_id: Arc::from(task_id.as_str()),
        }
    }

    /// Runs `call` on the backend with the GIL released. A Ctrl-C (or SystemExit) a hook held
    /// back during it is raised first; then the backend's error, in the plugin's words.
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&Backend) -> Result<T, agent_sandbox::Error> + Send,
    ) -> PyResult<T> {
        let backend = Arc::clone(&self.backend);
        let result = py.detach(move || call(&backend));
        if let Some(interrupt) = take_deferred(&self.deferred) {
            return Err(interrupt);
        }
        result.map_err(|error| Error::in_profile(error, &self.profile_home).into())
    }
}

impl PyBackend {
    /// [`PyBackend::detached`] under the watchdog (O7): the call runs on a thread of its own,
    /// in the caller's Python context, and is given up at `deadline` (default: the
    /// [`DEFAULT_CALL_TIME`] plus the grace) with an error naming the sandbox and what it
    /// waited for; a result that comes later goes to `late`.
    fn watched<T: Send + 'static>(
        &self,
        py: Python<'_>,
        operation: &'static str,
        deadline: Option<&PyDeadline>,
        call: impl FnOnce(&Backend) -> Result<T, agent_sandbox::Error> + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> PyResult<T> {
        let result = self.watched_raw(py, operation, deadline, call, late)?;
        if let Some(interrupt) = take_deferred(&self.deferred) {
            return Err(interrupt);
        }
        result.map_err(|error| Error::in_profile(error, &self.profile_home).into())
    }

    /// [`PyBackend::watched`] without re-raising a held-back Ctrl-C: for a caller that must
    /// undo what the call did first.
    fn watched_raw<T: Send + 'static>(
        &self,
        py: Python<'_>,
        operation: &'static str,
        deadline: Option<&PyDeadline>,
        call: impl FnOnce(&Backend) -> Result<T, agent_sandbox::Error> + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> PyResult<Result<T, agent_sandbox::Error>> {
        let deadline = deadline.map_or_else(
            || self.backend.call_deadline(DEFAULT_CALL_TIME),
            |given| given.deadline,
        );
        let context = CallerContext::capture(py)?;
        let backend = Arc::clone(&self.backend);
        let task = Arc::clone(&self.task_id);
        let result = py.detach(move || {
            backend.within(
                operation,
                deadline,
                move |backend| {
                    let _entered = context.enter();
                    // Every line the call logs names its task: a gateway chat's key.
                    let _span = tracing::info_span!("call", task = %task).entered();
                    call(backend)
                },
                late,
            )
        });
        Ok(result)
    }
}

#[pymethods]
impl PyBackend {
    /// The deadline of a tool call given `seconds` of its own (Hermes' command time): those
    /// seconds plus the `watchdog_grace_seconds` setting, from now. A negative or unusable
    /// number counts as 0 (the command itself refuses it, naming the setting).
    fn call_deadline(&self, seconds: f64) -> PyDeadline {
        let time = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO);
        PyDeadline {
            deadline: self.backend.call_deadline(time),
        }
    }

    /// Builds the backend; contacts nothing (the first `run` attaches). `key_resolver()` is
    /// called on first use and returns the profile's API key or None (unconfigured).
    /// `lifetime_seconds` is Hermes' `terminal.lifetime_seconds` (None: the default lease).
    #[new]
    #[pyo3(signature = (settings, *, profile_home, task_id, mode, lifetime_seconds, key_resolver, hooks, host_only, credential_resolver = None, chat = None))]
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
        credential_resolver: Option<Py<PyAny>>,
        chat: Option<String>,
    ) -> PyResult<PyBackend> {
        let persistence = Persistence::parse(mode)?;
        let mut config = settings.settings.to_config(
            ApiKeySource::Resolver(python_key_resolver(key_resolver)),
            persistence,
            idle_lifetime(lifetime_seconds),
        );
        config.host_only = host_only;
        config.credentials = settings
            .settings
            .credentials_with(
                python_credential_values(credential_resolver),
                credential_source(&profile_home),
            )
            .map_err(|error| error.in_config_file(crate::error::config_file(&profile_home)))?;
        let hermes_credentials = settings.settings.credentials_from_hermes.clone();
        let mut services = Services::new(runtime::handle()?);
        services.fleet = runtime::fleet();
        let deferred = Deferred::default();
        let hooks = Arc::new(PyHooks {
            target: hooks,
            host_home: profile_home.clone(),
            chat: chat.filter(|chat| !chat.is_empty()).map(|key| Chat {
                key,
                skills: if settings.settings.skills_in_chat_sandboxes {
                    ChatSkills::Pushed
                } else {
                    ChatSkills::KeptOut
                },
            }),
            deferred: Arc::clone(&deferred),
        });
        let task: Arc<str> = Arc::from(task_id.as_str());
        let scope = Scope {
            profile_home: profile_home.clone(),
            task_id,
        };
        let backend = Backend::new(config, scope, services, hooks).map_err(Error::from)?;
        Ok(PyBackend {
            backend: Arc::new(backend),
            profile_home,
            deferred,
            replacement_reported: std::sync::Mutex::new(None),
            hermes_credentials,
            task_id: task,
        })
    }

    /// Forks this scope's sandbox for the delegated child `child_id`, working in `dir` (R15):
    /// the parent's commands are waited for up to `wait_seconds`, never cut. The child's tool
    /// calls use `Child.backend()`; its work comes back with `Child.bring_back()`.
    #[pyo3(signature = (child_id, dir, *, wait_seconds = None))]
    fn fork_child(
        &self,
        py: Python<'_>,
        child_id: String,
        dir: String,
        wait_seconds: Option<f64>,
    ) -> PyResult<PyChild> {
        let wait = checkpoint_wait(wait_seconds);
        let profile_home = self.profile_home.clone();
        let parent = Arc::clone(&self.backend);
        py.detach(move || subagents::fork_child(&parent, &profile_home, &child_id, &dir, wait))
            .map_err(|error| Error::in_profile(error, &self.profile_home).into())
    }

    /// Makes the TCP ports live process `live_id` of `target` listens on reachable at the
    /// same ports in this backend's sandbox (R15: a process a subagent handed off, in its
    /// fork): a list of `SharedPort`, one per port, each `reachable` (the sandboxes share a
    /// network), `forwarded` (through the host, until `stop`) or `refused` (with `reason`).
    fn share_ports(
        &self,
        py: Python<'_>,
        target: &PyBackend,
        live_id: String,
    ) -> PyResult<Vec<live::PySharedPort>> {
        let here = Arc::clone(&self.backend);
        let there = Arc::clone(&target.backend);
        let shared = py
            .detach(move || here.share_ports(&there, &live_id))
            .map_err(|error| PyErr::from(Error::in_profile(error, &self.profile_home)))?;
        Ok(shared.into_iter().map(live::PySharedPort::new).collect())
    }

    /// Says that a command of this backend runs in `dir`: on a delegated child's fork, a
    /// directory outside the roots its work is compared in becomes one of them (R15); on any
    /// other backend it does nothing. Contacts nothing.
    fn worked_in(&self, dir: &str) {
        self.backend.worked_in(dir);
    }

    /// Replaces the egress policy with `allow_out` / `deny_out` as the settings write them
    /// (re-read before each command): validated like the settings (ConfigurationError naming
    /// the key); the attached sandbox is updated before the next command that finds its
    /// rules differ (X10). Contacts nothing. Returns whether the policy changed.
    /// `credentials`, when given, is the `credentials` setting as re-read: the credentials
    /// taken from Hermes' egress firewall at construction are kept beside it (X16).
    #[pyo3(signature = (allow_out, deny_out, credentials = None))]
    fn set_egress(
        &self,
        allow_out: &Bound<'_, PyAny>,
        deny_out: &Bound<'_, PyAny>,
        credentials: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let raw = std::collections::BTreeMap::from([
            ("allow_out".to_owned(), settings::to_value(allow_out)?),
            ("deny_out".to_owned(), settings::to_value(deny_out)?),
        ]);
        let policy = crate::settings::egress(&raw)?;
        let mut changed = false;
        if let Some(credentials) = credentials {
            let raw = std::collections::BTreeMap::from([(
                "credentials".to_owned(),
                settings::to_value(credentials)?,
            )]);
            let mut list = crate::settings::credentials(&raw)?;
            let current = self.backend.credentials();
            // Those Hermes' firewall gave (names the setting does not configure) stay.
            for kept in current.list() {
                if self.hermes_credentials.contains(&kept.name().to_owned())
                    && !list.iter().any(|c| c.name() == kept.name())
                {
                    list.push(kept.clone());
                }
            }
            let next = current.with_list(list).map_err(Error::from)?;
            changed |= self.backend.set_credentials(next);
        }
        changed |= self.backend.set_egress(policy);
        Ok(changed)
    }

    /// The credentials in force from the next command on, and the stand-ins the attached
    /// sandbox's commands see: a list of dicts (name, hosts, header, stand_in). Never a value.
    fn credentials<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let backend = Arc::clone(&self.backend);
        let stand_ins = py.detach(move || backend.stand_ins());
        self.backend
            .credentials()
            .list()
            .iter()
            .map(|credential| {
                let dict = PyDict::new(py);
                dict.set_item("name", credential.name())?;
                dict.set_item("hosts", credential.hosts().to_vec())?;
                dict.set_item("header", credential.header())?;
                dict.set_item("stand_in", stand_ins.get(credential.name()))?;
                Ok(dict)
            })
            .collect()
    }

    /// The egress policy in force from the next command on: `(allow_out, deny_out)`.
    fn egress(&self) -> (Vec<String>, Vec<String>) {
        let policy = self.backend.egress();
        (policy.allow_out().to_vec(), policy.deny_out().to_vec())
    }

    /// The scope digest stamped into the sandbox metadata.
    fn scope_digest(&self) -> String {
        self.backend.scope_digest()
    }

    /// Attaches now if not yet attached; returns what was found. Watched (O7).
    #[pyo3(signature = (*, deadline = None))]
    fn attach<'py>(
        &self,
        py: Python<'py>,
        deadline: Option<PyRef<'py, PyDeadline>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let info = self.watched(py, "attach", deadline.as_deref(), Backend::attach, drop)?;
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
    fn take_replaced(&self, py: Python<'_>) -> Option<String> {
        // Without the GIL: `info` waits for the scope's state lock, whose holder may be a
        // command's admission calling back into Python (a sync hook, a log record), which
        // needs the GIL this thread would otherwise hold: a deadlock of the whole process
        // (Hermes' execute_code polls from two threads at once, contract O7).
        let backend = Arc::clone(&self.backend);
        let info = py.detach(move || backend.info())?;
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
    /// Watched (O7): given up at `deadline`, naming what held the scope.
    #[pyo3(signature = (*, deadline = None))]
    fn sync_state(&self, py: Python<'_>, deadline: Option<PyRef<'_, PyDeadline>>) -> PyResult<()> {
        self.watched(
            py,
            "sync state",
            deadline.as_deref(),
            Backend::sync_state,
            drop,
        )
    }

    /// Hermes' `fetch_file`: copies the regular sandbox file `remote_path` (links followed;
    /// relative to `cwd`) to `local_dest` on the host, streamed, failing at the first byte
    /// past `max_bytes` (None: [`DEFAULT_FETCH_CAP`]). The file appears at `local_dest` only
    /// whole; a failure leaves nothing there. Returns the size. Attaches if needed.
    #[pyo3(signature = (remote_path, local_dest, *, max_bytes = None, cwd = None))]
    fn fetch_file(
        &self,
        py: Python<'_>,
        remote_path: String,
        local_dest: PathBuf,
        max_bytes: Option<i64>,
        cwd: Option<String>,
    ) -> PyResult<u64> {
        let max_bytes = match max_bytes {
            None => DEFAULT_FETCH_CAP,
            Some(cap) => u64::try_from(cap).map_err(|_| Error::InvalidArgument {
                operation: "fetch file",
                reason: format!("the cap must not be negative, got {cap}"),
            })?,
        };
        let path = sandbox_path(remote_path, cwd.as_deref());
        self.detached(py, move |backend| {
            backend.fetch_file(&path, &local_dest, max_bytes)
        })
    }

    /// Hermes' `fetch_realpath`: `readlink -f remote_path` in the sandbox (relative to `cwd`),
    /// or None when it cannot be resolved. Attaches if needed.
    #[pyo3(signature = (remote_path, *, cwd = None))]
    fn fetch_realpath(
        &self,
        py: Python<'_>,
        remote_path: String,
        cwd: Option<String>,
    ) -> PyResult<Option<String>> {
        let path = sandbox_path(remote_path, cwd.as_deref());
        self.detached(py, move |backend| backend.realpath(&path))
    }

    /// The attached sandbox id, if any.
    #[getter]
    fn sandbox_id(&self, py: Python<'_>) -> Option<String> {
        // Without the GIL, as `take_replaced`.
        let backend = Arc::clone(&self.backend);
        py.detach(move || backend.info().map(|info| info.sandbox_id))
    }

    /// Starts `command` (`bash -c`, or `bash -l -c` when `login`: Hermes' own `_run_bash`
    /// flag, passed straight through), writing its merged output into `fd` as it arrives.
    /// `timeout_seconds` is Hermes' timeout; the sandbox deadline trails it by
    /// [`DEADLINE_MARGIN`]. Takes ownership of `fd` in every case (closed at the end of the
    /// output, or at once if the command cannot start). `stdin` (bytes, any size) becomes the
    /// command's standard input without passing through its command line (Hermes' payload
    /// stdin mode).
    ///
    /// Watched (O7): the start is given up at `deadline` (a command that starts after that
    /// is killed at once), and the command's sandbox deadline never lies beyond it, so a
    /// command that Hermes stops waiting for ends by then plus the kill's own grace.
    #[pyo3(signature = (command, *, fd, timeout_seconds, login = false, cwd = None, stdin = None, deadline = None))]
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
        deadline: Option<PyRef<'_, PyDeadline>>,
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
        let deadline = deadline.map_or_else(
            || self.backend.call_deadline(timeout),
            |given| given.deadline,
        );
        let sandbox_deadline = timeout
            .saturating_add(DEADLINE_MARGIN)
            .min(deadline.remaining());
        let mut options = RunOptions::new(sandbox_deadline);
        options.shell = if login { Shell::Login } else { Shell::Plain };
        options.cwd = cwd;
        options.stdin = stdin.map(|data| data.as_bytes().to_vec().into());
        options.purpose = crate::watch::purpose(&command);
        options.answer_while_paused = crate::watch::answer_while_paused(&command).map(Into::into);
        let sink = Box::new(WriteSink::new(File::from(owned)));
        let given = PyDeadline { deadline };
        let started = self.watched_raw(
            py,
            "start command",
            Some(&given),
            move |backend| backend.run(&command, options, sink),
            // Started after its caller was told it would not be: nobody waits for it.
            |command: RunningCommand| command.kill(),
        )?;
        if let Some(interrupt) = take_deferred(&self.deferred) {
            if let Ok(command) = &started {
                command.kill();
            }
            return Err(interrupt);
        }
        let command = started.map_err(|error| Error::in_profile(error, &self.profile_home))?;
        Ok(PyCommand::new(command))
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

    /// Takes a checkpoint (an E2B snapshot) of the scope's sandbox; attaches if needed. Only
    /// the scope's writer may (R1); waits up to `wait_seconds` for running commands (R2).
    /// `reason` is "manual", "start" or "agent". Returns the checkpoint's dict.
    #[pyo3(signature = (label = None, *, reason = "manual", wait_seconds = None))]
    fn checkpoint<'py>(
        &self,
        py: Python<'py>,
        label: Option<String>,
        reason: &str,
        wait_seconds: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let reason = match CheckpointReason::parse(reason) {
            Some(
                reason @ (CheckpointReason::Manual
                | CheckpointReason::SessionStart
                | CheckpointReason::Agent),
            ) => reason,
            _ => {
                return Err(Error::InvalidArgument {
                    operation: "checkpoint",
                    reason: format!("reason must be manual, start or agent, not {reason:?}"),
                }
                .into());
            }
        };
        let request = CheckpointRequest {
            label,
            reason,
            wait: checkpoint_wait(wait_seconds),
        };
        let checkpoint = self.detached(py, move |backend| backend.checkpoint(request))?;
        checkpoint_dict(py, &checkpoint)
    }

    /// The scope's checkpoints, newest first, from E2B's snapshot list (attaches nothing).
    fn checkpoints<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let all = self.detached(py, Backend::checkpoints)?;
        all.iter().map(|c| checkpoint_dict(py, c)).collect()
    }

    /// Deletes the scope's automatic checkpoints beyond the newest `keep` (R7); returns them.
    fn prune_checkpoints<'py>(
        &self,
        py: Python<'py>,
        keep: usize,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let deleted = self.detached(py, move |backend| backend.prune_checkpoints(keep))?;
        deleted.iter().map(|c| checkpoint_dict(py, c)).collect()
    }

    /// Rolls the scope back to checkpoint `name` (a label or snapshot id; None: the latest
    /// one not taken by a rollback) (R4, R5, R8). Returns restored, undo, retired_sandbox,
    /// sandbox_id, recovered (counts) and warnings.
    #[pyo3(signature = (name = None, *, wait_seconds = None))]
    fn rollback<'py>(
        &self,
        py: Python<'py>,
        name: Option<String>,
        wait_seconds: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let target = match name {
            Some(name) => CheckpointTarget::Named(name),
            None => CheckpointTarget::Latest,
        };
        let wait = checkpoint_wait(wait_seconds);
        let report = self.detached(py, move |backend| backend.rollback(target, wait))?;
        let dict = PyDict::new(py);
        dict.set_item("restored", checkpoint_dict(py, &report.restored)?)?;
        dict.set_item("undo", checkpoint_dict(py, &report.undo)?)?;
        dict.set_item("retired_sandbox", &report.retired_sandbox)?;
        dict.set_item("sandbox_id", &report.sandbox_id)?;
        let counts = PyDict::new(py);
        counts.set_item("restored", report.recovery.restored)?;
        counts.set_item("unchanged", report.recovery.unchanged)?;
        counts.set_item("superseded", report.recovery.superseded)?;
        counts.set_item("quarantined", report.recovery.quarantined)?;
        counts.set_item("skipped", report.recovery.skipped)?;
        dict.set_item("recovered", counts)?;
        let warnings: Vec<String> = report
            .warnings
            .iter()
            .map(|w| without_time_words(w))
            .collect();
        dict.set_item("warnings", warnings)?;
        Ok(dict)
    }

    /// A turn-level file checkpoint of `directory` inside the sandbox (R9): one command, the
    /// store keeps the newest `keep`. Returns its dict.
    #[pyo3(signature = (directory, *, label, keep))]
    fn turn_checkpoint<'py>(
        &self,
        py: Python<'py>,
        directory: String,
        label: String,
        keep: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let request = TurnRequest {
            directory,
            label,
            keep,
        };
        let turn = self.detached(py, move |backend| backend.turn_checkpoint(request))?;
        turn_dict(py, &turn)
    }

    /// The sandbox's turn checkpoints, newest first (one command; attaches if needed).
    fn turn_checkpoints<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let turns = self.detached(py, Backend::turn_checkpoints)?;
        turns.iter().map(|t| turn_dict(py, t)).collect()
    }

    /// Restores turn checkpoint `number` (R10); returns restored and undo.
    #[pyo3(signature = (number, *, keep, wait_seconds = None))]
    fn restore_turn<'py>(
        &self,
        py: Python<'py>,
        number: u64,
        keep: usize,
        wait_seconds: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let wait = checkpoint_wait(wait_seconds);
        let report = self.detached(py, move |backend| backend.restore_turn(number, keep, wait))?;
        let dict = PyDict::new(py);
        dict.set_item("restored", turn_dict(py, &report.restored)?)?;
        dict.set_item("undo", turn_dict(py, &report.undo)?)?;
        Ok(dict)
    }

    /// Starts `command` as live process `id` (letters, digits, `_`, `-`): admitted like a
    /// command, its stdin open, its output read with `LiveProcess.read` as it is written
    /// (nothing polls), on a terminal of `terminal` = (rows, cols) when given, else on pipes
    /// (stdout and stderr merged). `login`: `bash -lc`, as Hermes' background processes run.
    /// Watched (O7): given up at `deadline`; a process that starts after that is killed.
    #[pyo3(signature = (id, command, *, cwd = None, env = None, login = true, terminal = None, deadline = None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, not a Rust API
    fn start_live(
        &self,
        py: Python<'_>,
        id: String,
        command: String,
        cwd: Option<String>,
        env: Option<Bound<'_, PyDict>>,
        login: bool,
        terminal: Option<(u16, u16)>,
        deadline: Option<PyRef<'_, PyDeadline>>,
    ) -> PyResult<PyLiveProcess> {
        let shell = if login { Shell::Login } else { Shell::Plain };
        let mut options = match terminal {
            Some((rows, cols)) => agent_sandbox::LiveOptions::terminal(
                shell,
                agent_sandbox::TerminalSize { rows, cols },
            ),
            None => agent_sandbox::LiveOptions::pipes(shell),
        };
        options.cwd = cwd;
        options.env = live::text_map(env.as_ref())?;
        let process = self.watched(
            py,
            "start live process",
            deadline.as_deref(),
            move |backend| backend.start_live(&id, &command, options),
            |late: agent_sandbox::LiveProcess| {
                let _ = late.signal(agent_sandbox::LiveSignal::Kill);
            },
        )?;
        Ok(PyLiveProcess::new(process, self.profile_home.clone()))
    }

    /// Takes up live process `id` (pid `pid`) of sandbox `sandbox_id` again, started by an
    /// earlier process of this scope: its output from byte `offset` (0: all the sandbox
    /// kept). Contacts nothing now; it follows from the scope's next use.
    #[pyo3(signature = (id, sandbox_id, pid, *, offset = 0))]
    fn follow_live(
        &self,
        py: Python<'_>,
        id: String,
        sandbox_id: String,
        pid: u32,
        offset: u64,
    ) -> PyResult<PyLiveProcess> {
        let process = self.detached(py, move |backend| {
            backend.follow_live(&id, &sandbox_id, pid, offset)
        })?;
        Ok(PyLiveProcess::new(process, self.profile_home.clone()))
    }

    /// Starts a session kernel (`python`, any template that has it; no Jupyter): cells run in
    /// one namespace, `modules` (name: source) importable by them, `env` set for it, the caps
    /// as Hermes' (characters of stdout and stderr kept per cell), `idle_exit_seconds` before
    /// it exits by itself. Watched (O7).
    #[pyo3(signature = (*, python = "python3".to_owned(), cwd = None, env = None, modules = None, stdout_cap = 50_000, stderr_cap = 10_000, idle_exit_seconds = 1800.0, deadline = None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments, not a Rust API
    fn start_kernel(
        &self,
        py: Python<'_>,
        python: String,
        cwd: Option<String>,
        env: Option<Bound<'_, PyDict>>,
        modules: Option<Bound<'_, PyDict>>,
        stdout_cap: usize,
        stderr_cap: usize,
        idle_exit_seconds: f64,
        deadline: Option<PyRef<'_, PyDeadline>>,
    ) -> PyResult<PyKernel> {
        let mut options = agent_sandbox::KernelOptions::new(python);
        options.cwd = cwd;
        options.env = live::text_map(env.as_ref())?;
        options.modules = live::text_map(modules.as_ref())?;
        options.stdout_cap = stdout_cap;
        options.stderr_cap = stderr_cap;
        options.raw_cap = stdout_cap;
        options.idle_exit =
            Duration::try_from_secs_f64(idle_exit_seconds).unwrap_or(Duration::from_secs(1800));
        let kernel = self.watched(
            py,
            "start a session kernel",
            deadline.as_deref(),
            move |backend| backend.start_kernel(options),
            |late: agent_sandbox::Kernel| {
                let _ = late.kill();
            },
        )?;
        Ok(PyKernel::new(kernel, self.profile_home.clone()))
    }

    /// The finalizer path: releases locally, never pulls state.
    fn finalize(&self, py: Python<'_>) {
        let backend = Arc::clone(&self.backend);
        py.detach(move || backend.finalize());
    }
}

#[cfg(test)]
mod tests;
