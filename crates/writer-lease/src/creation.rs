//! The cross-process creation lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;
use crate::key::ScopeFile;
use crate::scope::{Degradation, LockAttempt, LockKind, ScopeFiles};

/// How often a bounded wait for the creation lock retries.
pub const CREATION_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The longest [`ScopeFiles::creation_lock_within`] waits, whatever it is asked.
pub const MAX_CREATION_WAIT: Duration = Duration::from_secs(3600);

/// The outcome of asking for the creation lock.
#[derive(Debug)]
#[must_use]
pub enum CreationAccess {
    /// This session may create the sandbox; others wait until the guard
    /// drops, then find it by metadata.
    Locked(CreationGuard),
    /// Another session holds the lock (after the bounded wait, if any).
    Busy,
    /// The host cannot lock; create without the lock and accept a possible
    /// duplicate, which adoption later reports (contracts C6, I5).
    Unprotected(Degradation),
}

/// Holds the creation lock until dropped, also released by process death.
#[derive(Debug)]
pub struct CreationGuard {
    // Never read: holding the open file is what holds the lock.
    _file: File,
    path: PathBuf,
}

impl CreationGuard {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases the lock; same as dropping the guard.
    pub fn release(self) {
        drop(self);
    }
}

impl ScopeFiles {
    /// Tries to take the creation lock without blocking (contract I6).
    ///
    /// Where the host cannot lock, returns [`CreationAccess::Unprotected`];
    /// a failure that may pass is an error.
    pub fn try_creation_lock(&self) -> Result<CreationAccess, Error> {
        Ok(
            match self.lock(ScopeFile::CreationLock, LockKind::Exclusive)? {
                LockAttempt::Locked(file) => CreationAccess::Locked(CreationGuard {
                    _file: file,
                    path: self.path(ScopeFile::CreationLock),
                }),
                LockAttempt::Busy => CreationAccess::Busy,
                LockAttempt::Degraded(degradation) => CreationAccess::Unprotected(degradation),
            },
        )
    }

    /// Takes the creation lock, waiting at most `timeout` (capped at
    /// [`MAX_CREATION_WAIT`]).
    ///
    /// Blocks the calling thread between polls (every
    /// [`CREATION_POLL_INTERVAL`]); async callers run it on a blocking
    /// thread. Returns [`CreationAccess::Busy`] when the wait ends unlocked:
    /// a holder that is alive but stuck must not stall every cold start.
    pub fn creation_lock_within(&self, timeout: Duration) -> Result<CreationAccess, Error> {
        let host = self.host();
        let Some(deadline) = host.now().checked_add(timeout.min(MAX_CREATION_WAIT)) else {
            return self.try_creation_lock();
        };
        loop {
            let access = self.try_creation_lock()?;
            if !matches!(access, CreationAccess::Busy) {
                return Ok(access);
            }
            let remaining = deadline.saturating_duration_since(host.now());
            if remaining.is_zero() {
                return Ok(CreationAccess::Busy);
            }
            host.sleep(remaining.min(CREATION_POLL_INTERVAL));
        }
    }
}
