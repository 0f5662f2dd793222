//! A sandbox's own writable layer over the host's system: what its commands write outside
//! the home, `/tmp` and the volumes (`mkdir /app`, a package install) lands in the layer,
//! never on the host, and stays with the sandbox through pauses, snapshots and templates.
//!
//! The layer is an overlay mount: the host's root filesystem below, the sandbox's
//! `layer/` directory above. It is mounted once per sandbox, in a mount namespace held by
//! the sandbox's init ([`crate::sandbox_ns`]), never in the host's (where anything that
//! walked the sandbox's directory would walk the whole host through it). Every command
//! starts in that namespace, copies it (so all of a sandbox's commands share one overlay,
//! as one kernel's page cache, rather than each mounting its own over the same upper
//! directory, which overlayfs leaves undefined), binds its usual areas, brings the host's
//! other mounts (`/proc`, `/dev`, `/sys`, ...) over, and makes the overlay its root
//! ([`crate::isolation`]).
//!
//! Which sandboxes have one: a template build's (its steps may install anything, and the
//! host stays untouched), and every sandbox made from files that carry one (a built
//! template, a snapshot or fork of a sandbox with a layer). It needs a PID namespace to
//! hold the mount; a host without one runs builds read-only instead, as before.
//!
//! Architecture Invariant: the overlay is never mounted in the server's own mount
//! namespace, so a crash leaves no mount behind and deleting a sandbox's directory never
//! reaches the host's files.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::syscall::{check, cstring};
use crate::tree_copy::is_opaque;

/// The directory holding a layer's changes (overlayfs' upper directory) in a sandbox's
/// directory and in a snapshot's files.
pub(crate) const LAYER_DIR: &str = "layer";
/// Overlayfs' scratch directory, on the same filesystem as the layer.
const WORK_DIR: &str = "layer-work";
/// Where the overlay is mounted inside the sandbox's mount namespace (an empty directory
/// on the host).
const MOUNT_DIR: &str = "layer-root";

/// A sandbox's layer directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RootLayer {
    upper: PathBuf,
    work: PathBuf,
    root: PathBuf,
}

impl RootLayer {
    /// The layer of the sandbox whose directory is `dir`, if it has one.
    pub(crate) fn of_sandbox(dir: &Path) -> Option<RootLayer> {
        let layer = RootLayer::at(dir);
        layer.upper.is_dir().then_some(layer)
    }

    fn at(dir: &Path) -> RootLayer {
        RootLayer {
            upper: dir.join(LAYER_DIR),
            work: dir.join(WORK_DIR),
            root: dir.join(MOUNT_DIR),
        }
    }

    /// Gives the sandbox at `dir` an empty layer.
    pub(crate) fn create_empty(dir: &Path) -> io::Result<RootLayer> {
        let layer = RootLayer::at(dir);
        fs::create_dir_all(&layer.upper)?;
        // The layer's root is the host root's stand-in: the same mode, or a command as
        // `user` could not even look up `/` through the overlay.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&layer.upper, fs::Permissions::from_mode(0o755))?;
        Ok(layer)
    }

    /// Where the overlay is mounted in the sandbox's mount namespace.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// Mounts the overlay in a new mount namespace of the calling thread and returns that
    /// namespace. Runs on the thread that holds the sandbox's namespaces, which no other
    /// code uses ([`crate::sandbox_ns`]).
    pub(crate) fn mount_in_new_namespace(&self) -> io::Result<File> {
        // Left over from an earlier boot: overlayfs wants an empty scratch directory.
        if self.work.exists() {
            fs::remove_dir_all(&self.work)?;
        }
        fs::create_dir_all(&self.work)?;
        fs::create_dir_all(&self.root)?;
        let options = CString::new(format!(
            // Renames and hard links of lower files copy up whole (no redirect or metacopy
            // xattrs), so the upper directory alone says what the layer holds and a plain
            // copy of it is the layer.
            "lowerdir=/,upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
            overlay_path(&self.upper)?,
            overlay_path(&self.work)?,
        ))
        .map_err(io::Error::other)?;
        let target = cstring(&self.root)?;
        // SAFETY: unshare and mount take valid NUL-terminated strings; both affect only the
        // calling thread (CLONE_NEWNS unshares its filesystem attributes too).
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"overlay".as_ptr(),
                target.as_ptr(),
                c"overlay".as_ptr(),
                0,
                options.as_ptr().cast(),
            ))?;
        }
        File::open("/proc/thread-self/ns/mnt")
    }

    /// Whether `path` (absolute, as the sandbox names it, outside its areas) is a
    /// directory in the sandbox's view: in the layer, or on the host and neither deleted
    /// nor hidden by the layer.
    pub(crate) fn is_dir(&self, path: &str) -> bool {
        let mut upper = self.upper.clone();
        let mut host = PathBuf::from("/");
        let mut lower_visible = true;
        let mut parts = path.split('/').filter(|p| !p.is_empty() && *p != ".");
        while let Some(part) = parts.next() {
            upper.push(part);
            host.push(part);
            match fs::symlink_metadata(&upper) {
                Ok(meta) if meta.is_dir() => lower_visible &= !is_opaque(&upper),
                // A whiteout, a file or a link in the layer: not a directory to start in.
                Ok(_) => return false,
                Err(_) => {
                    // The layer holds nothing below here: the host decides, where the
                    // layer lets it show through.
                    host.extend(parts);
                    return lower_visible && host.is_dir();
                }
            }
        }
        true
    }
}

/// Copies the root layer of the sandbox (or snapshot) files at `from`, if they have one,
/// into `to`'s.
pub(crate) fn copy_layer(from: &Path, to: &Path) -> io::Result<crate::tree_copy::CopyStats> {
    let source = from.join(LAYER_DIR);
    if !source.is_dir() {
        return Ok(crate::tree_copy::CopyStats::default());
    }
    crate::tree_copy::copy_tree_keeping(
        &source,
        &to.join(LAYER_DIR),
        crate::tree_copy::Specials::OverlayMarkers,
    )
}

/// The mount points directly on the host's root mount (`/proc`, `/dev`, `/sys`, ...), which
/// a command whose root is the overlay gets bound over from the host, as its own root
/// would have them.
pub(crate) fn host_top_mounts() -> io::Result<Vec<PathBuf>> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(top_mounts(&table))
}

/// [`host_top_mounts`] from a `mountinfo` table.
fn top_mounts(table: &str) -> Vec<PathBuf> {
    let rows: Vec<(&str, &str, String)> = table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?;
            let parent = fields.next()?;
            let point = fields.nth(2)?;
            Some((id, parent, unescape(point)))
        })
        .collect();
    // The root mount seen last is the one on top (mounts stack in table order).
    let Some(root) = rows.iter().rev().find(|(_, _, point)| point == "/") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = rows
        .iter()
        .filter(|(_, parent, point)| *parent == root.0 && point != "/")
        .map(|(_, _, point)| PathBuf::from(point))
        .collect();
    points.sort();
    points.dedup();
    points
}

/// Undoes `mountinfo`'s octal escapes (`\040` for a space, and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .is_some_and(|digits| digits.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\' && octal {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u16, |acc, digit| acc * 8 + u16::from(digit - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path as an overlay option: overlayfs splits its options at commas and its lower
/// directories at colons, so those are refused rather than misread.
fn overlay_path(path: &Path) -> io::Result<String> {
    let text = path
        .to_str()
        .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", path.display())))?;
    if text.contains([',', ':', '\\']) {
        return Err(io::Error::other(format!(
            "{text} holds a comma, colon or backslash, which overlay mount options cannot carry"
        )));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree_copy::{is_whiteout, make_opaque, make_whiteout};

    #[test]
    fn the_top_mounts_are_the_children_of_the_topmost_root_mount() {
        let table = "\
22 1 253:0 / / rw - ext4 /dev/vda rw
23 22 0:5 / /dev rw - devtmpfs dev rw
24 23 0:6 / /dev/pts rw - devpts devpts rw
25 22 0:7 / /proc rw - proc proc rw
26 22 0:8 / /with\\040space rw - tmpfs tmpfs rw
27 1 0:9 / /old rw - tmpfs tmpfs rw
";
        assert_eq!(
            top_mounts(table),
            ["/dev", "/proc", "/with space"].map(PathBuf::from).to_vec()
        );
        // A root stacked over the first one: its children are the ones a command sees.
        let stacked =
            format!("{table}30 22 0:10 / / rw - tmpfs t rw\n31 30 0:11 / /x rw - tmpfs t rw\n");
        assert_eq!(top_mounts(&stacked), vec![PathBuf::from("/x")]);
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_layer_copy_keeps_its_whiteouts_and_opaque_directories_and_is_dir_honours_them() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("from");
        let layer = RootLayer::create_empty(&from).unwrap();
        let upper = from.join(LAYER_DIR);
        if !is_root() {
            // Only root makes overlayfs' markers (a device node, a trusted xattr).
            assert!(make_whiteout(&upper.join("usr")).is_err());
            return;
        }
        fs::create_dir_all(upper.join("app/src")).unwrap();
        fs::write(upper.join("app/src/main.py"), "print(1)\n").unwrap();
        make_whiteout(&upper.join("usr")).unwrap();
        fs::create_dir(upper.join("etc")).unwrap();
        make_opaque(&upper.join("etc")).unwrap();
        fs::create_dir(upper.join("var")).unwrap();

        // The sandbox's view: the layer's own, deleted, hidden, and the host's through it.
        assert!(layer.is_dir("/app/src"));
        assert!(!layer.is_dir("/usr"));
        assert!(!layer.is_dir("/usr/bin"));
        assert!(
            !layer.is_dir("/etc/ssl"),
            "an opaque directory hides the host's entries"
        );
        assert!(layer.is_dir("/etc"));
        assert!(layer.is_dir("/var/tmp") == Path::new("/var/tmp").is_dir());
        assert!(!layer.is_dir("/app/src/main.py"));
        assert!(!layer.is_dir("/no-such-dir-anywhere"));

        let to = dir.path().join("to");
        fs::create_dir(&to).unwrap();
        let stats = copy_layer(&from, &to).unwrap();
        assert_eq!((stats.files, stats.skipped), (1, 0));
        let copied = to.join(LAYER_DIR);
        assert!(is_whiteout(
            &fs::symlink_metadata(copied.join("usr")).unwrap()
        ));
        assert!(is_opaque(&copied.join("etc")));
        assert!(!is_opaque(&copied.join("var")));
        assert_eq!(
            fs::read_to_string(copied.join("app/src/main.py")).unwrap(),
            "print(1)\n"
        );
        // Files without a layer have none to copy.
        let bare = dir.path().join("bare");
        fs::create_dir(&bare).unwrap();
        assert_eq!(copy_layer(&bare, &to.join("x")).unwrap().files, 0);
        assert!(RootLayer::of_sandbox(&bare).is_none());
    }

    #[test]
    fn overlay_options_refuse_paths_they_would_misread() {
        assert!(overlay_path(Path::new("/var/lib/e2b/sb/layer")).is_ok());
        for bad in ["/a,b", "/a:b", "/a\\b"] {
            assert!(overlay_path(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
