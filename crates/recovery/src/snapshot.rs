//! Reading the sandbox's snapshot tar: capped while streaming, one member at a time.
//!
//! This is deliberately separate from state-sync's reader (the two crates must not depend on
//! each other). The rules are the same; the difference is that here a bad member never fails
//! the read: it becomes a [`SkipReason`] in the report (contract X5, S10).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::io::{self, Read};

use crate::Error;
use crate::report::SkipReason;

/// The longest member name buffered from a GNU long-name record or a PAX `path` (64 KiB).
const MAX_NAME_BYTES: u64 = 64 * 1024;
/// The largest PAX extended header buffered (1 MiB).
const MAX_EXTENSION_BYTES: u64 = 1024 * 1024;

/// One member of the snapshot, as handed to the recovery logic.
pub(crate) enum SnapshotMember<'a> {
    /// An accepted regular file, `path` checked (relative, normalised, UTF-8).
    File {
        path: String,
        size: u64,
        executable: bool,
        content: &'a mut dyn Read,
    },
    /// An accepted directory (used for structure only).
    Directory,
    /// A member that is not recovered, with its name as it appeared.
    Rejected { name: String, reason: SkipReason },
}

/// What the whole stream held.
pub(crate) struct SnapshotStats {
    /// Members other than the archive root, accepted or not.
    pub(crate) members: u64,
}

/// Reads the whole snapshot, calling `on_member` for each member. Any stream-level problem
/// (over the cap, truncated, malformed, the source failing) is an error, reported against the
/// member being read.
pub(crate) fn read_snapshot(
    source: &mut dyn Read,
    limit: u64,
    sandbox_id: &str,
    on_member: &mut dyn FnMut(SnapshotMember<'_>) -> Result<(), Error>,
) -> Result<SnapshotStats, Error> {
    let meter = MeterState {
        limit,
        sandbox_id,
        ..MeterState::default()
    };
    let mut archive = tar::Archive::new(Meter {
        inner: source,
        state: &meter,
    });
    let mut stats = SnapshotStats { members: 0 };
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
                b'K' | b'g' => continue,
                b'x' => {
                    pending.read_pax(&mut entry, &meter, &last)?;
                    continue;
                }
                _ => {}
            }
            let (name, too_long) = pending.take_name(header.path_bytes().into_owned());
            let display = String::from_utf8_lossy(&name).into_owned();
            if let Some(size) = pending.pax_size.take()
                && size != entry.size()
            {
                return Err(meter.malformed(Some(display), "PAX size differs from the header size"));
            }
            last = Some(display.clone());
            let checked = if too_long {
                Err(SkipReason::NameTooLong)
            } else {
                check_member(&name, type_byte, &mut seen)
            };
            let member = match checked {
                Ok(Checked::Root) => continue,
                Ok(Checked::Directory) => SnapshotMember::Directory,
                Ok(Checked::File(path)) => {
                    stats.members += 1;
                    let size = entry.size();
                    let executable = header.mode().map(|m| m & 0o111 != 0).unwrap_or(false);
                    let mut content = Counted {
                        inner: &mut entry,
                        count: 0,
                    };
                    let result = on_member(SnapshotMember::File {
                        path,
                        size,
                        executable,
                        content: &mut content,
                    });
                    result.map_err(|e| meter.reclassify(e, &display))?;
                    io::copy(&mut content, &mut io::sink())
                        .map_err(|e| meter.classify(&e, Some(display.clone())))?;
                    if content.count != size {
                        return Err(Error::SnapshotTruncated {
                            sandbox_id: sandbox_id.to_owned(),
                            member: Some(display),
                        });
                    }
                    continue;
                }
                Err(reason) => SnapshotMember::Rejected {
                    name: display.clone(),
                    reason,
                },
            };
            stats.members += 1;
            on_member(member).map_err(|e| meter.reclassify(e, &display))?;
        }
        let pending_extension =
            pending.long_name.is_some() || pending.pax_path.is_some() || pending.pax_size.is_some();
        if pending_extension && !meter.eof.get() {
            return Err(meter.malformed(last, "extended header not followed by a member"));
        }
    }
    if meter.eof.get() {
        // The tar crate stops quietly at end of stream; only a zero block marks a real end.
        return Err(Error::SnapshotTruncated {
            sandbox_id: sandbox_id.to_owned(),
            member: last,
        });
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
            return Err(meter.malformed(last, "data after the end-of-archive marker"));
        }
    }
    Ok(stats)
}

enum Checked {
    Root,
    Directory,
    File(String),
}

fn check_member(name: &[u8], type_byte: u8, seen: &mut Seen) -> Result<Checked, SkipReason> {
    let path = parse_name(name)?;
    let is_file = match type_byte {
        b'0' | b'\0' | b'7' => true,
        b'5' => false,
        b'1' => return Err(SkipReason::HardLink),
        b'2' => return Err(SkipReason::Symlink),
        b'3' => return Err(SkipReason::CharacterDevice),
        b'4' => return Err(SkipReason::BlockDevice),
        b'6' => return Err(SkipReason::Fifo),
        b'S' => return Err(SkipReason::Sparse),
        other => return Err(SkipReason::UnsupportedType(other)),
    };
    let Some(path) = path else {
        return if is_file {
            Err(SkipReason::EmptyName)
        } else {
            Ok(Checked::Root)
        };
    };
    if is_file && name.ends_with(b"/") {
        return Err(SkipReason::FileNameEndsWithSlash);
    }
    seen.admit(&path, is_file)?;
    Ok(if is_file {
        Checked::File(path)
    } else {
        Checked::Directory
    })
}

/// Checks and normalises a member name; `Ok(None)` is the archive root (`.` or `./`).
fn parse_name(raw: &[u8]) -> Result<Option<String>, SkipReason> {
    if raw.contains(&0) {
        return Err(SkipReason::NulByte);
    }
    let text = std::str::from_utf8(raw).map_err(|_| SkipReason::Unrepresentable)?;
    if text.is_empty() {
        return Err(SkipReason::EmptyName);
    }
    if text.starts_with('/') {
        return Err(SkipReason::AbsolutePath);
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in text.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(SkipReason::ParentTraversal),
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return if text.contains('.') {
            Ok(None)
        } else {
            Err(SkipReason::EmptyName)
        };
    }
    Ok(Some(parts.join("/")))
}

fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(at, _)| &path[..at])
}

#[derive(Default)]
struct Seen {
    members: HashSet<String>,
    files: HashSet<String>,
    dirs: HashSet<String>,
}

impl Seen {
    fn admit(&mut self, path: &str, is_file: bool) -> Result<(), SkipReason> {
        if self.members.contains(path) {
            return Err(SkipReason::Duplicate);
        }
        if ancestors(path).any(|a| self.files.contains(a)) {
            return Err(SkipReason::ParentIsFileMember);
        }
        if is_file && self.dirs.contains(path) {
            return Err(SkipReason::PathIsDirectoryMember);
        }
        self.members.insert(path.to_owned());
        for ancestor in ancestors(path) {
            self.dirs.insert(ancestor.to_owned());
        }
        if is_file {
            self.files.insert(path.to_owned());
        } else {
            self.dirs.insert(path.to_owned());
        }
        Ok(())
    }
}

#[derive(Default)]
struct Pending {
    long_name: Option<Option<Vec<u8>>>,
    pax_path: Option<Option<Vec<u8>>>,
    pax_size: Option<u64>,
}

impl Pending {
    fn take_name(&mut self, header_name: Vec<u8>) -> (Vec<u8>, bool) {
        let long = self.long_name.take();
        match self.pax_path.take().or(long) {
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
        meter: &MeterState<'_>,
        last: &Option<String>,
    ) -> Result<(), Error> {
        let Some(data) = read_bounded(entry, MAX_EXTENSION_BYTES, meter, last)? else {
            return Err(meter.malformed(last.clone(), "PAX header too large"));
        };
        for record in tar::PaxExtensions::new(&data) {
            let record = record.map_err(|_| meter.malformed(last.clone(), "bad PAX record"))?;
            match record.key_bytes() {
                b"path" => {
                    let value = record.value_bytes();
                    self.pax_path =
                        Some((value.len() as u64 <= MAX_NAME_BYTES).then(|| value.to_vec()));
                }
                b"size" => {
                    let size = record.value().ok().and_then(|v| v.parse::<u64>().ok());
                    self.pax_size = Some(
                        size.ok_or_else(|| meter.malformed(last.clone(), "unreadable PAX size"))?,
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn read_bounded<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    limit: u64,
    meter: &MeterState<'_>,
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
        return Err(Error::SnapshotTruncated {
            sandbox_id: meter.sandbox_id.to_owned(),
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

#[derive(Default)]
struct MeterState<'a> {
    limit: u64,
    sandbox_id: &'a str,
    read: Cell<u64>,
    exceeded: Cell<bool>,
    eof: Cell<bool>,
    failure: RefCell<Option<io::Error>>,
}

impl MeterState<'_> {
    fn in_trouble(&self) -> bool {
        self.exceeded.get() || self.eof.get() || self.failure.borrow().is_some()
    }

    fn malformed(&self, member: Option<String>, detail: &str) -> Error {
        Error::SnapshotMalformed {
            sandbox_id: self.sandbox_id.to_owned(),
            member,
            detail: detail.to_owned(),
        }
    }

    fn classify(&self, error: &io::Error, member: Option<String>) -> Error {
        let sandbox_id = self.sandbox_id.to_owned();
        if self.exceeded.get() {
            return Error::SnapshotOverCap {
                sandbox_id,
                limit: self.limit,
                member,
            };
        }
        if let Some(source) = self.failure.borrow_mut().take() {
            return Error::SnapshotSource { sandbox_id, source };
        }
        if self.eof.get() {
            return Error::SnapshotTruncated { sandbox_id, member };
        }
        Error::SnapshotMalformed {
            sandbox_id,
            member,
            detail: error.to_string(),
        }
    }

    /// An error from the recovery callback: if the stream underneath is what failed, say so.
    fn reclassify(&self, error: Error, member: &str) -> Error {
        match error {
            error if self.in_trouble() && error.is_snapshot_unreadable() => {
                self.classify(&io::Error::other("member content"), Some(member.to_owned()))
            }
            // Content errors are raised without context; give them the sandbox and member.
            Error::SnapshotMalformed {
                sandbox_id, detail, ..
            } if sandbox_id.is_empty() => Error::SnapshotMalformed {
                sandbox_id: self.sandbox_id.to_owned(),
                member: Some(member.to_owned()),
                detail,
            },
            error => error,
        }
    }
}

struct Meter<'a> {
    inner: &'a mut dyn Read,
    state: &'a MeterState<'a>,
}

impl Read for Meter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let state = self.state;
        if state.exceeded.get() || state.failure.borrow().is_some() {
            return Err(io::Error::other("snapshot stream already failed"));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        // At most one byte past the cap is ever requested from the source.
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
                        return Err(io::Error::other("snapshot stream over its cap"));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    *state.failure.borrow_mut() = Some(e);
                    return Err(io::Error::other("snapshot stream failed"));
                }
            }
        }
    }
}
