//! One scope's coordination files: reading them, locking them, admitting readers.

use std::fmt;
use std::fs::{File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::Error;
use crate::host::{Host, MAX_RECORD_BYTES, OsHost};
use crate::key::{ScopeFile, ScopeKey};
use crate::records::{DirtyMarker, Generation, PreparedStamp, parse_generation};
#[cfg(target_os = "linux")]
use crate::writers_lock::{self, WritersFile};

/// What holds a writer's role for its session (never read: holding it is the lock).
#[derive(Debug)]
pub(crate) enum WriterHold {
    /// The scope's byte of the directory's writers' lock (Linux).
    #[cfg(target_os = "linux")]
    Byte { _held: writers_lock::ByteHold },
    /// The scope's own lock file, open with its `flock` (elsewhere).
    #[cfg(not(target_os = "linux"))]
    OwnFile { _held: File },
}

/// Why this host cannot protect concurrent same-scope sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DegradationCause {
    /// The platform or filesystem cannot take the lock (no flock, or a
    /// network/FUSE filesystem without a lock manager).
    LockingUnsupported,
    /// The coordination directory or a file in it cannot be created or
    /// written.
    MarkerDirUnusable,
}

impl fmt::Display for DegradationCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DegradationCause::LockingUnsupported => "file locking is not supported",
            DegradationCause::MarkerDirUnusable => "the coordination directory is not writable",
        })
    }
}

/// The one value that says this host is degraded (contract C6).
///
/// The caller logs it once at WARNING and carries on as the sole writer: a
/// single session works fully, concurrent same-scope sessions are not
/// protected from each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degradation {
    /// What is missing.
    pub cause: DegradationCause,
    /// The directory or file where it was found missing.
    pub path: PathBuf,
    /// The operating system's error message.
    pub detail: String,
}

impl Degradation {
    pub(crate) fn new(cause: DegradationCause, path: &Path, error: &io::Error) -> Self {
        Degradation {
            cause,
            path: path.to_path_buf(),
            detail: error.to_string(),
        }
    }
}

impl fmt::Display for Degradation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "concurrent same-scope persistent sessions are not supported here: {} ({}: {}); \
             this session acts as the sole writer",
            self.cause,
            self.path.display(),
            self.detail
        )
    }
}

/// Whether anyone holds a scope's writer role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterStatus {
    /// Some session (possibly in this process) holds it.
    Held,
    /// Nobody holds it.
    Free,
    /// The host cannot tell (see the degradation).
    Unknown(Degradation),
}

/// Whether a reader's command may run.
#[derive(Debug)]
#[must_use]
pub enum Admission {
    /// The scope is clean and stamped prepared for this sandbox.
    Admitted {
        /// The generation whose push the command runs against.
        generation: Generation,
    },
    /// The command must not run; fail closed with a retry hint.
    Refused(Refusal),
}

impl Admission {
    /// Whether the command may run.
    pub fn is_admitted(&self) -> bool {
        matches!(self, Admission::Admitted { .. })
    }
}

/// Why a reader's command is refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refusal {
    /// The scope is marked dirty.
    Dirty(DirtyMarker),
    /// No push by the current writer generation has completed.
    Unprepared,
    /// The stamp is for another sandbox than the one this reader attached to.
    OtherSandbox,
    /// The generation moved while admission was being decided, or a new writer holds the
    /// role and has not begun its transition yet.
    Changed,
    /// The coordination files could not be read; the gate cannot vouch for
    /// anything, so it refuses.
    Unreadable(Error),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Dirty(marker) => write!(f, "the scope is dirty: {}", marker.reason),
            Refusal::Unprepared => f.write_str("no writer has prepared the sandbox yet"),
            Refusal::OtherSandbox => f.write_str("the sandbox was prepared for another sandbox id"),
            Refusal::Changed => f.write_str("a writer started a new transition"),
            Refusal::Unreadable(error) => {
                // A refusal is shown as text, so it carries the error's causes along.
                write!(f, "the state markers are unreadable: {error}")?;
                let mut source = std::error::Error::source(error);
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
                Ok(())
            }
        }
    }
}

/// The coordination files of one scope in one directory (normally
/// `~/.hermes/cache/e2b/`).
///
/// Cheap to clone; holds no open files. Lock files are never deleted:
/// deleting a lock file someone holds would let a newcomer lock a fresh
/// inode beside them.
#[derive(Debug, Clone)]
pub struct ScopeFiles {
    dir: PathBuf,
    key: ScopeKey,
    host: Arc<dyn Host>,
    /// `dir` resolved, once (the writers' lock file's name in this process): a reader asks
    /// at every command, and resolving costs a system call per path component.
    resolved_dir: Arc<OnceLock<PathBuf>>,
}

impl ScopeFiles {
    /// The files of scope `key` in `dir`, on the real host.
    pub fn new(dir: PathBuf, key: ScopeKey) -> Self {
        ScopeFiles::with_host(dir, key, Arc::new(OsHost))
    }

    /// The files of scope `key` in `dir`, through a substitute [`Host`].
    pub fn with_host(dir: PathBuf, key: ScopeKey, host: Arc<dyn Host>) -> Self {
        ScopeFiles {
            dir,
            key,
            host,
            resolved_dir: Arc::new(OnceLock::new()),
        }
    }

    /// The coordination directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The coordination directory resolved (links followed), once it exists; as given before.
    fn resolved_dir(&self) -> &Path {
        if let Some(resolved) = self.resolved_dir.get() {
            return resolved;
        }
        match std::fs::canonicalize(&self.dir) {
            Ok(resolved) => self.resolved_dir.get_or_init(|| resolved),
            Err(_) => &self.dir,
        }
    }

    /// The scope key.
    pub fn key(&self) -> ScopeKey {
        self.key
    }

    /// The path of one of the scope's files.
    pub fn path(&self, file: ScopeFile) -> PathBuf {
        self.dir.join(self.key.file_name(file))
    }

    pub(crate) fn host(&self) -> &dyn Host {
        &*self.host
    }

    /// Whether anyone holds the writer role.
    ///
    /// Takes a shared lock for an instant; a session trying to become writer
    /// at that very instant is told the role is held and, like any reader,
    /// tries again at its next command.
    pub fn writer_status(&self) -> Result<WriterStatus, Error> {
        // The scope's own lock file first: a writer of an older version holds it.
        match self.lock(ScopeFile::WriterLock, LockKind::Shared)? {
            LockAttempt::Locked(_) => {}
            LockAttempt::Busy => return Ok(WriterStatus::Held),
            LockAttempt::Degraded(degradation) => return Ok(WriterStatus::Unknown(degradation)),
        }
        self.writer_byte_status()
    }

    /// Elsewhere the scope's own lock file is the writer's lock, and it was free.
    #[cfg(not(target_os = "linux"))]
    fn writer_byte_status(&self) -> Result<WriterStatus, Error> {
        Ok(WriterStatus::Free)
    }

    /// Whether the scope's byte of the writers' lock is held.
    #[cfg(target_os = "linux")]
    fn writer_byte_status(&self) -> Result<WriterStatus, Error> {
        let path = self.dir.join(writers_lock::FILE_NAME);
        let file = match WritersFile::open(self.host(), self.resolved_dir()) {
            Ok(file) => file,
            Err(error) => {
                return degradation_or_error("open lock file", &path, error)
                    .map(WriterStatus::Unknown);
            }
        };
        Ok(
            match file.is_held(self.host(), writers_lock::byte_of(self.key)) {
                Ok(true) => WriterStatus::Held,
                Ok(false) => WriterStatus::Free,
                Err(TryLockError::WouldBlock) => WriterStatus::Held,
                Err(TryLockError::Error(error)) => WriterStatus::Unknown(Degradation::new(
                    DegradationCause::LockingUnsupported,
                    &path,
                    &error,
                )),
            },
        )
    }

    /// Takes the writer's lock for the session, given the scope's own lock file just
    /// taken exclusively (`own`): elsewhere than on Linux, that file itself, held open.
    ///
    /// There record locks belong to the process, and closing any descriptor of the file
    /// anywhere in it (a backup reading the Hermes home, say) would drop them all; `flock`
    /// has no such hole, so a scope keeps its own file open there, as before.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn hold_writer(&self, own: File) -> Result<LockAttempt<WriterHold>, Error> {
        Ok(LockAttempt::Locked(WriterHold::OwnFile { _held: own }))
    }

    /// Takes the writer's lock for the session, given the scope's own lock file just
    /// taken exclusively (`own`, given back here): the scope's byte of the directory's
    /// writers' lock ([`writers_lock`]), so the process holds one descriptor for all its
    /// scopes.
    #[cfg(target_os = "linux")]
    pub(crate) fn hold_writer(&self, own: File) -> Result<LockAttempt<WriterHold>, Error> {
        drop(own);
        // The directory exists: the scope's own lock file was just taken in it.
        let path = self.dir.join(writers_lock::FILE_NAME);
        let file = match WritersFile::open(self.host(), self.resolved_dir()) {
            Ok(file) => file,
            Err(error) => return unusable_or_error("open lock file", &path, error),
        };
        Ok(
            match file.try_hold(Arc::clone(&self.host), writers_lock::byte_of(self.key)) {
                Ok(Some(hold)) => LockAttempt::Locked(WriterHold::Byte { _held: hold }),
                Ok(None) | Err(TryLockError::WouldBlock) => LockAttempt::Busy,
                Err(TryLockError::Error(error)) => LockAttempt::Degraded(Degradation::new(
                    DegradationCause::LockingUnsupported,
                    &path,
                    &error,
                )),
            },
        )
    }

    /// Decides whether a reader attached to `sandbox_id` may run a command
    /// now (contracts C2, C7).
    ///
    /// Admitted only if the scope is not dirty and the current generation
    /// stamped this sandbox prepared. Reads the generation, the stamp, the
    /// dirty marker and the generation again, in that order: a writer marks
    /// dirty before it bumps the generation and clears dirty only after it
    /// stamps, so any interleaving that passes saw a clean, stamped scope at
    /// the moment it read the marker. Fails closed on anything unreadable.
    pub fn admission(&self, sandbox_id: &str) -> Admission {
        match self.admission_inner(sandbox_id) {
            Ok(admission) => admission,
            Err(error) => Admission::Refused(Refusal::Unreadable(error)),
        }
    }

    fn admission_inner(&self, sandbox_id: &str) -> Result<Admission, Error> {
        // Held shared while the markers are read: a writer that took the role but has
        // not marked the scope dirty yet holds it exclusively (see `try_acquire_writer`).
        let _gate = match self.hold_gate(LockKind::Shared)? {
            GateHold::Held(file) => Some(file),
            GateHold::Busy => return Ok(Admission::Refused(Refusal::Changed)),
            GateHold::Unsupported => None,
        };
        let before = self.generation()?;
        let stamp = self.prepared()?;
        if let Some(marker) = self.dirty()? {
            return Ok(Admission::Refused(Refusal::Dirty(marker)));
        }
        let current =
            |stamp: &PreparedStamp| stamp.generation == before && before != Generation::NONE;
        let Some(stamp) = stamp.filter(current) else {
            return Ok(Admission::Refused(Refusal::Unprepared));
        };
        if self.generation()? != before {
            return Ok(Admission::Refused(Refusal::Changed));
        }
        if stamp.sandbox_id != sandbox_id {
            return Ok(Admission::Refused(Refusal::OtherSandbox));
        }
        Ok(Admission::Admitted { generation: before })
    }

    /// The dirty marker, if the scope is dirty.
    pub fn dirty(&self) -> Result<Option<DirtyMarker>, Error> {
        Ok(self
            .read_record(ScopeFile::Dirty, "read dirty marker")?
            .map(|bytes| DirtyMarker::parse(&bytes)))
    }

    /// The prepared stamp, if any push completed since the last transition
    /// began.
    pub fn prepared(&self) -> Result<Option<PreparedStamp>, Error> {
        const OPERATION: &str = "read prepared stamp";
        match self.read_record(ScopeFile::Prepared, OPERATION)? {
            None => Ok(None),
            Some(bytes) => PreparedStamp::parse(&bytes)
                .map(Some)
                .ok_or(Error::Corrupt {
                    operation: OPERATION,
                    path: self.path(ScopeFile::Prepared),
                    detail: "not a prepared stamp",
                }),
        }
    }

    /// The latest writer generation that began a transition.
    pub fn generation(&self) -> Result<Generation, Error> {
        const OPERATION: &str = "read writer generation";
        match self.read_record(ScopeFile::Generation, OPERATION)? {
            None => Ok(Generation::NONE),
            Some(bytes) => parse_generation(&bytes).ok_or(Error::Corrupt {
                operation: OPERATION,
                path: self.path(ScopeFile::Generation),
                detail: "not a generation record",
            }),
        }
    }

    fn read_record(
        &self,
        file: ScopeFile,
        operation: &'static str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let path = self.path(file);
        match self.host.read(&path) {
            Ok(bytes) if bytes.len() as u64 > MAX_RECORD_BYTES => Err(Error::Corrupt {
                operation,
                path,
                detail: "larger than any record this crate writes",
            }),
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(Error::io(operation, &path, error)),
        }
    }

    pub(crate) fn lock(&self, file: ScopeFile, kind: LockKind) -> Result<LockAttempt, Error> {
        let path = self.path(file);
        // The directory is made (or its failure told) only when the file cannot be opened: a
        // reader locks at every command, and the directory exists after the first. A failure
        // is the directory's when it has one, the same for every scope of the directory.
        let opened = match self.host.open_lock_file(&path) {
            Err(error) => {
                if let Err(error) = self.host.ensure_private_dir(&self.dir) {
                    return unusable_or_error("create coordination directory", &self.dir, error);
                }
                // Opened again only when the directory was missing: any other failure (out
                // of descriptors) is the file's, reported as it was.
                if error.kind() == io::ErrorKind::NotFound {
                    self.host.open_lock_file(&path)
                } else {
                    Err(error)
                }
            }
            opened => opened,
        };
        let handle = match opened {
            Ok(handle) => handle,
            Err(error) => return unusable_or_error("open lock file", &path, error),
        };
        let attempt = match kind {
            LockKind::Exclusive => self.host.try_lock(&handle),
            LockKind::Shared => self.host.try_lock_shared(&handle),
        };
        Ok(match attempt {
            Ok(()) => LockAttempt::Locked(handle),
            Err(TryLockError::WouldBlock) => LockAttempt::Busy,
            // Anything but "held by someone" means this filesystem cannot
            // lock (ENOLCK, EOPNOTSUPP, Unsupported). Reading it as contention
            // would report a phantom writer forever.
            Err(TryLockError::Error(error)) => LockAttempt::Degraded(Degradation::new(
                DegradationCause::LockingUnsupported,
                &path,
                &error,
            )),
        })
    }
}

/// Whether an error creating or opening a coordination file means the
/// directory cannot be used here at all (degrade), rather than a failure
/// that may pass (report). Degrading on a passing failure would make this
/// session a second, unprotected writer beside the real one.
pub(crate) fn is_unusable(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::PermissionDenied
            | io::ErrorKind::ReadOnlyFilesystem
            | io::ErrorKind::NotADirectory
            | io::ErrorKind::IsADirectory
            // create_dir_all on a path held by a regular file.
            | io::ErrorKind::AlreadyExists
            | io::ErrorKind::Unsupported
    )
}

fn unusable_or_error<T>(
    operation: &'static str,
    path: &Path,
    error: io::Error,
) -> Result<LockAttempt<T>, Error> {
    degradation_or_error(operation, path, error).map(LockAttempt::Degraded)
}

fn degradation_or_error(
    operation: &'static str,
    path: &Path,
    error: io::Error,
) -> Result<Degradation, Error> {
    if is_unusable(&error) {
        Ok(Degradation::new(
            DegradationCause::MarkerDirUnusable,
            path,
            &error,
        ))
    } else {
        Err(Error::io(operation, path, error))
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum LockKind {
    Exclusive,
    Shared,
}

/// The gate (`ScopeFile::Gate`) as taken by [`ScopeFiles::hold_gate`].
#[derive(Debug)]
pub(crate) enum GateHold {
    Held(File),
    /// Still held the other way after [`GATE_WAIT`].
    Busy,
    /// This host cannot lock; the writer lock degrades alike and says why.
    Unsupported,
}

/// Longest wait for the gate: readers hold it shared only while they read the markers,
/// a new writer exclusively only until its transition began.
pub const GATE_WAIT: Duration = Duration::from_secs(2);
/// How often a waiting session retries the gate.
const GATE_POLL_INTERVAL: Duration = Duration::from_millis(1);

impl ScopeFiles {
    /// Takes the gate, waiting at most [`GATE_WAIT`] while it is held the other way.
    pub(crate) fn hold_gate(&self, kind: LockKind) -> Result<GateHold, Error> {
        let start = self.host().now();
        loop {
            match self.lock(ScopeFile::Gate, kind)? {
                LockAttempt::Locked(file) => return Ok(GateHold::Held(file)),
                LockAttempt::Degraded(_) => return Ok(GateHold::Unsupported),
                LockAttempt::Busy => {
                    let waited = self.host().now().saturating_duration_since(start);
                    if waited >= GATE_WAIT {
                        return Ok(GateHold::Busy);
                    }
                    self.host()
                        .sleep(GATE_POLL_INTERVAL.min(GATE_WAIT - waited));
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum LockAttempt<T = File> {
    Locked(T),
    Busy,
    Degraded(Degradation),
}
