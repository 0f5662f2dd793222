//! Which existing sandbox, if any, a session adopts.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::checkpoint::{
    BRANCH_KEY, CheckpointName, RESTORED_FROM_KEY, SUBAGENT_KEY, SUPERSEDES_KEY, alias_of,
};
use crate::metadata::IdentityMetadata;
use crate::scope::{Mode, ScopeIdentity};

/// A sandbox's lifecycle state as a list call reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Running; connecting extends its lease.
    Running,
    /// Paused; connecting resumes it.
    Paused,
    /// Any other value the service reported. Never adopted.
    Other,
}

/// One sandbox as a list call returns it.
///
/// A plain record filled by the caller from whatever client it uses, so this
/// crate needs no HTTP types. Every field is untrusted input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The sandbox id.
    pub sandbox_id: String,
    /// The template id the service reports (`templateID`).
    pub template_id: String,
    /// The template alias the service reports (`alias`), if any.
    pub template_alias: Option<String>,
    /// The sandbox's metadata.
    pub metadata: BTreeMap<String, String>,
    /// When the sandbox was started (`startedAt`).
    pub started_at: SystemTime,
    /// Running, paused or something else.
    pub state: SandboxState,
}

/// Why a candidate is not adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mismatch {
    /// Its metadata carries no readable identity of this version.
    NoIdentity,
    /// It belongs to another scope (other profile, task, template or posture).
    OtherScope,
    /// It was created in the other mode.
    OtherMode,
    /// The service reports a template other than the configured one (checked
    /// against both the template id and the alias).
    OtherTemplate,
    /// It is neither running nor paused.
    NotResumable,
}

/// Whether `candidate` is a valid substitute for the sandbox `identity` would
/// create.
///
/// The posture (egress and envd protection) is part of the digest, so a
/// candidate created under another posture carries another scope digest and
/// fails as [`Mismatch::OtherScope`]. The template is checked twice: through
/// the digest and against what the service reports, so metadata copied onto a
/// sandbox of another template is still refused.
pub fn check(identity: &ScopeIdentity, candidate: &Candidate) -> Result<(), Mismatch> {
    check_against(identity, &IdentityMetadata::for_scope(identity), candidate)
}

fn check_against(
    identity: &ScopeIdentity,
    wanted: &IdentityMetadata,
    candidate: &Candidate,
) -> Result<(), Mismatch> {
    let found =
        IdentityMetadata::from_map(&candidate.metadata).map_err(|_| Mismatch::NoIdentity)?;
    if found.digest != wanted.digest {
        return Err(Mismatch::OtherScope);
    }
    if found.mode != wanted.mode {
        return Err(Mismatch::OtherMode);
    }
    let template_matches = candidate.template_id == identity.template
        || candidate.template_alias.as_deref() == Some(identity.template.as_str())
        || restored_from_own_checkpoint(wanted, candidate);
    if !template_matches {
        return Err(Mismatch::OtherTemplate);
    }
    match candidate.state {
        SandboxState::Running | SandboxState::Paused => Ok(()),
        SandboxState::Other => Err(Mismatch::NotResumable),
    }
}

/// Whether `candidate` was created from one of the scope's own checkpoints and reports
/// that checkpoint as its template (R4): the sandbox a rollback or an adoption made.
fn restored_from_own_checkpoint(wanted: &IdentityMetadata, candidate: &Candidate) -> bool {
    let Some(snapshot) = candidate.metadata.get(RESTORED_FROM_KEY) else {
        return false;
    };
    if CheckpointName::parse_for(snapshot, &wanted.digest).is_none() {
        return false;
    }
    let alias = alias_of(snapshot);
    match candidate.template_alias.as_deref() {
        Some(reported) => alias_of(reported) == alias || alias_of(&candidate.template_id) == alias,
        // E2B may report a snapshot template by its raw id alone; a sandbox of another
        // named template (the forgery I3 guards against) still reports that template's alias.
        None => true,
    }
}

/// The adoption decision for one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Adoption<'a> {
    /// Adopt this candidate: the newest that matches exactly.
    Adopt {
        /// The chosen sandbox.
        candidate: &'a Candidate,
        /// How many other matching sandboxes exist for the scope; the caller
        /// warns once when this is non-zero (contract I5).
        duplicates: usize,
        /// How many candidates were refused (see [`check`]).
        rejected: usize,
    },
    /// Nothing matches: the writer creates a sandbox, under the creation lock.
    Create {
        /// How many candidates were refused (see [`check`]).
        rejected: usize,
    },
    /// Ephemeral mode: a fresh sandbox per session, never adopted.
    NeverAdopt,
}

/// Picks the sandbox a session adopts among the candidates a list call
/// returned.
///
/// The newest matching candidate wins (latest `started_at`; on a tie, the
/// greatest sandbox id, so every process picks the same one). A candidate
/// that fails [`check`] is never adopted. In ephemeral mode nothing is.
pub fn choose<'a>(identity: &ScopeIdentity, candidates: &'a [Candidate]) -> Adoption<'a> {
    if identity.mode == Mode::Ephemeral {
        return Adoption::NeverAdopt;
    }
    let wanted = IdentityMetadata::for_scope(identity);
    let matches: Vec<&'a Candidate> = candidates
        .iter()
        .filter(|candidate| check_against(identity, &wanted, candidate).is_ok())
        .collect();
    let retired = retired_among(&matches);
    let live: Vec<&'a Candidate> = matches
        .into_iter()
        .filter(|candidate| !retired.contains(candidate))
        .collect();
    let waiting = waiting_branches(&live);
    let mut newest: Option<&'a Candidate> = None;
    let mut matching = 0usize;
    for candidate in live {
        if waiting.contains(&candidate) {
            continue;
        }
        matching += 1;
        let newer = newest.is_none_or(|best| {
            (candidate.started_at, &candidate.sandbox_id) > (best.started_at, &best.sandbox_id)
        });
        if newer {
            newest = Some(candidate);
        }
    }
    let rejected = candidates.len() - matching;
    match newest {
        Some(candidate) => Adoption::Adopt {
            candidate,
            duplicates: matching - 1,
            rejected,
        },
        None => Adoption::Create { rejected },
    }
}

/// The scope's sandboxes that another of its sandboxes replaces ([`SUPERSEDES_KEY`]): left
/// over by a rollback or an adoption interrupted between its create and its kill. Never
/// adopted; the writer's bring-up kills them (R5).
pub fn superseded<'a>(identity: &ScopeIdentity, candidates: &'a [Candidate]) -> Vec<&'a Candidate> {
    let wanted = IdentityMetadata::for_scope(identity);
    let matches: Vec<&'a Candidate> = candidates
        .iter()
        .filter(|candidate| check_against(identity, &wanted, candidate).is_ok())
        .collect();
    retired_among(&matches)
}

/// What the writer's bring-up kills besides what it adopts: the [`superseded`] sandboxes,
/// and, when the chosen sandbox is a branch (its parent gone, nothing unbranched left), every
/// other branch that would be as adoptable: left by a fork whose parent vanished or whose
/// adoption was cut short. Their fork's checkpoint keeps the state they started from (R5,
/// R6).
pub fn retirable<'a>(identity: &ScopeIdentity, candidates: &'a [Candidate]) -> Vec<&'a Candidate> {
    let mut retire = superseded(identity, candidates);
    if let Adoption::Adopt { candidate, .. } = choose(identity, candidates)
        && candidate.metadata.contains_key(BRANCH_KEY)
    {
        let wanted = IdentityMetadata::for_scope(identity);
        let live: Vec<&'a Candidate> = candidates
            .iter()
            .filter(|c| check_against(identity, &wanted, c).is_ok() && !retire.contains(c))
            .collect();
        let waiting = waiting_branches(&live);
        retire.extend(live.into_iter().filter(|c| {
            c.sandbox_id != candidate.sandbox_id
                && c.metadata.contains_key(BRANCH_KEY)
                && !waiting.contains(c)
        }));
    }
    retire
}

fn retired_among<'a>(matches: &[&'a Candidate]) -> Vec<&'a Candidate> {
    matches
        .iter()
        .copied()
        .filter(|old| {
            matches.iter().any(|new| {
                new.sandbox_id != old.sandbox_id
                    && new.metadata.get(SUPERSEDES_KEY) == Some(&old.sandbox_id)
            })
        })
        .collect()
}

/// The branches that are not (yet) the scope's: their parent still exists, or the scope has
/// a sandbox that is no branch (R6); and every delegated child's fork, which never is (R15).
fn waiting_branches<'a>(live: &[&'a Candidate]) -> Vec<&'a Candidate> {
    let unbranched = live.iter().any(|candidate| {
        !candidate.metadata.contains_key(BRANCH_KEY)
            && !candidate.metadata.contains_key(SUBAGENT_KEY)
    });
    live.iter()
        .copied()
        .filter(|branch| {
            branch.metadata.contains_key(SUBAGENT_KEY)
                || branch.metadata.get(BRANCH_KEY).is_some_and(|parent| {
                    unbranched || live.iter().any(|other| &other.sandbox_id == parent)
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scope::{InternetAccess, Security};

    fn identity(mode: Mode) -> ScopeIdentity {
        ScopeIdentity {
            profile_home: "/home/u/.hermes".to_owned(),
            task_id: "default".to_owned(),
            template: "base".to_owned(),
            mode,
            internet: InternetAccess::Allowed,
            security: Security::Secure,
        }
    }

    fn candidate(id: &str, scope: &ScopeIdentity, started_secs: u64) -> Candidate {
        Candidate {
            sandbox_id: id.to_owned(),
            template_id: "rki5dems9wqfm4r03t7g".to_owned(),
            template_alias: Some("base".to_owned()),
            metadata: IdentityMetadata::for_scope(scope).to_map(),
            started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(started_secs),
            state: SandboxState::Paused,
        }
    }

    // contract: I5
    #[test]
    fn adopts_the_newest_and_counts_duplicates() {
        let scope = identity(Mode::Persistent);
        let list = [
            candidate("old", &scope, 10),
            candidate("new", &scope, 30),
            candidate("mid", &scope, 20),
        ];
        match choose(&scope, &list) {
            Adoption::Adopt {
                candidate,
                duplicates,
                rejected,
            } => {
                assert_eq!(candidate.sandbox_id, "new");
                assert_eq!(duplicates, 2);
                assert_eq!(rejected, 0);
            }
            other => panic!("expected adoption, got {other:?}"),
        }
    }

    #[test]
    fn equal_start_times_break_ties_by_sandbox_id() {
        let scope = identity(Mode::Persistent);
        let forward = [candidate("a", &scope, 5), candidate("b", &scope, 5)];
        let backward = [candidate("b", &scope, 5), candidate("a", &scope, 5)];
        for list in [&forward[..], &backward[..]] {
            let chosen = match choose(&scope, list) {
                Adoption::Adopt { candidate, .. } => candidate.sandbox_id.as_str(),
                _ => "",
            };
            assert_eq!(chosen, "b");
        }
    }

    // contract: I3
    #[test]
    fn never_adopts_another_template_or_posture() {
        let scope = identity(Mode::Persistent);

        let mut other_template = candidate("t", &scope, 50);
        other_template.template_id = "python".to_owned();
        other_template.template_alias = Some("python".to_owned());
        assert_eq!(check(&scope, &other_template), Err(Mismatch::OtherTemplate));

        let laxer = ScopeIdentity {
            internet: InternetAccess::Allowed,
            security: Security::Insecure,
            ..scope.clone()
        };
        let insecure = candidate("i", &laxer, 60);
        assert_eq!(check(&scope, &insecure), Err(Mismatch::OtherScope));

        let open = ScopeIdentity {
            internet: InternetAccess::Denied,
            ..scope.clone()
        };
        assert_eq!(
            check(&open, &candidate("n", &scope, 1)),
            Err(Mismatch::OtherScope)
        );

        let mut ephemeral_meta = candidate("e", &scope, 70);
        ephemeral_meta.metadata = IdentityMetadata {
            digest: scope.digest(),
            mode: Mode::Ephemeral,
        }
        .to_map();
        assert_eq!(check(&scope, &ephemeral_meta), Err(Mismatch::OtherMode));

        let list = [other_template, insecure, ephemeral_meta];
        assert_eq!(choose(&scope, &list), Adoption::Create { rejected: 3 });
    }

    #[test]
    fn the_template_may_match_by_id_or_alias() {
        let by_id = ScopeIdentity {
            template: "rki5dems9wqfm4r03t7g".to_owned(),
            ..identity(Mode::Persistent)
        };
        let mut listed = candidate("x", &by_id, 1);
        listed.template_alias = None;
        assert_eq!(check(&by_id, &listed), Ok(()));

        let by_alias = identity(Mode::Persistent);
        assert_eq!(check(&by_alias, &candidate("y", &by_alias, 1)), Ok(()));
    }

    #[test]
    fn unknown_states_and_unstamped_sandboxes_are_refused() {
        let scope = identity(Mode::Persistent);
        let mut dying = candidate("d", &scope, 1);
        dying.state = SandboxState::Other;
        assert_eq!(check(&scope, &dying), Err(Mismatch::NotResumable));

        let mut bare = candidate("b", &scope, 1);
        bare.metadata.clear();
        assert_eq!(check(&scope, &bare), Err(Mismatch::NoIdentity));
    }

    // contract: L4
    #[test]
    fn ephemeral_mode_never_adopts() {
        let scope = identity(Mode::Ephemeral);
        let list = [candidate("e", &scope, 1)];
        // The candidate matches exactly; ephemeral mode still refuses it.
        assert_eq!(check(&scope, &list[0]), Ok(()));
        assert_eq!(choose(&scope, &list), Adoption::NeverAdopt);
    }

    // contract: I4
    #[test]
    fn a_sandbox_whose_create_response_was_lost_is_found_by_metadata_alone() {
        let scope = identity(Mode::Persistent);
        let list = [candidate("lost-response", &scope, 1)];
        assert!(matches!(
            choose(&scope, &list),
            Adoption::Adopt { candidate, duplicates: 0, rejected: 0 }
                if candidate.sandbox_id == "lost-response"
        ));
        assert_eq!(choose(&scope, &[]), Adoption::Create { rejected: 0 });
    }

    fn restored(id: &str, scope: &ScopeIdentity, started_secs: u64, snapshot: &str) -> Candidate {
        let mut c = candidate(id, scope, started_secs);
        c.template_id = crate::checkpoint::alias_of(snapshot).to_owned();
        c.template_alias = Some(crate::checkpoint::alias_of(snapshot).to_owned());
        c.metadata
            .insert(RESTORED_FROM_KEY.to_owned(), snapshot.to_owned());
        c
    }

    fn checkpoint_of(scope: &ScopeIdentity) -> String {
        crate::checkpoint::CheckpointName {
            scope: CheckpointName::scope_tag(&scope.digest()),
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            reason: crate::checkpoint::CheckpointReason::Manual,
            source: "old".to_owned(),
            label: None,
        }
        .encode()
    }

    // contract: R4
    #[test]
    fn a_sandbox_made_from_the_scopes_checkpoint_is_adopted_another_scopes_is_not() {
        let scope = identity(Mode::Persistent);
        let mut other = identity(Mode::Persistent);
        other.task_id = "other".to_owned();
        let own = restored(
            "new",
            &scope,
            30,
            &format!("team/{}:default", checkpoint_of(&scope)),
        );
        let foreign = restored(
            "bad",
            &scope,
            40,
            &format!("{}:default", checkpoint_of(&other)),
        );
        let list = [candidate("old", &scope, 10), own, foreign];
        match choose(&scope, &list) {
            Adoption::Adopt {
                candidate,
                duplicates,
                rejected,
            } => {
                assert_eq!(candidate.sandbox_id, "new");
                assert_eq!((duplicates, rejected), (1, 1));
            }
            other => panic!("expected adoption, got {other:?}"),
        }
        // Metadata naming the checkpoint on a sandbox of another template is refused.
        let mut forged = restored("forged", &scope, 50, &checkpoint_of(&scope));
        forged.template_id = "sometemplate".to_owned();
        forged.template_alias = Some("sometemplate".to_owned());
        assert_eq!(check(&scope, &forged), Err(Mismatch::OtherTemplate));
        // A snapshot template reported by its raw id alone is accepted.
        let mut raw = restored("raw", &scope, 50, &checkpoint_of(&scope));
        raw.template_id = "rki5dems9wqfm4r03t7g".to_owned();
        raw.template_alias = None;
        assert_eq!(check(&scope, &raw), Ok(()));
    }

    // contract: R5
    #[test]
    fn a_superseded_sandbox_is_never_adopted_whatever_its_age() {
        let scope = identity(Mode::Persistent);
        let mut new = candidate("new", &scope, 10);
        new.metadata
            .insert(SUPERSEDES_KEY.to_owned(), "old".to_owned());
        let list = [candidate("old", &scope, 99), new];
        match choose(&scope, &list) {
            Adoption::Adopt {
                candidate,
                duplicates,
                ..
            } => {
                assert_eq!(candidate.sandbox_id, "new");
                assert_eq!(duplicates, 0);
            }
            other => panic!("expected adoption, got {other:?}"),
        }
        let retired: Vec<&str> = superseded(&scope, &list)
            .iter()
            .map(|c| c.sandbox_id.as_str())
            .collect();
        assert_eq!(retired, ["old"]);
        // A foreign sandbox's claim retires nothing of this scope.
        let mut other = identity(Mode::Persistent);
        other.task_id = "other".to_owned();
        let mut claim = candidate("claim", &other, 10);
        claim
            .metadata
            .insert(SUPERSEDES_KEY.to_owned(), "old".to_owned());
        assert!(superseded(&scope, &[candidate("old", &scope, 99), claim]).is_empty());
    }

    // contract: R6
    #[test]
    fn a_branch_is_adopted_only_when_its_parent_and_every_unbranched_sandbox_are_gone() {
        let scope = identity(Mode::Persistent);
        let branch = |id: &str, parent: &str, secs| {
            let mut c = candidate(id, &scope, secs);
            c.metadata.insert(BRANCH_KEY.to_owned(), parent.to_owned());
            c
        };
        let adopted = |list: &[Candidate]| match choose(&scope, list) {
            Adoption::Adopt {
                candidate,
                duplicates,
                ..
            } => (candidate.sandbox_id.clone(), duplicates),
            other => panic!("expected adoption, got {other:?}"),
        };
        let forked = [
            candidate("main", &scope, 10),
            branch("b1", "main", 20),
            branch("b2", "main", 30),
        ];
        assert_eq!(adopted(&forked), ("main".to_owned(), 0));
        // The other branch retired, the parent still there: still the parent.
        assert_eq!(adopted(&forked[..2]), ("main".to_owned(), 0));
        // The parent retired: the branch is what is left.
        assert_eq!(adopted(&[branch("b1", "main", 20)]), ("b1".to_owned(), 0));
        // An adopted branch forks again: its own branches wait while it exists.
        let again = [branch("b1", "main", 20), branch("c1", "b1", 40)];
        assert_eq!(adopted(&again), ("b1".to_owned(), 0));
        // A rollback made an unbranched sandbox: branches of a dead parent wait too.
        let mut restored = candidate("r", &scope, 15);
        restored
            .metadata
            .insert(SUPERSEDES_KEY.to_owned(), "main".to_owned());
        assert_eq!(
            adopted(&[restored, branch("b1", "main", 20)]),
            ("r".to_owned(), 0)
        );
    }

    // contract: R15
    #[test]
    fn a_delegated_childs_fork_is_never_adopted() {
        let scope = identity(Mode::Persistent);
        let child = |id: &str, secs| {
            let mut c = candidate(id, &scope, secs);
            c.metadata.insert(BRANCH_KEY.to_owned(), "main".to_owned());
            c.metadata
                .insert(SUBAGENT_KEY.to_owned(), "sa-0".to_owned());
            c
        };
        // Beside its parent, newer: the parent is adopted.
        match choose(&scope, &[candidate("main", &scope, 10), child("f1", 20)]) {
            Adoption::Adopt { candidate, .. } => assert_eq!(candidate.sandbox_id, "main"),
            other => panic!("expected the parent, got {other:?}"),
        }
        // Its parent gone (a crash after a kill): still not adopted; a new sandbox is made.
        assert!(
            !matches!(choose(&scope, &[child("f1", 20)]), Adoption::Adopt { .. }),
            "a child's fork is never the scope's"
        );
    }

    // contract: R6
    #[test]
    fn branches_left_beside_an_adopted_orphan_branch_are_retirable() {
        let scope = identity(Mode::Persistent);
        let branch = |id: &str, parent: &str, secs| {
            let mut c = candidate(id, &scope, secs);
            c.metadata.insert(BRANCH_KEY.to_owned(), parent.to_owned());
            c
        };
        // The parent vanished: two branches of it are left; the newest is adopted and the
        // other retired.
        let orphans = [branch("b1", "gone", 20), branch("b2", "gone", 30)];
        let ids = |list: Vec<&Candidate>| -> Vec<String> {
            list.iter().map(|c| c.sandbox_id.clone()).collect()
        };
        assert_eq!(ids(retirable(&scope, &orphans)), ["b1"]);
        // With the parent alive nothing is retired: the branches wait.
        let alive = [candidate("gone", &scope, 10), branch("b1", "gone", 20)];
        assert!(retirable(&scope, &alive).is_empty());
        // An adopted branch's own waiting branches are kept.
        let again = [branch("b1", "gone", 20), branch("c1", "b1", 40)];
        assert!(retirable(&scope, &again).is_empty());
    }
}
