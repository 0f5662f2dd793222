//! The one error type of this crate.

use std::io;

/// Why an archive could not be read to its end.
///
/// Every variant names the member being read when it happened, where there was one. The
/// wording of `Display` is for people; callers decide with the `is_*()` predicates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The stream exceeded its byte cap; reading stopped at that byte.
    #[error("archive exceeds the cap of {limit} bytes (stopped while reading {})", describe_member(.member))]
    OverCap {
        /// The cap in bytes.
        limit: u64,
        /// The member being read when the cap was hit, if any.
        member: Option<String>,
    },
    /// The archive ended early: inside a header, inside a member, or without its end marker
    /// (an empty stream included).
    #[error("archive is truncated (ended while reading {})", describe_member(.member))]
    Truncated {
        /// The member being read, or the last complete member when the end marker is missing.
        member: Option<String>,
    },
    /// The stream is not a well-formed tar archive.
    #[error("archive is malformed near {}: {detail}", describe_member(.member))]
    Malformed {
        /// The member being read, or the last member read before the problem.
        member: Option<String>,
        /// What is wrong.
        detail: String,
    },
    /// The stream underneath failed (network, process exit, ...).
    #[error("reading the archive stream failed")]
    Source {
        /// The error the stream returned.
        #[source]
        source: io::Error,
    },
}

/// How an error names the member it stopped in: `member "a/b"`, or the archive headers when
/// no member was current. Shared with the adapters so their messages read the same.
pub fn describe_member(member: &Option<String>) -> String {
    match member {
        Some(name) => format!("member {name:?}"),
        None => "the archive headers".to_owned(),
    }
}

impl Error {
    /// The stream was bigger than the cap.
    pub fn is_over_cap(&self) -> bool {
        matches!(self, Self::OverCap { .. })
    }

    /// The archive ended early (a partial archive is never a success).
    pub fn is_truncated(&self) -> bool {
        matches!(self, Self::Truncated { .. })
    }

    /// The stream was not a well-formed tar archive.
    pub fn is_malformed(&self) -> bool {
        matches!(self, Self::Malformed { .. })
    }

    /// The stream failed underneath the reader.
    pub fn is_source_failure(&self) -> bool {
        matches!(self, Self::Source { .. })
    }

    /// The archive member this error concerns, if any.
    pub fn member(&self) -> Option<&str> {
        match self {
            Self::OverCap { member, .. }
            | Self::Truncated { member }
            | Self::Malformed { member, .. } => member.as_deref(),
            Self::Source { .. } => None,
        }
    }
}
