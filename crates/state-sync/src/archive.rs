//! Reading a tar stream from the sandbox: capped while streaming, checked member by member.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::io::{self, Read};

use crate::Error;
use crate::member::{MemberPath, RejectReason};

/// The default cap on an archive stream: 2 GiB, Hermes' own sync-back limit.
pub const DEFAULT_MAX_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The longest member name accepted from a GNU long-name record or a PAX `path` (64 KiB).
/// A longer name costs that member ([`RejectReason::NameTooLong`]); it is never buffered.
pub const MAX_NAME_BYTES: u64 = 64 * 1024;

/// The largest PAX extended header accepted (1 MiB). A larger one makes the archive malformed,
/// because its unread records could change where the next member starts.
pub const MAX_EXTENSION_BYTES: u64 = 1024 * 1024;

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

/// What an accepted member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    /// A regular file of `size` bytes.
    File {
        /// Content length in bytes, from the header.
        size: u64,
        /// Whether any execute bit was set (all other mode bits are dropped).
        executable: bool,
    },
    /// A directory.
    Directory,
}

/// An accepted member, as handed to a [`MemberSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The checked, normalised name.
    pub path: MemberPath,
    /// File or directory.
    pub kind: MemberKind,
    /// Modification time in seconds since the epoch (0 if the header's field is unreadable).
    pub mtime: u64,
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
/// name or sit below a file member.
pub fn read_archive(
    source: &mut dyn Read,
    config: &ReadConfig,
    sink: &mut dyn MemberSink,
) -> Result<ArchiveSummary, Error> {
    let meter = MeterState::new(config.max_bytes);
    let mut archive = tar::Archive::new(Meter {
        inner: source,
        state: &meter,
    });
    let mut summary = ArchiveSummary::default();
    let mut last: Option<String> = None;
    {
        let entries = archive
            .entries()
            .map_err(|e| meter.classify(e, None))?
            .raw(true);
        let mut pending = Pending::default();
        let mut seen = Seen::default();
        for entry in entries {
            let mut entry = entry.map_err(|e| meter.classify(e, last.clone()))?;
            let header = entry.header().clone();
            let type_byte = header.entry_type().as_byte();
            match type_byte {
                b'L' => {
                    pending.long_name =
                        Some(read_bounded(&mut entry, MAX_NAME_BYTES, &meter, &last)?);
                    continue;
                }
                b'K' => continue, // A long link target: links are rejected whatever it says.
                b'x' => {
                    pending.read_pax(&mut entry, &meter, &last)?;
                    continue;
                }
                b'g' => continue, // Global PAX defaults carry nothing this reader uses.
                _ => {}
            }

            let header_name = header.path_bytes().into_owned();
            let (name, name_too_long) = pending.take_name(header_name);
            let display = String::from_utf8_lossy(&name).into_owned();
            if let Some(size) = pending.pax_size.take()
                && size != entry.size()
            {
                return Err(Error::Malformed {
                    operation: OPERATION,
                    member: Some(display),
                    detail: "PAX size differs from the header size".to_owned(),
                });
            }
            last = Some(display.clone());

            let checked = if name_too_long {
                Err(RejectReason::NameTooLong)
            } else {
                check_member(&name, type_byte, &mut seen)
            };
            let kind = match checked {
                Ok(Some(kind)) => kind,
                Ok(None) => continue, // The archive root (`./`).
                Err(reason) => {
                    match config.unsafe_members {
                        UnsafeMembers::Skip => summary.rejected.push(RejectedMember {
                            name: display,
                            reason,
                        }),
                        UnsafeMembers::Refuse => {
                            return Err(Error::UnsafeMember {
                                operation: OPERATION,
                                member: display,
                                reason,
                            });
                        }
                    }
                    continue;
                }
            };
            let path = match MemberPath::parse(&name) {
                Ok(Some(path)) => path,
                // check_member already parsed this name successfully.
                _ => unreachable_name(&display)?,
            };
            let executable = header.mode().map(|m| m & 0o111 != 0).unwrap_or(false);
            let kind = match kind {
                Kind::Directory => MemberKind::Directory,
                Kind::File => MemberKind::File {
                    size: entry.size(),
                    executable,
                },
            };
            let member = Member {
                path,
                kind,
                mtime: header.mtime().unwrap_or(0),
            };
            match member.kind {
                MemberKind::Directory => {
                    sink.directory(&member)
                        .map_err(|e| sink_error(&meter, e, &display))?;
                    summary.directories += 1;
                }
                MemberKind::File { size, .. } => {
                    let mut content = Counted {
                        inner: &mut entry,
                        count: 0,
                    };
                    sink.file(&member, &mut content)
                        .map_err(|e| sink_error(&meter, e, &display))?;
                    io::copy(&mut content, &mut io::sink())
                        .map_err(|e| meter.classify(e, Some(display.clone())))?;
                    if content.count != size {
                        return Err(Error::Truncated {
                            operation: OPERATION,
                            member: Some(display),
                        });
                    }
                    summary.files += 1;
                    summary.file_bytes += size;
                }
            }
        }
        if pending.is_pending() && !meter.eof.get() {
            return Err(Error::Malformed {
                operation: OPERATION,
                member: last,
                detail: "extended header not followed by a member".to_owned(),
            });
        }
    }
    if meter.eof.get() {
        // The tar crate stops quietly at end of stream; only a zero block marks a real end.
        return Err(Error::Truncated {
            operation: OPERATION,
            member: last,
        });
    }
    let mut rest = archive.into_inner();
    let mut buf = [0u8; 8192];
    loop {
        let n = rest
            .read(&mut buf)
            .map_err(|e| meter.classify(e, last.clone()))?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(Error::Malformed {
                operation: OPERATION,
                member: last,
                detail: "data after the end-of-archive marker".to_owned(),
            });
        }
    }
    summary.stream_bytes = meter.read.get();
    Ok(summary)
}

fn unreachable_name(display: &str) -> Result<MemberPath, Error> {
    Err(Error::Malformed {
        operation: OPERATION,
        member: Some(display.to_owned()),
        detail: "member name changed while being checked".to_owned(),
    })
}

fn sink_error(meter: &MeterState, error: io::Error, member: &str) -> Error {
    if meter.in_trouble() {
        meter.classify(error, Some(member.to_owned()))
    } else {
        Error::Sink {
            operation: "write member",
            member: Some(member.to_owned()),
            source: error,
        }
    }
}

enum Kind {
    File,
    Directory,
}

/// Applies the member rules; `Ok(None)` is the archive root directory.
fn check_member(name: &[u8], type_byte: u8, seen: &mut Seen) -> Result<Option<Kind>, RejectReason> {
    let parsed = MemberPath::parse(name)?;
    let kind = match type_byte {
        b'0' | b'\0' | b'7' => Kind::File,
        b'5' => Kind::Directory,
        b'1' => return Err(RejectReason::HardLink),
        b'2' => return Err(RejectReason::Symlink),
        b'3' => return Err(RejectReason::CharacterDevice),
        b'4' => return Err(RejectReason::BlockDevice),
        b'6' => return Err(RejectReason::Fifo),
        b'S' => return Err(RejectReason::Sparse),
        other => return Err(RejectReason::UnsupportedType(other)),
    };
    let Some(path) = parsed else {
        return match kind {
            Kind::Directory => Ok(None),
            Kind::File => Err(RejectReason::EmptyName),
        };
    };
    if matches!(kind, Kind::File) && name.ends_with(b"/") {
        return Err(RejectReason::FileNameEndsWithSlash);
    }
    seen.admit(&path, matches!(kind, Kind::File))?;
    Ok(Some(kind))
}

/// Names seen so far, so that duplicates and members below files are caught.
#[derive(Default)]
struct Seen {
    members: HashSet<String>,
    files: HashSet<String>,
    dirs: HashSet<String>,
}

impl Seen {
    fn admit(&mut self, path: &MemberPath, is_file: bool) -> Result<(), RejectReason> {
        if self.members.contains(path.as_str()) {
            return Err(RejectReason::Duplicate);
        }
        if path.ancestors().any(|a| self.files.contains(a)) {
            return Err(RejectReason::ParentIsFile);
        }
        if is_file && self.dirs.contains(path.as_str()) {
            return Err(RejectReason::PathIsDirectory);
        }
        self.members.insert(path.as_str().to_owned());
        for ancestor in path.ancestors() {
            self.dirs.insert(ancestor.to_owned());
        }
        if is_file {
            self.files.insert(path.as_str().to_owned());
        } else {
            self.dirs.insert(path.as_str().to_owned());
        }
        Ok(())
    }
}

/// Extension records waiting for the member they describe.
#[derive(Default)]
struct Pending {
    long_name: Option<Option<Vec<u8>>>,
    pax_path: Option<Option<Vec<u8>>>,
    pax_size: Option<u64>,
}

impl Pending {
    fn is_pending(&self) -> bool {
        self.long_name.is_some() || self.pax_path.is_some() || self.pax_size.is_some()
    }

    /// The member's name (PAX wins over a GNU long name, which wins over the header) and
    /// whether it was too long to read.
    fn take_name(&mut self, header_name: Vec<u8>) -> (Vec<u8>, bool) {
        let long = self.long_name.take();
        let pax = self.pax_path.take();
        match pax.or(long) {
            Some(Some(mut name)) => {
                while name.last() == Some(&0) {
                    name.pop();
                }
                (name, false)
            }
            Some(None) => (header_name, true),
            None => (header_name, false),
        }
    }

    fn read_pax<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        meter: &MeterState,
        last: &Option<String>,
    ) -> Result<(), Error> {
        let Some(data) = read_bounded(entry, MAX_EXTENSION_BYTES, meter, last)? else {
            return Err(Error::Malformed {
                operation: OPERATION,
                member: last.clone(),
                detail: format!("PAX header larger than {MAX_EXTENSION_BYTES} bytes"),
            });
        };
        for record in tar::PaxExtensions::new(&data) {
            let record = record.map_err(|e| Error::Malformed {
                operation: OPERATION,
                member: last.clone(),
                detail: format!("bad PAX record: {e}"),
            })?;
            match record.key_bytes() {
                b"path" => {
                    let value = record.value_bytes();
                    self.pax_path =
                        Some((value.len() as u64 <= MAX_NAME_BYTES).then(|| value.to_vec()));
                }
                b"size" => {
                    let size = record
                        .value()
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| Error::Malformed {
                            operation: OPERATION,
                            member: last.clone(),
                            detail: "unreadable PAX size".to_owned(),
                        })?;
                    self.pax_size = Some(size);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Reads an extension record's data if it is at most `limit` bytes; `None` if it is longer
/// (the reader skips it without buffering).
fn read_bounded<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    limit: u64,
    meter: &MeterState,
    last: &Option<String>,
) -> Result<Option<Vec<u8>>, Error> {
    let size = entry.size();
    if size > limit {
        return Ok(None);
    }
    let mut data = Vec::with_capacity(size as usize);
    entry
        .read_to_end(&mut data)
        .map_err(|e| meter.classify(e, last.clone()))?;
    if data.len() as u64 != size {
        return Err(Error::Truncated {
            operation: OPERATION,
            member: last.clone(),
        });
    }
    Ok(Some(data))
}

struct Counted<'a> {
    inner: &'a mut dyn Read,
    count: u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

/// Shared between the metered stream and the reader: what happened underneath the tar parser.
struct MeterState {
    limit: u64,
    read: Cell<u64>,
    exceeded: Cell<bool>,
    eof: Cell<bool>,
    failure: RefCell<Option<io::Error>>,
}

impl MeterState {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            read: Cell::new(0),
            exceeded: Cell::new(false),
            eof: Cell::new(false),
            failure: RefCell::new(None),
        }
    }

    fn in_trouble(&self) -> bool {
        self.exceeded.get() || self.eof.get() || self.failure.borrow().is_some()
    }

    /// Turns an error surfacing from the tar parser into what really happened.
    fn classify(&self, error: io::Error, member: Option<String>) -> Error {
        if self.exceeded.get() {
            return Error::OverCap {
                operation: OPERATION,
                limit: self.limit,
                member,
            };
        }
        if let Some(source) = self.failure.borrow_mut().take() {
            return Error::Source {
                operation: OPERATION,
                source,
            };
        }
        if self.eof.get() {
            return Error::Truncated {
                operation: OPERATION,
                member,
            };
        }
        Error::Malformed {
            operation: OPERATION,
            member,
            detail: error.to_string(),
        }
    }
}

/// The stream as the tar parser sees it: every byte is counted as it is pulled, and the byte
/// past the cap fails the read.
struct Meter<'a> {
    inner: &'a mut dyn Read,
    state: &'a MeterState,
}

impl Read for Meter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let state = self.state;
        if state.exceeded.get() || state.failure.borrow().is_some() {
            return Err(io::Error::other("archive stream already failed"));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        // Ask for at most one byte past the cap, so the stream is never read further than that.
        let allowed = state.limit - state.read.get();
        let window =
            usize::try_from(allowed.saturating_add(1)).map_or(buf.len(), |w| w.min(buf.len()));
        loop {
            match self.inner.read(&mut buf[..window]) {
                Ok(0) => {
                    state.eof.set(true);
                    return Ok(0);
                }
                Ok(n) => {
                    let total = state.read.get() + n as u64;
                    state.read.set(total.min(state.limit.saturating_add(1)));
                    if total > state.limit {
                        state.exceeded.set(true);
                        return Err(io::Error::other("archive stream over its cap"));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    *state.failure.borrow_mut() = Some(e);
                    return Err(io::Error::other("archive stream failed"));
                }
            }
        }
    }
}
