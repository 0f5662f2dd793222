#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod archive;
mod error;
mod extract;
mod plan;
mod teardown;

pub use archive::{
    ArchiveSummary, DEFAULT_MAX_BYTES, MemberSink, ReadConfig, RejectedMember, UnsafeMembers,
    read_archive,
};
pub use capped_tar::{
    MAX_EXTENSION_BYTES, MAX_NAME_BYTES, Member, MemberKind, MemberPath, RejectReason,
};
pub use error::Error;
pub use extract::DirExtractor;
pub use plan::{DeletePlan, MAX_COMMAND_BYTES, UploadPart, UploadPlan, shell_quote};
pub use teardown::{
    TEARDOWN_ARCHIVE_PREFIX, TEARDOWN_BLOCKING_FACTOR, TeardownArchive, pull_teardown,
    teardown_archive_path, teardown_archive_size, teardown_command, teardown_file_command,
};

#[cfg(test)]
mod tests {
    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<crate::Error>();
    }
}
