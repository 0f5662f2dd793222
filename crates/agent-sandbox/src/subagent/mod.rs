//! A delegated child's work in a fork of its parent's sandbox, and how it comes back
//! (contract R15): the pure half.
//!
//! What comes back is everything the child changed under the *roots*: the sandbox user's
//! home (less the caches in [`NOT_BROUGHT_BACK`] and the Hermes home, whose skills and
//! memories come back on their own), the child's working directory, the directories its
//! commands ran in and the paths the user adds. Each side's changes are found within its own
//! file system: the parent's by a [`Manifest`] of the roots read at the fork and again at the
//! bring-back; the child's by the change times of its files against a [`Stamp`] read in its
//! fork before anything ran there (any write, `chmod`, rename or link sets a file's change
//! time, which nothing can set back). What goes back is a [`Plan`]: what only the child
//! changed is applied; a path both changed is compared by content ([`parse_digests`]), and
//! when they differ the parent's version stays and the child's lands beside it, never
//! silently lost. A git work tree the child changed comes back as the branch
//! `hermes-subagent/<id>` in that repository instead (Hermes' own worktree-isolation
//! contract). What the child changed anywhere else ([`ELSEWHERE`]) is not copied but named
//! ([`Elsewhere`]), so the parent's model can redo it or ask for it.

use std::fmt;

use crate::error::Error;

mod elsewhere;
mod manifest;
mod plan;

pub(crate) use elsewhere::elsewhere_script;
pub use elsewhere::{ELSEWHERE, Elsewhere};
pub use manifest::{Manifest, Mark, Stamp, parse_digests};
pub(crate) use manifest::{UNREAD, digests_script, manifest_script, stamp_script};
pub use plan::{ChildChanges, Conflict, Plan, Sides};

/// The branch a child's commits come back on is this and the child's id.
pub const SUBAGENT_BRANCH_PREFIX: &str = "hermes-subagent/";

pub use sandbox_identity::SUBAGENT_KEY;

/// A child's version of a file the parent changed too lands beside it, named with this and
/// the child's id: `notes.txt.hermes-subagent-<id>`.
pub const CONFLICT_SUFFIX: &str = ".hermes-subagent-";

/// Directories under the sandbox user's home that never come back: caches that only cost
/// time to fill again (the package managers' and the toolchains' downloads), and this
/// crate's own live-process logs (under `.cache`).
pub const NOT_BROUGHT_BACK: [&str; 13] = [
    ".cache",
    ".npm",
    ".pnpm-store",
    ".local/share/pnpm/store",
    ".yarn/cache",
    ".yarn/berry/cache",
    ".bun/install/cache",
    ".cargo/registry",
    ".cargo/git",
    ".rustup/downloads",
    ".m2/repository",
    ".gradle/caches",
    "go/pkg/mod",
];

/// The most entries a manifest may hold: past it, the work is too big to bring back file by
/// file (a git work tree has no such limit).
pub const MAX_MANIFEST_ENTRIES: usize = 200_000;

/// What the kernel and the system own: no root is under them (changes there are named, not
/// copied: [`ELSEWHERE`]), except in the scratch directories ([`SCRATCH`]).
const SYSTEM: [&str; 13] = [
    "/proc", "/sys", "/dev", "/run", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/usr",
    "/etc", "/var",
];

/// Scratch space: never a root itself, but a directory under it that a child worked in is
/// (`cd /tmp/build && make`: its build comes back; a file it left in `/tmp` is named).
const SCRATCH: [&str; 2] = ["/tmp", "/var/tmp"];

/// Whether a directory may be a root: absolute and plain (no `.`, `..` or empty component,
/// no control character), not `/`, not scratch space itself, not under what the system owns
/// (less the scratch space).
pub fn may_be_root(dir: &str) -> bool {
    let plain = dir.starts_with('/')
        && dir.len() > 1
        && !dir.ends_with('/')
        && !dir.chars().any(char::is_control)
        && dir[1..]
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    let scratch = SCRATCH.iter().any(|tmp| is_within(dir, tmp));
    plain
        && !SCRATCH.contains(&dir)
        && (scratch || !SYSTEM.iter().any(|system| is_within(dir, system)))
}

/// Whether `path` is `dir` or under it (both absolute, plain).
pub fn is_within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The roots among `dirs` that may be roots ([`may_be_root`]), none under another, sorted.
pub fn roots<'a>(dirs: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut dirs: Vec<&str> = dirs.into_iter().filter(|dir| may_be_root(dir)).collect();
    dirs.sort_unstable();
    dirs.dedup();
    let mut roots: Vec<String> = Vec::new();
    for dir in dirs {
        // Sorted: a directory's ancestors come before it.
        if !roots.iter().any(|root| is_within(dir, root)) {
            roots.push(dir.to_owned());
        }
    }
    roots
}

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

/// `text` as one shell word.
pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// An absolute path as `find` prints it from `/` (its starting points given relative):
/// `home/user/x`.
pub(crate) fn from_root(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// `template` with each of its `keys` replaced by its value, in one pass (a value holding a
/// key is not replaced again).
pub(crate) fn fill(template: &str, keys: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    'scan: while !rest.is_empty() {
        for (key, value) in keys {
            if let Some(after) = rest.strip_prefix(key) {
                out.push_str(value);
                rest = after;
                continue 'scan;
            }
        }
        let next = rest.chars().next().map_or(1, char::len_utf8);
        out.push_str(&rest[..next]);
        rest = &rest[next..];
    }
    out
}

/// `dirs` (absolute) as `find`'s starting points from `/`: quoted shell words, space-separated.
pub(crate) fn find_starts(dirs: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    dirs.into_iter()
        .map(|dir| shell_quote(from_root(dir.as_ref())))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One `-path` test per path of `paths` (absolute), each matching that path only, for a
/// `find` started from `/` to prune.
pub(crate) fn find_prunes(paths: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<String> {
    paths
        .into_iter()
        .map(|path| {
            format!(
                "-path {}",
                shell_quote(&glob_literal(from_root(path.as_ref())))
            )
        })
        .collect()
}

/// `path` as a `find -path` pattern matching only itself (its glob characters escaped).
pub(crate) fn glob_literal(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn roots_are_plain_user_directories_none_inside_another() {
        // contract: R15
        assert_eq!(
            roots([
                "/home/user/proj",
                "/home/user",
                "/workspace",
                "/workspace/a",
                "/srv/app",
                "/",
                "/tmp/x",
                "/tmp",
                "/var/tmp/y",
                "/var/lib",
                "/usr/local/src",
                "/etc",
                "relative",
                "/home/user/../etc",
                "/home/user/",
                "/home/user",
            ]),
            [
                "/home/user",
                "/srv/app",
                "/tmp/x",
                "/var/tmp/y",
                "/workspace"
            ]
        );
        assert!(is_within("/a/b", "/a") && is_within("/a", "/a") && !is_within("/ab", "/a"));
        assert_eq!(glob_literal("/home/u/[x]*?"), "/home/u/\\[x\\]\\*\\?");
        assert_eq!(fill("a KEY b KEY", &[("KEY", "KEY!")]), "a KEY! b KEY!");
    }
}
