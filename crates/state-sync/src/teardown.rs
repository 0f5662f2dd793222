//! The teardown pull: the sandbox's Hermes home in, the tar Hermes expects out.

use std::io::{self, Read, Write};

use capped_tar::{Member, MemberKind};

use crate::Error;
use crate::archive::{ArchiveSummary, MemberSink, ReadConfig, read_archive};
use crate::plan::{check_remote_path, shell_quote};

const OPERATION: &str = "write teardown archive";

/// The command that makes the sandbox stream its Hermes home for [`pull_teardown`]:
/// `tar -C '<remote root>' -cf - .` (members relative to the root, sockets left out by tar).
pub fn teardown_command(remote_root: &str) -> Result<String, Error> {
    check_remote_path(OPERATION, remote_root)?;
    Ok(format!("tar -C {} -cf - .", shell_quote(remote_root)))
}

/// Where [`teardown_file_command`] makes the archive: a fresh private file in the sandbox's
/// `/tmp` (outside the synced state), named by `mktemp` from this prefix.
pub const TEARDOWN_ARCHIVE_PREFIX: &str = "/tmp/hermes-e2b-pull.";

/// The command that makes the sandbox write the archive of [`teardown_command`] to a fresh
/// private file ([`TEARDOWN_ARCHIVE_PREFIX`], mode 0600) while the caller downloads it as it
/// grows (ranges of `/files`). Its output is two lines: the file's path as soon as it exists
/// (read it with [`teardown_archive_path`]), then, once `tar` has succeeded, the archive's
/// size in bytes (read it with [`teardown_archive_size`]), which is where the download ends.
/// Prints nothing when `remote_root` is not a directory (verifiably nothing to pull). A
/// failing `tar` removes its partial file and exits non-zero; the caller removes the file
/// once it has it all (or gives up). Archives an hour old are removed first: a pull that lost
/// its connection cannot leave one behind for good. The file is opened once, before its path
/// is printed, and `tar` writes to that descriptor: a removal after a failure cannot be
/// undone by a child of the shell the caller's kill missed opening the path again.
pub fn teardown_file_command(remote_root: &str) -> Result<String, Error> {
    check_remote_path(OPERATION, remote_root)?;
    Ok(format!(
        "umask 077; \
         find /tmp -maxdepth 1 -name '{stale}*' -type f -mmin +60 -exec rm -f {{}} + 2>/dev/null; \
         [ -d {root} ] || exit 0; f=$(mktemp {TEARDOWN_ARCHIVE_PREFIX}XXXXXX) || exit 1; \
         exec 3>\"$f\" || exit 1; \
         trap 'rm -f \"$f\"' HUP INT TERM; printf '%s\\n' \"$f\"; \
         b=; case $(tar --version 2>/dev/null) in *'GNU tar'*|*bsdtar*) b='-b {TEARDOWN_BLOCKING_FACTOR}' ;; esac; \
         if tar $b -C {root} -cf - . >&3; then wc -c < \"$f\"; else rm -f \"$f\"; exit 1; fi",
        root = shell_quote(remote_root),
        stale = TEARDOWN_ARCHIVE_PREFIX.trim_start_matches("/tmp/"),
    ))
}

/// The teardown archive's records, in 512-byte blocks (128 KiB), where `tar` takes the
/// option (GNU tar, bsdtar; busybox `tar` has none and keeps its own): its default of 20
/// (10 KiB) costs a read and a write system call per 10 KiB, about twice the system time
/// of writing 500 MiB in 128 KiB records, and writing the file is the pull's wall. The last
/// record is padded with zeros, so an archive grows by less than one record.
pub const TEARDOWN_BLOCKING_FACTOR: u32 = 256;

/// The archive path [`teardown_file_command`] printed: its first line, newline included
/// (the command prints nothing when there is nothing to pull). The output comes from the
/// sandbox: anything but one path of the documented shape is refused, so the download and
/// the removal that follow can only touch that file.
pub fn teardown_archive_path(line: &[u8]) -> Result<String, Error> {
    let stdout = line;
    let refuse = |reason| Error::InvalidRemotePath {
        operation: "teardown pull",
        path: String::from_utf8_lossy(stdout).chars().take(200).collect(),
        reason,
    };
    let line = stdout
        .strip_suffix(b"\n")
        .ok_or_else(|| refuse("not one line"))?;
    let suffix = line
        .strip_prefix(TEARDOWN_ARCHIVE_PREFIX.as_bytes())
        .ok_or_else(|| refuse("not the archive the teardown command makes"))?;
    if suffix.len() < 6 || !suffix.iter().all(u8::is_ascii_alphanumeric) {
        return Err(refuse("not a name mktemp makes"));
    }
    // All ASCII, checked above.
    Ok(String::from_utf8_lossy(line).into_owned())
}

/// The archive size [`teardown_file_command`] printed after its path, once `tar` succeeded:
/// the rest of its output, one decimal number (`wc -c` may pad it with blanks). `None` for
/// anything else: the sandbox's word is not taken for more.
pub fn teardown_archive_size(rest: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(rest.strip_suffix(b"\n")?).ok()?.trim();
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Reads the sandbox's archive of `remote_root` (members relative to it, as
/// [`teardown_command`] produces) and writes to `dest` the archive Hermes' `bulk_download_fn`
/// must produce: every accepted member named by its absolute remote path without the leading
/// `/` (`home/user/.hermes/skills/x/SKILL.md`), regular files and directories only, modes
/// reduced to 0644/0755, owner 0.
///
/// On error `dest` holds an unfinished archive without an end marker; the caller discards it.
/// Returns the summary and `dest` (for the caller to flush or sync).
pub fn pull_teardown<W: Write>(
    source: &mut dyn Read,
    config: &ReadConfig,
    remote_root: &str,
    dest: W,
) -> Result<(ArchiveSummary, W), Error> {
    let mut out = TeardownArchive::new(dest, remote_root)?;
    match read_archive(source, config, &mut out) {
        Ok(summary) => Ok((summary, out.finish()?)),
        Err(error) => {
            out.abandon();
            Err(error)
        }
    }
}

/// A [`MemberSink`] writing the archive Hermes extracts after its teardown pull.
pub struct TeardownArchive<W: Write> {
    builder: tar::Builder<Gate<W>>,
    prefix: String,
}

impl<W: Write> std::fmt::Debug for TeardownArchive<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeardownArchive")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl<W: Write> TeardownArchive<W> {
    /// Starts an archive whose members live under `remote_root` (absolute, normalised).
    pub fn new(dest: W, remote_root: &str) -> Result<Self, Error> {
        check_remote_path(OPERATION, remote_root)?;
        let builder = tar::Builder::new(Gate {
            inner: dest,
            open: true,
        });
        Ok(Self {
            builder,
            prefix: remote_root[1..].to_owned(),
        })
    }

    /// Writes the end-of-archive marker and returns the destination.
    pub fn finish(self) -> Result<W, Error> {
        self.builder
            .into_inner()
            .map(|gate| gate.inner)
            .map_err(|source| Error::Sink {
                operation: OPERATION,
                member: None,
                source,
            })
    }

    /// Drops the archive without an end marker, so a partial pull can never pass for a whole
    /// one.
    pub fn abandon(mut self) {
        // The tar builder finishes itself on drop; a closed gate makes that write fail.
        self.builder.get_mut().open = false;
    }

    fn header(member: &Member) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(member.mtime);
        match member.kind {
            MemberKind::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
            }
            MemberKind::File { size, executable } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(if executable { 0o755 } else { 0o644 });
                header.set_size(size);
            }
        }
        header
    }
}

impl<W: Write> MemberSink for TeardownArchive<W> {
    fn directory(&mut self, member: &Member) -> io::Result<()> {
        let mut header = Self::header(member);
        let name = format!("{}/{}", self.prefix, member.path);
        self.builder.append_data(&mut header, name, io::empty())
    }

    fn file(&mut self, member: &Member, content: &mut dyn Read) -> io::Result<()> {
        let mut header = Self::header(member);
        let name = format!("{}/{}", self.prefix, member.path);
        self.builder.append_data(&mut header, name, content)
    }
}

/// A writer that can be closed, so that the builder's finish-on-drop writes nothing.
struct Gate<W> {
    inner: W,
    open: bool,
}

impl<W: Write> Write for Gate<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.open {
            return Err(io::Error::other("teardown archive abandoned"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
