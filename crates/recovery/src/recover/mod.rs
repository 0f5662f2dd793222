//! The recovery itself: decide each sandbox file's outcome and write it through verified handles.

mod batch;
mod quarantine;

use std::io::{self, Read};
use std::path::PathBuf;

use cap_fs_ext::DirExt;
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use capped_tar::{Member, MemberKind, RejectReason};

use crate::Error;
use crate::base::PushBase;
use crate::host::{Comparison, HostOnly, Spool, TempError, compare_host, write_temp_batched};
use crate::report::{
    FileReport, Outcome, QuarantineReason, RecoveryReport, SkipReason, SnapshotState,
};
use crate::roots::RECOVERABLE_ROOTS;

/// The default cap on the snapshot stream: 2 GiB, the same as the teardown pull.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The quarantine tree, relative to the Hermes home; each sandbox gets `<this>/<sandbox id>/`.
pub const QUARANTINE_DIR: &str = "cache/e2b-recovered";

/// Longest name component the host is assumed to accept (`NAME_MAX`).
const NAME_MAX: usize = 255;
/// Longest absolute path the host is assumed to accept, terminator included (`PATH_MAX`).
const PATH_MAX: usize = 4096;
/// Files up to this size are held in memory while compared; larger ones in a temp file.
const MEMORY_SPOOL_LIMIT: u64 = 8 * 1024 * 1024;
/// How many `name~N` alternatives a quarantine destination may try.
const MAX_ALTERNATES: u32 = 1000;

/// What to recover, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// The host Hermes home (`~/.hermes`, or a profile home). It may be a symlink.
    pub hermes_home: PathBuf,
    /// The sandbox recovered from; names its quarantine directory, so it must be a plain name.
    pub sandbox_id: String,
    /// Host-only paths, absolute or relative to the home: credential files, `config.yaml`,
    /// `.env`, `platforms/`, the mirrored cache trees. A path covers everything below it. They
    /// are never written from sandbox data, in place or in quarantine.
    pub host_only: Vec<PathBuf>,
    /// Cap on the snapshot stream in bytes ([`DEFAULT_MAX_SNAPSHOT_BYTES`]).
    pub max_snapshot_bytes: u64,
    /// What this host last pushed into this sandbox ([`PushBase::load`]); `None`, or a base
    /// for another sandbox, means no base: every difference is a conflict.
    pub push_base: Option<PushBase>,
}

/// The shell command that makes the sandbox stream its snapshot, for `remote_hermes_home`
/// (e.g. `/home/user/.hermes`).
///
/// The snapshot is rooted at the sandbox's Hermes home: members are `skills/...` and
/// `memories/...`, as `tar -C <home> -cf - skills memories` writes them. When the home, or both
/// trees, do not exist the command writes an empty archive: that is "nothing to recover". Any
/// other failure exits non-zero, which the caller must treat as an unreadable snapshot.
pub fn snapshot_command(remote_hermes_home: &str) -> Result<String, Error> {
    if !remote_hermes_home.starts_with('/') || remote_hermes_home.contains('\0') {
        return Err(Error::InvalidRemoteHome {
            path: remote_hermes_home.to_owned(),
        });
    }
    let home = remote_hermes_home.replace('\'', "'\\''");
    Ok(format!(
        "h='{home}'; if [ ! -e \"$h\" ] && [ ! -L \"$h\" ]; then exec tar -cf - -T /dev/null; fi; \
         cd -- \"$h\" || exit 1; set --; \
         for d in skills memories; do if [ -e \"$d\" ] || [ -L \"$d\" ]; then set -- \"$@\" \"$d\"; fi; done; \
         exec tar -cf - -T /dev/null \"$@\""
    ))
}

/// Recovers the sandbox's `skills/` and `memories/` from `snapshot` (a tar stream rooted at the
/// sandbox's Hermes home, see [`snapshot_command`]) into the host Hermes home.
///
/// Every file member ends restored, unchanged, quarantined or skipped, and is listed in the
/// report. Host files are never modified. Every write goes through a `cap_std` directory
/// handle opened, one component at a time and without following symlinks, from the verified
/// home; files are written to a temp name and then given their name only if it is still free.
pub fn recover(config: &RecoveryConfig, snapshot: &mut dyn Read) -> Result<RecoveryReport, Error> {
    check_sandbox_id(&config.sandbox_id)?;
    let id = config.sandbox_id.as_str();
    let home_failure = |source| Error::HomeUnusable {
        sandbox_id: id.to_owned(),
        home: config.hermes_home.clone(),
        source,
    };
    // A symlinked home is not a redirection: resolve it once, then work from the handle.
    let home_phys = std::fs::canonicalize(&config.hermes_home).map_err(home_failure)?;
    let home = Dir::open_ambient_dir(&home_phys, ambient_authority()).map_err(home_failure)?;
    let base = config
        .push_base
        .as_ref()
        .filter(|base| base.sandbox_id() == id);
    let mut run = Run {
        id,
        base,
        home_len: home_phys.as_os_str().len(),
        host_only: HostOnly::resolve(&config.host_only, &config.hermes_home, &home_phys),
        roots: Vec::new(),
        home,
        quarantine: None,
        files: Vec::new(),
        seq: 0,
        pending: batch::Batch::default(),
        walked: None,
    };
    for root in RECOVERABLE_ROOTS {
        let state = run.probe_root(root)?;
        run.roots.push((root, state));
    }
    let read = capped_tar::read(snapshot, config.max_snapshot_bytes, &mut run);
    // Files read in full before a failure are restored all the same, as one at a time would
    // have been; the snapshot's failure is the one reported.
    let settled = run.settle();
    let read = read?;
    settled?;
    let state = if read.files + read.directories + read.rejected == 0 {
        SnapshotState::NothingToRecover
    } else {
        SnapshotState::Recovered
    };
    Ok(RecoveryReport {
        sandbox_id: id.to_owned(),
        state,
        files: run.files,
    })
}

fn check_sandbox_id(id: &str) -> Result<(), Error> {
    let plain = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        Ok(())
    } else {
        Err(Error::InvalidSandboxId {
            sandbox_id: id.to_owned(),
        })
    }
}

/// A recoverable root as found on the host.
enum Root {
    Absent,
    Dir(Dir),
    Redirected,
    NotADirectory,
}

/// Where a destination stands after walking to it.
enum Place {
    Skip(SkipReason),
    Quarantine(QuarantineReason),
    /// The file is absent; `create` are the directories still to make below `dir`.
    Missing {
        dir: Dir,
        create: Vec<String>,
    },
    /// A regular file is there.
    Regular {
        dir: Dir,
    },
}

struct Run<'a> {
    id: &'a str,
    /// What this host last pushed into this sandbox, if known.
    base: Option<&'a PushBase>,
    home: Dir,
    home_len: usize,
    host_only: HostOnly,
    roots: Vec<(&'static str, Root)>,
    /// The verified `cache/e2b-recovered/<id>` directory, opened on first need.
    quarantine: Option<Dir>,
    files: Vec<FileReport>,
    seq: u64,
    /// Restored files waiting for one batched sync before they take their names.
    pending: batch::Batch,
    /// The directory the last walk reached (its path below the home, its verified handle):
    /// members of one directory come together in a tar, so most skip the walk.
    walked: Option<(String, Dir)>,
}

impl Run<'_> {
    /// Decides and writes one file member. Called only from the visitor's `file`, which
    /// pushes the member's report entry right after (a restore waiting for its name refers to
    /// that entry by index).
    fn file(&mut self, path: &str, body: Body<'_>) -> Result<Outcome, Error> {
        let comps: Vec<&str> = path.split('/').collect();
        if comps.len() < 2 || !RECOVERABLE_ROOTS.contains(&comps[0]) {
            return Ok(skipped(SkipReason::OutsideRecoverableTrees));
        }
        if comps.iter().any(|c| c.len() > NAME_MAX) {
            return Ok(skipped(SkipReason::NameTooLong));
        }
        if self.home_len + 1 + path.len() >= PATH_MAX {
            return Ok(skipped(SkipReason::PathTooLong));
        }
        if self.host_only.covers(path) {
            return self.quarantine_stream(path, body, QuarantineReason::HostOnlyPath);
        }
        let name = comps[comps.len() - 1];
        match self.locate(&comps)? {
            Place::Skip(reason) => Ok(skipped(reason)),
            Place::Quarantine(reason) => self.quarantine_stream(path, body, reason),
            Place::Missing { dir, create } => self.restore(path, &comps, dir, create, name, body),
            Place::Regular { dir } => {
                let spool = self.spool(path, body)?;
                let outcome = self.settle_against_host(&dir, name, path, &spool);
                spool.discard();
                outcome
            }
        }
    }

    fn probe_root(&self, root: &str) -> Result<Root, Error> {
        match self.home.symlink_metadata(root) {
            Ok(meta) if meta.is_dir() => Ok(self
                .home
                .open_dir_nofollow(root)
                .map_or(Root::Redirected, Root::Dir)),
            Ok(meta) if meta.file_type().is_symlink() => Ok(Root::Redirected),
            Ok(_) => Ok(Root::NotADirectory),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Root::Absent),
            Err(source) => Err(self.host_io("inspect", root, source)),
        }
    }

    /// Walks from the root to the destination's directory, one component at a time, never
    /// following a symlink.
    fn locate(&mut self, comps: &[&str]) -> Result<Place, Error> {
        let name = comps[comps.len() - 1];
        let key = comps[..comps.len() - 1].join("/");
        let dir = match &self.walked {
            // The last member's directory, verified then: its handle is still that directory.
            Some((walked, dir)) if *walked == key => self.try_clone(dir)?,
            _ => match self.walk(comps)? {
                Ok(dir) => {
                    self.walked = Some((key, self.try_clone(&dir)?));
                    dir
                }
                Err(place) => return Ok(place),
            },
        };
        match dir.symlink_metadata(name) {
            Ok(meta) if meta.is_file() => Ok(Place::Regular { dir }),
            Ok(_) => Ok(Place::Quarantine(QuarantineReason::HostNotRegularFile)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Place::Missing {
                dir,
                create: Vec::new(),
            }),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                Ok(Place::Quarantine(QuarantineReason::HostUnreadable))
            }
            Err(source) => Err(self.host_io("inspect", &comps.join("/"), source)),
        }
    }

    /// The walk of [`Self::locate`] down to the destination's directory: its handle, or where
    /// the destination stands when the walk cannot reach it.
    fn walk(&self, comps: &[&str]) -> Result<Result<Dir, Place>, Error> {
        let root = comps[0];
        let parents = &comps[1..comps.len() - 1];
        let state = &self
            .roots
            .iter()
            .find(|(r, _)| *r == root)
            .expect("a recoverable root")
            .1;
        let mut dir = match state {
            Root::Redirected => {
                return Ok(Err(Place::Quarantine(QuarantineReason::RedirectedRoot {
                    root: root.to_owned(),
                })));
            }
            Root::NotADirectory => {
                return Ok(Err(Place::Skip(SkipReason::AncestorIsFile {
                    at: root.to_owned(),
                })));
            }
            Root::Absent => {
                let create = comps[..comps.len() - 1]
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect();
                return Ok(Err(Place::Missing {
                    dir: self.try_clone(&self.home)?,
                    create,
                }));
            }
            Root::Dir(dir) => self.try_clone(dir)?,
        };
        for (index, comp) in parents.iter().enumerate() {
            let at = comps[..index + 2].join("/");
            match dir.symlink_metadata(comp) {
                Ok(meta) if meta.is_dir() => match dir.open_dir_nofollow(comp) {
                    Ok(next) => dir = next,
                    Err(_) => {
                        return Ok(Err(Place::Quarantine(
                            QuarantineReason::SymlinkedDirectory { at },
                        )));
                    }
                },
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Ok(Err(Place::Quarantine(
                        QuarantineReason::SymlinkedDirectory { at },
                    )));
                }
                Ok(_) => return Ok(Err(Place::Skip(SkipReason::AncestorIsFile { at }))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let create = parents[index..].iter().map(|c| (*c).to_owned()).collect();
                    return Ok(Err(Place::Missing { dir, create }));
                }
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                    return Ok(Err(Place::Skip(SkipReason::AncestorIsFile { at })));
                }
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    return Ok(Err(Place::Quarantine(QuarantineReason::HostUnreadable)));
                }
                Err(source) => return Err(self.host_io("inspect", &at, source)),
            }
        }
        Ok(Ok(dir))
    }

    /// Writes a file the host lacks: missing directories, then a temp file, then the name.
    fn restore(
        &mut self,
        path: &str,
        comps: &[&str],
        mut dir: Dir,
        create: Vec<String>,
        name: &str,
        body: Body<'_>,
    ) -> Result<Outcome, Error> {
        let first_created = comps.len() - 1 - create.len();
        for (offset, comp) in create.iter().enumerate() {
            let at = comps[..first_created + offset + 1].join("/");
            match dir.create_dir(comp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return self.unplaceable(path, &at, e, body),
            }
            dir = match dir.open_dir_nofollow(comp) {
                Ok(next) => next,
                Err(_) => {
                    return self.quarantine_stream(
                        path,
                        body,
                        QuarantineReason::SymlinkedDirectory { at },
                    );
                }
            };
            if first_created + offset == 0 {
                // The root itself was created: remember its handle for later members.
                let state = self.probe_root(comps[0])?;
                if let Some(slot) = self.roots.iter_mut().find(|(r, _)| *r == comps[0]) {
                    slot.1 = state;
                }
            }
        }
        let Body {
            content,
            size,
            executable,
        } = body;
        let temp = match write_temp_batched(&dir, &mut self.seq, content, size, executable) {
            Ok(temp) => temp,
            Err(TempError::Create(e)) => {
                return self.unplaceable(
                    path,
                    path,
                    e,
                    Body {
                        content,
                        size,
                        executable,
                    },
                );
            }
            Err(TempError::Source(e)) => return Err(self.content_failed(path, e)),
            Err(TempError::Short) => return Err(self.content_short(path)),
            Err(TempError::Write(source)) => return Err(self.host_io("write", path, source)),
        };
        // Provisional: the batch names the file after syncing it, and corrects this entry if
        // the name was taken meanwhile (batch.rs).
        let report = self.files.len();
        self.wait_for_name(path, dir, temp, name, report);
        Ok(Outcome::Restored)
    }

    /// A restore that cannot be placed before any content was read.
    fn unplaceable(
        &mut self,
        path: &str,
        at: &str,
        error: io::Error,
        body: Body<'_>,
    ) -> Result<Outcome, Error> {
        match host_write_verdict(&error, at) {
            Verdict::Skip(reason) => Ok(skipped(reason)),
            Verdict::Quarantine(reason) => self.quarantine_stream(path, body, reason),
            Verdict::Fail => Err(self.host_io("create", at, error)),
        }
    }

    fn try_clone(&self, dir: &Dir) -> Result<Dir, Error> {
        dir.try_clone()
            .map_err(|source| self.host_io("duplicate handle", "", source))
    }

    fn refuse(&self, at: &str, reason: &'static str) -> Error {
        Error::QuarantineRefused {
            sandbox_id: self.id.to_owned(),
            path: PathBuf::from(at),
            reason,
        }
    }

    /// A sandbox file whose host name is taken: identical content is left alone; content this
    /// host pushed last is superseded by the host's edit (S15); anything else keeps the host
    /// copy and quarantines the sandbox's (S6).
    fn settle_against_host(
        &mut self,
        dir: &Dir,
        name: &str,
        path: &str,
        spool: &Spool,
    ) -> Result<Outcome, Error> {
        let reason =
            match compare_host(dir, name, spool).map_err(|e| self.host_io("compare", path, e))? {
                Comparison::Same => return Ok(Outcome::Unchanged),
                Comparison::Different if self.pushed_last(path, spool)? => {
                    return Ok(Outcome::Superseded);
                }
                Comparison::Different => QuarantineReason::Conflict,
                Comparison::Unreadable => QuarantineReason::HostUnreadable,
                Comparison::NotRegular => QuarantineReason::HostNotRegularFile,
            };
        self.quarantine_spool(path, spool, reason)
    }

    /// Whether the sandbox copy is exactly what this host last pushed to `path`: the sandbox
    /// wrote nothing there since, so only the host's version is news.
    fn pushed_last(&self, path: &str, spool: &Spool) -> Result<bool, Error> {
        let Some(base) = self.base else {
            return Ok(false);
        };
        let mut reader = spool
            .reader()
            .map_err(|e| self.host_io("read spool", path, e))?;
        base.was_pushed(path, &mut reader)
            .map_err(|e| self.host_io("read spool", path, e))
    }

    fn host_io(&self, operation: &'static str, at: &str, source: io::Error) -> Error {
        Error::HostIo {
            sandbox_id: self.id.to_owned(),
            operation,
            path: PathBuf::from(at),
            source,
        }
    }

    /// A failure reading member content. The snapshot reader reports what really happened
    /// underneath instead (over the cap, truncated, source failure); this is what remains
    /// when the stream itself looks fine.
    fn content_failed(&self, path: &str, error: io::Error) -> Error {
        self.snapshot_failed(capped_tar::Error::Malformed {
            member: Some(path.to_owned()),
            detail: format!("member content: {error}"),
        })
    }

    fn content_short(&self, path: &str) -> Error {
        self.snapshot_failed(capped_tar::Error::Malformed {
            member: Some(path.to_owned()),
            detail: "member content ended early".to_owned(),
        })
    }

    fn snapshot_failed(&self, source: capped_tar::Error) -> Error {
        Error::Snapshot {
            sandbox_id: self.id.to_owned(),
            source,
        }
    }
}

/// The snapshot reader hands every member here: rejected members and files become report
/// entries, directories only shape the tree.
impl capped_tar::Visitor for Run<'_> {
    type Error = Error;

    fn archive_failed(&self, error: capped_tar::Error) -> Error {
        self.snapshot_failed(error)
    }

    fn directory(&mut self, _member: &Member) -> Result<(), Error> {
        Ok(())
    }

    fn file(&mut self, member: &Member, content: &mut dyn Read) -> Result<(), Error> {
        // The reader calls `file` for file members only.
        let MemberKind::File { size, executable } = member.kind else {
            return Ok(());
        };
        let path = member.path.as_str();
        let outcome = self.file(
            path,
            Body {
                content,
                size,
                executable,
            },
        )?;
        self.files.push(FileReport {
            member: path.to_owned(),
            outcome,
        });
        if self.pending.is_full() {
            self.settle()?;
        }
        Ok(())
    }

    fn rejected(&mut self, name: &str, reason: RejectReason) -> Result<(), Error> {
        self.files.push(FileReport {
            member: name.to_owned(),
            outcome: skipped(SkipReason::Rejected(reason)),
        });
        Ok(())
    }
}

/// A file member's unread content.
struct Body<'a> {
    content: &'a mut dyn Read,
    size: u64,
    executable: bool,
}

enum Verdict {
    Skip(SkipReason),
    Quarantine(QuarantineReason),
    Fail,
}

/// What a failed host write means for the one file concerned.
fn host_write_verdict(error: &io::Error, at: &str) -> Verdict {
    match error.kind() {
        io::ErrorKind::InvalidFilename => Verdict::Skip(SkipReason::NameTooLong),
        io::ErrorKind::InvalidInput => Verdict::Skip(SkipReason::Unrepresentable),
        io::ErrorKind::NotADirectory => {
            Verdict::Skip(SkipReason::AncestorIsFile { at: parent_of(at) })
        }
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            Verdict::Quarantine(QuarantineReason::HostUnwritable)
        }
        _ => Verdict::Fail,
    }
}

fn parent_of(at: &str) -> String {
    at.rsplit_once('/').map_or(at, |(dir, _)| dir).to_owned()
}

fn skipped(reason: SkipReason) -> Outcome {
    Outcome::Skipped { reason }
}
