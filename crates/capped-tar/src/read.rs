//! The reader: walks the archive under the meter, applies the member rules and hands each
//! member to the visitor.

use std::collections::HashSet;
use std::io::{self, Read};

use crate::error::Error;
use crate::member::{Member, MemberKind, MemberPath, RejectReason};
use crate::meter::{Counted, Meter, MeterState};

/// The longest member name accepted from a GNU long-name record or a PAX `path` (64 KiB).
/// A longer name costs that member ([`RejectReason::NameTooLong`]); it is never buffered.
pub const MAX_NAME_BYTES: u64 = 64 * 1024;

/// The largest PAX extended header accepted (1 MiB). A larger one makes the archive malformed,
/// because its unread records could change where the next member starts.
pub const MAX_EXTENSION_BYTES: u64 = 1024 * 1024;

/// Where the members of an archive go, one at a time, in archive order.
///
/// The visitor owns the error type: a visitor error stops the read and is returned as it is,
/// and [`archive_failed`](Self::archive_failed) says how a failure of the archive itself is
/// expressed in it (typically a variant wrapping [`Error`] with the caller's context).
pub trait Visitor {
    /// What a failed read returns.
    type Error;

    /// Expresses a failure of the archive or of the stream underneath it.
    fn archive_failed(&self, error: Error) -> Self::Error;

    /// Called for an accepted directory member.
    fn directory(&mut self, member: &Member) -> Result<(), Self::Error>;

    /// Called for an accepted file member. `content` yields at most the header's size; what
    /// the visitor leaves unread is drained, and a short member is reported as truncated
    /// afterwards. If reading `content` fails, the visitor may return any error: the reader
    /// reports what happened to the stream instead (over the cap, truncated, source failure).
    fn file(&mut self, member: &Member, content: &mut dyn Read) -> Result<(), Self::Error>;

    /// Called for a member that broke a member rule. `name` is the name as it appeared,
    /// lossily rendered as UTF-8. Returning an error refuses the whole archive.
    fn rejected(&mut self, name: &str, reason: RejectReason) -> Result<(), Self::Error>;
}

/// What a complete read saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Regular files handed to the visitor.
    pub files: u64,
    /// Directories handed to the visitor (the archive root `./` is not one).
    pub directories: u64,
    /// Members handed to [`Visitor::rejected`].
    pub rejected: u64,
    /// Content bytes of the accepted files.
    pub file_bytes: u64,
    /// Bytes pulled from the stream, headers and padding included.
    pub stream_bytes: u64,
}

/// Reads a whole tar stream from `source`, at most `max_bytes` of it (headers and padding
/// included), handing every member to `visitor`.
///
/// Success means the archive was complete (it ended with its end-of-archive marker), stayed
/// under the cap and every member either reached the visitor as accepted or as rejected.
/// Anything else is an error: a partial archive is never a success. Only regular files and
/// directories are accepted; names must be relative, UTF-8, free of NUL and `..`; a member may
/// not repeat a name or sit below a file member.
pub fn read<V: Visitor + ?Sized>(
    source: &mut dyn Read,
    max_bytes: u64,
    visitor: &mut V,
) -> Result<Summary, V::Error> {
    walk(source, max_bytes, visitor).map_err(|stop| match stop {
        Stop::Archive(error) => visitor.archive_failed(error),
        Stop::Visitor(error) => error,
    })
}

/// Why a walk stopped early: the archive (or the stream under it), or the visitor.
enum Stop<E> {
    Archive(Error),
    Visitor(E),
}

impl<E> From<Error> for Stop<E> {
    fn from(error: Error) -> Self {
        Stop::Archive(error)
    }
}

fn walk<V: Visitor + ?Sized>(
    source: &mut dyn Read,
    max_bytes: u64,
    visitor: &mut V,
) -> Result<Summary, Stop<V::Error>> {
    let meter = MeterState::new(max_bytes);
    let mut archive = tar::Archive::new(Meter {
        inner: source,
        state: &meter,
    });
    let mut summary = Summary::default();
    let mut last: Option<String> = None;
    {
        let entries = archive
            .entries()
            .map_err(|e| meter.classify(&e, None))?
            .raw(true);
        let mut pending = Pending::default();
        let mut seen = Seen::default();
        for entry in entries {
            let mut entry = entry.map_err(|e| meter.classify(&e, last.clone()))?;
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

            let (name, name_too_long) = pending.take_name(header.path_bytes().into_owned());
            let display = String::from_utf8_lossy(&name).into_owned();
            if let Some(size) = pending.pax_size.take()
                && size != entry.size()
            {
                return Err(Error::Malformed {
                    member: Some(display),
                    detail: "PAX size differs from the header size".to_owned(),
                }
                .into());
            }
            last = Some(display.clone());

            let checked = if name_too_long {
                Err(RejectReason::NameTooLong)
            } else {
                check_member(&name, type_byte, &mut seen)
            };
            let (kind, path) = match checked {
                Ok(Some(accepted)) => accepted,
                Ok(None) => continue, // The archive root (`./`).
                Err(reason) => {
                    visitor
                        .rejected(&display, reason)
                        .map_err(|e| after_visit(&meter, e, &display))?;
                    summary.rejected += 1;
                    continue;
                }
            };
            let executable = header.mode().map(|m| m & 0o111 != 0).unwrap_or(false);
            let member = Member {
                path,
                name: display,
                kind: match kind {
                    Kind::Directory => MemberKind::Directory,
                    Kind::File => MemberKind::File {
                        size: entry.size(),
                        executable,
                    },
                },
                mtime: header.mtime().unwrap_or(0),
            };
            match member.kind {
                MemberKind::Directory => {
                    visitor
                        .directory(&member)
                        .map_err(|e| after_visit(&meter, e, &member.name))?;
                    summary.directories += 1;
                }
                MemberKind::File { size, .. } => {
                    let mut content = Counted {
                        inner: &mut entry,
                        count: 0,
                    };
                    visitor
                        .file(&member, &mut content)
                        .map_err(|e| after_visit(&meter, e, &member.name))?;
                    io::copy(&mut content, &mut io::sink())
                        .map_err(|e| meter.classify(&e, Some(member.name.clone())))?;
                    if content.count != size {
                        return Err(Error::Truncated {
                            member: Some(member.name),
                        }
                        .into());
                    }
                    summary.files += 1;
                    summary.file_bytes += size;
                }
            }
        }
        if pending.is_pending() && !meter.at_eof() {
            return Err(Error::Malformed {
                member: last,
                detail: "extended header not followed by a member".to_owned(),
            }
            .into());
        }
    }
    if meter.at_eof() {
        // The tar crate stops quietly at end of stream; only a zero block marks a real end.
        return Err(Error::Truncated { member: last }.into());
    }
    let mut rest = archive.into_inner();
    let mut buf = [0u8; 8192];
    loop {
        let n = rest
            .read(&mut buf)
            .map_err(|e| meter.classify(&e, last.clone()))?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(Error::Malformed {
                member: last,
                detail: "data after the end-of-archive marker".to_owned(),
            }
            .into());
        }
    }
    summary.stream_bytes = meter.bytes_read();
    Ok(summary)
}

/// A visitor's error, unless the stream underneath is what failed: then that is reported.
fn after_visit<E>(meter: &MeterState, error: E, member: &str) -> Stop<E> {
    if meter.in_trouble() {
        let cause = io::Error::other("member content");
        Stop::Archive(meter.classify(&cause, Some(member.to_owned())))
    } else {
        Stop::Visitor(error)
    }
}

enum Kind {
    File,
    Directory,
}

/// Applies the member rules; `Ok(None)` is the archive root directory.
fn check_member(
    name: &[u8],
    type_byte: u8,
    seen: &mut Seen,
) -> Result<Option<(Kind, MemberPath)>, RejectReason> {
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
    Ok(Some((kind, path)))
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
                member: last.clone(),
                detail: format!("PAX header larger than {MAX_EXTENSION_BYTES} bytes"),
            });
        };
        for record in tar::PaxExtensions::new(&data) {
            let record = record.map_err(|e| Error::Malformed {
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
        .map_err(|e| meter.classify(&e, last.clone()))?;
    if data.len() as u64 != size {
        return Err(Error::Truncated {
            member: last.clone(),
        });
    }
    Ok(Some(data))
}
