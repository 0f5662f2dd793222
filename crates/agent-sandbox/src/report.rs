//! What the backend reports: how it holds its sandbox, its counters, what cleanup did.

/// How the backend came to hold its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It created it.
    Created,
    /// It adopted an existing sandbox of its scope found by metadata.
    Adopted {
        /// How many other sandboxes matched the scope (warned about once, contract I5).
        duplicates: usize,
    },
    /// Attach mode: connected to the sandbox id it was given (L12).
    Connected,
    /// A rollback or an adoption made it the scope's (R4, R6).
    Restored,
}

/// The backend's part in its scope's state protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoleKind {
    /// Persistent writer: recovers, pushes, syncs and pulls (C1).
    Writer,
    /// Persistent reader: runs commands once the gates pass (C2).
    Reader,
    /// Ephemeral owner: sole user of its own sandbox; pushes, pulls, kills.
    Owner,
    /// The prompt probe: no state, killed at cleanup (L11).
    Probe,
    /// Attach mode: an externally owned sandbox; no state protocol, never paused or killed.
    External,
}

/// What [`Backend::attach`](crate::Backend::attach) found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttachInfo {
    /// The sandbox.
    pub sandbox_id: String,
    /// How it was obtained.
    pub origin: Origin,
    /// Whether connect found it paused and resumed it.
    pub resumed: bool,
    /// The role at attach time.
    pub role: RoleKind,
    /// Set when this host cannot protect concurrent sessions (C6); logged once.
    pub degradation: Option<String>,
    /// The sandbox this attachment replaced because it was gone (Hermes: mark the environment
    /// recreated).
    pub replaced: Option<String>,
    /// The sandbox user and its real home, as the sandbox reported them.
    pub home: crate::home::SandboxHome,
    /// Where Hermes' state lives in the sandbox (the configured root, else `<home>/.hermes`).
    pub remote_hermes_home: String,
    /// Commands' starting directory when they name none (the configured cwd, else the home).
    pub default_cwd: String,
}

/// What holds a scope's state now ([`Backend::holder`](crate::Backend::holder)): the
/// operation, the step it is in, and for how long. Shown as
/// ``"`sync state` for 47 s, in Hermes' state hooks (sync)"``.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScopeHolder {
    /// The backend operation that took the state (`start command`, `sync state`, `attach`,
    /// `checkpoint`, `cleanup`, ...).
    pub operation: &'static str,
    /// The state hook the operation is in (`initial push`, `sync`, `pull`), when it is in one:
    /// the host's sync engine (Hermes' FileSyncManager) is running.
    pub step: Option<&'static str>,
    /// How long it has held the state.
    pub held_for: std::time::Duration,
}

impl std::fmt::Display for ScopeHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` for {} s", self.operation, self.held_for.as_secs())?;
        if let Some(step) = self.step {
            write!(f, ", in Hermes' state hooks ({step})")?;
        }
        Ok(())
    }
}

/// Counters of the backend's own E2B requests, for accounting tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Sandboxes created.
    pub creates: u64,
    /// List requests (paged lists count once).
    pub lists: u64,
    /// Connect requests (attach, resume, lease top-up).
    pub connects: u64,
    /// Of those, lease top-ups before a command.
    pub lease_extensions: u64,
    /// Commands started.
    pub commands: u64,
    /// Kill requests for whole sandboxes.
    pub sandbox_kills: u64,
    /// Start requests that asked a sandbox for its home (once per sandbox per host).
    pub home_probes: u64,
    /// Snapshot requests (checkpoints, undo points, fork points).
    pub snapshots: u64,
    /// Snapshot list requests (paged lists count once).
    pub snapshot_lists: u64,
    /// Snapshot deletions.
    pub snapshot_deletes: u64,
    /// Egress policy updates of a live sandbox (X9, X10).
    pub network_updates: u64,
}

/// What a teardown pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullOutcome {
    /// Not this role's job, or nothing was attached.
    NotAttempted,
    /// The pull completed.
    Pulled,
    /// The pull failed; logged with the sandbox id, recovered by the next resume (S12).
    Failed(String),
    /// Nothing used the sandbox since the bring-up made its state the host's: there was
    /// nothing to pull, and a paused sandbox was not resumed for it (L16).
    Unchanged,
    /// The sandbox was paused and the account's limit left no slot to resume it: the state
    /// stays in it, brought back by its next use or `hermes e2b pull` (L16). The text is the
    /// limit error.
    Deferred(String),
}

/// What the backend's own recovery did at teardown, after the caller's pull hook: it brings
/// back under `skills/` and `memories/` what that pull cannot map back (files it never
/// pushed, a pull that found nothing pushed), conflicts quarantined (S6, L4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeardownRecovery {
    /// Not this role's job, or nothing was attached.
    NotAttempted,
    /// Recovery completed.
    Recovered(RecoverySummary),
    /// Recovery failed; logged with the sandbox id. A persistent sandbox keeps its files for
    /// the next resume's recovery; an ephemeral one is killed all the same.
    Failed(String),
}

/// What happened to the sandbox itself at cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillOutcomeReport {
    /// Left alone (a reader, attach mode, or a persistent sandbox another session may use:
    /// never killed, L3, L12).
    LeftRunning,
    /// Paused: a persistent writer's sandbox whose state is on the host and that no other
    /// session uses (L16); its next use resumes it.
    Paused,
    /// Killed (ephemeral, probe).
    Killed,
    /// It was already gone.
    AlreadyGone,
    /// The kill failed; logged.
    Failed(String),
}

/// What [`Backend::cleanup`](crate::Backend::cleanup) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupReport {
    /// The sandbox that was attached, if any.
    pub sandbox_id: Option<String>,
    /// Whether an earlier cleanup had already run (this one did nothing, L7).
    pub repeated: bool,
    /// The teardown pull.
    pub pull: PullOutcome,
    /// The backend's own recovery after the pull.
    pub recovery: TeardownRecovery,
    /// The sandbox's fate.
    pub sandbox: KillOutcomeReport,
}

/// What one resume recovery did, in counts (the files themselves are logged as warnings
/// when quarantined or skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoverySummary {
    /// Written in place (the host lacked them).
    pub restored: usize,
    /// Identical on both sides.
    pub unchanged: usize,
    /// Only what this host pushed last, which the host has edited since: the host's version
    /// stays (S15).
    pub superseded: usize,
    /// Saved under `cache/e2b-recovered/<sandbox id>/` instead (conflicts, host-only paths).
    pub quarantined: usize,
    /// Not recovered; they stay in the sandbox.
    pub skipped: usize,
}

impl RecoverySummary {
    pub(crate) fn of(report: &recovery::RecoveryReport) -> RecoverySummary {
        use recovery::Outcome;
        RecoverySummary {
            restored: report.count(|o| matches!(o, Outcome::Restored)),
            unchanged: report.count(|o| matches!(o, Outcome::Unchanged)),
            superseded: report.count(|o| matches!(o, Outcome::Superseded)),
            quarantined: report.count(|o| matches!(o, Outcome::Quarantined { .. })),
            skipped: report.count(|o| matches!(o, Outcome::Skipped { .. })),
        }
    }
}

impl std::fmt::Display for RecoverySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} restored, {} unchanged, {} superseded, {} quarantined, {} skipped",
            self.restored, self.unchanged, self.superseded, self.quarantined, self.skipped
        )
    }
}
