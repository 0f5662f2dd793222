#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod activity;
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
#[cfg(target_os = "linux")]
mod writers_lock;

pub use activity::{ActivityRecorder, ScopeActivity};
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
