//! Removal, decided before anything is killed: what each named sandbox's fate is
//! ([`Verdict`]), refused ([`Refusal`]) or with what it takes along ([`Loss`]).

use std::fmt;
use std::time::{Duration, SystemTime};

use sandbox_identity::Mode;

use super::{EntryState, Owner, SandboxEntry, WriterHolder};

/// What `rm` acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalTarget {
    /// These sandbox ids.
    Ids(Vec<String>),
    /// This profile's paused sandboxes, those the selection takes.
    Paused(PausedSelection),
    /// This profile's duplicates (the newest of each scope is kept).
    Duplicates,
}

/// Which of the profile's paused sandboxes [`RemovalTarget::Paused`] takes; the default
/// takes every one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PausedSelection {
    /// Only those unused for at least this long: the later of their last use and their
    /// pause is that long before the plan's time. One with neither known is not taken.
    pub unused_for: Option<Duration>,
    /// Only those of these tasks, as this host recorded them; empty: any task.
    pub tasks: Vec<String>,
}

impl PausedSelection {
    /// Every paused sandbox unused for at least `unused_for` (None: any), of `tasks` (empty:
    /// any).
    pub fn new(unused_for: Option<Duration>, tasks: Vec<String>) -> PausedSelection {
        PausedSelection { unused_for, tasks }
    }

    fn takes(&self, entry: &SandboxEntry, now: SystemTime) -> bool {
        let task = entry.host.as_ref().and_then(|host| host.task_id.as_deref());
        if !self.tasks.is_empty() && !task.is_some_and(|t| self.tasks.iter().any(|w| w == t)) {
            return false;
        }
        let Some(unused_for) = self.unused_for else {
            return true;
        };
        let latest = entry.usage.last_used.max(entry.usage.paused_at);
        latest.is_some_and(|at| now.duration_since(at).is_ok_and(|idle| idle >= unused_for))
    }
}

/// Whether refusals that protect a live session on this host are overridden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Force {
    /// Refuse a sandbox whose writer role is held on this host, or whose owner is unknown.
    No,
    /// Kill it anyway.
    Yes,
}

/// What a removal will do to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Kill it; `loses` names what goes with it.
    Kill {
        /// What is lost, for the confirmation.
        loses: Loss,
    },
    /// It is not listed any more: nothing to do, and that is success.
    AlreadyGone,
    /// Refused; the refusal says why and whether forcing would change it.
    Refused(Refusal),
}

/// Why a removal is refused. The `Display` text says why in plain words; the caller's
/// interface adds how its users change it (its command names and flags).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Another profile's sandbox: only that profile removes it, forced or not.
    OtherProfile,
    /// Made before sandboxes carried their profile, and not by this host's profile: only a
    /// forced removal takes it.
    UnknownOwner,
    /// A live session on this host holds its writer role: only a forced removal takes it.
    LiveWriter {
        /// The holder's pid, when the scope note has it.
        pid: Option<u32>,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::OtherProfile => f.write_str("another profile owns it"),
            Refusal::UnknownOwner => f.write_str(
                "made before sandboxes carried their profile, and not by this host's profile",
            ),
            Refusal::LiveWriter { pid } => {
                let holder = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
                write!(
                    f,
                    "a live session on this host{holder} holds its writer role"
                )
            }
        }
    }
}

/// What killing a sandbox takes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// A duplicate of its scope: sessions use `newest`; state written only here goes.
    Duplicate {
        /// The sandbox the scope's sessions use.
        newest: String,
    },
    /// An ephemeral sandbox: its files and processes.
    Ephemeral,
    /// A persistent sandbox: its files and processes, including agent state not yet pulled
    /// back (an on-demand pull first keeps `skills/` and `memories/`).
    UnpulledState {
        /// The scope note's last pull line, when this host recorded one.
        last_pull: Option<String>,
    },
    /// A persistent sandbox whose agent state this host pulled back (or found unchanged) at
    /// or after its last use: its files and processes, nothing of the state.
    PulledState {
        /// The scope note's last pull line.
        last_pull: String,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::Duplicate { newest } => write!(
                f,
                "its files and processes (a duplicate: sessions use {newest}; agent state written only here is lost)"
            ),
            Loss::Ephemeral => f.write_str("its files and processes"),
            Loss::UnpulledState { last_pull } => {
                let pulled = last_pull
                    .as_ref()
                    .map(|line| format!("last pull {line}"))
                    .unwrap_or_else(|| "no pull recorded on this host".to_owned());
                write!(
                    f,
                    "its files and processes, including agent state not yet pulled ({pulled})"
                )
            }
            Loss::PulledState { last_pull } => write!(
                f,
                "its files and processes (its agent state was pulled back after its last use: {last_pull})"
            ),
        }
    }
}

/// One sandbox of a removal plan.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannedRemoval {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its listing, when E2B still lists it.
    pub entry: Option<SandboxEntry>,
    /// What will happen.
    pub verdict: Verdict,
}

/// What a removal did to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Removed {
    /// The sandbox.
    pub sandbox_id: String,
    /// Killed, already gone, refused (the plan's reason) or failed (the error chain).
    pub outcome: RemovalOutcome,
}

/// The outcome of removing one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemovalOutcome {
    /// Killed now.
    Killed,
    /// It was already gone (success).
    AlreadyGone,
    /// Not touched: the plan refused it.
    Refused(Refusal),
    /// The kill request failed.
    Failed(String),
}

impl RemovalOutcome {
    /// Killed or already gone.
    pub fn is_success(&self) -> bool {
        matches!(self, RemovalOutcome::Killed | RemovalOutcome::AlreadyGone)
    }
}

/// The removal decision for every sandbox `target` names, against a listing of all
/// profiles made at `now`. Pure.
pub(crate) fn plan(
    all: &[SandboxEntry],
    target: &RemovalTarget,
    force: Force,
    now: SystemTime,
) -> Vec<PlannedRemoval> {
    let ours = |entry: &&SandboxEntry| entry.owner == Owner::ThisProfile;
    let chosen: Vec<(String, Option<&SandboxEntry>)> = match target {
        RemovalTarget::Ids(ids) => ids
            .iter()
            .map(|id| (id.clone(), all.iter().find(|e| &e.sandbox_id == id)))
            .collect(),
        RemovalTarget::Paused(selection) => all
            .iter()
            .filter(ours)
            .filter(|e| e.state == EntryState::Paused && selection.takes(e, now))
            .map(|e| (e.sandbox_id.clone(), Some(e)))
            .collect(),
        RemovalTarget::Duplicates => all
            .iter()
            .filter(ours)
            .filter(|e| e.duplicate_of.is_some())
            .map(|e| (e.sandbox_id.clone(), Some(e)))
            .collect(),
    };
    chosen
        .into_iter()
        .map(|(sandbox_id, entry)| PlannedRemoval {
            verdict: match entry {
                None => Verdict::AlreadyGone,
                Some(entry) => verdict(entry, force),
            },
            entry: entry.cloned(),
            sandbox_id,
        })
        .collect()
}

fn verdict(entry: &SandboxEntry, force: Force) -> Verdict {
    match entry.owner {
        Owner::OtherProfile => return Verdict::Refused(Refusal::OtherProfile),
        Owner::Unknown if force == Force::No => return Verdict::Refused(Refusal::UnknownOwner),
        _ => {}
    }
    let held = entry
        .host
        .as_ref()
        .and_then(|host| match &host.writer {
            WriterHolder::Held { pid } => Some(*pid),
            _ => None,
        })
        // A duplicate is not the sandbox the writer works in.
        .filter(|_| entry.duplicate_of.is_none());
    if let Some(pid) = held
        && force == Force::No
    {
        return Verdict::Refused(Refusal::LiveWriter { pid });
    }
    let loses = match entry.duplicate_of.as_deref() {
        Some(newest) => Loss::Duplicate {
            newest: newest.to_owned(),
        },
        None if entry.mode == Mode::Ephemeral => Loss::Ephemeral,
        None => {
            let last_pull = entry.host.as_ref().and_then(|host| host.last_pull.clone());
            match last_pull {
                Some(line)
                    if pulled_after_last_use(&line, &entry.sandbox_id, entry.usage.last_used) =>
                {
                    Loss::PulledState { last_pull: line }
                }
                last_pull => Loss::UnpulledState { last_pull },
            }
        }
    };
    Verdict::Kill { loses }
}

/// Whether the scope note's last pull line (`<RFC 3339 time> pulled from <id>`, or
/// `unchanged in <id> since attach`) brought `sandbox_id`'s state back at or after its last
/// known use. An unknown last use, or a line of another form, says no.
fn pulled_after_last_use(
    line: &str,
    sandbox_id: &str,
    last_used: Option<std::time::SystemTime>,
) -> bool {
    let Some((when, what)) = line.split_once(' ') else {
        return false;
    };
    let settled = what == format!("pulled from {sandbox_id}")
        || what == format!("unchanged in {sandbox_id} since attach");
    let Ok(when) =
        time::OffsetDateTime::parse(when, &time::format_description::well_known::Rfc3339)
    else {
        return false;
    };
    // The note's time has whole seconds: a use within the same second counts as before it.
    let pulled = std::time::SystemTime::from(when) + std::time::Duration::from_secs(1);
    settled && last_used.is_some_and(|used| used <= pulled)
}

#[cfg(test)]
mod pull_tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::pulled_after_last_use;

    fn at(secs: u64) -> Option<SystemTime> {
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    }

    // contract: L16 (what `rm` says of a sandbox whose state was just pulled)
    #[test]
    fn a_pull_of_this_sandbox_after_its_last_use_means_nothing_unpulled() {
        // 2026-12-01T00:00:00Z is 1796083200.
        let pulled = "2026-12-01T00:00:00Z pulled from i1";
        assert!(pulled_after_last_use(pulled, "i1", at(1_796_083_190)));
        assert!(pulled_after_last_use(pulled, "i1", at(1_796_083_200)));
        assert!(
            !pulled_after_last_use(pulled, "i1", at(1_796_083_260)),
            "used after"
        );
        assert!(
            !pulled_after_last_use(pulled, "i2", at(1_796_083_190)),
            "another sandbox"
        );
        assert!(!pulled_after_last_use(pulled, "i1", None), "no known use");
        let unchanged = "2026-12-01T00:00:00Z unchanged in i1 since attach";
        assert!(pulled_after_last_use(unchanged, "i1", at(1_796_083_190)));
        for other in [
            "2026-12-01T00:00:00Z failed from i1: boom",
            "2026-12-01T00:00:00Z deferred from i1: no slot under the account's limit",
            "soon pulled from i1",
        ] {
            assert!(
                !pulled_after_last_use(other, "i1", at(1_796_083_190)),
                "{other}"
            );
        }
    }
}
