//! A delegated child's fork of its parent's sandbox, as Python holds it (R15): the backend
//! its tool calls use, and the bring-back and end the parent's hooks ask for.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox::{Backend, BringBack, ChildId, ChildSandbox};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::PyBackend;
use crate::error::Error;

/// One child's fork. Its work comes back, and the fork ends, only through the parent.
#[pyclass(name = "Child", module = "hermes_e2b._native", frozen)]
pub struct PyChild {
    parent: Arc<Backend>,
    profile_home: PathBuf,
    /// `None` once ended.
    child: Mutex<Option<ChildSandbox>>,
    id: String,
    sandbox_id: String,
    dir: String,
    git: bool,
    backend: Arc<Backend>,
}

impl std::fmt::Debug for PyChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyChild")
            .field("id", &self.id)
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// Forks `parent`'s sandbox for child `child_id` working in `dir` (waiting up to `wait` for
/// the parent's commands, never cutting one).
pub(super) fn fork_child(
    parent: &Arc<Backend>,
    profile_home: &std::path::Path,
    child_id: &str,
    dir: &str,
    wait: Duration,
) -> Result<PyChild, agent_sandbox::Error> {
    let id = ChildId::new(child_id)?;
    // Siblings asking at once share one checkpoint of the parent.
    let child = parent.fork_child(id, dir, wait)?;
    Ok(PyChild {
        parent: Arc::clone(parent),
        profile_home: profile_home.to_path_buf(),
        id: child.id.to_string(),
        sandbox_id: child.sandbox_id.as_str().to_owned(),
        dir: child.dir.clone(),
        git: child.is_git(),
        backend: Arc::clone(child.backend()),
        child: Mutex::new(Some(child)),
    })
}

/// A bring-back's report as the dict Python reads (`Child.bring_back`, `pull_subagent`).
pub(crate) fn report_dict<'py>(
    py: Python<'py>,
    report: &BringBack,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("child", &report.child)?;
    let branches = PyList::empty(py);
    for branch in &report.branches {
        let entry = PyDict::new(py);
        entry.set_item("repository", &branch.repository)?;
        entry.set_item("branch", &branch.branch)?;
        entry.set_item("commits", branch.commits)?;
        branches.append(entry)?;
    }
    dict.set_item("branches", branches)?;
    dict.set_item("written", &report.written)?;
    dict.set_item("deleted", &report.deleted)?;
    let conflicts: Vec<(String, Option<String>)> = report.conflicts.clone();
    dict.set_item("conflicts", conflicts)?;
    dict.set_item("compared", &report.compared)?;
    dict.set_item("unread", &report.unread)?;
    let elsewhere = PyDict::new(py);
    elsewhere.set_item("paths", &report.elsewhere.paths)?;
    elsewhere.set_item("directories", &report.elsewhere.directories)?;
    elsewhere.set_item("counts", report.elsewhere.counts.clone())?;
    elsewhere.set_item("total", report.elsewhere.total)?;
    elsewhere.set_item("truncated", report.elsewhere.truncated)?;
    dict.set_item("elsewhere", elsewhere)?;
    dict.set_item("state_written", &report.state.written)?;
    dict.set_item("state_beside", report.state.beside.clone())?;
    dict.set_item("summary", report.summary())?;
    Ok(dict)
}

#[pymethods]
impl PyChild {
    /// The child's id (Hermes' `subagent_id`).
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The fork's sandbox id.
    #[getter]
    fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    /// The working directory the child's work is measured in.
    #[getter]
    fn dir(&self) -> &str {
        &self.dir
    }

    /// Whether the work comes back as a git branch.
    #[getter]
    fn is_git(&self) -> bool {
        self.git
    }

    /// A backend whose commands run in the fork, for the child's environment.
    fn backend(&self, task_id: String) -> PyBackend {
        PyBackend::around(
            Arc::clone(&self.backend),
            self.profile_home.clone(),
            task_id,
        )
    }

    /// Brings the child's work back into the parent's sandbox: a dict of `child`, `branches`
    /// (`repository`, `branch`, `commits` each), `written`, `deleted`, `conflicts` (path,
    /// where the child's version is), `compared` (the directories compared), `unread` (those
    /// under them one side could not enter, not compared), `elsewhere`
    /// (`paths`, `directories`, `counts`, `total`, `truncated`: what it changed outside
    /// them, not copied), `state_written`, `state_beside` and `summary` (what the parent's
    /// model is told).
    fn bring_back<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let parent = Arc::clone(&self.parent);
        let guard = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(child) = guard.as_ref() else {
            return Err(Error::from(agent_sandbox::Error::InvalidConfig {
                reason: format!("subagent {} has ended; nothing to bring back", self.id),
            })
            .into());
        };
        let report = py
            .detach(|| parent.bring_back(child))
            .map_err(|error| PyErr::from(Error::in_profile(error, &self.profile_home)))?;
        report_dict(py, &report)
    }

    /// Keeps the fork running for `what` (a process the child handed off to its parent),
    /// its work back: `hermes e2b list` says so until `end` kills it.
    fn hold(&self, what: &str) {
        if let Some(child) = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            self.parent.hold_child(child, what);
        }
    }

    /// Pauses and keeps the fork, its work back (`subagent_forks: keep`; once, like `end`).
    fn keep(&self, py: Python<'_>) -> PyResult<()> {
        self.finish(py, Backend::keep_child)
    }

    /// Kills the fork (once; later calls do nothing).
    fn end(&self, py: Python<'_>) -> PyResult<()> {
        self.finish(py, Backend::end_child)
    }
}

impl PyChild {
    /// Ends the fork the one way `how` says, once: a later `keep` or `end` does nothing.
    fn finish(
        &self,
        py: Python<'_>,
        how: fn(&Backend, ChildSandbox) -> Result<(), agent_sandbox::Error>,
    ) -> PyResult<()> {
        let taken = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(child) = taken else {
            return Ok(());
        };
        let parent = Arc::clone(&self.parent);
        py.detach(move || how(&parent, child))
            .map_err(|error| PyErr::from(Error::in_profile(error, &self.profile_home)))
    }
}
