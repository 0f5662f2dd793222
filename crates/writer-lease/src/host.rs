//! The filesystem and time seam: every host effect goes through [`Host`].

use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Coordination files are a few dozen bytes; anything larger is not ours.
pub(crate) const MAX_RECORD_BYTES: u64 = 4096;

/// The host facilities this crate uses.
///
/// [`OsHost`] is the real one. Tests substitute an implementation that fails
/// chosen operations, to simulate a host without lock support, an unwritable
/// directory or a failing disk, and one whose clock is virtual.
pub trait Host: fmt::Debug + Send + Sync {
    /// Creates `dir` and missing parents, private to the user (0700).
    fn ensure_private_dir(&self, dir: &Path) -> io::Result<()>;
    /// Opens (creating if needed, 0600) a lock file, without truncating it.
    fn open_lock_file(&self, path: &Path) -> io::Result<File>;
    /// Takes an exclusive lock on `file` without blocking.
    fn try_lock(&self, file: &File) -> Result<(), TryLockError>;
    /// Takes a shared lock on `file` without blocking.
    fn try_lock_shared(&self, file: &File) -> Result<(), TryLockError>;
    /// Locks byte `offset` of `file` exclusively without blocking: a record lock that
    /// excludes other processes (other open files on Linux), released by
    /// [`Host::unlock_byte`] or when the file closes.
    fn try_lock_byte(&self, file: &File, offset: u64) -> Result<(), TryLockError>;
    /// Releases byte `offset` of `file`, locked by [`Host::try_lock_byte`].
    fn unlock_byte(&self, file: &File, offset: u64) -> io::Result<()>;
    /// Whether another process (another open file on Linux) holds byte `offset` of `file`
    /// locked; asks without locking.
    fn byte_locked_elsewhere(&self, file: &File, offset: u64) -> Result<bool, TryLockError>;
    /// Replaces `path` atomically with `contents` (0600): the file holds
    /// either its old content or all of the new one, even after a crash.
    fn write_atomic(&self, path: &Path, contents: &[u8]) -> io::Result<()>;
    /// Overwrites `path` with `contents` in place (created 0600), without waiting for the
    /// disk and without a new file per write: a reader may see a mix of the old and the new
    /// bytes (the record must carry its own check), and a crash may lose the update. For
    /// records written per command (the activity record), where a new inode per write costs
    /// more than the command. By default as [`Host::write_atomic`].
    fn write_in_place(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        self.write_atomic(path, contents)
    }
    /// Reads a small file whole; `NotFound` when absent.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Removes a file durably; `NotFound` when absent.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Checks that new files can be created in `dir`.
    fn probe_writable(&self, dir: &Path) -> io::Result<()>;
    /// The current instant, for bounded waits.
    fn now(&self) -> Instant;
    /// Blocks the calling thread, for bounded waits.
    fn sleep(&self, duration: Duration);
}

/// The real host: std filesystem calls, `flock`-style locks, real time.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsHost;

/// Makes temp-file names unique within the process; the pid makes them
/// unique across processes.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_path(path: &Path, purpose: &str) -> io::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(path.with_file_name(format!(".{name}.{purpose}.{}.{n}", std::process::id())))
}

fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Makes a rename or unlink in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened for syncing here; the rename itself
        // is still atomic.
        let _ = dir;
        Ok(())
    }
}

fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))
}

impl Host for OsHost {
    fn ensure_private_dir(&self, dir: &Path) -> io::Result<()> {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(dir)
    }

    fn open_lock_file(&self, path: &Path) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        options.open(path)
    }

    fn try_lock(&self, file: &File) -> Result<(), TryLockError> {
        file.try_lock()
    }

    fn try_lock_shared(&self, file: &File) -> Result<(), TryLockError> {
        file.try_lock_shared()
    }

    fn try_lock_byte(&self, file: &File, offset: u64) -> Result<(), TryLockError> {
        record_lock::set(file, offset, record_lock::Kind::Write).map_err(|error| {
            if record_lock::is_contention(&error) {
                TryLockError::WouldBlock
            } else {
                TryLockError::Error(error)
            }
        })
    }

    fn unlock_byte(&self, file: &File, offset: u64) -> io::Result<()> {
        record_lock::set(file, offset, record_lock::Kind::Unlock)
    }

    fn byte_locked_elsewhere(&self, file: &File, offset: u64) -> Result<bool, TryLockError> {
        record_lock::held_elsewhere(file, offset).map_err(TryLockError::Error)
    }

    fn write_in_place(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path)?;
        // The new bytes first, then the length: a reader never finds the file shorter than
        // the old content or the new.
        file.write_all(contents)?;
        file.set_len(contents.len() as u64)
    }

    fn write_atomic(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        let temp = temp_path(path, "tmp")?;
        let result = create_private(&temp).and_then(|mut file| {
            file.write_all(contents)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&temp, path)?;
            sync_dir(parent(path)?)
        });
        if result.is_err() {
            // Best effort: a leftover temp file is harmless (its name never
            // matches a scope file) but untidy.
            let _ = fs::remove_file(&temp);
        }
        result
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        File::open(path)?
            .take(MAX_RECORD_BYTES + 1)
            .read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)?;
        sync_dir(parent(path)?)
    }

    fn probe_writable(&self, dir: &Path) -> io::Result<()> {
        let probe = temp_path(&dir.join("probe"), "probe")?;
        drop(create_private(&probe)?);
        fs::remove_file(&probe)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// POSIX record locks on one byte: open-file-description locks on Linux (held by the open
/// file, like `flock`), classic process locks elsewhere on Unix; none on other systems
/// (every call fails as unsupported, which the caller reads as a host that cannot lock).
mod record_lock {
    use std::fs::File;
    use std::io;

    #[derive(Clone, Copy)]
    pub(super) enum Kind {
        Write,
        Unlock,
    }

    /// Whether a failed lock means someone else holds it (rather than no locking here).
    pub(super) fn is_contention(error: &io::Error) -> bool {
        #[cfg(unix)]
        {
            matches!(error.raw_os_error(), Some(code) if code == libc::EAGAIN || code == libc::EACCES)
        }
        #[cfg(not(unix))]
        {
            let _ = error;
            false
        }
    }

    #[cfg(unix)]
    mod os {
        use std::fs::File;
        use std::io;
        use std::os::fd::AsRawFd;

        #[cfg(target_os = "linux")]
        pub(super) const SET: libc::c_int = libc::F_OFD_SETLK;
        #[cfg(target_os = "linux")]
        pub(super) const GET: libc::c_int = libc::F_OFD_GETLK;
        #[cfg(not(target_os = "linux"))]
        pub(super) const SET: libc::c_int = libc::F_SETLK;
        #[cfg(not(target_os = "linux"))]
        pub(super) const GET: libc::c_int = libc::F_GETLK;

        /// Runs `command` on a one-byte record at `offset`; the record as the call left it.
        pub(super) fn fcntl(
            file: &File,
            command: libc::c_int,
            offset: u64,
            kind: libc::c_short,
        ) -> io::Result<libc::flock> {
            let start = libc::off_t::try_from(offset).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "lock offset too large")
            })?;
            // SAFETY: a plain C struct for which all zeroes is a valid value (and l_pid must
            // be 0 for open-file-description locks).
            let mut record: libc::flock = unsafe { std::mem::zeroed() };
            record.l_type = kind;
            record.l_whence = libc::SEEK_SET as libc::c_short;
            record.l_start = start;
            record.l_len = 1;
            // SAFETY: the descriptor is open for the duration of the call and `record` is
            // a valid flock the call may write to.
            let result = unsafe { libc::fcntl(file.as_raw_fd(), command, &mut record) };
            if result == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(record)
        }
    }

    pub(super) fn set(file: &File, offset: u64, kind: Kind) -> io::Result<()> {
        #[cfg(unix)]
        {
            let kind = match kind {
                Kind::Write => libc::F_WRLCK,
                Kind::Unlock => libc::F_UNLCK,
            };
            os::fcntl(file, os::SET, offset, kind as libc::c_short).map(|_| ())
        }
        #[cfg(not(unix))]
        {
            let _ = (file, offset, kind);
            Err(io::Error::from(io::ErrorKind::Unsupported))
        }
    }

    pub(super) fn held_elsewhere(file: &File, offset: u64) -> io::Result<bool> {
        #[cfg(unix)]
        {
            let record = os::fcntl(file, os::GET, offset, libc::F_WRLCK as libc::c_short)?;
            Ok(record.l_type != libc::F_UNLCK as libc::c_short)
        }
        #[cfg(not(unix))]
        {
            let _ = (file, offset);
            Err(io::Error::from(io::ErrorKind::Unsupported))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_content_with_private_permissions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nested = dir.path().join("cache").join("e2b");
        OsHost.ensure_private_dir(&nested).expect("mkdir");
        let path = nested.join("x.prepared");
        OsHost.write_atomic(&path, b"first").expect("write");
        OsHost.write_atomic(&path, b"second").expect("rewrite");
        assert_eq!(OsHost.read(&path).expect("read"), b"second");
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(&nested)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["x.prepared"]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode(&path), 0o600);
            assert_eq!(mode(&nested), 0o700);
            let lock = nested.join("x.writer.lock");
            drop(OsHost.open_lock_file(&lock).expect("open lock"));
            assert_eq!(mode(&lock), 0o600);
        }

        OsHost.remove(&path).expect("remove");
        assert_eq!(
            OsHost.read(&path).map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn a_failed_atomic_write_leaves_the_target_and_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Renaming a file over a non-empty directory fails after the temp
        // file was written and synced: the target must be untouched and the
        // temp file cleaned up.
        let blocked = dir.path().join("x.generation");
        fs::create_dir(&blocked).expect("mkdir");
        fs::write(blocked.join("inner"), b"old").expect("fill");
        assert!(OsHost.write_atomic(&blocked, b"new").is_err());
        assert_eq!(fs::read(blocked.join("inner")).expect("read"), b"old");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["x.generation"]);
    }
}
