//! Reading a tar stream from the sandbox into a [`MemberSink`]: capped-tar's reader, with this
//! crate's policy for unsafe members and its summary.

use std::io::{self, Read};

use capped_tar::{Member, RejectReason};

use crate::Error;

/// The default cap on an archive stream: 2 GiB, Hermes' own sync-back limit.
pub const DEFAULT_MAX_BYTES: u64 = 2 * 1024 * 1024 * 1024;

const OPERATION: &str = "read archive";

/// What to do with a member that breaks a member rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafeMembers {
    /// Leave it out and name it in [`ArchiveSummary::rejected`] (contract X5); keep reading.
    Skip,
    /// Fail the whole read with [`Error::UnsafeMember`].
    Refuse,
}

/// How to read an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadConfig {
    /// Total bytes that may be pulled from the stream, headers and padding included. Reading
    /// stops at the first byte past it ([`DEFAULT_MAX_BYTES`] is Hermes' limit).
    pub max_bytes: u64,
    /// What happens to members that break a rule.
    pub unsafe_members: UnsafeMembers,
}

/// A member left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedMember {
    /// The member name as it appeared, lossily rendered as UTF-8.
    pub name: String,
    /// The rule it broke.
    pub reason: RejectReason,
}

/// What a complete read saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// Regular files handed to the sink.
    pub files: u64,
    /// Directories handed to the sink.
    pub directories: u64,
    /// Content bytes of those files.
    pub file_bytes: u64,
    /// Bytes pulled from the stream, headers and padding included.
    pub stream_bytes: u64,
    /// Members left out under [`UnsafeMembers::Skip`], in archive order.
    pub rejected: Vec<RejectedMember>,
}

/// Where accepted members go: an output archive, a directory, a test's record.
pub trait MemberSink {
    /// Called for an accepted directory member.
    fn directory(&mut self, member: &Member) -> io::Result<()>;

    /// Called for an accepted file member. `content` yields at most the header's size; what the
    /// sink leaves unread is drained, and a short member is reported as truncated afterwards.
    fn file(&mut self, member: &Member, content: &mut dyn Read) -> io::Result<()>;
}

/// Reads a whole tar stream from `source`, handing each accepted member to `sink`.
///
/// Success means the archive was complete (it ended with its end-of-archive marker), stayed
/// under the cap and every member either reached the sink or is listed as rejected. Anything
/// else is an error: a partial archive is never a success. Only regular files and directories
/// are accepted; names must be relative, UTF-8, free of NUL and `..`; a member may not repeat a
/// name or sit below a file member (capped-tar's member rules).
pub fn read_archive(
    source: &mut dyn Read,
    config: &ReadConfig,
    sink: &mut dyn MemberSink,
) -> Result<ArchiveSummary, Error> {
    let mut adapter = SinkAdapter {
        sink,
        unsafe_members: config.unsafe_members,
        rejected: Vec::new(),
    };
    let read = capped_tar::read(source, config.max_bytes, &mut adapter)?;
    Ok(ArchiveSummary {
        files: read.files,
        directories: read.directories,
        file_bytes: read.file_bytes,
        stream_bytes: read.stream_bytes,
        rejected: adapter.rejected,
    })
}

/// capped-tar's visitor for a [`MemberSink`]: sink failures become [`Error::Sink`], rejected
/// members are listed or refuse the archive.
struct SinkAdapter<'a> {
    sink: &'a mut dyn MemberSink,
    unsafe_members: UnsafeMembers,
    rejected: Vec<RejectedMember>,
}

impl SinkAdapter<'_> {
    fn sink_failed(member: &Member, source: io::Error) -> Error {
        Error::Sink {
            operation: "write member",
            member: Some(member.name.clone()),
            source,
        }
    }
}

impl capped_tar::Visitor for SinkAdapter<'_> {
    type Error = Error;

    fn archive_failed(&self, error: capped_tar::Error) -> Error {
        Error::Archive {
            operation: OPERATION,
            source: error,
        }
    }

    fn directory(&mut self, member: &Member) -> Result<(), Error> {
        self.sink
            .directory(member)
            .map_err(|e| Self::sink_failed(member, e))
    }

    fn file(&mut self, member: &Member, content: &mut dyn Read) -> Result<(), Error> {
        self.sink
            .file(member, content)
            .map_err(|e| Self::sink_failed(member, e))
    }

    fn rejected(&mut self, name: &str, reason: RejectReason) -> Result<(), Error> {
        match self.unsafe_members {
            UnsafeMembers::Skip => {
                self.rejected.push(RejectedMember {
                    name: name.to_owned(),
                    reason,
                });
                Ok(())
            }
            UnsafeMembers::Refuse => Err(Error::UnsafeMember {
                operation: OPERATION,
                member: name.to_owned(),
                reason,
            }),
        }
    }
}
