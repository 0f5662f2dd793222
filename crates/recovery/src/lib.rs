#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod base;
mod error;
mod host;
mod recover;
mod report;
mod roots;

pub use base::{BaseSource, PUSH_BASE_MAX_BYTES, PushBase};
pub use capped_tar::RejectReason;
pub use error::Error;
pub use recover::{
    DEFAULT_MAX_SNAPSHOT_BYTES, QUARANTINE_DIR, RecoveryConfig, recover, snapshot_command,
};
pub use report::{
    FileReport, Outcome, QuarantineReason, RecoveryReport, SkipReason, SnapshotState,
};
pub use roots::RECOVERABLE_ROOTS;

#[cfg(test)]
mod tests {
    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<crate::Error>();
    }
}
