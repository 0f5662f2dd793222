//! A running command as Python sees it (`hermes_e2b._native.Command`): poll, a wait Ctrl-C
//! interrupts, kill and how it ended.

use std::time::Duration;

use agent_sandbox::{CommandResult, RunningCommand, Termination};
use pyo3::prelude::*;

use super::SIGNAL_CHECK;
use crate::error::Error;

/// A command running in the sandbox. Deliberately has no `pid`: Hermes would kill that pid
/// on the host.
#[pyclass(name = "Command", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PyCommand {
    command: RunningCommand,
}

impl PyCommand {
    pub(super) fn new(command: RunningCommand) -> PyCommand {
        PyCommand { command }
    }
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
