//! A delegated child's work in a fork of its parent's sandbox, and how it comes back
//! (contract R15): the pure half. What a directory held is a [`Manifest`] of each file's
//! size, times and mode (read from the sandbox, trusted for nothing: every path is checked),
//! taken in the parent's sandbox and in the child's fork at the fork, and again at the
//! bring-back: each side's changes are found within its own file system, without reading a
//! file. What goes back is a [`Plan`]: what only the child changed is applied; a path both
//! changed is compared by content ([`parse_digests`]), and when they differ the parent's
//! version stays and the child's lands beside it, never silently lost.
//! In a git work tree the child's commits, and one more of what it left uncommitted, come
//! back as the branch `hermes-subagent/<id>` instead (Hermes' own worktree-isolation
//! contract).

use std::collections::BTreeMap;
use std::fmt;

use crate::error::Error;

/// The branch a child's commits come back on is this and the child's id.
pub const SUBAGENT_BRANCH_PREFIX: &str = "hermes-subagent/";

pub use sandbox_identity::SUBAGENT_KEY;

/// A child's version of a file the parent changed too lands beside it, named with this and
/// the child's id: `notes.txt.hermes-subagent-<id>`.
pub const CONFLICT_SUFFIX: &str = ".hermes-subagent-";

/// Directories under the child's working directory that never come back as files: git's
/// own (a git work tree comes back as a branch), and the Hermes home (its skills and
/// memories come back on their own, for the parent's state sync to carry to the host).
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

/// What one path held, as `find` reports it: a regular file's size, modification and
/// change times and mode (any write or `chmod` changes one of them), or a symbolic link's
/// target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A regular file.
    File {
        /// Its size in bytes.
        size: u64,
        /// Its modification time, as `find` prints it (seconds, fraction).
        modified: String,
        /// Its status change time, likewise.
        changed: String,
        /// Its permission bits, octal.
        mode: String,
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

    /// Parses [`manifest_script`]'s output, NUL-terminated records: `f <size> <mtime>
    /// <ctime> <mode> <path>` for regular files, `l <path>` followed by a record with a
    /// symbolic link's target. Refused, naming the record: a path that is absolute, empty,
    /// holds `..` or a control character, a field that is not what `find` prints, and more
    /// than [`MAX_MANIFEST_ENTRIES`].
    pub fn parse(output: &[u8]) -> Result<Manifest, String> {
        let mut entries = BTreeMap::new();
        let mut records = output
            .split(|byte| *byte == 0)
            .filter(|record| !record.is_empty());
        while let Some(record) = records.next() {
            let text = std::str::from_utf8(record)
                .map_err(|_| "a manifest record is not UTF-8".to_owned())?;
            let (path, mark) = if let Some(path) = text.strip_prefix("l ") {
                let target = records
                    .next()
                    .ok_or_else(|| format!("link {path:?} without its target"))?;
                let target = std::str::from_utf8(target)
                    .map_err(|_| format!("link {path:?}: target is not UTF-8"))?;
                (path, Mark::Link(target.to_owned()))
            } else if let Some(rest) = text.strip_prefix("f ") {
                let mut fields = rest.splitn(5, ' ');
                let (Some(size), Some(modified), Some(changed), Some(mode), Some(path)) = (
                    fields.next(),
                    fields.next(),
                    fields.next(),
                    fields.next(),
                    fields.next(),
                ) else {
                    return Err(format!("bad file record {text:?}"));
                };
                let time_ok =
                    |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.');
                let size = size.parse().map_err(|_| format!("bad size in {text:?}"))?;
                if !time_ok(modified)
                    || !time_ok(changed)
                    || mode.is_empty()
                    || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
                {
                    return Err(format!("bad file record {text:?}"));
                }
                let mark = Mark::File {
                    size,
                    modified: modified.to_owned(),
                    changed: changed.to_owned(),
                    mode: mode.to_owned(),
                };
                (path, mark)
            } else {
                return Err(format!("unknown manifest record {text:?}"));
            };
            entries.insert(clean(path)?, mark);
            if entries.len() > MAX_MANIFEST_ENTRIES {
                return Err(format!(
                    "more than {MAX_MANIFEST_ENTRIES} files: too many to bring back one by one"
                ));
            }
        }
        Ok(Manifest { entries })
    }
}

impl Manifest {
    /// The manifest as [`manifest_script`] prints it: [`Manifest::parse`] reads it back.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, mark) in &self.entries {
            match mark {
                Mark::File {
                    size,
                    modified,
                    changed,
                    mode,
                } => out.extend_from_slice(
                    format!("f {size} {modified} {changed} {mode} {path}\0").as_bytes(),
                ),
                Mark::Link(target) => {
                    out.extend_from_slice(format!("l {path}\0{target}\0").as_bytes())
                }
            }
        }
        out
    }
}

/// Parses `sha256sum -z`'s output (`<64 hex>  <path>` records): each path's content digest.
/// Refused, naming the record, as [`Manifest::parse`] refuses.
pub fn parse_digests(output: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let mut digests = BTreeMap::new();
    for record in output.split(|byte| *byte == 0).filter(|r| !r.is_empty()) {
        let text =
            std::str::from_utf8(record).map_err(|_| "a digest record is not UTF-8".to_owned())?;
        let digest = text
            .get(..64)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let path = text
            .get(64..)
            .and_then(|rest| rest.strip_prefix("  ").or_else(|| rest.strip_prefix(" *")));
        match (digest, path) {
            (Some(digest), Some(path)) => {
                digests.insert(clean(path)?, digest.to_ascii_lowercase());
            }
            _ => return Err(format!("unknown digest record {text:?}")),
        }
    }
    Ok(digests)
}

/// A reported path without its `./`, checked.
fn clean(path: &str) -> Result<String, String> {
    let path = path.strip_prefix("./").unwrap_or(path);
    check_path(path)?;
    Ok(path.to_owned())
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
/// [`NOT_BROUGHT_BACK`]'s directories. One `find`, whatever the number of files; nothing is
/// read.
pub(crate) fn manifest_script(dir: &str) -> String {
    let prune: Vec<String> = NOT_BROUGHT_BACK
        .iter()
        .map(|name| format!("-name {name} -prune"))
        .collect();
    format!(
        "set -e; cd -- {dir}; find . -xdev \\( {prune} \\) -o \\( -type f -printf 'f %s %T@ %C@ %m %p\\0' \\) \
         -o \\( -type l -printf 'l %p\\0%l\\0' \\)",
        dir = shell_quote(dir),
        prune = prune.join(" -o "),
    )
}

/// A shell script printing the content digests (`sha256sum -z`) of the files the
/// NUL-separated list at `list` names under `dir`; a missing one is left out. The list is
/// removed.
pub(crate) fn digests_script(dir: &str, list: &str) -> String {
    format!(
        "trap \"rm -f -- {list}\" EXIT; cd -- {dir} || exit 3; while IFS= read -r -d '' p; do \
           [ -f \"$p\" ] && [ ! -L \"$p\" ] && printf '%s\\0' \"$p\"; done < {list} | \
         xargs -0 -r sha256sum -z",
        dir = shell_quote(dir),
        list = shell_quote(list),
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
    /// Paths both changed, to be compared by content before they count as conflicts
    /// ([`Plan::settle`]).
    pub undecided: Vec<String>,
}

/// One path both the parent and the child changed since the fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The path, relative to the working directory.
    pub path: String,
    /// Whether the child deleted it (then nothing lands beside it).
    pub deleted_by_child: bool,
}

/// The paths whose marks differ between two manifests of one file system.
fn changed<'a>(before: &'a Manifest, after: &'a Manifest) -> std::collections::BTreeSet<&'a str> {
    before
        .entries
        .keys()
        .chain(after.entries.keys())
        .filter(|path| before.entries.get(*path) != after.entries.get(*path))
        .map(String::as_str)
        .collect()
}

impl Plan {
    /// The plan for a child whose directory went from `child_base` to `child` (its fork's
    /// file system), while the parent's went from `parent_base` to `parent` (the parent's):
    /// each side's changes are found within its own file system.
    pub fn new(
        child_base: &Manifest,
        child: &Manifest,
        parent_base: &Manifest,
        parent: &Manifest,
    ) -> Plan {
        let ours = changed(parent_base, parent);
        let mut plan = Plan::default();
        for path in changed(child_base, child) {
            if ours.contains(path) {
                plan.undecided.push(path.to_owned());
            } else if child.entries.contains_key(path) {
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
                Some(Mark::Link(_)) => false,
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
        }
    }

    fn digests(pairs: &[(&str, char)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(path, c)| ((*path).to_owned(), c.to_string().repeat(64)))
            .collect()
    }

    #[test]
    fn the_plan_applies_what_only_the_child_changed_and_keeps_both_where_both_did() {
        // contract: R15 — each side's changes within its own file system (the two file
        // systems' stats need not agree); what both changed is compared by content.
        let parent_base = manifest(&[
            ("same", file(1)),
            ("child-edits", file(1)),
            ("child-deletes", file(1)),
            ("both-edit", file(1)),
            ("both-same", file(1)),
            ("parent-deletes-child-edits", file(1)),
        ]);
        let parent = manifest(&[
            ("same", file(1)),
            ("child-edits", file(1)),
            ("child-deletes", file(1)),
            ("both-edit", file(2)),
            ("both-same", file(2)),
            ("parent-new", file(2)),
        ]);
        // The fork's file system reports other times for the same files.
        let child_base = manifest(&[
            ("same", file(7)),
            ("child-edits", file(7)),
            ("child-deletes", file(7)),
            ("both-edit", file(7)),
            ("both-same", file(7)),
            ("parent-deletes-child-edits", file(7)),
        ]);
        let child = manifest(&[
            ("same", file(7)),
            ("child-edits", file(8)),
            ("both-edit", file(8)),
            ("both-same", file(8)),
            ("parent-deletes-child-edits", file(8)),
            ("child-new", file(8)),
        ]);
        let mut plan = Plan::new(&child_base, &child, &parent_base, &parent);
        assert_eq!(plan.write, ["child-edits", "child-new"]);
        assert_eq!(plan.delete, ["child-deletes"]);
        assert_eq!(
            plan.undecided,
            ["both-edit", "both-same", "parent-deletes-child-edits"]
        );
        plan.settle(
            &digests(&[("both-edit", 'a'), ("both-same", 'c')]),
            &digests(&[
                ("both-edit", 'b'),
                ("both-same", 'c'),
                ("parent-deletes-child-edits", 'd'),
            ]),
            &child,
        );
        let conflicts: Vec<&str> = plan.conflicts.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(conflicts, ["both-edit", "parent-deletes-child-edits"]);
        assert!(plan.undecided.is_empty());
        // A file the parent changed and the child deleted: the parent's stays, nothing beside.
        let mut plan = Plan::new(
            &manifest(&[("f", file(1))]),
            &manifest(&[]),
            &manifest(&[("f", file(1))]),
            &manifest(&[("f", file(2))]),
        );
        plan.settle(&digests(&[("f", 'a')]), &digests(&[]), &manifest(&[]));
        assert_eq!(
            plan.conflicts,
            [Conflict {
                path: "f".to_owned(),
                deleted_by_child: true
            }]
        );
    }

    #[test]
    fn manifests_parse_strictly() {
        // contract: R15
        let output = "f 12 1700000000.1234567890 1700000000.1234567890 755 ./bin/run\0\
                      f 0 1.0 1.0 644 ./a b.txt\0l ./link\0../target\0";
        let parsed = Manifest::parse(output.as_bytes()).unwrap();
        assert_eq!(parsed.entries().len(), 3);
        assert_eq!(
            parsed.entries()["bin/run"],
            Mark::File {
                size: 12,
                modified: "1700000000.1234567890".to_owned(),
                changed: "1700000000.1234567890".to_owned(),
                mode: "755".to_owned()
            }
        );
        assert_eq!(parsed.entries()["link"], Mark::Link("../target".to_owned()));
        for bad in [
            "f 1 1.0 1.0 644 ../escape\0",
            "f 1 1.0 1.0 644 /abs\0",
            "f 1 1.0 1.0 644 ./a/../b\0",
            "f x 1.0 1.0 644 ./a\0",
            "f 1 1.0 1.0 9z9 ./a\0",
            "f 1 1.0 ./a\0",
            "l ./dangling\0",
            "what ./what\0",
        ] {
            assert!(Manifest::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let digest = "ab".repeat(32);
        let parsed = parse_digests(format!("{digest}  ./a b\0").as_bytes()).unwrap();
        assert_eq!(parsed["a b"], digest);
        assert!(parse_digests(format!("{digest}  ../x\0").as_bytes()).is_err());
        assert!(parse_digests(b"short  ./x\0").is_err());
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
