//! A delegated child's work in a fork of its parent's sandbox, and how it comes back
//! (contract R15): the pure half. What a directory held is a [`Manifest`] (read from the
//! sandbox, trusted for nothing: every path is checked); what goes back is a [`Plan`] made
//! from three manifests (at the fork, the parent's now, the child's now), so a file both
//! changed keeps the parent's version and gets the child's beside it, never silently lost.
//! In a git work tree the child's commits, and one more of what it left uncommitted, come
//! back as the branch `hermes-subagent/<id>` instead (Hermes' own worktree-isolation
//! contract).

use std::collections::BTreeMap;
use std::fmt;

use crate::error::Error;

/// The branch a child's commits come back on is this and the child's id.
pub const SUBAGENT_BRANCH_PREFIX: &str = "hermes-subagent/";

/// The metadata key naming the child a fork works for (beside `hermes.branch`, the parent).
pub const SUBAGENT_KEY: &str = "hermes.subagent";

/// A child's version of a file the parent changed too lands beside it, named with this and
/// the child's id: `notes.txt.hermes-subagent-<id>`.
pub const CONFLICT_SUFFIX: &str = ".hermes-subagent-";

/// Directories under the child's working directory that never come back as files: git's
/// own (a git work tree comes back as a branch), and the Hermes home (its state is synced
/// to the host as the parent's is).
pub const NOT_BROUGHT_BACK: [&str; 2] = [".git", ".hermes"];

/// The most entries a manifest may hold: past it, the work is too big to bring back file by
/// file (a git work tree has no such limit).
pub const MAX_MANIFEST_ENTRIES: usize = 100_000;

/// A child's id as Hermes names it (`subagent_id`): letters, digits, `.`, `_` and `-`, 1 to
/// 64 of them, not starting with `.` or `-` (it becomes a git branch and a file suffix).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChildId(String);

impl ChildId {
    /// Checks `id`; the error says why.
    pub fn new(id: &str) -> Result<ChildId, Error> {
        let ok = !id.is_empty()
            && id.len() <= 64
            && !id.starts_with(['.', '-'])
            && !id.contains("..")
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(ChildId(id.to_owned()))
        } else {
            Err(Error::InvalidConfig {
                reason: format!(
                    "subagent id {id:?} is not 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
                ),
            })
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The branch its commits come back on.
    pub fn branch(&self) -> String {
        format!("{SUBAGENT_BRANCH_PREFIX}{}", self.0)
    }

    /// Where its version of a conflicting `path` lands.
    pub fn beside(&self, path: &str) -> String {
        format!("{path}{CONFLICT_SUFFIX}{}", self.0)
    }
}

impl fmt::Debug for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChildId({})", self.0)
    }
}

impl fmt::Display for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What one path held: a regular file's content digest (and whether it is executable), or
/// a symbolic link's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A regular file: SHA-256 of its bytes, 64 hex digits, and its executable bit.
    File {
        /// The digest.
        sha256: String,
        /// Whether the owner may execute it.
        executable: bool,
    },
    /// A symbolic link and its target, unresolved.
    Link(String),
}

/// What a directory held, by path relative to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    entries: BTreeMap<String, Mark>,
}

impl Manifest {
    /// The entries.
    pub fn entries(&self) -> &BTreeMap<String, Mark> {
        &self.entries
    }

    /// Parses [`manifest_script`]'s output: NUL-terminated records `f <sha256> <x|->
    /// <path>` and `l <path>` followed by a record with the target. Refused, naming the
    /// record: a path that is absolute, empty, holds `..` or a control character, or a
    /// digest that is not 64 hex digits, and more than [`MAX_MANIFEST_ENTRIES`].
    pub fn parse(output: &[u8]) -> Result<Manifest, String> {
        let mut entries = BTreeMap::new();
        let mut records = output
            .split(|byte| *byte == 0)
            .filter(|record| !record.is_empty());
        while let Some(record) = records.next() {
            let text = std::str::from_utf8(record)
                .map_err(|_| "a manifest record is not UTF-8".to_owned())?;
            let (path, mark) = if let Some(rest) = text.strip_prefix("f ") {
                let (sha256, rest) = rest
                    .split_once(' ')
                    .ok_or_else(|| format!("bad file record {text:?}"))?;
                let (mode, path) = rest
                    .split_once(' ')
                    .ok_or_else(|| format!("bad file record {text:?}"))?;
                if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("bad digest in {text:?}"));
                }
                let executable = match mode {
                    "x" => true,
                    "-" => false,
                    _ => return Err(format!("bad mode in {text:?}")),
                };
                let mark = Mark::File {
                    sha256: sha256.to_ascii_lowercase(),
                    executable,
                };
                (path, mark)
            } else if let Some(path) = text.strip_prefix("l ") {
                let target = records
                    .next()
                    .ok_or_else(|| format!("link {path:?} without its target"))?;
                let target = std::str::from_utf8(target)
                    .map_err(|_| format!("link {path:?}: target is not UTF-8"))?;
                (path, Mark::Link(target.to_owned()))
            } else {
                return Err(format!("unknown manifest record {text:?}"));
            };
            let path = path.strip_prefix("./").unwrap_or(path);
            check_path(path)?;
            entries.insert(path.to_owned(), mark);
            if entries.len() > MAX_MANIFEST_ENTRIES {
                return Err(format!(
                    "more than {MAX_MANIFEST_ENTRIES} files: too many to bring back one by one"
                ));
            }
        }
        Ok(Manifest { entries })
    }
}

/// A relative path that stays inside its directory.
fn check_path(path: &str) -> Result<(), String> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.chars().any(char::is_control)
        || path
            .split('/')
            .any(|part| part.is_empty() || part == ".." || part == ".");
    if bad {
        Err(format!("path {path:?} is not a plain relative path"))
    } else {
        Ok(())
    }
}

/// A shell script printing the manifest of `dir` (see [`Manifest::parse`]): regular files
/// and symbolic links, not following links, not crossing file systems, without
/// [`NOT_BROUGHT_BACK`]'s directories.
pub(crate) fn manifest_script(dir: &str) -> String {
    let prune: Vec<String> = NOT_BROUGHT_BACK
        .iter()
        .map(|name| format!("-name {name} -prune"))
        .collect();
    format!(
        "set -e; cd -- {dir}; \
         find . -xdev \\( {prune} \\) -o -type f -print0 | \
         while IFS= read -r -d '' p; do \
           h=$(sha256sum < \"$p\" | cut -d' ' -f1); \
           if [ -x \"$p\" ]; then m=x; else m=-; fi; \
           printf 'f %s %s %s\\0' \"$h\" \"$m\" \"$p\"; \
         done; \
         find . -xdev \\( {prune} \\) -o -type l -printf 'l %p\\0%l\\0'",
        dir = shell_quote(dir),
        prune = prune.join(" -o "),
    )
}

/// `text` as one shell word.
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// What the parent gets of a child's file changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Paths the child created or changed that the parent left as they were at the fork:
    /// the child's version replaces the parent's.
    pub write: Vec<String>,
    /// Paths the child deleted that the parent left as they were: deleted.
    pub delete: Vec<String>,
    /// Paths both changed differently: the parent's version stays, and the child's (when it
    /// has one) lands beside it ([`ChildId::beside`]).
    pub conflicts: Vec<Conflict>,
}

/// One path both the parent and the child changed since the fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The path, relative to the working directory.
    pub path: String,
    /// Whether the child deleted it (then nothing lands beside it).
    pub deleted_by_child: bool,
}

impl Plan {
    /// The plan for a child whose directory went from `base` (at the fork) to `child`, while
    /// the parent's went to `parent`.
    pub fn new(base: &Manifest, parent: &Manifest, child: &Manifest) -> Plan {
        let mut plan = Plan::default();
        let paths = base
            .entries
            .keys()
            .chain(child.entries.keys())
            .collect::<std::collections::BTreeSet<_>>();
        for path in paths {
            let at_fork = base.entries.get(path);
            let theirs = child.entries.get(path);
            if at_fork == theirs {
                continue;
            }
            let ours = parent.entries.get(path);
            if ours == theirs {
                // Both ended at the same place: nothing to do.
                continue;
            }
            if ours == at_fork {
                match theirs {
                    Some(_) => plan.write.push(path.clone()),
                    None => plan.delete.push(path.clone()),
                }
            } else {
                plan.conflicts.push(Conflict {
                    path: path.clone(),
                    deleted_by_child: theirs.is_none(),
                });
            }
        }
        plan
    }

    /// Whether nothing comes back.
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.delete.is_empty() && self.conflicts.is_empty()
    }

    /// The paths whose child version travels: written and conflicting ones it still has.
    pub fn carried(&self) -> Vec<&str> {
        self.write
            .iter()
            .map(String::as_str)
            .chain(
                self.conflicts
                    .iter()
                    .filter(|c| !c.deleted_by_child)
                    .map(|c| c.path.as_str()),
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(hash: char) -> Mark {
        Mark::File {
            sha256: hash.to_string().repeat(64),
            executable: false,
        }
    }

    fn manifest(entries: &[(&str, Mark)]) -> Manifest {
        Manifest {
            entries: entries
                .iter()
                .map(|(path, mark)| ((*path).to_owned(), mark.clone()))
                .collect(),
        }
    }

    #[test]
    fn the_plan_applies_what_only_the_child_changed_and_keeps_both_where_both_did() {
        // contract: R15
        let base = manifest(&[
            ("same", file('a')),
            ("child-edits", file('a')),
            ("child-deletes", file('a')),
            ("both-edit", file('a')),
            ("parent-edits", file('a')),
            ("parent-deletes-child-edits", file('a')),
            ("both-same", file('a')),
        ]);
        let parent = manifest(&[
            ("same", file('a')),
            ("child-edits", file('a')),
            ("child-deletes", file('a')),
            ("both-edit", file('b')),
            ("parent-edits", file('b')),
            ("both-same", file('c')),
        ]);
        let child = manifest(&[
            ("same", file('a')),
            ("child-edits", file('c')),
            ("both-edit", file('c')),
            ("parent-edits", file('a')),
            ("parent-deletes-child-edits", file('d')),
            ("both-same", file('c')),
            ("child-new", file('e')),
        ]);
        let plan = Plan::new(&base, &parent, &child);
        assert_eq!(plan.write, ["child-edits", "child-new"]);
        assert_eq!(plan.delete, ["child-deletes"]);
        let conflicts: Vec<&str> = plan.conflicts.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(conflicts, ["both-edit", "parent-deletes-child-edits"]);
        assert_eq!(
            plan.carried(),
            [
                "child-edits",
                "child-new",
                "both-edit",
                "parent-deletes-child-edits"
            ]
        );
        // A file the parent changed and the child deleted: the parent's stays, nothing beside.
        let plan = Plan::new(
            &manifest(&[("f", file('a'))]),
            &manifest(&[("f", file('b'))]),
            &manifest(&[]),
        );
        assert_eq!(
            plan.conflicts,
            [Conflict {
                path: "f".to_owned(),
                deleted_by_child: true
            }]
        );
        assert!(plan.carried().is_empty());
    }

    #[test]
    fn manifests_parse_strictly() {
        // contract: R15
        let digest = "ab".repeat(32);
        let output =
            format!("f {digest} x ./bin/run\0f {digest} - ./a b.txt\0l ./link\0../target\0");
        let parsed = Manifest::parse(output.as_bytes()).unwrap();
        assert_eq!(parsed.entries().len(), 3);
        assert_eq!(
            parsed.entries()["bin/run"],
            Mark::File {
                sha256: digest.clone(),
                executable: true
            }
        );
        assert_eq!(parsed.entries()["link"], Mark::Link("../target".to_owned()));
        for bad in [
            format!("f {digest} - ../escape\0"),
            format!("f {digest} - /abs\0"),
            format!("f {digest} - ./a/../b\0"),
            "f short - ./a\0".to_owned(),
            format!("f {digest} ? ./a\0"),
            "l ./dangling\0".to_owned(),
            "x ./what\0".to_owned(),
        ] {
            assert!(Manifest::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn child_ids_become_branches_and_suffixes_and_refuse_what_would_not() {
        // contract: R15
        let id = ChildId::new("sa-1.2_x").unwrap();
        assert_eq!(id.branch(), "hermes-subagent/sa-1.2_x");
        assert_eq!(id.beside("a/b.txt"), "a/b.txt.hermes-subagent-sa-1.2_x");
        for bad in ["", "-x", ".x", "a..b", "a/b", "a b", &"x".repeat(65)] {
            assert!(ChildId::new(bad).is_err(), "{bad:?}");
        }
    }
}
