//! The core's reports as the Python dicts the plugin reads: a teardown, a checkpoint, a turn
//! checkpoint, a role.

use agent_sandbox::{
    Checkpoint, CleanupReport, KillOutcomeReport, PullOutcome, RoleKind, TeardownRecovery,
    TurnCheckpoint,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::without_time_words;

/// A role as `attach` reports it.
pub(super) fn role_name(role: RoleKind) -> &'static str {
    match role {
        RoleKind::Writer => "writer",
        RoleKind::Reader => "reader",
        RoleKind::Owner => "owner",
        RoleKind::Probe => "probe",
        RoleKind::External => "external",
    }
}

/// A teardown's report as `cleanup` returns it.
pub(super) fn cleanup_dict<'py>(
    py: Python<'py>,
    report: &CleanupReport,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("sandbox_id", report.sandbox_id.clone())?;
    dict.set_item("repeated", report.repeated)?;
    let (pull, pull_error) = match &report.pull {
        PullOutcome::NotAttempted => ("not_attempted", None),
        PullOutcome::Pulled => ("pulled", None),
        PullOutcome::Failed(reason) => ("failed", Some(without_time_words(reason))),
        PullOutcome::Unchanged => ("unchanged", None),
        PullOutcome::Deferred(reason) => ("deferred", Some(without_time_words(reason))),
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
        KillOutcomeReport::Paused => ("paused", None),
        KillOutcomeReport::Killed => ("killed", None),
        KillOutcomeReport::AlreadyGone => ("already_gone", None),
        KillOutcomeReport::Failed(reason) => ("kill_failed", Some(without_time_words(reason))),
    };
    dict.set_item("sandbox", sandbox)?;
    dict.set_item("kill_error", kill_error)?;
    Ok(dict)
}

fn epoch_seconds(time: std::time::SystemTime) -> f64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One checkpoint as `hermes e2b checkpoints --json` shows it.
pub(super) fn checkpoint_dict<'py>(
    py: Python<'py>,
    checkpoint: &Checkpoint,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("snapshot_id", &checkpoint.snapshot_id)?;
    dict.set_item("name", checkpoint.display_name())?;
    dict.set_item("label", checkpoint.label.clone())?;
    dict.set_item("reason", checkpoint.reason.as_str())?;
    dict.set_item("automatic", checkpoint.is_automatic())?;
    dict.set_item("taken_at", epoch_seconds(checkpoint.taken_at))?;
    dict.set_item("taken_at_utc", agent_sandbox::utc(checkpoint.taken_at))?;
    dict.set_item("source_sandbox", &checkpoint.source_sandbox)?;
    Ok(dict)
}

/// One turn checkpoint as `turn_checkpoints` lists it.
pub(super) fn turn_dict<'py>(
    py: Python<'py>,
    turn: &TurnCheckpoint,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("number", turn.number)?;
    dict.set_item("label", &turn.label)?;
    dict.set_item("directory", &turn.directory)?;
    dict.set_item("entries", turn.entries)?;
    dict.set_item("bytes", turn.bytes)?;
    dict.set_item("taken_at", epoch_seconds(turn.taken_at))?;
    dict.set_item("taken_at_utc", agent_sandbox::utc(turn.taken_at))?;
    Ok(dict)
}
