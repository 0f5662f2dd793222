//! Copies a sandbox's file tree for snapshots: copy-on-write (a reflink through `FICLONE`)
//! where the filesystem shares extents (btrfs, xfs, bcachefs), an in-kernel copy
//! (`copy_file_range`, through `std::io::copy`) otherwise. Modes, owners and modification
//! times are kept, as `cp -a` keeps them; symlinks are copied as links, never followed.
//! A root layer's copy also keeps overlayfs' markers, whiteouts and opaque directories, which
//! this module reads and writes for [`crate::root_layer`] too.

use std::fs::{self, File, FileTimes, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::syscall::{check, cstring};

/// What one copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyStats {
    /// Regular files copied.
    pub(crate) files: u64,
    /// Their bytes.
    pub(crate) bytes: u64,
    /// Of those files, how many were reflinked (copy-on-write) rather than copied.
    pub(crate) reflinked: u64,
    /// Sockets, fifos and devices, which a snapshot does not keep.
    pub(crate) skipped: u64,
}

/// What a copy does with the entries that are not files, directories or links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Specials {
    /// Leaves them out (a home or `/tmp`: sockets and fifos belong to processes).
    Skip,
    /// Keeps overlayfs' markers of a root layer ([`crate::root_layer`]): whiteouts (the
    /// lower files it deleted) and opaque directories (the lower ones it replaced).
    OverlayMarkers,
}

/// Copies the tree at `src` to `dst`, which must not exist yet.
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> io::Result<CopyStats> {
    copy_tree_keeping(src, dst, Specials::Skip)
}

/// [`copy_tree`], keeping the special entries `specials` names.
pub(crate) fn copy_tree_keeping(
    src: &Path,
    dst: &Path,
    specials: Specials,
) -> io::Result<CopyStats> {
    let mut stats = CopyStats::default();
    // Directories get their real mode and times only after their content is in, so a
    // read-only directory can still be filled and its mtime is not changed by the filling.
    let mut dirs: Vec<(PathBuf, fs::Metadata)> = Vec::new();
    let mut stack = vec![(src.to_path_buf(), dst.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        let meta = fs::symlink_metadata(&from)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            fs::DirBuilder::new().mode(0o700).create(&to)?;
            if specials == Specials::OverlayMarkers && is_opaque(&from) {
                make_opaque(&to)?;
            }
            for entry in fs::read_dir(&from)? {
                let entry = entry?;
                stack.push((entry.path(), to.join(entry.file_name())));
            }
            dirs.push((to, meta));
        } else if kind.is_file() {
            let reflinked = copy_file(&from, &to, &meta)?;
            stats.files += 1;
            stats.bytes += meta.len();
            stats.reflinked += u64::from(reflinked);
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
            keep_owner(&to, &meta)?;
        } else if specials == Specials::OverlayMarkers && is_whiteout(&meta) {
            make_whiteout(&to)?;
        } else {
            tracing::debug!(path = %from.display(), "snapshot skips a socket, fifo or device");
            stats.skipped += 1;
        }
    }
    for (dir, meta) in dirs.iter().rev() {
        keep_owner(dir, meta)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        File::open(dir)?.set_times(times_of(meta)?)?;
    }
    Ok(stats)
}

/// Copies one regular file; true when it was reflinked.
fn copy_file(from: &Path, to: &Path, meta: &fs::Metadata) -> io::Result<bool> {
    let mut source = File::open(from)?;
    let mut target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    // SAFETY: both descriptors are open for the duration of the call; FICLONE takes the
    // source descriptor as its argument and touches no memory of ours.
    let cloned = unsafe { libc::ioctl(target.as_raw_fd(), libc::FICLONE, source.as_raw_fd()) } == 0;
    if !cloned {
        io::copy(&mut source, &mut target)?;
    }
    keep_owner(to, meta)?;
    target.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    target.set_times(times_of(meta)?)?;
    Ok(cloned)
}

fn times_of(meta: &fs::Metadata) -> io::Result<FileTimes> {
    Ok(FileTimes::new()
        .set_accessed(meta.accessed()?)
        .set_modified(meta.modified()?))
}

/// Gives the copy the original's owner when it differs (a server running as root serves
/// homes owned by the sandbox user); a server that may not change owners keeps its own.
fn keep_owner(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let now = fs::symlink_metadata(path)?;
    if now.uid() == meta.uid() && now.gid() == meta.gid() {
        return Ok(());
    }
    match std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid())) {
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        other => other,
    }
}

/// Overlayfs' marker for a deleted lower file: a character device 0:0 in the upper dir.
const WHITEOUT_RDEV: u64 = 0;
/// The extended attribute that makes an upper directory hide the lower one's entries.
const OPAQUE_XATTR: &std::ffi::CStr = c"trusted.overlay.opaque";

/// Whether an upper-directory entry is a whiteout (a deleted lower entry).
pub(crate) fn is_whiteout(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_char_device() && meta.rdev() == WHITEOUT_RDEV
}

/// Marks `path` (absent) deleted, as overlayfs does: a character device 0:0.
pub(crate) fn make_whiteout(path: &Path) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: a valid NUL-terminated path; mknod touches no memory of ours.
    check(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR, WHITEOUT_RDEV) })
}

/// Makes the directory `dir` opaque, as overlayfs does.
pub(crate) fn make_opaque(dir: &Path) -> io::Result<()> {
    let path = cstring(dir)?;
    // SAFETY: valid NUL-terminated strings and a one-byte value of the length given.
    check(unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            OPAQUE_XATTR.as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    })
}

/// Whether an upper directory is opaque (hides the lower directory's entries).
pub(crate) fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = cstring(dir) else {
        return false;
    };
    let mut value = [0u8; 4];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let read = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            OPAQUE_XATTR.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    read > 0 && value[0] == b'y'
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn a_copy_keeps_content_modes_links_and_times_and_is_independent() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f.txt"), b"hello").unwrap();
        fs::write(src.join("run.sh"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(src.join("a/b/f.txt"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o555)).unwrap();

        let dst = dir.path().join("dst");
        let stats = copy_tree(&src, &dst).unwrap();
        assert_eq!((stats.files, stats.bytes), (2, 15));
        assert_eq!(fs::read(dst.join("a/b/f.txt")).unwrap(), b"hello");
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dst.join("run.sh")), 0o751);
        assert_eq!(mode(&dst.join("a")), 0o555);
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert_eq!(
            fs::metadata(dst.join("a/b/f.txt"))
                .unwrap()
                .modified()
                .unwrap(),
            old
        );
        // Writing the copy leaves the original alone (a reflink is copy-on-write too).
        fs::write(dst.join("a/b/f.txt"), b"changed").unwrap();
        assert_eq!(fs::read(src.join("a/b/f.txt")).unwrap(), b"hello");
        fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dst.join("a"), fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn copying_onto_an_existing_target_fails() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("src")).unwrap();
        fs::create_dir(dir.path().join("dst")).unwrap();
        assert!(copy_tree(&dir.path().join("src"), &dir.path().join("dst")).is_err());
    }
}
