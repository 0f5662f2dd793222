//! A profile's sandboxes as E2B lists them and this host knows them, and the actions a
//! person takes on them: list, remove (with refusals), pull, and a live round trip.
//!
//! Framework-neutral: refusals and losses are values with plain-words `Display`; each
//! framework's interface (the Hermes plugin's `hermes e2b`, the MCP example) adds its own
//! command names and flags. Ownership comes from the `hermes.profile` label
//! (a digest of the profile home; no path leaves the host); a sandbox made before that label
//! existed counts as this profile's when this host has coordinated its scope.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use e2b_client::{KillOutcome, ListQuery, ListedSandbox, SandboxId, StateFilter};
use futures::TryStreamExt;
use sandbox_identity::{IdentityMetadata, Labels, Mode, ProfileDigest, ScopeDigest};
use writer_lease::{ScopeActivity, ScopeFiles, ScopeKey, WriterStatus};

use crate::backend::Backend;
use crate::command::RunOptions;
use crate::config::{Config, PROBE_TASK_ID, SandboxMode, Scope, Services};
use crate::error::{Error, ErrorChain};
use crate::hooks::NoStateHooks;
use crate::note::{NOTE_EGRESS, NOTE_PULL, NOTE_RECOVERY, NOTE_TASK, NOTE_WRITER_PID};
use crate::report::{KillOutcomeReport, RecoverySummary};
use crate::sink::{FnSink, OutputStream};

mod classify;
mod egress;
mod removal;
mod usage;

pub(crate) use classify::{by_last_use, classify};
pub use egress::{CredentialHeaders, EgressApplied, EgressOutcome};
pub use usage::{Activity, Usage, UseSource};

pub(crate) use removal::plan;
pub use removal::{
    Force, Loss, PausedSelection, PlannedRemoval, Refusal, RemovalOutcome, RemovalTarget, Removed,
    Verdict,
};

/// Who a listed sandbox belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Owner {
    /// This profile: its label says so, or (made before the label) this host coordinated
    /// its scope.
    ThisProfile,
    /// Another profile's label.
    OtherProfile,
    /// Made by this plugin before the profile label existed, on another host or profile.
    Unknown,
}

impl Owner {
    /// `this-profile`, `other-profile` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Owner::ThisProfile => "this-profile",
            Owner::OtherProfile => "other-profile",
            Owner::Unknown => "unknown",
        }
    }
}

/// Which sandboxes [`Inventory::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// This profile's only.
    ThisProfile,
    /// Every sandbox this plugin made, whoever owns it (marked by [`Owner`]).
    AllProfiles,
}

/// A sandbox's state as E2B lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryState {
    /// Running.
    Running,
    /// Paused (resumed by the next use).
    Paused,
    /// Anything else E2B reported.
    Other,
}

impl EntryState {
    /// `running`, `paused` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::Running => "running",
            EntryState::Paused => "paused",
            EntryState::Other => "other",
        }
    }
}

/// The writer role of a scope on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriterHolder {
    /// A live session holds it; the pid is the last writer's the note recorded.
    Held {
        /// The holder's pid, when the note has it.
        pid: Option<u32>,
    },
    /// Nobody holds it.
    Free,
    /// This host cannot tell (no file locking); the text says why.
    Unknown(String),
}

/// What this host knows about a sandbox's scope.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostScope {
    /// The task id (Hermes' container key), as the last writer here recorded it.
    pub task_id: Option<String>,
    /// Who holds the writer role.
    pub writer: WriterHolder,
    /// Why the scope is dirty, if it is.
    pub dirty: Option<String>,
    /// The sandbox the last completed push prepared, if any.
    pub prepared_for: Option<String>,
    /// The last teardown pull (time and outcome), as recorded.
    pub last_pull: Option<String>,
    /// The last resume recovery (time and outcome), as recorded.
    pub last_recovery: Option<String>,
    /// The egress policy this host last applied live: `<sandbox> <digest>` (X9).
    pub egress_applied: Option<String>,
    /// This host's record of the scope's last command (start, end, sandbox).
    pub(crate) activity: Option<ScopeActivity>,
}

/// One sandbox this plugin made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxEntry {
    /// The sandbox id.
    pub sandbox_id: String,
    /// Running, paused, ...
    pub state: EntryState,
    /// The template alias, else its id; for a sandbox made from a checkpoint, the scope's
    /// template it recorded (when it recorded one).
    pub template: String,
    /// For a sandbox made from a checkpoint (a rollback, a fork): what it was restored from
    /// (the checkpoint's label, else its reason and time).
    pub restored_from: Option<String>,
    /// Persistent or ephemeral.
    pub mode: Mode,
    /// The scope digest (64 hex).
    pub scope: String,
    /// Whose it is.
    pub owner: Owner,
    /// The posture label (`internet-allowed secure`, ...), when stamped.
    pub posture: Option<String>,
    /// When E2B started (or last resumed) it.
    pub started_at: SystemTime,
    /// Lease time left, for a running sandbox.
    pub lease_left: Option<Duration>,
    /// Set on a duplicate: the newer sandbox of the same scope that sessions adopt.
    pub duplicate_of: Option<String>,
    /// A delegated child's fork (R15): the child's id and the parent sandbox it was forked
    /// from. Never a duplicate of its parent's scope, never adopted.
    pub subagent: Option<(String, String)>,
    /// A child's fork whose work is not back and that this host can bring back (`hermes e2b
    /// pull --subagent`): it holds the fork's record. False for a fork kept once its work
    /// came back (`subagent_forks: keep`) and for another host's.
    pub subagent_recoverable: bool,
    /// For a subagent's fork kept after its work came back: what keeps it (a process the
    /// child handed off to its parent), as this host noted it.
    pub subagent_held: Option<String>,
    /// What this host knows about its scope (this profile's scopes only).
    pub host: Option<HostScope>,
    /// The digest of the egress policy it was created with (its `hermes.egress` metadata).
    pub egress_stamp: Option<String>,
    /// When it was last used and how long it has been idle (or that it runs a command).
    pub usage: Usage,
}

impl SandboxEntry {
    /// The digest of the egress rules in force on it as far as this host knows: what this
    /// host last applied to it, else what it was created with (X9).
    pub fn egress_known(&self) -> Option<String> {
        self.host
            .as_ref()
            .and_then(|host| host.egress_applied.as_deref())
            .and_then(|line| crate::backend::noted_egress_for(line, &self.sandbox_id))
            .or_else(|| self.egress_stamp.clone())
    }
}

/// How long [`Inventory::check_access`] may take: long enough for a slow network, short
/// enough for a doctor row.
pub const ACCESS_CHECK_DEADLINE: Duration = Duration::from_secs(5);

/// The tools the backend runs in every sandbox (the state protocol, the writer record,
/// command wrapping); a custom template must have them, and a writable home.
pub const TEMPLATE_TOOLS: [&str; 5] = ["bash", "tar", "flock", "setsid", "date"];

/// What [`Inventory::check_access`] found: the key and the endpoint work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Access {
    /// Sandboxes running on the account, when E2B said.
    pub running: Option<u64>,
    /// How long the request took.
    pub elapsed: Duration,
    /// The control-plane URL asked.
    pub api_url: String,
}

/// One step of [`Inventory::live_check`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LiveStep {
    /// `create`, `check template` or `kill`.
    pub step: &'static str,
    /// How long it took.
    pub elapsed: Duration,
    /// `Err` with the error chain when it failed.
    pub result: Result<(), String>,
    /// The backend's error behind a failed step, when one caused it, so a caller can add
    /// its own hint (a refused key, a missing template, ...).
    pub error: Option<Arc<Error>>,
}

/// A profile's sandboxes and the actions on them. Built from the same [`Config`] as a
/// [`Backend`] (endpoints, key, template and posture for `pull`).
#[derive(Debug, Clone)]
pub struct Inventory {
    config: Config,
    profile_home: PathBuf,
    services: Services,
    idle_lifetime: Option<Duration>,
}

impl Inventory {
    /// The inventory of the profile at `profile_home`. Contacts nothing until called.
    pub fn new(config: Config, profile_home: PathBuf, services: Services) -> Inventory {
        Inventory {
            config,
            profile_home,
            services,
            idle_lifetime: None,
        }
    }

    /// The framework's idle lifetime (Hermes' `terminal.lifetime_seconds`): the floor of an
    /// ephemeral sandbox's lease, which the last-use estimate from E2B's lease end needs.
    /// Without it, ephemeral sandboxes are estimated with the baseline lease.
    pub fn with_idle_lifetime(mut self, lifetime: Duration) -> Inventory {
        self.idle_lifetime = Some(lifetime);
        self
    }

    /// The lease a use leaves ahead of it, per mode: the baseline lease the backend attaches
    /// and extends with, plus [`LEASE_HEADROOM`](crate::LEASE_HEADROOM).
    fn lease_spans(&self) -> LeaseSpans {
        let policy = |kind| sandbox_identity::LeasePolicy {
            lease: self.config.lease,
            command_grace: self.config.command_grace,
            kind,
        };
        let ephemeral = match self.idle_lifetime {
            Some(lifetime) => policy(sandbox_identity::LeaseKind::Ephemeral { lifetime }),
            None => policy(sandbox_identity::LeaseKind::Persistent),
        };
        LeaseSpans {
            persistent: policy(sandbox_identity::LeaseKind::Persistent)
                .baseline()
                .saturating_add(crate::LEASE_HEADROOM),
            ephemeral: ephemeral.baseline().saturating_add(crate::LEASE_HEADROOM),
        }
    }

    /// The sandboxes this plugin made that `which` selects, newest first, duplicates marked
    /// and this host's view of each of this profile's scopes attached. `now` is the wall
    /// clock the lease time left is counted from.
    pub fn list(&self, which: Listing, now: SystemTime) -> Result<Vec<SandboxEntry>, Error> {
        let client = self.config.client()?;
        let mut query = ListQuery::all();
        query.state = StateFilter::Any;
        let listed: Vec<ListedSandbox> = self
            .services
            .runtime
            .block_on(client.list(query).try_collect())
            .map_err(|source| Error::e2b("list sandboxes", None, source))?;
        let profile = ProfileDigest::of(&self.profile_home.to_string_lossy());
        let mut entries = classify(&listed, profile, now, self.lease_spans(), &|scope| {
            self.host_scope(scope)
        });
        if which == Listing::ThisProfile {
            entries.retain(|entry| entry.owner == Owner::ThisProfile);
        }
        for entry in entries.iter_mut().filter(|entry| entry.subagent.is_some()) {
            let Some(id) = SandboxId::parse(entry.sandbox_id.clone()) else {
                continue;
            };
            entry.subagent_recoverable =
                crate::backend::subagent::record::record_path(&self.profile_home, &id).exists();
            entry.subagent_held =
                crate::backend::subagent::record::read_held(&self.profile_home, &id);
        }
        Ok(entries)
    }

    /// [`Inventory::list`] ordered by last use, the most recently used first: a sandbox
    /// running a command counts as used now, one with no known use comes last, ties go
    /// newest started first. One line per session, the active ones on top.
    pub fn list_by_last_use(
        &self,
        which: Listing,
        now: SystemTime,
    ) -> Result<Vec<SandboxEntry>, Error> {
        let mut entries = self.list(which, now)?;
        by_last_use(&mut entries);
        Ok(entries)
    }

    fn scope_files(&self, scope: &ScopeDigest) -> ScopeFiles {
        ScopeFiles::new(
            self.profile_home.join("cache").join("e2b"),
            ScopeKey::from_bytes(*scope.as_bytes()),
        )
    }

    /// What this host knows about `scope`, if it ever coordinated it. Reads files only; no
    /// file is created for a scope this host never saw.
    fn host_scope(&self, scope: &ScopeDigest) -> Option<HostScope> {
        let files = self.scope_files(scope);
        if !files.known_on_host() {
            return None;
        }
        let note = files.note().ok().flatten();
        let noted = |name: &str| note.as_ref().and_then(|n| n.get(name).map(str::to_owned));
        let writer = match files.writer_status() {
            Ok(WriterStatus::Held) => WriterHolder::Held {
                pid: noted(NOTE_WRITER_PID).and_then(|pid| pid.parse().ok()),
            },
            Ok(WriterStatus::Free) => WriterHolder::Free,
            Ok(WriterStatus::Unknown(degradation)) => {
                WriterHolder::Unknown(degradation.cause.to_string())
            }
            Err(error) => WriterHolder::Unknown(ErrorChain(&error).to_string()),
        };
        let dirty = match files.dirty() {
            Ok(marker) => marker.map(|m| m.reason.to_string()),
            Err(error) => Some(ErrorChain(&error).to_string()),
        };
        Some(HostScope {
            task_id: noted(NOTE_TASK),
            writer,
            dirty,
            prepared_for: files.prepared().ok().flatten().map(|s| s.sandbox_id),
            last_pull: noted(NOTE_PULL),
            last_recovery: noted(NOTE_RECOVERY),
            egress_applied: noted(NOTE_EGRESS),
            activity: files.activity().ok().flatten(),
        })
    }

    /// Decides what removing `target` would do, without touching anything: the
    /// confirmation shows it, [`Inventory::remove`] carries it out.
    pub fn plan_removal(
        &self,
        target: &RemovalTarget,
        force: Force,
        now: SystemTime,
    ) -> Result<Vec<PlannedRemoval>, Error> {
        let all = self.list(Listing::AllProfiles, now)?;
        Ok(plan(&all, target, force, now))
    }

    /// Carries out a plan: kills what it says to kill, one request per sandbox; a sandbox
    /// gone meanwhile is success.
    pub fn remove(&self, plan: &[PlannedRemoval]) -> Result<Vec<Removed>, Error> {
        let client = self.config.client()?;
        Ok(plan
            .iter()
            .map(|item| {
                let outcome = match &item.verdict {
                    Verdict::AlreadyGone => RemovalOutcome::AlreadyGone,
                    Verdict::Refused(reason) => RemovalOutcome::Refused(reason.clone()),
                    Verdict::Kill { .. } => match SandboxId::parse(item.sandbox_id.clone()) {
                        None => RemovalOutcome::Failed("not a valid sandbox id".to_owned()),
                        Some(id) => match self.services.runtime.block_on(client.kill(&id)) {
                            Ok(KillOutcome::Killed) => RemovalOutcome::Killed,
                            Ok(KillOutcome::NotFound) => RemovalOutcome::AlreadyGone,
                            Err(source) => RemovalOutcome::Failed(
                                ErrorChain(&Error::e2b("kill", Some(id.as_str()), source))
                                    .to_string(),
                            ),
                        },
                    },
                };
                Removed {
                    sandbox_id: item.sandbox_id.clone(),
                    outcome,
                }
            })
            .collect())
    }

    /// Resume recovery from the scope `task_id` of this profile into its home now (see
    /// [`Backend::pull_now`]): the persistent scope the current settings name.
    pub fn pull(&self, task_id: &str) -> Result<RecoverySummary, Error> {
        let mut config = self.config.clone();
        config.mode = SandboxMode::Persistent;
        let backend = Backend::new(
            config,
            Scope {
                profile_home: self.profile_home.clone(),
                task_id: task_id.to_owned(),
            },
            self.services.clone(),
            Arc::new(NoStateHooks),
        )?;
        backend.pull_now()
    }

    /// Brings back the work of a delegated child whose process died mid-child (R15): the
    /// fork `fork`, as this host's record of it says (which child, whose sandbox, the base),
    /// applied to the parent's sandbox as the child's end would have, under that scope's
    /// state lock; then the fork is killed and the record removed.
    pub fn pull_subagent(&self, fork: &str) -> Result<crate::backend::BringBack, Error> {
        let fork = SandboxId::parse(fork.to_owned()).ok_or_else(|| Error::InvalidConfig {
            reason: format!("{fork:?} is not a sandbox id"),
        })?;
        let record = crate::backend::subagent::record::ForkRecord::load(&self.profile_home, &fork)?;
        let mut config = self.config.clone();
        config.mode = SandboxMode::Attach {
            sandbox_id: record.parent.clone(),
        };
        let parent = Backend::new(
            config,
            Scope {
                profile_home: self.profile_home.clone(),
                task_id: record.task_id.clone(),
            },
            self.services.clone(),
            Arc::new(NoStateHooks),
        )?;
        parent.recover_child(record)
    }

    /// Whether this host can lock the profile's coordination files (C6): `Err` says what is
    /// missing. Takes a shared lock for an instant on a file of its own.
    pub fn host_locking(&self) -> Result<(), String> {
        let probe = ProfileDigest::of(&self.profile_home.to_string_lossy());
        let files = ScopeFiles::new(
            self.profile_home.join("cache").join("e2b"),
            ScopeKey::from_bytes(probe.as_bytes()),
        );
        match files.writer_status() {
            Ok(WriterStatus::Held | WriterStatus::Free) => Ok(()),
            Ok(WriterStatus::Unknown(degradation)) => Err(degradation.to_string()),
            Err(error) => Err(ErrorChain(&error).to_string()),
        }
    }

    /// One cheap authenticated request that creates nothing (the count of running
    /// sandboxes), bounded by [`ACCESS_CHECK_DEADLINE`]: whether the key is accepted and the
    /// endpoint reachable. The error tells a refused key, an unreachable endpoint, a TLS
    /// failure and a passed deadline apart by its predicates.
    pub fn check_access(&self) -> Result<Access, Error> {
        let client = self.config.client_with_deadline(ACCESS_CHECK_DEADLINE)?;
        let api_url = self.config.api_url()?;
        let started = Instant::now();
        let running = self
            .services
            .runtime
            .block_on(client.count_running())
            .map_err(|source| Error::e2b("list sandboxes", None, source))?;
        Ok(Access {
            running,
            elapsed: started.elapsed(),
            api_url,
        })
    }

    /// A short round trip, each step timed: create a probe sandbox (killed at lease end
    /// whatever happens), check that its template has what the backend needs
    /// ([`TEMPLATE_TOOLS`], a writable home), kill it. Stops at the first failed step.
    pub fn live_check(&self) -> Vec<LiveStep> {
        let mut steps = Vec::new();
        // A probe scope creates its own sandbox even when the settings attach to one.
        let mut config = self.config.clone();
        config.mode = SandboxMode::Persistent;
        let backend = match Backend::new(
            config,
            Scope {
                profile_home: self.profile_home.clone(),
                task_id: PROBE_TASK_ID.to_owned(),
            },
            self.services.clone(),
            Arc::new(NoStateHooks),
        ) {
            Ok(backend) => backend,
            Err(error) => {
                steps.push(step("create", Instant::now(), Err(error)));
                return steps;
            }
        };
        let started = Instant::now();
        let created = backend.attach().map(|_| ());
        let ok = created.is_ok();
        steps.push(step("create", started, created));
        if ok {
            let started = Instant::now();
            let output = Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink_output = Arc::clone(&output);
            let sink = FnSink(move |_stream: OutputStream, bytes: &[u8]| {
                sink_output
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(bytes);
                Ok(())
            });
            let mut failure = None;
            let ran = match backend.run(
                &template_check_script(),
                RunOptions::new(Duration::from_secs(30)),
                Box::new(sink),
            ) {
                Err(error) => {
                    let text = ErrorChain(&error).to_string();
                    failure = Some(Arc::new(error));
                    Err(text)
                }
                Ok(command) => match command.wait() {
                    Err(error) => Err(ErrorChain(&*error).to_string()),
                    Ok(exit) if exit.exit_code == 0 => {
                        let output = output
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        template_gaps(&String::from_utf8_lossy(&output))
                    }
                    Ok(exit) => Err(format!("the template check exited {}", exit.exit_code)),
                },
            };
            steps.push(LiveStep {
                step: "check template",
                elapsed: started.elapsed(),
                result: ran,
                error: failure,
            });
        }
        let started = Instant::now();
        let report = backend.cleanup();
        if ok {
            let result = match report.sandbox {
                KillOutcomeReport::Killed | KillOutcomeReport::AlreadyGone => Ok(()),
                KillOutcomeReport::Failed(text) => Err(text),
                KillOutcomeReport::LeftRunning | KillOutcomeReport::Paused => {
                    Err("the probe sandbox was left running; its kill lease ends it".to_owned())
                }
            };
            steps.push(LiveStep {
                step: "kill",
                elapsed: started.elapsed(),
                result,
                error: None,
            });
        }
        steps
    }
}

/// A POSIX `sh` script printing one line `missing:<what>` per tool of [`TEMPLATE_TOOLS`] the
/// sandbox lacks and `missing:writable home <path>` when the home cannot be written.
fn template_check_script() -> String {
    let tools = TEMPLATE_TOOLS.join(" ");
    format!(
        "for tool in {tools}; do command -v \"$tool\" >/dev/null 2>&1 || echo \"missing:$tool\"; done; \
         probe=\"$HOME/.e2b-doctor-probe.$$\"; \
         if ( : > \"$probe\" ) 2>/dev/null; then rm -f \"$probe\"; else echo \"missing:writable home $HOME\"; fi"
    )
}

/// Reads [`template_check_script`]'s output: `Ok` when nothing is missing, else the
/// sentence naming each missing thing.
pub(crate) fn template_gaps(output: &str) -> Result<(), String> {
    let missing: Vec<&str> = output
        .lines()
        .filter_map(|line| line.trim().strip_prefix("missing:"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the template lacks {} (the backend needs {} and a writable home)",
            missing.join(", "),
            TEMPLATE_TOOLS.join(", ")
        ))
    }
}

fn step(name: &'static str, started: Instant, result: Result<(), Error>) -> LiveStep {
    let (result, error) = match result {
        Ok(()) => (Ok(()), None),
        Err(error) => (Err(ErrorChain(&error).to_string()), Some(Arc::new(error))),
    };
    LiveStep {
        step: name,
        elapsed: started.elapsed(),
        result,
        error,
    }
}

/// The lease a use leaves ahead of it (baseline plus headroom), per mode: what the last-use
/// estimate from E2B's lease end subtracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseSpans {
    pub(crate) persistent: Duration,
    pub(crate) ephemeral: Duration,
}

#[cfg(test)]
mod tests;
