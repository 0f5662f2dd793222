//! Checkpoints, rollback and fork: the types a caller sees. The steps are in
//! `backend/checkpoint.rs`; the names and the adoption rules that make them safe are
//! sandbox-identity's (`CheckpointName`, R-lines in `docs/contract.md`).

use std::time::{Duration, SystemTime};

use e2b_client::SandboxId;
use sandbox_identity::{CheckpointName, CheckpointReason, ScopeDigest};

use crate::report::RecoverySummary;

/// How long a checkpoint, rollback or fork waits by default for the scope's running commands
/// to end before it is refused (E2B pauses the sandbox while it snapshots, which would cut
/// them).
pub const DEFAULT_CHECKPOINT_WAIT: Duration = Duration::from_secs(30);

/// Metadata key of a sandbox made from a checkpoint: the scope's template at that time. E2B
/// reports such a sandbox's template as the snapshot (a long internal name), so listings
/// read the template here.
pub(crate) const TEMPLATE_KEY: &str = "hermes.template";

/// One checkpoint of the scope: an E2B snapshot whose name says what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checkpoint {
    /// E2B's id for the snapshot (what a sandbox is created from, and what deletion takes).
    pub snapshot_id: String,
    /// The label a person or the agent gave it; `None` for an automatic one.
    pub label: Option<String>,
    /// Why it was taken.
    pub reason: CheckpointReason,
    /// When it was taken (the taking host's wall clock, to the millisecond).
    pub taken_at: SystemTime,
    /// The sandbox it was taken of.
    pub source_sandbox: String,
}

impl Checkpoint {
    /// The checkpoint a snapshot id or name denotes, if it is one of the scope's.
    pub(crate) fn from_snapshot(
        snapshot_id: &str,
        names: &[String],
        digest: &ScopeDigest,
    ) -> Option<Checkpoint> {
        let name = std::iter::once(snapshot_id)
            .chain(names.iter().map(String::as_str))
            .find_map(|name| CheckpointName::parse_for(name, digest))?;
        Some(Checkpoint::named(snapshot_id.to_owned(), name))
    }

    /// What a listing says a sandbox made from snapshot `snapshot_id` was restored from:
    /// the checkpoint's [`Checkpoint::display_name`] when the id is a checkpoint's name (of
    /// any scope), else the id.
    pub(crate) fn restored_from_name(snapshot_id: &str) -> String {
        CheckpointName::parse(snapshot_id).map_or_else(
            || snapshot_id.to_owned(),
            |name| Checkpoint::named(snapshot_id.to_owned(), name).display_name(),
        )
    }

    pub(crate) fn named(snapshot_id: String, name: CheckpointName) -> Checkpoint {
        Checkpoint {
            snapshot_id,
            label: name.label,
            reason: name.reason,
            taken_at: name.taken_at,
            source_sandbox: name.source,
        }
    }

    /// Whether retention may remove it (it has no label).
    pub fn is_automatic(&self) -> bool {
        self.label.is_none()
    }

    /// What a person calls it: its label, else its reason and time (UTC).
    pub fn display_name(&self) -> String {
        match &self.label {
            Some(label) => label.clone(),
            None => format!("{} {}", self.reason.as_str(), utc(self.taken_at)),
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, without a date library.
pub fn utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// What to checkpoint, and how long to wait for running commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest {
    /// A label (normalised to E2B's name rules: lowercase letters, digits, `-`); a labelled
    /// checkpoint is never removed by retention.
    pub label: Option<String>,
    /// Why it is taken.
    pub reason: CheckpointReason,
    /// How long to wait for the scope's running commands to end before refusing.
    pub wait: Duration,
}

/// Which checkpoint a rollback restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointTarget {
    /// The newest checkpoint of the scope that no rollback or adoption took on its own
    /// behalf (so `--last` twice does not bounce between two states).
    Latest,
    /// The newest checkpoint with this label, or the one with this snapshot id.
    Named(String),
}

impl CheckpointTarget {
    /// Picks the target among the scope's checkpoints, newest first.
    pub(crate) fn pick<'a>(&self, newest_first: &'a [Checkpoint]) -> Option<&'a Checkpoint> {
        match self {
            CheckpointTarget::Latest => newest_first.iter().find(|checkpoint| {
                !matches!(
                    checkpoint.reason,
                    CheckpointReason::BeforeRollback | CheckpointReason::BeforeAdopt
                )
            }),
            CheckpointTarget::Named(name) => {
                let label = CheckpointName::label_from(name);
                newest_first
                    .iter()
                    .find(|checkpoint| checkpoint.snapshot_id == *name)
                    .or_else(|| {
                        newest_first
                            .iter()
                            .find(|checkpoint| label.is_some() && checkpoint.label == label)
                    })
            }
        }
    }

    /// How the target reads in a refusal.
    pub(crate) fn describe(&self) -> String {
        match self {
            CheckpointTarget::Latest => "the latest checkpoint".to_owned(),
            CheckpointTarget::Named(name) => format!("checkpoint `{name}`"),
        }
    }
}

/// What a rollback (or an adoption) did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RollbackReport {
    /// The checkpoint restored (for an adoption: the fork's checkpoint).
    pub restored: Checkpoint,
    /// The checkpoint of the state it replaced: roll back to it to undo.
    pub undo: Checkpoint,
    /// The sandbox that was the scope's before.
    pub retired_sandbox: String,
    /// The scope's sandbox now.
    pub sandbox_id: String,
    /// What came back from the retired sandbox's `skills/` and `memories/` before it went.
    pub recovery: RecoverySummary,
    /// Steps that failed without failing the rollback (a kill E2B refused: the next
    /// bring-up retires that sandbox), for the caller to show.
    pub warnings: Vec<String>,
}

/// N branches of the scope's current state.
#[derive(Debug)]
#[non_exhaustive]
pub struct Fork {
    /// The checkpoint the branches were made from.
    pub checkpoint: Checkpoint,
    /// The sandbox the branches were forked from (the scope's at the time).
    pub parent: String,
    /// One entry per requested branch: its sandbox, or why it did not start.
    pub branches: Vec<Result<Branch, crate::Error>>,
}

impl Fork {
    /// The branches that started.
    pub fn started(&self) -> impl Iterator<Item = &Branch> {
        self.branches
            .iter()
            .filter_map(|branch| branch.as_ref().ok())
    }
}

/// One branch of a fork: a sandbox of its own, made from the fork's checkpoint. Use it
/// through [`Backend::branch`](crate::Backend::branch); make it the scope's with
/// [`Backend::adopt`](crate::Backend::adopt) or kill it with
/// [`Backend::discard`](crate::Backend::discard).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Branch {
    /// Its position in the fork (0-based).
    pub index: usize,
    /// Its sandbox.
    pub sandbox_id: SandboxId,
}

/// What [`Backend::discard`](crate::Backend::discard) did to each branch.
#[derive(Debug)]
#[non_exhaustive]
pub struct Discarded {
    /// Branches killed (or already gone).
    pub killed: Vec<String>,
    /// Branches whose kill failed, with why; they pause on their own lease.
    pub failed: Vec<(String, String)>,
}

/// The automatic checkpoints beyond the newest `keep`, newest first in, oldest last out.
pub(crate) fn beyond_keep(newest_first: &[Checkpoint], keep: usize) -> Vec<&Checkpoint> {
    newest_first
        .iter()
        .filter(|checkpoint| checkpoint.is_automatic())
        .skip(keep)
        .collect()
}

/// Sorts checkpoints newest first (ties by snapshot id, so every host lists the same order).
pub(crate) fn newest_first(checkpoints: &mut [Checkpoint]) {
    checkpoints.sort_by(|a, b| (b.taken_at, &b.snapshot_id).cmp(&(a.taken_at, &a.snapshot_id)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(ms: u64, reason: CheckpointReason, label: Option<&str>) -> Checkpoint {
        Checkpoint {
            snapshot_id: format!("s{ms}"),
            label: label.map(str::to_owned),
            reason,
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
            source_sandbox: "i1".to_owned(),
        }
    }

    // contract: R7
    #[test]
    fn retention_removes_only_the_oldest_automatic_checkpoints() {
        let mut all = vec![
            checkpoint(1, CheckpointReason::SessionStart, None),
            checkpoint(2, CheckpointReason::Manual, Some("keep-me")),
            checkpoint(3, CheckpointReason::SessionStart, None),
            checkpoint(4, CheckpointReason::BeforeRollback, None),
            checkpoint(5, CheckpointReason::Agent, Some("agent-named")),
        ];
        newest_first(&mut all);
        let gone: Vec<&str> = beyond_keep(&all, 1)
            .iter()
            .map(|c| c.snapshot_id.as_str())
            .collect();
        assert_eq!(gone, ["s3", "s1"]);
        assert!(beyond_keep(&all, 3).is_empty());
        assert_eq!(beyond_keep(&all, 0).len(), 3);
    }

    #[test]
    fn targets_pick_by_id_label_or_latest_own_checkpoint() {
        let mut all = vec![
            checkpoint(1, CheckpointReason::Manual, Some("before-upgrade")),
            checkpoint(2, CheckpointReason::Manual, Some("before-upgrade")),
            checkpoint(3, CheckpointReason::SessionStart, None),
            checkpoint(4, CheckpointReason::BeforeRollback, None),
        ];
        newest_first(&mut all);
        let pick = |target: CheckpointTarget| target.pick(&all).map(|c| c.snapshot_id.clone());
        assert_eq!(pick(CheckpointTarget::Latest), Some("s3".to_owned()));
        assert_eq!(
            pick(CheckpointTarget::Named("Before Upgrade".to_owned())),
            Some("s2".to_owned())
        );
        assert_eq!(
            pick(CheckpointTarget::Named("s1".to_owned())),
            Some("s1".to_owned())
        );
        assert_eq!(pick(CheckpointTarget::Named("nope".to_owned())), None);
    }

    #[test]
    fn utc_formats_civil_time() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_648_858);
        assert_eq!(utc(t), "2025-12-02 04:14:18");
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap), "2000-02-29 00:00:00");
    }
}
