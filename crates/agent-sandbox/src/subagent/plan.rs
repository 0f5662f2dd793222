//! What the parent gets of a child's file changes ([`Plan`]), decided from what each side
//! changed within its own file system ([`Sides`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{Manifest, Mark, Stamp, is_within};

/// How the child's changes are found in its fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildChanges {
    /// Changed after this [`Stamp`] of the fork's file clock, read there before anything
    /// ran: a path it holds with a later change time, and a path that was there at the fork
    /// and is gone.
    Since(Stamp),
    /// Different from this manifest of the fork, read there before anything ran (the base
    /// of records written before stamps).
    Listed(Manifest),
}

/// What a [`Plan`] is made from: both sides now, and what each is measured against. Paths
/// are relative to `/`, as the manifests hold them.
#[derive(Clone, Copy, Debug)]
pub struct Sides<'a> {
    /// The roots read at the fork (absolute): under them the parent's changes are what
    /// differs from `parent_base`.
    pub based: &'a [String],
    /// The parent's manifest of `based`, read at the fork.
    pub parent_base: &'a Manifest,
    /// The parent's file clock at the fork: outside `based` (the directories the child's
    /// commands ran in later), the parent's changes are what changed after it.
    pub parent_since: Stamp,
    /// The parent's manifest now.
    pub parent: &'a Manifest,
    /// The child's manifest now.
    pub child: &'a Manifest,
    /// How the child's changes are found.
    pub child_changes: &'a ChildChanges,
}

impl Sides<'_> {
    fn based(&self, path: &str) -> bool {
        self.based
            .iter()
            .any(|root| is_within(&format!("/{path}"), root))
    }

    /// Whether the parent's file system holds `path` as the fork left it.
    fn parent_changed(&self, path: &str, based: bool) -> bool {
        if based {
            return self.parent_base.entries.get(path) != self.parent.entries.get(path);
        }
        // Outside the base a path the parent lacks is taken as never there: the child's
        // version of it is applied.
        self.parent
            .entries
            .get(path)
            .is_some_and(|mark| after(mark, self.parent_since))
    }

    fn child_changed(&self, path: &str, based: bool) -> bool {
        match (self.child.entries.get(path), self.child_changes) {
            (Some(mark), ChildChanges::Since(since)) => after(mark, *since),
            (Some(mark), ChildChanges::Listed(base)) => base.entries.get(path) != Some(mark),
            // Gone: a change if it was there at the fork.
            (None, ChildChanges::Listed(base)) => base.entries.contains_key(path),
            (None, ChildChanges::Since(_)) if based => self.parent_base.entries.contains_key(path),
            // Outside the base: there at the fork if the parent has not touched it since.
            (None, ChildChanges::Since(_)) => self
                .parent
                .entries
                .get(path)
                .is_some_and(|mark| !after(mark, self.parent_since)),
        }
    }
}

/// Whether `mark` changed after `since` (a mark without a time counts as changed).
fn after(mark: &Mark, since: Stamp) -> bool {
    mark.changed().is_none_or(|changed| changed > since)
}

/// What the parent gets of a child's file changes (paths relative to `/`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Paths the child created or changed that the parent left as they were at the fork:
    /// the child's version replaces the parent's.
    pub write: Vec<String>,
    /// Paths the child deleted that the parent left as they were: deleted.
    pub delete: Vec<String>,
    /// Paths both changed differently: the parent's version stays, and the child's (when it
    /// has one) lands beside it ([`super::ChildId::beside`]).
    pub conflicts: Vec<Conflict>,
    /// Paths both changed, to be compared by content before they count as conflicts
    /// ([`Plan::settle`]).
    pub undecided: Vec<String>,
}

/// One path both the parent and the child changed since the fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The path, relative to `/`.
    pub path: String,
    /// Whether the child deleted it (then nothing lands beside it).
    pub deleted_by_child: bool,
}

impl Plan {
    /// The plan for the child's changes, each side's found within its own file system.
    pub fn new(sides: &Sides<'_>) -> Plan {
        let paths: BTreeSet<&str> = sides
            .child
            .entries
            .keys()
            .chain(sides.parent.entries.keys())
            .chain(sides.parent_base.entries.keys())
            .map(String::as_str)
            .collect();
        let mut plan = Plan::default();
        for path in paths {
            // Under a directory one side could not enter, that side's version is unknown:
            // neither copied nor deleted (the report names the directory).
            if sides.child.hides(path) || sides.parent.hides(path) {
                continue;
            }
            let based = sides.based(path);
            if !sides.child_changed(path, based) {
                continue;
            }
            if sides.parent_changed(path, based) {
                plan.undecided.push(path.to_owned());
            } else if sides.child.entries.contains_key(path) {
                plan.write.push(path.to_owned());
            } else {
                plan.delete.push(path.to_owned());
            }
        }
        plan
    }

    /// Decides the paths both changed by their content now (`parent` and `child`: digests by
    /// path, a path without one being absent or no regular file): the same content (or both
    /// gone) is nothing to do; anything else a conflict.
    pub fn settle(
        &mut self,
        parent: &BTreeMap<String, String>,
        child: &BTreeMap<String, String>,
        child_manifest: &Manifest,
    ) {
        for path in std::mem::take(&mut self.undecided) {
            let theirs = child_manifest.entries.get(&path);
            let same = match theirs {
                None => !parent.contains_key(&path),
                Some(Mark::Link { .. }) => false,
                Some(Mark::File { .. }) => {
                    child.get(&path).is_some() && child.get(&path) == parent.get(&path)
                }
            };
            if !same {
                self.conflicts.push(Conflict {
                    deleted_by_child: theirs.is_none(),
                    path,
                });
            }
        }
    }

    /// Whether nothing comes back.
    pub fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.delete.is_empty()
            && self.conflicts.is_empty()
            && self.undecided.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file whose times are `version`.5 (its change time too).
    fn file(version: u64) -> Mark {
        Mark::File {
            size: version,
            modified: format!("{version}.5"),
            changed: format!("{version}.5"),
            mode: "644".to_owned(),
        }
    }

    fn manifest(entries: &[(&str, Mark)]) -> Manifest {
        Manifest {
            entries: entries
                .iter()
                .map(|(path, mark)| ((*path).to_owned(), mark.clone()))
                .collect(),
            unread: BTreeSet::new(),
        }
    }

    fn digests(pairs: &[(&str, char)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(path, c)| ((*path).to_owned(), c.to_string().repeat(64)))
            .collect()
    }

    fn stamp(text: &str) -> Stamp {
        Stamp::parse(text).unwrap()
    }

    #[test]
    fn the_plan_applies_what_only_the_child_changed_and_keeps_both_where_both_did() {
        // contract: R15 — the parent's changes against its manifest at the fork, the child's
        // by its fork's change times (another file system: its files' times need not agree
        // with the parent's); what both changed is compared by content.
        let based = ["/h".to_owned()];
        let parent_base = manifest(&[
            ("h/same", file(1)),
            ("h/child-edits", file(1)),
            ("h/child-deletes", file(1)),
            ("h/both-edit", file(1)),
            ("h/both-same", file(1)),
            ("h/parent-deletes-child-edits", file(1)),
        ]);
        let parent = manifest(&[
            ("h/same", file(1)),
            ("h/child-edits", file(1)),
            ("h/child-deletes", file(1)),
            ("h/both-edit", file(2)),
            ("h/both-same", file(2)),
            ("h/parent-new", file(2)),
        ]);
        // The fork's clock stamped 7.9 before the child ran; its copies of the parent's
        // files carry the fork's own times (7.5), all before.
        let child = manifest(&[
            ("h/same", file(7)),
            ("h/child-edits", file(8)),
            ("h/both-edit", file(8)),
            ("h/both-same", file(8)),
            ("h/parent-deletes-child-edits", file(8)),
            ("h/child-new", file(8)),
        ]);
        let changes = ChildChanges::Since(stamp("7.9"));
        let sides = Sides {
            based: &based,
            parent_base: &parent_base,
            parent_since: stamp("1.9"),
            parent: &parent,
            child: &child,
            child_changes: &changes,
        };
        let mut plan = Plan::new(&sides);
        assert_eq!(plan.write, ["h/child-edits", "h/child-new"]);
        assert_eq!(plan.delete, ["h/child-deletes"]);
        assert_eq!(
            plan.undecided,
            ["h/both-edit", "h/both-same", "h/parent-deletes-child-edits"]
        );
        plan.settle(
            &digests(&[("h/both-edit", 'a'), ("h/both-same", 'c')]),
            &digests(&[
                ("h/both-edit", 'b'),
                ("h/both-same", 'c'),
                ("h/parent-deletes-child-edits", 'd'),
            ]),
            &child,
        );
        let conflicts: Vec<&str> = plan.conflicts.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(conflicts, ["h/both-edit", "h/parent-deletes-child-edits"]);
        assert!(plan.undecided.is_empty());
        // A file the parent changed and the child deleted: the parent's stays, nothing beside.
        let base = manifest(&[("h/f", file(1))]);
        let sides = Sides {
            parent_base: &base,
            parent: &manifest(&[("h/f", file(2))]),
            child: &manifest(&[]),
            ..sides
        };
        let mut plan = Plan::new(&sides);
        plan.settle(&digests(&[("h/f", 'a')]), &digests(&[]), &manifest(&[]));
        assert_eq!(
            plan.conflicts,
            [Conflict {
                path: "h/f".to_owned(),
                deleted_by_child: true
            }]
        );
    }

    #[test]
    fn outside_the_base_each_sides_changes_are_those_after_its_stamp() {
        // contract: R15 — a directory the child's commands ran in that no root covered at
        // the fork: no manifest of it from then, so each side's stamp decides.
        let changes = ChildChanges::Since(stamp("7.9"));
        let empty = Manifest::default();
        let parent = manifest(&[
            ("srv/old", file(1)),
            ("srv/child-deletes", file(1)),
            ("srv/parent-edits", file(2)),
            ("srv/both", file(2)),
        ]);
        let child = manifest(&[
            ("srv/old", file(7)),
            ("srv/parent-edits", file(7)),
            ("srv/both", file(8)),
            ("srv/new", file(8)),
        ]);
        let sides = Sides {
            based: &[],
            parent_base: &empty,
            parent_since: stamp("1.9"),
            parent: &parent,
            child: &child,
            child_changes: &changes,
        };
        let plan = Plan::new(&sides);
        assert_eq!(plan.write, ["srv/new"]);
        assert_eq!(plan.delete, ["srv/child-deletes"]);
        assert_eq!(plan.undecided, ["srv/both"]);
    }

    #[test]
    fn an_older_records_base_finds_the_childs_changes_by_its_manifest() {
        // contract: R15 — records written before stamps hold the fork's manifest instead.
        let based = ["/h".to_owned()];
        let changes = ChildChanges::Listed(manifest(&[("h/a", file(7)), ("h/b", file(7))]));
        let child = manifest(&[("h/a", file(8))]);
        let plan = Plan::new(&Sides {
            based: &based,
            parent_base: &manifest(&[("h/a", file(1)), ("h/b", file(1))]),
            parent_since: stamp("1.9"),
            parent: &manifest(&[("h/a", file(1)), ("h/b", file(1))]),
            child: &child,
            child_changes: &changes,
        });
        assert_eq!(
            (plan.write, plan.delete),
            (vec!["h/a".to_owned()], vec!["h/b".to_owned()])
        );
    }
}
