#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod archive;
mod error;
mod extract;
mod member;
mod plan;
mod teardown;

pub use archive::{
    read_archive, ArchiveSummary, Member, MemberKind, MemberSink, ReadConfig, RejectedMember, UnsafeMembers,
    DEFAULT_MAX_BYTES, MAX_EXTENSION_BYTES, MAX_NAME_BYTES,
};
pub use error::Error;
pub use extract::DirExtractor;
pub use member::{MemberPath, RejectReason};
pub use plan::{shell_quote, DeletePlan, UploadPart, UploadPlan, MAX_COMMAND_BYTES};
pub use teardown::{pull_teardown, teardown_command, TeardownArchive};

#[cfg(test)]
mod tests {
    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<crate::Error>();
    }
}
