//! Checkpoints of a scope, as E2B snapshot names, and the metadata that ties a sandbox
//! made from one (a rollback, an adopted branch) to its scope.
//!
//! E2B keeps nothing about a snapshot but its id and names, so everything a person needs to
//! choose one (when, why, from which sandbox, their label) lives in the name. The name is
//! the only place: any host and any later sandbox of the scope finds the scope's checkpoints
//! by listing snapshots and keeping the names this module parses for the scope's digest.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use sandbox_identity::{CheckpointName, CheckpointReason, InternetAccess, Mode, ScopeIdentity, Security};
//!
//! let scope = ScopeIdentity {
//!     profile_home: "/home/u/.hermes".to_owned(),
//!     task_id: "default".to_owned(),
//!     template: "base".to_owned(),
//!     mode: Mode::Persistent,
//!     internet: InternetAccess::Allowed,
//!     security: Security::Secure,
//! };
//! let name = CheckpointName {
//!     scope: CheckpointName::scope_tag(&scope.digest()),
//!     taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_650_000_123),
//!     reason: CheckpointReason::Manual,
//!     source: "i1a2b3c".to_owned(),
//!     label: CheckpointName::label_from("Before upgrade"),
//! };
//! let text = name.encode();
//! assert_eq!(CheckpointName::parse_for(&text, &scope.digest()), Some(name));
//! ```

use std::time::{Duration, SystemTime};

use crate::scope::ScopeDigest;

/// Metadata key of a sandbox created from a checkpoint: the snapshot id it was made from.
/// Such a sandbox reports the snapshot's template, not the scope's; this key (with a name
/// of the scope's own checkpoints) is what lets adoption accept it.
pub const RESTORED_FROM_KEY: &str = "hermes.restored_from";
/// Metadata key of a sandbox that replaces another: the id it replaces. While both exist
/// (a rollback or adoption interrupted between its create and its kill), the replaced one
/// is never adopted, and the next writer bring-up kills it.
pub const SUPERSEDES_KEY: &str = "hermes.supersedes";
/// Metadata key of a fork branch: the id of the sandbox it was forked from (its parent). A
/// branch is never adopted while its parent exists or while the scope has a sandbox that is
/// no branch; `adopt` retires the other branches, then the parent, so the chosen branch is
/// what is left (R6).
pub const BRANCH_KEY: &str = "hermes.branch";
/// Metadata key of a delegated child's fork (R15), beside [`BRANCH_KEY`]: the child's id. Such
/// a fork is never adopted, whether its parent exists or not: it holds a child's work, which
/// comes back to the parent, never the scope's sandbox in its place.
pub const SUBAGENT_KEY: &str = "hermes.subagent";

/// Prefix of every checkpoint name; the rest is `_`-separated fields.
const PREFIX: &str = "hermes";
/// Hex characters of the scope digest a name carries: enough to keep scopes apart in one
/// team's snapshot list (the full digest is checked again on every sandbox made from it).
const SCOPE_TAG_LEN: usize = 16;
/// Longest label kept, in characters.
pub const MAX_LABEL_LEN: usize = 40;

/// Why a checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CheckpointReason {
    /// Asked for by a person.
    Manual,
    /// Taken automatically when a session began.
    SessionStart,
    /// The state a rollback replaced, so the rollback can be undone.
    BeforeRollback,
    /// Asked for by the agent itself.
    Agent,
    /// The state a fork branched from.
    Fork,
    /// The state an adoption of a branch replaced.
    BeforeAdopt,
}

impl CheckpointReason {
    /// Every reason, in declaration order.
    pub const ALL: [CheckpointReason; 6] = [
        CheckpointReason::Manual,
        CheckpointReason::SessionStart,
        CheckpointReason::BeforeRollback,
        CheckpointReason::Agent,
        CheckpointReason::Fork,
        CheckpointReason::BeforeAdopt,
    ];

    /// The word in the snapshot name and in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointReason::Manual => "manual",
            CheckpointReason::SessionStart => "start",
            CheckpointReason::BeforeRollback => "rollback",
            CheckpointReason::Agent => "agent",
            CheckpointReason::Fork => "fork",
            CheckpointReason::BeforeAdopt => "adopt",
        }
    }

    /// The reason a word names.
    pub fn parse(word: &str) -> Option<CheckpointReason> {
        CheckpointReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == word)
    }
}

/// A checkpoint's name, decoded: which scope, when, why, from which sandbox, and the label a
/// person or the agent gave it (a checkpoint with a label is never removed by retention).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckpointName {
    /// The first hex characters of the scope digest ([`CheckpointName::scope_tag`]).
    pub scope: String,
    /// When it was taken (millisecond precision).
    pub taken_at: SystemTime,
    /// Why it was taken.
    pub reason: CheckpointReason,
    /// The sandbox it was taken of (lowercase letters, digits and `-`).
    pub source: String,
    /// Its label ([`CheckpointName::label_from`]), if it has one.
    pub label: Option<String>,
}

impl CheckpointName {
    /// The part of a scope digest a checkpoint name carries.
    pub fn scope_tag(digest: &ScopeDigest) -> String {
        digest.to_hex()[..SCOPE_TAG_LEN].to_owned()
    }

    /// A label as E2B's name rules allow it: lowercased, every run of characters other than
    /// `a-z`, `0-9` and `-` made one `-`, trimmed of `-`, at most [`MAX_LABEL_LEN`]
    /// characters. `None` when nothing is left.
    pub fn label_from(text: &str) -> Option<String> {
        let mut label = String::with_capacity(text.len().min(MAX_LABEL_LEN));
        let mut dash = false;
        for c in text.trim().chars().flat_map(char::to_lowercase) {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                if dash && !label.is_empty() {
                    label.push('-');
                }
                dash = false;
                label.push(c);
            } else {
                dash = true;
            }
            if label.len() >= MAX_LABEL_LEN {
                break;
            }
        }
        let label = label.trim_end_matches('-').to_owned();
        (!label.is_empty()).then_some(label)
    }

    /// The snapshot name: `hermes_<scope>_<ms>_<reason>_<source>_<label>` (the label part
    /// empty when there is none). Every field is in E2B's alias alphabet.
    pub fn encode(&self) -> String {
        let millis = self
            .taken_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!(
            "{PREFIX}_{}_{millis}_{}_{}_{}",
            self.scope,
            self.reason.as_str(),
            self.source,
            self.label.as_deref().unwrap_or("")
        )
    }

    /// Decodes a snapshot id or name (`namespace/` and `:tag` are ignored) if it is a
    /// checkpoint of the scope with `digest`. Anything else, including a name that only
    /// looks like one, is `None`: snapshot names come from the service and are untrusted.
    pub fn parse_for(name: &str, digest: &ScopeDigest) -> Option<CheckpointName> {
        let parsed = CheckpointName::parse(name)?;
        (parsed.scope == CheckpointName::scope_tag(digest)).then_some(parsed)
    }

    /// Decodes any checkpoint name, of whichever scope.
    pub fn parse(name: &str) -> Option<CheckpointName> {
        let alias = alias_of(name);
        let mut fields = alias.split('_');
        if fields.next()? != PREFIX {
            return None;
        }
        let scope = fields.next()?;
        let millis = fields.next()?;
        let reason = CheckpointReason::parse(fields.next()?)?;
        let source = fields.next()?;
        let label = fields.next()?;
        if fields.next().is_some() {
            return None;
        }
        let scope_ok = scope.len() == SCOPE_TAG_LEN
            && scope
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let millis_ok = !millis.is_empty()
            && millis.len() <= 16
            && millis.bytes().all(|b| b.is_ascii_digit())
            && !(millis.len() > 1 && millis.starts_with('0'));
        let source_ok = !source.is_empty()
            && source.len() <= 64
            && source
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !(scope_ok && millis_ok && source_ok) {
            return None;
        }
        let label = match label {
            "" => None,
            label if CheckpointName::label_from(label).as_deref() == Some(label) => {
                Some(label.to_owned())
            }
            _ => return None,
        };
        Some(CheckpointName {
            scope: scope.to_owned(),
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(millis.parse().ok()?),
            reason,
            source: source.to_owned(),
            label,
        })
    }

    /// Whether retention may remove it: only a checkpoint without a label.
    pub fn is_automatic(&self) -> bool {
        self.label.is_none()
    }
}

/// The alias part of a snapshot id or name: without `namespace/` and without `:tag`.
pub fn alias_of(name: &str) -> &str {
    let name = name.split_once(':').map_or(name, |(alias, _tag)| alias);
    name.rsplit_once('/')
        .map_or(name, |(_namespace, alias)| alias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::{InternetAccess, Mode, ScopeIdentity, Security};
    use proptest::prelude::*;

    fn digest(task: &str) -> ScopeDigest {
        ScopeIdentity {
            profile_home: "/home/u/.hermes".to_owned(),
            task_id: task.to_owned(),
            template: "base".to_owned(),
            mode: Mode::Persistent,
            internet: InternetAccess::Allowed,
            security: Security::Secure,
        }
        .digest()
    }

    fn name(label: Option<&str>) -> CheckpointName {
        CheckpointName {
            scope: CheckpointName::scope_tag(&digest("default")),
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_650_000_123),
            reason: CheckpointReason::BeforeRollback,
            source: "iabc123".to_owned(),
            label: label.map(str::to_owned),
        }
    }

    // contract: R3
    #[test]
    fn names_round_trip_through_every_form_e2b_reports() {
        for label in [None, Some("before-upgrade")] {
            let name = name(label);
            let text = name.encode();
            assert!(
                text.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'-'
                    || b == b'_')
            );
            for form in [
                text.clone(),
                format!("{text}:default"),
                format!("team-slug/{text}:default"),
                format!("team-slug/{text}"),
            ] {
                assert_eq!(
                    CheckpointName::parse_for(&form, &digest("default")),
                    Some(name.clone())
                );
            }
        }
    }

    // contract: R3
    #[test]
    fn another_scopes_checkpoint_is_not_this_scopes() {
        let text = name(None).encode();
        assert!(CheckpointName::parse(&text).is_some());
        assert_eq!(CheckpointName::parse_for(&text, &digest("other")), None);
    }

    #[test]
    fn labels_follow_e2b_name_rules() {
        assert_eq!(
            CheckpointName::label_from("  Before Upgrade!! v2 "),
            Some("before-upgrade-v2".to_owned())
        );
        assert_eq!(CheckpointName::label_from("___"), None);
        assert_eq!(CheckpointName::label_from(""), None);
        let long = CheckpointName::label_from(&"a".repeat(100)).unwrap();
        assert_eq!(long.len(), MAX_LABEL_LEN);
    }

    #[test]
    fn malformed_names_are_refused() {
        let good = name(Some("x")).encode();
        for bad in [
            good.replacen("hermes_", "other_", 1),
            good.replace("_rollback_", "_reboot_"),
            format!("{good}_extra"),
            good.replace("iabc123", "IABC123"),
            good.replace("_1764650000123_", "_01764650000123_"),
            good.replace("_x", "_X"),
            "hermes".to_owned(),
            String::new(),
        ] {
            assert_eq!(CheckpointName::parse(&bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn any_name_round_trips(
            millis in 0u64..4_000_000_000_000,
            reason in 0usize..CheckpointReason::ALL.len(),
            source in "[a-z0-9][a-z0-9-]{0,30}",
            label in proptest::option::of("[ -~]{0,60}"),
        ) {
            let name = CheckpointName {
                scope: CheckpointName::scope_tag(&digest("default")),
                taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(millis),
                reason: CheckpointReason::ALL[reason],
                source,
                label: label.as_deref().and_then(CheckpointName::label_from),
            };
            prop_assert_eq!(CheckpointName::parse_for(&name.encode(), &digest("default")), Some(name));
        }

        #[test]
        fn parsing_never_panics(text in "\\PC{0,120}") {
            let _ = CheckpointName::parse(&text);
        }
    }
}
