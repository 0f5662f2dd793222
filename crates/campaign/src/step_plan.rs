//! What a cycle's checkpoint step is (checkpoint, rollback, fork and adopt), the fault drawn
//! inside it, and the counts the summary prints; `steps` draws and carries them out.

use std::collections::{BTreeMap, HashSet};

/// A checkpoint step, inserted into the first host's script before its cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `checkpoint`.
    Checkpoint,
    /// `checkpoint`, a command, then `rollback` to it.
    Rollback,
    /// `fork-adopt <count> <branch>`.
    ForkAdopt { count: u32, branch: u32 },
}

impl Step {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Step::Checkpoint => "checkpoint",
            Step::Rollback => "rollback",
            Step::ForkAdopt { .. } => "fork-adopt",
        }
    }

    /// The script line the step's fault is armed before.
    pub(crate) fn faulted_line(self) -> String {
        match self {
            Step::Checkpoint => "checkpoint".to_owned(),
            Step::Rollback => "rollback".to_owned(),
            Step::ForkAdopt { count, branch } => format!("fork-adopt {count} {branch}"),
        }
    }
}

/// The faults inside the checkpoint steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StepFault {
    /// SIGKILL of the host once it has sent `skip` requests of a rollback or an adoption
    /// (its next request is held at e2b-local, so the kill falls between two requests).
    KillBetweenRequests { skip: u32 },
    /// 5xx answers to the snapshot call.
    SnapshotError { status: u16, count: u32 },
    /// The parent or a branch vanishes while a fork-adopt has sent `skip` requests.
    VanishMidFork { skip: u32, parent: bool },
}

impl StepFault {
    pub(crate) fn kind(self) -> &'static str {
        match self {
            StepFault::KillBetweenRequests { .. } => {
                "SIGKILL host between two requests of a rollback/adoption"
            }
            StepFault::SnapshotError { .. } => "injected 5xx on the snapshot call",
            StepFault::VanishMidFork { parent: true, .. } => "parent sandbox vanished mid-fork",
            StepFault::VanishMidFork { parent: false, .. } => "a branch vanished mid-fork",
        }
    }
}

/// Every step fault kind, for the summary.
pub(crate) const STEP_FAULT_KINDS: [&str; 4] = [
    "SIGKILL host between two requests of a rollback/adoption",
    "injected 5xx on the snapshot call",
    "parent sandbox vanished mid-fork",
    "a branch vanished mid-fork",
];

/// The step of the current cycle and where its fault stands.
#[derive(Debug)]
pub(crate) struct StepPlan {
    pub(crate) step: Step,
    pub(crate) fault: Option<StepFault>,
    /// A hold is armed at e2b-local and not yet seen holding.
    pub(crate) holding: bool,
    /// The Hermes state versions on the host and in the sandbox before a rollback/adoption.
    pub(crate) before: Option<HashSet<Vec<u8>>>,
    /// The version the agent wrote in the sandbox just before the step.
    pub(crate) agent_version: Option<Vec<u8>>,
}

/// Per-step outcome counts and the step invariants' figures.
#[derive(Debug, Default)]
pub(crate) struct StepStats {
    pub(crate) done: BTreeMap<&'static str, (u64, u64)>,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) recoveries: u64,
    pub(crate) rollbacks_checked: u64,
    /// Recoveries that found plain duplicate creates (I5's, warned about, not a violation).
    pub(crate) tolerated_duplicates: u64,
}
