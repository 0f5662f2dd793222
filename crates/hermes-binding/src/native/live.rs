//! Live processes and session kernels as Python sees them (`LiveProcess`, `Kernel`): thin
//! conversions over agent-sandbox's, every wait with the GIL released.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox::{
    CellHost, CellOutcome, CellStatus, Kernel, LiveEnd, LiveProcess, LiveRead, LiveSignal,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::error::Error;

/// A live process in the sandbox (`hermes_e2b._native.LiveProcess`): its output read as it is
/// written, its stdin, signals. Deliberately has no `pid`: Hermes would kill that pid on the
/// host.
#[pyclass(name = "LiveProcess", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyLiveProcess {
    process: LiveProcess,
    profile_home: PathBuf,
}

impl PyLiveProcess {
    pub(super) fn new(process: LiveProcess, profile_home: PathBuf) -> PyLiveProcess {
        PyLiveProcess {
            process,
            profile_home,
        }
    }

    fn call(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&LiveProcess) -> Result<(), agent_sandbox::Error> + Send,
    ) -> PyResult<()> {
        let process = self.process.clone();
        py.detach(move || call(&process))
            .map_err(|error| Error::in_profile(error, &self.profile_home).into())
    }
}

/// How a live process ended, as a dict: `kind` (exited, killed, lost, detached),
/// `exit_code` (exited only) and `reason` (lost only, in words).
pub(super) fn end_dict<'py>(py: Python<'py>, end: &LiveEnd) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    let (kind, code, reason) = match end {
        LiveEnd::Exited { code } => ("exited", Some(*code), None),
        LiveEnd::Killed => ("killed", None, None),
        LiveEnd::Lost(reason) => ("lost", None, Some(reason.to_string())),
        _ => ("detached", None, None),
    };
    dict.set_item("kind", kind)?;
    dict.set_item("exit_code", code)?;
    dict.set_item("reason", reason)?;
    Ok(dict)
}

#[pymethods]
impl PyLiveProcess {
    /// The process's id: its directory's name in the sandbox (`follow_live` takes it).
    #[getter]
    fn id(&self) -> &str {
        self.process.id()
    }

    /// The sandbox it runs in.
    #[getter]
    fn sandbox_id(&self) -> &str {
        self.process.sandbox_id()
    }

    /// Its runner's pid inside the sandbox (not a host process): the process group the
    /// command leads.
    #[getter]
    fn sandbox_pid(&self) -> u32 {
        self.process.sandbox_pid()
    }

    /// How many output bytes `read` handed over so far.
    #[getter]
    fn delivered(&self) -> u64 {
        self.process.delivered()
    }

    /// The next output bytes; `b""` when none came within `timeout` seconds (None: wait until
    /// some come); None once the process has ended (then `end` tells how). Ctrl-C interrupts
    /// the wait on the main thread.
    #[pyo3(signature = (timeout = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let limit = timeout
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(Duration::from_secs_f64);
        let started = std::time::Instant::now();
        loop {
            let left = limit.map(|limit| limit.saturating_sub(started.elapsed()));
            let step = left.map_or(super::SIGNAL_CHECK, |left| left.min(super::SIGNAL_CHECK));
            let process = self.process.clone();
            match py.detach(move || process.read(step)) {
                LiveRead::Output(bytes) => return Ok(Some(PyBytes::new(py, &bytes))),
                LiveRead::Ended(_) => return Ok(None),
                _ => {
                    if left.is_some_and(|left| left <= step) {
                        return Ok(Some(PyBytes::new(py, b"")));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// How it ended once `read` reported the end (a dict: kind, exit_code, reason), else None.
    #[getter]
    fn end<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.process.end().map(|end| end_dict(py, &end)).transpose()
    }

    /// Writes `data` to the command's stdin (on a terminal: types it). A use of the sandbox:
    /// a paused one is resumed first.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let data = data.to_vec();
        self.call(py, move |process| process.write(&data))
    }

    /// Closes the command's stdin.
    fn close_stdin(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, LiveProcess::close_stdin)
    }

    /// Sends `signal` ("interrupt", "terminate" or "kill") to the command; a kill reaches
    /// what it started too.
    fn signal(&self, py: Python<'_>, signal: &str) -> PyResult<()> {
        let signal = match signal {
            "interrupt" => LiveSignal::Interrupt,
            "terminate" => LiveSignal::Terminate,
            "kill" => LiveSignal::Kill,
            other => {
                return Err(Error::InvalidArgument {
                    operation: "signal a live process",
                    reason: format!("signal must be interrupt, terminate or kill, not {other:?}"),
                }
                .into());
            }
        };
        self.call(py, move |process| process.signal(signal))
    }
}

/// A session kernel (`hermes_e2b._native.Kernel`): cells in one Python namespace in the
/// sandbox, their calls answered on the calling thread.
#[pyclass(name = "Kernel", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyKernel {
    kernel: Arc<Kernel>,
    profile_home: PathBuf,
}

impl PyKernel {
    pub(super) fn new(kernel: Kernel, profile_home: PathBuf) -> PyKernel {
        PyKernel {
            kernel: Arc::new(kernel),
            profile_home,
        }
    }
}

/// The cell's host: its calls go to the Python callable `on_call(name, args_json) -> str`
/// (an exception is the call's error), interrupts come from `is_interrupted() -> bool`; both
/// are called on the thread that runs the cell, in its Python context.
struct PythonCellHost {
    on_call: Py<PyAny>,
    is_interrupted: Option<Py<PyAny>>,
}

impl CellHost for PythonCellHost {
    fn call(&mut self, name: &str, args: &str) -> Result<String, String> {
        Python::attach(|py| {
            self.on_call
                .call1(py, (name, args))
                .and_then(|answer| answer.extract::<String>(py))
                .map_err(|error| {
                    let text = error.to_string();
                    tracing::debug!("a kernel cell's call of {name} failed: {text}");
                    agent_sandbox::redact(&text)
                })
        })
    }

    fn interrupted(&mut self) -> bool {
        Python::attach(|py| {
            if py.check_signals().is_err() {
                return true;
            }
            self.is_interrupted.as_ref().is_some_and(|check| {
                check
                    .call0(py)
                    .and_then(|answer| answer.is_truthy(py))
                    .unwrap_or(false)
            })
        })
    }
}

fn status_name(status: &CellStatus) -> &'static str {
    match status {
        CellStatus::Ok => "ok",
        CellStatus::Error => "error",
        CellStatus::Exit => "exit",
        CellStatus::Timeout => "timeout",
        CellStatus::Interrupted => "interrupted",
        _ => "ended",
    }
}

fn outcome_dict<'py>(py: Python<'py>, outcome: &CellOutcome) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("status", status_name(&outcome.status))?;
    if let CellStatus::Ended(end) = &outcome.status {
        dict.set_item("end", end_dict(py, end)?)?;
    }
    dict.set_item("stdout", &outcome.stdout)?;
    dict.set_item("stdout_clipped", outcome.stdout_clipped)?;
    dict.set_item("stderr", &outcome.stderr)?;
    dict.set_item("stderr_clipped", outcome.stderr_clipped)?;
    dict.set_item("traceback", &outcome.traceback)?;
    dict.set_item("raw", &outcome.raw)?;
    dict.set_item("execution_count", outcome.execution_count)?;
    dict.set_item("calls", outcome.calls)?;
    Ok(dict)
}

#[pymethods]
impl PyKernel {
    /// The kernel process's pid inside the sandbox.
    #[getter]
    fn sandbox_pid(&self) -> u32 {
        self.kernel.process().sandbox_pid()
    }

    /// The sandbox it runs in.
    #[getter]
    fn sandbox_id(&self) -> &str {
        self.kernel.process().sandbox_id()
    }

    /// Whether the kernel is known to have ended (its state is lost).
    #[getter]
    fn ended(&self) -> bool {
        self.kernel.is_ended()
    }

    /// Runs `code` as the next cell within `timeout` seconds; its calls go to
    /// `on_call(name, args_json) -> str` on this thread, and `is_interrupted()` is asked every
    /// 100 ms. Returns a dict: status (ok, error, exit, timeout, interrupted, ended), stdout,
    /// stderr, their `_clipped` flags, traceback, raw (descriptor-level output),
    /// execution_count, calls, and `end` for an ended kernel. Raises `LiveProcessLostError`
    /// when the kernel was gone before the cell could be sent (the cell did not run).
    #[pyo3(signature = (code, *, timeout, on_call, is_interrupted = None))]
    fn run_cell<'py>(
        &self,
        py: Python<'py>,
        code: String,
        timeout: f64,
        on_call: Py<PyAny>,
        is_interrupted: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let Ok(timeout) = Duration::try_from_secs_f64(timeout) else {
            return Err(Error::InvalidArgument {
                operation: "run a kernel cell",
                reason: "the time must be a finite, non-negative number of seconds".to_owned(),
            }
            .into());
        };
        let kernel = Arc::clone(&self.kernel);
        let mut host = PythonCellHost {
            on_call,
            is_interrupted,
        };
        let outcome = py
            .detach(move || kernel.run_cell(&code, timeout, &mut host))
            .map_err(|error| Error::in_profile(error, &self.profile_home))?;
        outcome_dict(py, &outcome)
    }

    /// Kills the kernel (and what it started) and waits for its end; its state is lost.
    fn kill(&self, py: Python<'_>) -> PyResult<()> {
        let kernel = Arc::clone(&self.kernel);
        py.detach(move || kernel.kill())
            .map_err(|error| Error::in_profile(error, &self.profile_home).into())
    }
}

/// A Python mapping of text to text (`env`, `modules`), as the core takes it.
pub(super) fn text_map(value: Option<&Bound<'_, PyDict>>) -> PyResult<BTreeMap<String, String>> {
    let Some(value) = value else {
        return Ok(BTreeMap::new());
    };
    value
        .iter()
        .map(|(key, value)| Ok((key.extract::<String>()?, value.extract::<String>()?)))
        .collect()
}

/// What `Backend.share_ports` did for one port: `port`, `kind` (`reachable`, `forwarded`,
/// `refused`), `reason` (when refused); `stop()` ends a forward.
#[pyclass(name = "SharedPort", module = "hermes_e2b._native")]
#[derive(Debug)]
pub struct PySharedPort {
    port: u16,
    kind: &'static str,
    reason: Option<String>,
    forward: Mutex<Option<agent_sandbox::PortForward>>,
}

impl PySharedPort {
    pub(super) fn new(shared: agent_sandbox::SharedPort) -> PySharedPort {
        let port = shared.port();
        let (kind, reason, forward) = match shared {
            agent_sandbox::SharedPort::Forwarded(forward) => ("forwarded", None, Some(forward)),
            agent_sandbox::SharedPort::Refused { reason, .. } => ("refused", Some(reason), None),
            _ => ("reachable", None, None),
        };
        PySharedPort {
            port,
            kind,
            reason,
            forward: Mutex::new(forward),
        }
    }
}

#[pymethods]
impl PySharedPort {
    /// The port.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// `reachable`, `forwarded` or `refused`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// Why it was refused.
    #[getter]
    fn reason(&self) -> Option<String> {
        self.reason.clone()
    }

    /// Whether a forward still carries connections.
    #[getter]
    fn running(&self) -> bool {
        self.forward
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_some_and(agent_sandbox::PortForward::is_running)
    }

    /// Ends a forward (nothing for the other kinds; once).
    fn stop(&self, py: Python<'_>) {
        let taken = self
            .forward
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(forward) = taken {
            py.detach(move || forward.stop());
        }
    }
}
