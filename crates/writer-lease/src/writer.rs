//! The writer role: how a session takes it, and its state protocol.

use std::fs::File;
use std::io;

use crate::error::Error;
use crate::key::ScopeFile;
use crate::phase::WriterPhase;
use crate::records::{
    DirtyMarker, DirtyReason, Generation, PreparedStamp, encode_generation, valid_sandbox_id,
};
use crate::scope::{
    Degradation, DegradationCause, GateHold, LockAttempt, LockKind, ScopeFiles, WriterHold,
    is_unusable,
};

/// The role a session gets for a scope.
#[derive(Debug)]
#[must_use]
pub enum Role {
    /// This session is the writer: it alone recovers, pushes and syncs.
    /// Check [`WriterLease::degradation`]: on a degraded host the role is
    /// not exclusive.
    Writer(WriterLease),
    /// Another session holds the writer role; run commands as a reader once
    /// [`ScopeFiles::admission`] admits them, and try again later to take
    /// the role over.
    Reader,
}

impl ScopeFiles {
    /// Tries to take the writer role without blocking.
    ///
    /// Returns [`Role::Reader`] when another session holds it. Where the host
    /// cannot lock or cannot write the directory, returns an unprotected
    /// writer carrying the [`Degradation`] instead of failing, so a single
    /// session still works (contract C6). A failure that may pass (out of
    /// file descriptors, an I/O error) is an error instead: degrading on it
    /// would make this session a second writer beside the real one.
    pub fn try_acquire_writer(&self) -> Result<Role, Error> {
        // The gate first: from the moment this session holds the role until its
        // transition began, no reader may be admitted on the previous writer's stamp
        // (the host's state may have changed since). Readers hold the gate only while
        // they read the markers, so the wait is short; a gate that stays busy (a reader
        // frozen mid-admission) leaves this session a reader, never a writer without it.
        let gate = match self.hold_gate(LockKind::Exclusive)? {
            GateHold::Held(file) => Some(file),
            GateHold::Busy => return Ok(Role::Reader),
            GateHold::Unsupported => None,
        };
        // The scope's own lock file first: a writer of an older version of this crate
        // holds it for its session (it also marks the scope known on this host). On Linux
        // it is given back once the scope's byte of the writers' lock is taken.
        let own = match self.lock(ScopeFile::WriterLock, LockKind::Exclusive)? {
            LockAttempt::Locked(own) => own,
            LockAttempt::Busy => return Ok(Role::Reader),
            LockAttempt::Degraded(degradation) => {
                return Ok(Role::Writer(WriterLease::unprotected(
                    self.clone(),
                    degradation,
                )));
            }
        };
        let lock = match self.hold_writer(own)? {
            LockAttempt::Locked(hold) => hold,
            LockAttempt::Busy => return Ok(Role::Reader),
            LockAttempt::Degraded(degradation) => {
                return Ok(Role::Writer(WriterLease::unprotected(
                    self.clone(),
                    degradation,
                )));
            }
        };
        // The lock works; the markers must be writable too, or readers would
        // be gated by files this writer cannot update. Give the lock back so
        // every session on this host degrades alike.
        if let Err(error) = self.host().probe_writable(self.dir()) {
            drop(lock);
            if !is_unusable(&error) {
                return Err(Error::io("probe coordination directory", self.dir(), error));
            }
            let degradation =
                Degradation::new(DegradationCause::MarkerDirUnusable, self.dir(), &error);
            return Ok(Role::Writer(WriterLease::unprotected(
                self.clone(),
                degradation,
            )));
        }
        Ok(Role::Writer(WriterLease::exclusive(
            self.clone(),
            lock,
            gate,
        )))
    }
}

/// The writer role for one scope, held until dropped.
///
/// The exclusive lock lives in an open file, so the operating system
/// releases it when the process dies, however it dies. Dropping the lease
/// (or [`release`](Self::release)) gives the role up and leaves the markers
/// as they are: a writer that stops mid-transition or after a failed sync
/// leaves the scope dirty, and the next writer's full transition cleans it.
///
/// The protocol (contract C3): [`begin_transition`](Self::begin_transition)
/// before touching sandbox state, [`complete_push`](Self::complete_push)
/// after every completed push, [`record_sync_failure`](Self::record_sync_failure)
/// and [`record_sync_success`](Self::record_sync_success) around each
/// incremental sync.
#[derive(Debug)]
pub struct WriterLease {
    files: ScopeFiles,
    // Never read: holding it is what holds the scope's byte of the writers' lock.
    _lock: Option<WriterHold>,
    // The gate, held exclusively from taking the role until the transition began.
    gate: Option<File>,
    degradation: Option<Degradation>,
    phase: WriterPhase,
    generation: Generation,
}

impl WriterLease {
    pub(crate) fn exclusive(files: ScopeFiles, lock: WriterHold, gate: Option<File>) -> Self {
        WriterLease {
            files,
            _lock: Some(lock),
            gate,
            degradation: None,
            phase: WriterPhase::Idle,
            generation: Generation::NONE,
        }
    }

    pub(crate) fn unprotected(files: ScopeFiles, degradation: Degradation) -> Self {
        WriterLease {
            files,
            _lock: None,
            gate: None,
            degradation: Some(degradation),
            phase: WriterPhase::Idle,
            generation: Generation::NONE,
        }
    }

    /// Why this writer is not exclusive, if it is not. The caller logs it
    /// once at WARNING (contract C6).
    ///
    /// An unprotected writer follows the same protocol; its marker writes are
    /// best effort and their failures are not reported, since no reader on
    /// this host can rely on them anyway.
    pub fn degradation(&self) -> Option<&Degradation> {
        self.degradation.as_ref()
    }

    /// Where the writer is in its protocol.
    pub fn phase(&self) -> WriterPhase {
        self.phase
    }

    /// The generation this writer's current transition runs under
    /// ([`Generation::NONE`] before the first one).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The scope's files.
    pub fn files(&self) -> &ScopeFiles {
        &self.files
    }

    /// Starts a transition: marks the scope dirty, starts a new generation
    /// and removes the previous stamp, in that order, before the caller
    /// touches any sandbox state (contracts C3, C4).
    ///
    /// On error the caller must not touch state; it releases the role
    /// (contract C5). Whatever step failed, readers stay refused.
    pub fn begin_transition(&mut self) -> Result<Generation, Error> {
        let next = self.latest_generation()?.next();
        self.write_dirty(DirtyReason::Transition, next, "mark scope dirty")?;
        let path = self.files.path(ScopeFile::Generation);
        let written = self
            .files
            .host()
            .write_atomic(&path, &encode_generation(next))
            .map_err(|e| Error::io("write writer generation", &path, e));
        self.best_effort(written)?;
        self.remove(ScopeFile::Prepared, "invalidate prepared stamp")?;
        self.generation = next;
        self.phase = WriterPhase::InTransition;
        // The markers now refuse readers by themselves.
        self.gate = None;
        Ok(next)
    }

    /// Records a completed push to `sandbox_id`: stamps the scope prepared
    /// for this generation, then clears the dirty marker (contract C3).
    pub fn complete_push(&mut self, sandbox_id: &str) -> Result<PreparedStamp, Error> {
        const OPERATION: &str = "stamp prepared";
        if self.phase != WriterPhase::InTransition {
            return Err(Error::OutOfOrder {
                operation: OPERATION,
                phase: self.phase,
            });
        }
        if !valid_sandbox_id(sandbox_id) {
            return Err(Error::InvalidSandboxId {
                operation: OPERATION,
                length: sandbox_id.len(),
            });
        }
        let stamp = PreparedStamp {
            generation: self.generation,
            sandbox_id: sandbox_id.to_owned(),
        };
        let path = self.files.path(ScopeFile::Prepared);
        let written = self
            .files
            .host()
            .write_atomic(&path, &stamp.encode())
            .map_err(|e| Error::io(OPERATION, &path, e));
        self.best_effort(written)?;
        // Stamped but still dirty: a later successful sync may clear it.
        self.phase = WriterPhase::Stale;
        self.remove(ScopeFile::Dirty, "clear dirty marker")?;
        self.phase = WriterPhase::Prepared;
        Ok(stamp)
    }

    /// Records a failed sync: marks the scope dirty so readers stop being
    /// admitted (contracts C3, S3). Allowed in any phase.
    pub fn record_sync_failure(&mut self) -> Result<(), Error> {
        self.write_dirty(DirtyReason::FailedSync, self.generation, "mark scope dirty")?;
        if self.phase == WriterPhase::Prepared {
            self.phase = WriterPhase::Stale;
        }
        Ok(())
    }

    /// Records a successful sync: it established the host's state, so the
    /// dirty marker is cleared (contract S3). Only after a completed push;
    /// a sync cannot prepare a sandbox on its own.
    pub fn record_sync_success(&mut self) -> Result<(), Error> {
        const OPERATION: &str = "clear dirty marker";
        match self.phase {
            WriterPhase::Prepared | WriterPhase::Stale => {
                self.remove(ScopeFile::Dirty, OPERATION)?;
                self.phase = WriterPhase::Prepared;
                Ok(())
            }
            phase @ (WriterPhase::Idle | WriterPhase::InTransition) => Err(Error::OutOfOrder {
                operation: OPERATION,
                phase,
            }),
        }
    }

    /// Gives the role up; same as dropping the lease.
    pub fn release(self) {
        drop(self);
    }

    /// The highest generation any file mentions, so a lost or corrupt
    /// generation file can never make an old stamp look current again.
    fn latest_generation(&self) -> Result<Generation, Error> {
        let recorded = match self.files.generation() {
            Ok(generation) => generation,
            Err(error) if error.is_corrupt() => Generation::NONE,
            Err(error) => self.best_effort(Err(error)).map(|()| Generation::NONE)?,
        };
        let stamped = match self.files.prepared() {
            Ok(stamp) => stamp.map_or(Generation::NONE, |s| s.generation),
            Err(error) if error.is_corrupt() => Generation::NONE,
            Err(error) => self.best_effort(Err(error)).map(|()| Generation::NONE)?,
        };
        // A dirty marker may carry a generation whose bump never landed.
        let marked = self
            .files
            .dirty()
            .ok()
            .flatten()
            .and_then(|marker| marker.generation)
            .unwrap_or(Generation::NONE);
        Ok(recorded.max(stamped).max(marked))
    }

    fn write_dirty(
        &self,
        reason: DirtyReason,
        generation: Generation,
        operation: &'static str,
    ) -> Result<(), Error> {
        let marker = DirtyMarker {
            reason,
            generation: Some(generation),
            pid: Some(std::process::id()),
        };
        let path = self.files.path(ScopeFile::Dirty);
        let written = self
            .files
            .host()
            .write_atomic(&path, &marker.encode())
            .map_err(|e| Error::io(operation, &path, e));
        self.best_effort(written)
    }

    fn remove(&self, file: ScopeFile, operation: &'static str) -> Result<(), Error> {
        let path = self.files.path(file);
        let removed = match self.files.host().remove(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(Error::io(operation, &path, error)),
        };
        self.best_effort(removed)
    }

    fn best_effort(&self, result: Result<(), Error>) -> Result<(), Error> {
        match result {
            Err(_) if self.degradation.is_some() => Ok(()),
            other => other,
        }
    }
}
