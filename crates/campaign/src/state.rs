//! The campaign's state across cycles, below every module that acts on it: its fields' types
//! come from the leaf modules (`faults`, `server`, `step_plan`), and the modules holding the
//! campaign's behaviour (`cycle`, `inject`, `hosts`, `edits`, `steps`, `checks`) each add their
//! methods to it from above, so no two of them need each other.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use campaign::{EditKind, GenerationWatch, Ledger, Side};
use rand::rngs::StdRng;

use crate::faults::Fault;
use crate::server::LocalServer;
use crate::step_plan::{StepPlan, StepStats};

/// The campaign's state across cycles.
pub(crate) struct Campaign {
    pub(crate) rng: StdRng,
    pub(crate) root: PathBuf,
    pub(crate) home: PathBuf,
    pub(crate) push_log: PathBuf,
    pub(crate) host_bin: PathBuf,
    pub(crate) server: LocalServer,
    pub(crate) ledger: Ledger,
    pub(crate) sandbox: Option<String>,
    pub(crate) injected: BTreeMap<Fault, u64>,
    pub(crate) violations: Vec<String>,
    pub(crate) outside_baseline: BTreeSet<PathBuf>,
    /// Edits made, by side and the kind applied.
    pub(crate) edits: BTreeMap<(Side, EditKind), u64>,
    pub(crate) commands_ok: u64,
    pub(crate) commands_failed: u64,
    /// What happened in the current cycle, printed with its violations.
    pub(crate) trace: Vec<String>,
    pub(crate) previous_trace: Vec<String>,
    pub(crate) cycle_start: Instant,
    /// 1, or 2 for the two-host mode.
    pub(crate) hosts: usize,
    /// Stopped processes (by index in the cycle) and when they get SIGCONT.
    pub(crate) stopped: Vec<(Instant, usize)>,
    /// Per sandbox: the writer record and the landed markers (two-host mode).
    pub(crate) generations: BTreeMap<String, GenerationWatch>,
    /// Commands refused because another host's grant fenced their writer (`Error::Fenced`).
    pub(crate) fenced: u64,
    /// This cycle's processes: pid and machine.
    pub(crate) machine_pids: Vec<(String, usize)>,
    /// `--hermes-python`: some processes are then Hermes hosts.
    pub(crate) hermes_python: Option<PathBuf>,
    /// The share of processes that are Hermes hosts.
    pub(crate) hermes_share: f64,
    /// Host processes started, and how many of them were Hermes hosts.
    pub(crate) processes: u64,
    pub(crate) hermes_processes: u64,
    /// The Hermes hosts' commands (`run`), completed and refused or failed.
    pub(crate) hermes_commands_ok: u64,
    pub(crate) hermes_commands_failed: u64,
    /// What Hermes itself keeps in its home besides skills/, memories/ and cache/ (its
    /// start-up skeleton, the campaign's config.yaml and .env); see `bootstrap_hermes`.
    pub(crate) hermes_home_entries: BTreeSet<OsString>,
    /// Draws the checkpoint steps and their faults (apart, so the rest of a seed's schedule
    /// is unchanged by them).
    pub(crate) steps_rng: StdRng,
    /// The current cycle's checkpoint step.
    pub(crate) step: Option<StepPlan>,
    pub(crate) step_stats: StepStats,
    /// `--step-share`.
    pub(crate) step_share: f64,
    /// When the account limit set by `Fault::AccountLimit` is lifted (`None`: no limit set).
    pub(crate) limit_until: Option<Instant>,
    /// The cycle being run.
    pub(crate) cycle_no: u64,
}

impl Campaign {
    pub(crate) fn note(&mut self, what: String) {
        let ms = self.cycle_start.elapsed().as_millis();
        self.trace.push(format!("{ms:>6} ms {what}"));
    }
}
