//! Host coordination for one sandbox scope: the writer lease, dirty marker, prepared stamp and creation lock.
//!
//! ```
//! use writer_lease::{Admission, Refusal, Role, ScopeFiles, ScopeKey};
//!
//! let dir = tempfile::tempdir()?; // normally ~/.hermes/cache/e2b
//! let key = ScopeKey::from_bytes([7; 32]); // normally the scope digest
//!
//! // Session A takes the writer role; session B, on the same host, is a reader.
//! let a = ScopeFiles::new(dir.path().to_path_buf(), key);
//! let b = ScopeFiles::new(dir.path().to_path_buf(), key);
//! let Role::Writer(mut writer) = a.try_acquire_writer()? else { unreachable!() };
//! assert!(writer.degradation().is_none(), "this host can lock");
//! assert!(matches!(b.try_acquire_writer()?, Role::Reader));
//!
//! // The writer's transition: readers are refused until the push completes.
//! writer.begin_transition()?;
//! assert!(matches!(b.admission("isb1"), Admission::Refused(Refusal::Dirty(_))));
//! writer.complete_push("isb1")?;
//! assert!(b.admission("isb1").is_admitted());
//!
//! // A failed sync closes the gate again until a sync succeeds.
//! writer.record_sync_failure()?;
//! assert!(!b.admission("isb1").is_admitted());
//! writer.record_sync_success()?;
//! assert!(b.admission("isb1").is_admitted());
//!
//! // Released (or crashed): the reader takes the role over.
//! writer.release();
//! assert!(matches!(b.try_acquire_writer()?, Role::Writer(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it guarantees
//!
//! - **One writer per scope per host** (contract C1): [`ScopeFiles::try_acquire_writer`]
//!   takes an exclusive, non-blocking lock (std `File::try_lock`) on
//!   `<key>.writer.lock` and holds it in the returned [`WriterLease`] until it
//!   is dropped; the operating system releases it when the process dies,
//!   SIGKILL included, so a reader can take the role over (C4).
//! - **Hand-off** (C4, C5): a reader asks [`ScopeFiles::try_acquire_writer`]
//!   again; a new [`WriterLease`] starts [`WriterPhase::Idle`] and can stamp
//!   or clear nothing until its own full transition. A writer that stops
//!   mid-transition leaves the scope dirty for the next one to clean.
//! - **Reader admission** (C2, C7): [`ScopeFiles::admission`] admits a command
//!   only when the scope is not dirty and the current writer generation
//!   stamped the reader's sandbox prepared. Unreadable files refuse. It reads
//!   the markers holding `<key>.gate.lock` shared; a new writer holds that gate
//!   exclusively from taking the role until its transition began, so no reader
//!   is admitted on the previous writer's stamp meanwhile (both sides wait for
//!   the gate at most [`GATE_WAIT`], then refuse or stay a reader).
//! - **Writer protocol** (C3): every transition marks the scope dirty, starts
//!   a new [`Generation`] and removes the previous stamp before the caller
//!   touches state; every completed push stamps and then clears dirty; a
//!   failed sync marks dirty and only a later successful sync clears it.
//! - **Creation lock** (I6): [`ScopeFiles::try_creation_lock`] and the bounded
//!   [`ScopeFiles::creation_lock_within`]; nothing in this crate waits
//!   without a bound.
//! - **Degraded hosts** (C6): where locking is unsupported or the directory
//!   cannot be written, the caller gets an unprotected writer carrying one
//!   [`Degradation`] value to log once at WARNING, and a single session works.
//! - **Scope note** ([`ScopeFiles::note`], [`ScopeFiles::update_note`]): named one-line
//!   values a caller keeps for people (`<key>.note`); diagnostics only, no gate reads it.
//! - **Files**: written atomically (temp file, fsync, rename, directory
//!   fsync), named from the scope key's hex only, created 0600 in a 0700
//!   directory. Lock files are never deleted.
//!
//! - **Arbitration between hosts** ([`Arbitration`], [`decide`]): the interface a writer
//!   uses to take, renew and release the role and to check its generation (the fencing
//!   token), the compare-and-set rule a shared [`WriterRecord`] follows (expiry on the
//!   record keeper's clock only), and [`HostFileArbitration`], the one-host implementation
//!   over the host lock. The record keeper that reaches several hosts (the sandbox) lives
//!   where the E2B client is.
//!
//! Every filesystem effect goes through the [`Host`] trait, so tests can
//! simulate each failure. The `scope-lease` binary in this package prints a
//! scope's state and drives a session from its standard input; the
//! multi-process tests use it.

#![deny(missing_docs)]

mod arbitration;
mod creation;
mod error;
mod host;
mod key;
mod note;
mod phase;
mod records;
mod scope;
mod writer;

pub use arbitration::{
    Arbitration, Holder, HostFileArbitration, MAX_RECORD_LINE, Request, Verdict, WriterRecord,
    decide,
};
pub use creation::{CREATION_POLL_INTERVAL, CreationAccess, CreationGuard, MAX_CREATION_WAIT};
pub use error::Error;
pub use host::{Host, OsHost};
pub use key::{ScopeFile, ScopeKey};
pub use note::{MAX_NOTE_VALUE, ScopeNote};
pub use phase::WriterPhase;
pub use records::{DirtyMarker, DirtyReason, Generation, PreparedStamp};
pub use scope::{
    Admission, Degradation, DegradationCause, GATE_WAIT, Refusal, ScopeFiles, WriterStatus,
};
pub use writer::{Role, WriterLease};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
