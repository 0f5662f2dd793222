//! Host-side primitives: host-only path matching, spools, temp-then-commit writes.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};

/// The host-only set, as component lists relative to the physical Hermes home.
#[derive(Debug, Default)]
pub(crate) struct HostOnly {
    entries: Vec<Vec<String>>,
}

impl HostOnly {
    /// Resolves the caller's host-only paths (absolute, or relative to the home). Each is kept
    /// in its lexical form and in its physical form (symlinks on the way resolved), so a
    /// credential registered through a symlinked path still matches the place it really is.
    /// Paths outside the home are dropped: recovery never writes there anyway.
    pub(crate) fn resolve(given: &[PathBuf], home_given: &Path, home_phys: &Path) -> Self {
        let mut entries = Vec::new();
        for path in given {
            let absolute = if path.is_absolute() {
                path.clone()
            } else {
                home_given.join(path)
            };
            let lexical = normalize(&absolute);
            let mut forms = vec![lexical.clone()];
            if let Some(physical) = physical(&lexical) {
                forms.push(physical);
            }
            for form in forms {
                for base in [home_given, home_phys] {
                    if let Ok(rel) = form.strip_prefix(normalize(base)) {
                        let comps: Vec<String> = rel
                            .iter()
                            .map(|c| c.to_string_lossy().into_owned())
                            .collect();
                        if !entries.contains(&comps) {
                            entries.push(comps);
                        }
                    }
                }
            }
        }
        Self { entries }
    }

    /// Whether `rel` (a `/`-separated path relative to the home) is a host-only path or lies
    /// below one.
    pub(crate) fn covers(&self, rel: &str) -> bool {
        let comps: Vec<&str> = rel.split('/').collect();
        self.entries.iter().any(|entry| {
            entry.len() <= comps.len() && entry.iter().zip(&comps).all(|(a, b)| a == b)
        })
    }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The physical form of `path`: its deepest existing ancestor canonicalised, the rest appended.
fn physical(path: &Path) -> Option<PathBuf> {
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(&existing) {
            let mut out = canonical;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        rest.push(existing.file_name()?.to_os_string());
        if !existing.pop() {
            return None;
        }
    }
}

/// Sandbox content held so it can be read more than once (compared, then quarantined).
pub(crate) enum Spool {
    /// Small content, in memory, with its execute bit.
    Memory { data: Vec<u8>, executable: bool },
    /// Larger content, in a temp file named `name` in `dir`.
    File { dir: Dir, name: String },
}

impl Spool {
    pub(crate) fn reader(&self) -> io::Result<Box<dyn Read + '_>> {
        match self {
            Self::Memory { data, .. } => Ok(Box::new(&data[..])),
            Self::File { dir, name } => Ok(Box::new(dir.open(name)?)),
        }
    }

    /// Removes the spool's temp file, if it has one (best effort: it is a hidden temp name).
    pub(crate) fn discard(self) {
        if let Self::File { dir, name } = self {
            let _ = dir.remove_file(&name);
        }
    }
}

/// How writing a temp file failed.
pub(crate) enum TempError {
    /// Creating the file failed (nothing consumed from the source).
    Create(io::Error),
    /// Reading the source failed; the temp file was removed.
    Source(io::Error),
    /// The source ended before `size` bytes; the temp file was removed.
    Short,
    /// Writing failed (disk full, I/O); the temp file was removed.
    Write(io::Error),
}

/// Creates a fresh temp file in `dir` (never following or replacing anything), copies exactly
/// `size` bytes of `source` into it and syncs it. Returns the temp name.
pub(crate) fn write_temp(
    dir: &Dir,
    seq: &mut u64,
    source: &mut dyn Read,
    size: u64,
    executable: bool,
) -> Result<String, TempError> {
    write_temp_with(dir, seq, source, size, executable, Durability::SyncNow)
}

/// Like [`write_temp`], but on Linux leaves the data unsynced: the caller makes a whole batch
/// durable at once with [`sync_filesystems`] before any of it takes a name. Elsewhere (no
/// `syncfs(2)`) the file is synced here, as [`write_temp`] does.
pub(crate) fn write_temp_batched(
    dir: &Dir,
    seq: &mut u64,
    source: &mut dyn Read,
    size: u64,
    executable: bool,
) -> Result<String, TempError> {
    let durability = if cfg!(target_os = "linux") {
        Durability::Deferred
    } else {
        Durability::SyncNow
    };
    write_temp_with(dir, seq, source, size, executable, durability)
}

/// Whether a temp file is synced as soon as it is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    SyncNow,
    Deferred,
}

fn write_temp_with(
    dir: &Dir,
    seq: &mut u64,
    source: &mut dyn Read,
    size: u64,
    executable: bool,
    durability: Durability,
) -> Result<String, TempError> {
    let (name, mut file) = loop {
        *seq += 1;
        let name = format!(".e2b-recovery-{}-{}.tmp", std::process::id(), seq);
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .follow(FollowSymlinks::No);
        match dir.open_with(&name, &options) {
            Ok(file) => break (name, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(TempError::Create(e)),
        }
    };
    let outcome = (|| {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            let n = match source.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(TempError::Source(e)),
            };
            file.write_all(&buf[..n]).map_err(TempError::Write)?;
            total += n as u64;
        }
        if total != size {
            return Err(TempError::Short);
        }
        set_mode(&file, executable).map_err(TempError::Write)?;
        match durability {
            // The push that follows recovery overwrites the sandbox copy: make this one durable.
            Durability::SyncNow => file.sync_data().map_err(TempError::Write),
            Durability::Deferred => Ok(()),
        }
    })();
    match outcome {
        Ok(()) => Ok(name),
        Err(error) => {
            drop(file);
            let _ = dir.remove_file(&name);
            Err(error)
        }
    }
}

/// Makes everything written so far under `dirs` durable: one `syncfs(2)` per filesystem
/// they are on (written data, new names and new directories alike), instead of an
/// `fdatasync` per file. Linux reports writeback errors through `syncfs` since 5.8.
#[cfg(target_os = "linux")]
pub(crate) fn sync_filesystems<'a>(dirs: impl IntoIterator<Item = &'a Dir>) -> io::Result<()> {
    let mut synced = Vec::new();
    for dir in dirs {
        let device = rustix::fs::fstat(dir)?.st_dev;
        if !synced.contains(&device) {
            // Directory handles are `O_PATH`, which `syncfs` refuses: open it for reading.
            rustix::fs::syncfs(dir.open(".")?)?;
            synced.push(device);
        }
    }
    Ok(())
}

/// Without `syncfs(2)` every temp file was synced when written ([`write_temp_batched`]);
/// what remains is the directories, so the names are durable too.
#[cfg(not(target_os = "linux"))]
pub(crate) fn sync_filesystems<'a>(dirs: impl IntoIterator<Item = &'a Dir>) -> io::Result<()> {
    for dir in dirs {
        dir.open(".")?.sync_all()?;
    }
    Ok(())
}

#[cfg(unix)]
fn set_mode(file: &cap_std::fs::File, executable: bool) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if executable { 0o755 } else { 0o644 };
    file.set_permissions(cap_std::fs::Permissions::from_std(
        std::fs::Permissions::from_mode(mode),
    ))
}

#[cfg(not(unix))]
fn set_mode(_file: &cap_std::fs::File, _executable: bool) -> io::Result<()> {
    Ok(())
}

/// Gives temp file `temp` (in `dir`) the name `name`, unless `name` exists. Returns whether it
/// was placed; the temp name is gone only when it was.
///
/// On Linux a `renameat2(RENAME_NOREPLACE)` does it in one call; elsewhere, or where the
/// filesystem does not support the flag, a hard link is the no-replace rename. Either fails if
/// anything, even a dangling symlink, holds the name. On filesystems without hard links it
/// falls back to check-then-rename.
pub(crate) fn commit_temp(dir: &Dir, temp: &str, name: &str) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        // Both are single components (the snapshot reader refuses `..` and empty names), so
        // naming them relative to the verified handle resolves nothing outside it.
        use rustix::fs::{RenameFlags, renameat_with};
        match renameat_with(dir, temp, dir, name, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {}
            Err(other) => return Err(other.into()),
        }
    }
    match dir.hard_link(temp, dir, name) {
        Ok(()) => {
            dir.remove_file(temp)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported
            ) =>
        {
            match dir.symlink_metadata(name) {
                Ok(_) => Ok(false),
                Err(missing) if missing.kind() == io::ErrorKind::NotFound => {
                    dir.rename(temp, dir, name)?;
                    Ok(true)
                }
                Err(other) => Err(other),
            }
        }
        Err(e) => Err(e),
    }
}

/// Result of comparing a host file with sandbox content.
pub(crate) enum Comparison {
    Same,
    Different,
    Unreadable,
    NotRegular,
}

/// Compares the regular file `name` in `dir` (opened without following a symlink) with `spool`.
pub(crate) fn compare_host(dir: &Dir, name: &str, spool: &Spool) -> io::Result<Comparison> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    let mut host = match dir.open_with(name, &options) {
        Ok(file) => file,
        Err(_) => {
            return Ok(match dir.symlink_metadata(name) {
                Ok(meta) if !meta.is_file() => Comparison::NotRegular,
                _ => Comparison::Unreadable,
            });
        }
    };
    match host.metadata() {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Ok(Comparison::NotRegular),
        Err(_) => return Ok(Comparison::Unreadable),
    }
    let mut sandbox = spool.reader()?;
    let mut a = vec![0u8; 64 * 1024];
    let mut b = vec![0u8; 64 * 1024];
    loop {
        let n = match read_full(&mut host, &mut a) {
            Ok(n) => n,
            Err(_) => return Ok(Comparison::Unreadable),
        };
        let m = read_full(&mut sandbox, &mut b[..n.max(1)])?;
        if n != m || a[..n] != b[..m] {
            return Ok(Comparison::Different);
        }
        if n == 0 {
            return Ok(Comparison::Same);
        }
    }
}

fn read_full(source: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Whether the regular file `name` in `dir` has exactly the content of `spool`.
pub(crate) fn same_content(dir: &Dir, name: &str, spool: &Spool) -> io::Result<bool> {
    Ok(matches!(compare_host(dir, name, spool)?, Comparison::Same))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_temp_never_replaces_anything_at_the_name() {
        let tmp = std::env::temp_dir().join(format!("recovery-commit-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("mkdir");
        let dir = Dir::open_ambient_dir(&tmp, cap_std::ambient_authority()).expect("open");
        dir.write("t1", b"new").expect("temp");
        assert!(commit_temp(&dir, "t1", "free").expect("commits"));
        assert_eq!(dir.read("free").expect("named"), b"new");
        assert!(dir.symlink_metadata("t1").is_err(), "the temp name is gone");
        dir.write("t2", b"newer").expect("temp");
        dir.write("taken", b"host").expect("host file");
        assert!(!commit_temp(&dir, "t2", "taken").expect("refuses"));
        assert_eq!(dir.read("taken").expect("host file"), b"host");
        std::os::unix::fs::symlink("/nonexistent/target", tmp.join("dangling")).expect("ln");
        assert!(!commit_temp(&dir, "t2", "dangling").expect("refuses"));
        assert_eq!(dir.read("t2").expect("the temp stays"), b"newer");
        drop(dir);
        std::fs::remove_dir_all(&tmp).expect("cleanup");
    }

    #[test]
    fn host_only_covers_paths_and_their_subtrees() {
        let home = Path::new("/nonexistent-home/.hermes");
        let set = HostOnly::resolve(
            &[
                PathBuf::from("skills/acme/token.json"),
                PathBuf::from("/nonexistent-home/.hermes/platforms"),
            ],
            home,
            home,
        );
        assert!(set.covers("skills/acme/token.json"));
        assert!(set.covers("platforms/x/y"));
        assert!(!set.covers("skills/acme/token.json.bak"));
        assert!(!set.covers("skills/acme"));
        assert!(!set.covers("memories/platforms"));
    }
}
