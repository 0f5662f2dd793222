//! A [`Host`] that behaves like the real one except where a test tells it to
//! fail, and whose clock is virtual.

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use writer_lease::{Host, OsHost};

/// A host operation a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    EnsureDir,
    OpenLock,
    Lock,
    Write,
    Read,
    Remove,
    Probe,
}

/// One injected failure: the next `op` on a path ending in `suffix` fails
/// with `error()`. `persistent` faults fail every time.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) op: Op,
    pub(crate) suffix: &'static str,
    pub(crate) error: fn() -> io::Error,
    pub(crate) persistent: bool,
}

type Hook = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub(crate) struct FaultyHost {
    faults: Mutex<Vec<Fault>>,
    elapsed: Mutex<Duration>,
    sleeps: Mutex<u32>,
    /// Runs once, just before the read numbered by the countdown.
    read_hook: Mutex<Option<(u32, Hook)>>,
}

impl std::fmt::Debug for FaultyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyHost").finish_non_exhaustive()
    }
}

pub(crate) fn unsupported() -> io::Error {
    io::Error::from(io::ErrorKind::Unsupported)
}

pub(crate) fn no_locks() -> io::Error {
    // ENOLCK: what NFS without a lock manager reports.
    io::Error::from_raw_os_error(37)
}

pub(crate) fn denied() -> io::Error {
    io::Error::from(io::ErrorKind::PermissionDenied)
}

pub(crate) fn read_only() -> io::Error {
    // EROFS.
    io::Error::from_raw_os_error(30)
}

pub(crate) fn disk_full() -> io::Error {
    io::Error::from(io::ErrorKind::StorageFull)
}

impl FaultyHost {
    pub(crate) fn new() -> Self {
        FaultyHost::default()
    }

    pub(crate) fn fail_once(&self, op: Op, suffix: &'static str, error: fn() -> io::Error) {
        self.push(Fault {
            op,
            suffix,
            error,
            persistent: false,
        });
    }

    pub(crate) fn fail_always(&self, op: Op, suffix: &'static str, error: fn() -> io::Error) {
        self.push(Fault {
            op,
            suffix,
            error,
            persistent: true,
        });
    }

    fn push(&self, fault: Fault) {
        self.faults.lock().expect("faults").push(fault);
    }

    pub(crate) fn clear_faults(&self) {
        self.faults.lock().expect("faults").clear();
    }

    pub(crate) fn sleeps(&self) -> u32 {
        *self.sleeps.lock().expect("sleeps")
    }

    /// Runs `hook` just before the `before_read`-th read (0-based) from now.
    pub(crate) fn arm_read_hook(&self, before_read: u32, hook: Hook) {
        *self.read_hook.lock().expect("hook") = Some((before_read, hook));
    }

    /// Takes back a hook that never ran.
    pub(crate) fn disarm_read_hook(&self) -> Option<Hook> {
        self.read_hook
            .lock()
            .expect("hook")
            .take()
            .map(|(_, hook)| hook)
    }

    fn check(&self, op: Op, path: &Path) -> io::Result<()> {
        let mut faults = self.faults.lock().expect("faults");
        let name = path.to_string_lossy();
        if let Some(index) = faults
            .iter()
            .position(|f| f.op == op && name.ends_with(f.suffix))
        {
            let error = (faults[index].error)();
            if !faults[index].persistent {
                faults.remove(index);
            }
            return Err(error);
        }
        Ok(())
    }

    fn lock_fault(&self) -> Result<(), TryLockError> {
        // Lock faults match on the op only: the file handle has no path.
        self.check(Op::Lock, Path::new(""))
            .map_err(TryLockError::Error)
    }
}

impl Host for FaultyHost {
    fn ensure_private_dir(&self, dir: &Path) -> io::Result<()> {
        self.check(Op::EnsureDir, dir)?;
        OsHost.ensure_private_dir(dir)
    }

    fn open_lock_file(&self, path: &Path) -> io::Result<File> {
        self.check(Op::OpenLock, path)?;
        OsHost.open_lock_file(path)
    }

    fn try_lock(&self, file: &File) -> Result<(), TryLockError> {
        self.lock_fault()?;
        OsHost.try_lock(file)
    }

    fn try_lock_shared(&self, file: &File) -> Result<(), TryLockError> {
        self.lock_fault()?;
        OsHost.try_lock_shared(file)
    }

    fn try_lock_byte(&self, file: &File, offset: u64) -> Result<(), TryLockError> {
        self.lock_fault()?;
        OsHost.try_lock_byte(file, offset)
    }

    fn unlock_byte(&self, file: &File, offset: u64) -> io::Result<()> {
        OsHost.unlock_byte(file, offset)
    }

    fn byte_locked_elsewhere(&self, file: &File, offset: u64) -> Result<bool, TryLockError> {
        self.lock_fault()?;
        OsHost.byte_locked_elsewhere(file, offset)
    }

    fn write_atomic(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        self.check(Op::Write, path)?;
        OsHost.write_atomic(path, contents)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let hook = {
            let mut slot = self.read_hook.lock().expect("hook");
            match slot.take() {
                Some((0, hook)) => Some(hook),
                Some((n, hook)) => {
                    *slot = Some((n - 1, hook));
                    None
                }
                None => None,
            }
        };
        if let Some(hook) = hook {
            hook();
        }
        self.check(Op::Read, path)?;
        OsHost.read(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.check(Op::Remove, path)?;
        OsHost.remove(path)
    }

    fn probe_writable(&self, dir: &Path) -> io::Result<()> {
        self.check(Op::Probe, dir)?;
        OsHost.probe_writable(dir)
    }

    fn now(&self) -> Instant {
        // A fixed origin per process is enough: only differences matter.
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *ORIGIN.get_or_init(Instant::now) + *self.elapsed.lock().expect("clock")
    }

    fn sleep(&self, duration: Duration) {
        *self.sleeps.lock().expect("sleeps") += 1;
        *self.elapsed.lock().expect("clock") += duration;
    }
}
