//! A child's fork as the host remembers it until its work is back (R15): which child, which
//! fork of which parent sandbox, which task and directory, and the base the work is measured
//! from. Written once the fork's base is read, removed when its work is back; what is left
//! belongs to a process that died mid-child, and `Backend::recover_child` brings that fork's
//! work back from it. One owner-only file per fork under the profile's
//! `cache/e2b/subagents/`, written atomically by writer-lease's host.

use std::path::{Path, PathBuf};

use e2b_client::SandboxId;
use writer_lease::Host;

use super::{Base, ChildSandbox, WorkTree};
use crate::error::Error;
use crate::subagent::{ChildChanges, ChildId, Manifest, Stamp};

/// The record's first line (its format's version).
const HEADER: &str = "hermes-e2b subagent fork 2";

/// The first line of records written before stamps, which this version still reads: a
/// crash before an upgrade loses no child's work.
const HEADER_1: &str = "hermes-e2b subagent fork 1";

/// What a record holds.
#[derive(Clone, Debug)]
pub(crate) struct ForkRecord {
    pub(in crate::backend) child: ChildId,
    pub(in crate::backend) fork: SandboxId,
    pub(crate) parent: SandboxId,
    /// The parent's scope (its container key): the fork's work lands under its state lock.
    pub(crate) task_id: String,
    pub(in crate::backend) dir: String,
    pub(in crate::backend) forked_at: std::time::SystemTime,
    pub(in crate::backend) base: Base,
}

fn sandbox_id(text: String) -> Result<SandboxId, String> {
    SandboxId::parse(text.clone()).ok_or_else(|| format!("{text:?} is not a sandbox id"))
}

/// What is left of a record being read.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn line(&mut self, what: &str) -> Result<String, String> {
        let end = self
            .0
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| format!("the record ends before its {what} line"))?;
        let text = std::str::from_utf8(&self.0[..end])
            .map_err(|_| format!("its {what} line is not UTF-8"))?
            .to_owned();
        self.0 = &self.0[end + 1..];
        Ok(text)
    }

    /// The next line, left to read.
    fn peek_line(&self, what: &str) -> Result<String, String> {
        Cursor(self.0).line(what)
    }

    /// A `<name> <value>` line's value.
    fn field(&mut self, name: &str) -> Result<String, String> {
        let text = self.line(name)?;
        text.strip_prefix(name)
            .and_then(|value| value.strip_prefix(' '))
            .map(str::to_owned)
            .ok_or_else(|| format!("a {name} line was expected, not {text:?}"))
    }

    /// A `<name> <length>` line and that many bytes of a manifest.
    fn manifest(&mut self, name: &str) -> Result<Manifest, String> {
        let length: usize = self
            .field(name)?
            .parse()
            .map_err(|_| format!("the {name} manifest's length is not a number"))?;
        let body = self
            .0
            .get(..length)
            .ok_or_else(|| format!("the {name} manifest is cut short"))?;
        let manifest = Manifest::parse(body)?;
        self.0 = &self.0[length..];
        Ok(manifest)
    }
}

/// Where the record of `fork` lives under `profile_home`.
pub(crate) fn record_path(profile_home: &Path, fork: &SandboxId) -> PathBuf {
    profile_home
        .join("cache")
        .join("e2b")
        .join("subagents")
        .join(fork.as_str())
}

impl ForkRecord {
    pub(in crate::backend) fn of(child: &ChildSandbox, task_id: &str) -> ForkRecord {
        ForkRecord {
            child: child.id.clone(),
            fork: child.sandbox_id.clone(),
            parent: child.parent.clone(),
            task_id: task_id.to_owned(),
            dir: child.dir.clone(),
            forked_at: child.forked_at,
            base: child.base.clone(),
        }
    }

    /// Header lines, one line per root, prune, late directory and work tree, then the
    /// parent's manifest as `parent <length>`, a newline and its bytes.
    fn to_bytes(&self) -> Vec<u8> {
        let base = &self.base;
        let mut out = format!(
            "{HEADER}\nchild {}\nfork {}\nparent {}\ntask {}\ndir {}\nforked_at {}\n",
            self.child,
            self.fork.as_str(),
            self.parent.as_str(),
            self.task_id,
            self.dir,
            self.forked_at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs())
        );
        out.push_str(&format!("parent_since {}\n", base.parent_since));
        match &base.child {
            ChildChanges::Since(since) => out.push_str(&format!("child_since {since}\n")),
            ChildChanges::Listed(_) => out.push_str("child_listed\n"),
        }
        for (key, dirs) in [
            ("root", &base.roots),
            ("prune", &base.prune),
            ("late", &base.late),
        ] {
            for dir in dirs {
                out.push_str(&format!("{key} {dir}\n"));
            }
        }
        for tree in &base.trees {
            out.push_str(&format!("tree {} {}\n", tree.head, tree.top));
        }
        let mut out = out.into_bytes();
        if let ChildChanges::Listed(listed) = &base.child {
            let bytes = listed.to_bytes();
            out.extend_from_slice(format!("child {}\n", bytes.len()).as_bytes());
            out.extend_from_slice(&bytes);
        }
        let bytes = base.parent.to_bytes();
        out.extend_from_slice(format!("manifest {}\n", bytes.len()).as_bytes());
        out.extend_from_slice(&bytes);
        out
    }

    /// Parses [`ForkRecord::to_bytes`] (or a record of the first format); every field
    /// checked as when it was first read.
    fn parse(bytes: &[u8]) -> Result<ForkRecord, String> {
        let mut cursor = Cursor(bytes);
        let header = cursor.line("header")?;
        let first = match header.as_str() {
            HEADER => false,
            HEADER_1 => true,
            _ => return Err("it is not a subagent fork record this version reads".to_owned()),
        };
        let child = ChildId::new(&cursor.field("child")?).map_err(|error| error.to_string())?;
        let fork = sandbox_id(cursor.field("fork")?)?;
        let parent = sandbox_id(cursor.field("parent")?)?;
        let task_id = cursor.field("task")?;
        let dir = cursor.field("dir")?;
        if !dir.starts_with('/') {
            return Err(format!("the directory {dir:?} is not absolute"));
        }
        let forked_at = cursor
            .field("forked_at")?
            .parse()
            .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .map_err(|_| "the fork's time is not a number".to_owned())?;
        let base = if first {
            first_base(&mut cursor, &dir)?
        } else {
            base(&mut cursor)?
        };
        if !cursor.0.is_empty() {
            return Err("it has bytes after its last field".to_owned());
        }
        Ok(ForkRecord {
            child,
            fork,
            parent,
            task_id,
            dir,
            forked_at,
            base,
        })
    }

    /// Adds `dir` to the directories outside the roots that the fork's child worked in;
    /// a record missing or unreadable is left as it is (logged).
    pub(in crate::backend) fn add_late(profile_home: &Path, fork: &SandboxId, dir: &str) {
        match ForkRecord::load(profile_home, fork) {
            Ok(mut record) => {
                if !record.base.late.iter().any(|known| known == dir) {
                    record.base.late.push(dir.to_owned());
                    record.write(profile_home);
                }
            }
            Err(error) => tracing::debug!(
                "the subagent fork {}'s record does not say it worked in {dir}: {error}",
                fork.as_str()
            ),
        }
    }

    /// Writes the record (owner-only, atomically); a failure is logged, not fatal: the child
    /// works without it, only a crash's recovery needs it.
    pub(in crate::backend) fn write(&self, profile_home: &Path) {
        if self.task_id.chars().any(char::is_control) {
            tracing::warn!(
                "subagent {}'s fork record was not written: its task id holds a control character",
                self.child
            );
            return;
        }
        let path = record_path(profile_home, &self.fork);
        let host = writer_lease::OsHost;
        let written = path
            .parent()
            .map_or(Ok(()), |dir| host.ensure_private_dir(dir))
            .and_then(|()| host.write_atomic(&path, &self.to_bytes()));
        if let Err(error) = written {
            tracing::warn!(
                "subagent {}'s fork record {} was not written ({error}): if this process dies mid-child, `hermes e2b pull --subagent {}` cannot bring its work back",
                self.child,
                path.display(),
                self.fork.as_str()
            );
        }
    }

    /// The record of `fork`, if this host has one.
    pub(crate) fn load(profile_home: &Path, fork: &SandboxId) -> Result<ForkRecord, Error> {
        let path = record_path(profile_home, fork);
        let bytes = writer_lease::OsHost.read(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::InvalidConfig {
                    reason: format!(
                        "this host has no record of a subagent fork {0}: its work came back already, another host forked it (its base is kept only where it was made), or its process died before the child ran anything; `hermes e2b rm {0}` kills it",
                        fork.as_str()
                    ),
                }
            } else {
                Error::Io {
                    operation: "subagent record read",
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let record = ForkRecord::parse(&bytes).map_err(|reason| Error::InvalidConfig {
            reason: format!(
                "the subagent fork record {} is unreadable: {reason}",
                path.display()
            ),
        })?;
        if record.fork != *fork {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the subagent fork record {} names fork {}, not {}",
                    path.display(),
                    record.fork.as_str(),
                    fork.as_str()
                ),
            });
        }
        Ok(record)
    }

    /// Removes the record of `fork` (its work is back); a record already gone is fine.
    pub(in crate::backend) fn remove(profile_home: &Path, fork: &SandboxId) {
        let path = record_path(profile_home, fork);
        if let Err(error) = writer_lease::OsHost.remove(&path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "the subagent fork record {} was not removed: {error}",
                path.display()
            );
        }
    }
}

/// Where the note of a fork kept for a handed-off process lives.
pub(crate) fn held_path(profile_home: &Path, fork: &SandboxId) -> PathBuf {
    record_path(profile_home, fork).with_extension("held")
}

/// Notes that `fork` is kept running for `what` (one line, control characters dropped).
pub(in crate::backend) fn write_held(profile_home: &Path, fork: &SandboxId, what: &str) {
    let line: String = what.chars().filter(|c| !c.is_control()).take(500).collect();
    let path = held_path(profile_home, fork);
    let host = writer_lease::OsHost;
    let written = path
        .parent()
        .map_or(Ok(()), |dir| host.ensure_private_dir(dir))
        .and_then(|()| host.write_atomic(&path, format!("{line}\n").as_bytes()));
    if let Err(error) = written {
        tracing::warn!(
            "the note that fork {} is kept ({line}) was not written: {error}",
            fork.as_str()
        );
    }
}

/// What keeps `fork` running, if this host noted it.
pub(crate) fn read_held(profile_home: &Path, fork: &SandboxId) -> Option<String> {
    let bytes = writer_lease::OsHost
        .read(&held_path(profile_home, fork))
        .ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_owned())
}

/// Removes the note that `fork` is kept (a note already gone is fine).
pub(in crate::backend) fn remove_held(profile_home: &Path, fork: &SandboxId) {
    let path = held_path(profile_home, fork);
    if let Err(error) = writer_lease::OsHost.remove(&path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("the note {} was not removed: {error}", path.display());
    }
}

/// A record's base, after its header fields.
fn base(cursor: &mut Cursor<'_>) -> Result<Base, String> {
    let stamp = |text: String, what: &str| {
        Stamp::parse(&text).ok_or_else(|| format!("the {what} is not a time"))
    };
    let parent_since = stamp(cursor.field("parent_since")?, "parent's file clock")?;
    let listed = match cursor.line("child")? {
        text if text == "child_listed" => None,
        text => Some(stamp(
            text.strip_prefix("child_since ")
                .ok_or_else(|| format!("a child_since line was expected, not {text:?}"))?
                .to_owned(),
            "fork's file clock",
        )?),
    };
    let (mut roots, mut prune, mut late, mut trees) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let child = loop {
        let text = cursor.peek_line("manifest")?;
        let Some((key, value)) = text.split_once(' ') else {
            return Err(format!("unknown record line {text:?}"));
        };
        let absolute = |value: &str| {
            if value.starts_with('/') && !value.split('/').any(|part| part == "..") {
                Ok(value.to_owned())
            } else {
                Err(format!("{value:?} is not an absolute path"))
            }
        };
        match key {
            "root" => roots.push(absolute(value)?),
            "prune" => prune.push(absolute(value)?),
            "late" => late.push(absolute(value)?),
            "tree" => {
                let (head, top) = value
                    .split_once(' ')
                    .ok_or_else(|| format!("bad tree line {text:?}"))?;
                trees.push(WorkTree::checked(Some(top), Some(head))?);
            }
            "child" | "manifest" => {
                break match listed {
                    Some(since) => ChildChanges::Since(since),
                    None => ChildChanges::Listed(cursor.manifest("child")?),
                };
            }
            _ => return Err(format!("unknown record line {text:?}")),
        }
        cursor.line("base")?;
    };
    let parent = cursor.manifest("manifest")?;
    Ok(Base {
        roots,
        prune,
        trees,
        parent,
        parent_since,
        child,
        late,
    })
}

/// A first-format record's base (a git work tree or one directory's two manifests), as
/// this version measures it: the tree's branch; or the directory's files, the child's
/// changes found against the fork's manifest.
fn first_base(cursor: &mut Cursor<'_>, dir: &str) -> Result<Base, String> {
    let zero = Stamp::parse("0").expect("zero");
    let mut base = Base {
        roots: Vec::new(),
        prune: Vec::new(),
        trees: Vec::new(),
        parent: Manifest::default(),
        parent_since: zero,
        child: ChildChanges::Listed(Manifest::default()),
        late: Vec::new(),
    };
    match cursor.field("base")?.as_str() {
        "git" => {
            let top = cursor.field("top")?;
            let head = cursor.field("head")?;
            base.trees.push(WorkTree::checked(Some(&top), Some(&head))?);
        }
        "files" => {
            let child = cursor.manifest("child")?;
            let parent = cursor.manifest("parent")?;
            base.roots.push(dir.to_owned());
            // What the first format left out, by name.
            base.prune = [".git", ".hermes"]
                .iter()
                .map(|name| format!("{}/{name}", dir.trim_end_matches('/')))
                .collect();
            base.parent = parent.under(dir);
            base.child = ChildChanges::Listed(child.under(dir));
        }
        other => return Err(format!("unknown base {other:?}")),
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(base: Base) -> ForkRecord {
        ForkRecord {
            child: ChildId::new("sa-0-abc").unwrap(),
            fork: SandboxId::parse("fork1".to_owned()).unwrap(),
            parent: SandboxId::parse("parent1".to_owned()).unwrap(),
            task_id: "session:agent:main:api_server:x".to_owned(),
            dir: "/home/user/proj".to_owned(),
            forked_at: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000),
            base,
        }
    }

    fn base() -> Base {
        Base {
            roots: vec!["/home/user".to_owned(), "/work space".to_owned()],
            prune: vec!["/home/user/.cache".to_owned()],
            trees: vec![WorkTree {
                top: "/home/user/my repo".to_owned(),
                head: "a".repeat(40),
            }],
            parent: Manifest::parse(
                b"f 5 2.5 2.5 600 home/user/b b.txt\0s 3.5 home/user/l\0b b.txt\0",
            )
            .unwrap(),
            parent_since: Stamp::parse("1800000000.5").unwrap(),
            child: ChildChanges::Since(Stamp::parse("1800000001.25").unwrap()),
            late: vec!["/srv/app".to_owned()],
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_a_cut_or_foreign_one_is_refused() {
        // contract: R15
        let written = record(base());
        let bytes = written.to_bytes();
        let read = ForkRecord::parse(&bytes).unwrap();
        assert_eq!(read.to_bytes(), bytes);
        assert_eq!(read.base.roots, ["/home/user", "/work space"]);
        assert_eq!(read.base.trees[0].top, "/home/user/my repo");
        assert_eq!(read.base.late, ["/srv/app"]);
        assert_eq!(read.base.parent.entries().len(), 2);
        assert_eq!(read.task_id, "session:agent:main:api_server:x");
        assert!(ForkRecord::parse(&bytes[..bytes.len() - 3]).is_err());
        assert!(ForkRecord::parse(b"something else\n").is_err());
        let listed = record(Base {
            child: ChildChanges::Listed(Manifest::parse(b"f 1 1.5 1.5 644 home/user/a\0").unwrap()),
            ..base()
        });
        let read = ForkRecord::parse(&listed.to_bytes()).unwrap();
        assert_eq!(read.to_bytes(), listed.to_bytes());
        let text = String::from_utf8_lossy(&bytes).replace("late /srv/app", "late srv/../etc");
        assert!(ForkRecord::parse(text.as_bytes()).is_err());
    }

    #[test]
    fn a_first_format_record_is_still_read() {
        // contract: R15 — a child forked before an upgrade still comes back after it.
        let head = "b".repeat(40);
        let git = format!(
            "{HEADER_1}\nchild sa-1\nfork f1\nparent p1\ntask t\ndir /home/user/repo\nforked_at 5\n\
             base git\ntop /home/user/repo\nhead {head}\n"
        );
        let read = ForkRecord::parse(git.as_bytes()).unwrap();
        assert_eq!(
            read.base.trees,
            [WorkTree {
                top: "/home/user/repo".to_owned(),
                head
            }]
        );
        assert!(read.base.roots.is_empty());
        let child = b"f 4 1.5 1.5 644 ./a.txt\0";
        let parent = b"f 5 2.5 2.5 600 ./a.txt\0";
        let mut files = format!(
            "{HEADER_1}\nchild sa-1\nfork f1\nparent p1\ntask t\ndir /home/user/w\nforked_at 5\nbase files\nchild {}\n",
            child.len()
        )
        .into_bytes();
        files.extend_from_slice(child);
        files.extend_from_slice(format!("parent {}\n", parent.len()).as_bytes());
        files.extend_from_slice(parent);
        let read = ForkRecord::parse(&files).unwrap();
        assert_eq!(read.base.roots, ["/home/user/w"]);
        assert_eq!(
            read.base.parent.entries().keys().collect::<Vec<_>>(),
            ["home/user/w/a.txt"]
        );
        let ChildChanges::Listed(listed) = &read.base.child else {
            panic!("the fork's manifest")
        };
        assert!(listed.entries().contains_key("home/user/w/a.txt"));
    }
}
