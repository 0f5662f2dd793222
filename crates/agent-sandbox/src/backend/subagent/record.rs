//! A child's fork as the host remembers it until its work is back (R15): which child, which
//! fork of which parent sandbox, which task and directory, and the base the work is measured
//! from. Written once the fork's base is read, removed when its work is back; what is left
//! belongs to a process that died mid-child, and `Backend::recover_child` brings that fork's
//! work back from it. One owner-only file per fork under the profile's
//! `cache/e2b/subagents/`, written atomically by writer-lease's host.

use std::path::{Path, PathBuf};

use e2b_client::SandboxId;
use writer_lease::Host;

use super::{Base, ChildSandbox};
use crate::error::Error;
use crate::subagent::{ChildId, Manifest};

/// The record's first line (its format's version).
const HEADER: &str = "hermes-e2b subagent fork 1";

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

    /// Header lines, then for a files base the two manifests, each as `<name> <length>`, a
    /// newline and its bytes.
    fn to_bytes(&self) -> Vec<u8> {
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
        )
        .into_bytes();
        match &self.base {
            Base::Git { top, head } => {
                out.extend_from_slice(format!("base git\ntop {top}\nhead {head}\n").as_bytes());
            }
            Base::Files { child, parent } => {
                out.extend_from_slice(b"base files\n");
                for (name, manifest) in [("child", child), ("parent", parent)] {
                    let bytes = manifest.to_bytes();
                    out.extend_from_slice(format!("{name} {}\n", bytes.len()).as_bytes());
                    out.extend_from_slice(&bytes);
                }
            }
        }
        out
    }

    /// Parses [`ForkRecord::to_bytes`]; every field checked as when it was first read.
    fn parse(bytes: &[u8]) -> Result<ForkRecord, String> {
        let mut cursor = Cursor(bytes);
        if cursor.line("header")? != HEADER {
            return Err("it is not a subagent fork record this version reads".to_owned());
        }
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
        let base = match cursor.field("base")?.as_str() {
            "git" => Base::Git {
                top: cursor.field("top")?,
                head: cursor.field("head")?,
            },
            "files" => Base::Files {
                child: cursor.manifest("child")?,
                parent: cursor.manifest("parent")?,
            },
            other => return Err(format!("unknown base {other:?}")),
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

    #[test]
    fn a_files_record_reads_back_as_written() {
        let child = Manifest::parse(b"f 4 1.5 1.5 644 ./a.txt\0l ./link\0a.txt\0").unwrap();
        let parent = Manifest::parse(b"f 5 2.5 2.5 600 ./b b.txt\0").unwrap();
        let written = record(Base::Files { child, parent });
        let read = ForkRecord::parse(&written.to_bytes()).unwrap();
        assert_eq!(read.to_bytes(), written.to_bytes());
        let Base::Files { child, parent } = read.base else {
            panic!("a files base")
        };
        assert_eq!(child.entries().len(), 2);
        assert_eq!(parent.entries().keys().collect::<Vec<_>>(), ["b b.txt"]);
        assert_eq!(read.task_id, "session:agent:main:api_server:x");
    }

    #[test]
    fn a_git_record_reads_back_and_a_cut_or_foreign_one_is_refused() {
        let written = record(Base::Git {
            top: "/home/user/proj".to_owned(),
            head: "a".repeat(40),
        });
        let bytes = written.to_bytes();
        let read = ForkRecord::parse(&bytes).unwrap();
        assert!(matches!(read.base, Base::Git { ref head, .. } if head.len() == 40));
        assert!(ForkRecord::parse(&bytes[..bytes.len() - 10]).is_err());
        assert!(ForkRecord::parse(b"something else\n").is_err());
        let files = record(Base::Files {
            child: Manifest::parse(b"f 4 1.5 1.5 644 ./a.txt\0").unwrap(),
            parent: Manifest::default(),
        })
        .to_bytes();
        assert!(ForkRecord::parse(&files[..files.len() - 3]).is_err());
    }
}
