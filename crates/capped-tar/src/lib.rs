#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod error;
mod member;
mod meter;
mod read;

pub use error::{Error, describe_member};
pub use member::{Member, MemberKind, MemberPath, RejectReason};
pub use read::{MAX_EXTENSION_BYTES, MAX_NAME_BYTES, Summary, Visitor, read};

#[cfg(test)]
mod tests {
    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<crate::Error>();
    }
}
