//! Maps the paths a client names (`/home/user/...`, relative, `~`, `/tmp/...`) onto a
//! sandbox's host directories, without letting `..` or a symlink lead out of them.
//!
//! Symlinks inside the sandbox are resolved in the sandbox's own view: an absolute
//! target such as `/home/user/x` means the sandbox's home, not the host's. A path that
//! ends up anywhere but the sandbox home or its private tmp is refused. This guards the
//! writes the server performs itself; commands are not confined by it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The virtual directory commands see as their home, on every template but
/// [`OTHER_HOME_TEMPLATE`].
pub(crate) const HOME: &str = "/home/user";

/// A built-in template whose user's home is [`OTHER_HOME`], so clients can be tested against
/// a sandbox whose `$HOME` is not E2B's usual `/home/user`.
pub(crate) const OTHER_HOME_TEMPLATE: &str = "agent-home";

/// The home of [`OTHER_HOME_TEMPLATE`]'s user (directly under `/home`, where the namespace
/// set-up mounts homes).
pub(crate) const OTHER_HOME: &str = "/home/agent";

/// The home a template's user has.
pub(crate) fn home_for_template(template: &str) -> &'static str {
    if template == OTHER_HOME_TEMPLATE {
        OTHER_HOME
    } else {
        HOME
    }
}

/// Where a sandbox reads its boot id: its own (one per boot, see
/// [`crate::process_table::ProcessTable::boot_id`]), bound there for mount-namespace
/// commands and served for this path by `/files`.
pub(crate) const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Why a path could not be mapped.
#[derive(Debug)]
pub(crate) enum PathError {
    /// The path (after resolution) is outside `/home/user` and `/tmp`.
    Outside(String),
    /// Too many symlink hops, a NUL byte, or a non-UTF-8 link target.
    Invalid(String),
}

impl PathError {
    pub(crate) fn message(&self) -> String {
        match self {
            PathError::Outside(p) => format!(
                "path '{p}' is outside the sandbox: e2b-local serves only the user's home and /tmp"
            ),
            PathError::Invalid(p) => format!("invalid path '{p}'"),
        }
    }
}

/// Whether the last component is followed when it is a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Last {
    Follow,
    NoFollow,
}

/// A mapped path: where it lives on the host, and its name inside the sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) host: PathBuf,
    pub(crate) virt: String,
    /// The host directory of the area (home or tmp) the path is in.
    pub(crate) area_root: PathBuf,
}

/// A volume mounted into a sandbox: the directory the sandbox names, and the volume's
/// files on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// A normalised absolute path in the sandbox.
    pub(crate) virt: String,
    pub(crate) host: PathBuf,
}

/// A sandbox's writable areas: its home, its tmp, and the volumes mounted into it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SandboxFs<'a> {
    pub(crate) home: &'a Path,
    pub(crate) tmp: &'a Path,
    /// What the sandbox calls its home ([`home_for_template`]).
    pub(crate) virt_home: &'a str,
    /// Checked before home and tmp: a mount may lie inside either.
    pub(crate) mounts: &'a [Mount],
}

/// Turns any client path into a normalised absolute virtual path; relative paths and `~`
/// are under `home`.
pub(crate) fn normalize(path: &str, home: &str) -> Result<String, PathError> {
    if path.contains('\0') {
        return Err(PathError::Invalid(path.replace('\0', "\\0")));
    }
    let absolute = if path.is_empty() || path == "~" {
        home.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in absolute.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

impl<'a> SandboxFs<'a> {
    /// Splits a normalised virtual path into (area host root, area virtual root, rest).
    fn classify<'p>(&self, virt: &'p str) -> Option<(PathBuf, &'a str, Vec<&'p str>)> {
        // The deepest mount holding the path wins: mounts may nest.
        let mount = self
            .mounts
            .iter()
            .filter_map(|m| strip_area(virt, &m.virt).map(|rest| (m, rest)))
            .max_by_key(|(m, _)| m.virt.len());
        let (root, name, rest) = if let Some((mount, rest)) = mount {
            (mount.host.as_path(), mount.virt.as_str(), rest)
        } else if let Some(rest) = strip_area(virt, self.virt_home) {
            (self.home, self.virt_home, rest)
        } else if let Some(rest) = strip_area(virt, "/tmp") {
            (self.tmp, "/tmp", rest)
        } else {
            return None;
        };
        let rest = rest.split('/').filter(|p| !p.is_empty()).collect();
        Some((root.to_path_buf(), name, rest))
    }

    /// Maps `path` to the host, resolving symlinks in the sandbox's view.
    pub(crate) fn resolve(&self, path: &str, last: Last) -> Result<Resolved, PathError> {
        let virt = normalize(path, self.virt_home)?;
        walk(virt, self.virt_home, last, |virt| self.classify(virt))
    }
}

/// Maps `path`, named inside a volume (`/` is the volume's root), to the host directory
/// `root` holds it in; a symlink resolves inside the volume, as in a chroot, and `..` never
/// climbs above the root. The answer's `virt` is the path inside the volume.
pub(crate) fn resolve_in_volume(
    root: &Path,
    path: &str,
    last: Last,
) -> Result<Resolved, PathError> {
    let virt = normalize(path, "/")?;
    walk(virt, "/", last, |virt| {
        let rest = virt.split('/').filter(|p| !p.is_empty()).collect();
        Some((root.to_path_buf(), "", rest))
    })
}

/// Walks a normalised virtual path component by component, restarting at each symlink
/// with its target (in the same virtual view); `classify` names the area a path is in.
fn walk<'a, F>(mut virt: String, home: &str, last: Last, classify: F) -> Result<Resolved, PathError>
where
    F: for<'p> Fn(&'p str) -> Option<(PathBuf, &'a str, Vec<&'p str>)>,
{
    let mut hops = 0;
    'restart: loop {
        let Some((area_root, area_name, rest)) = classify(&virt) else {
            return Err(PathError::Outside(virt));
        };
        let mut host = area_root.clone();
        let mut current = area_name.to_owned();
        for (index, part) in rest.iter().enumerate() {
            let is_last = index + 1 == rest.len();
            let candidate = host.join(part);
            let is_link = fs::symlink_metadata(&candidate)
                .map(|m| m.file_type().is_symlink())
                .unwrap_or(false);
            if is_link && !(is_last && last == Last::NoFollow) {
                hops += 1;
                if hops > 40 {
                    return Err(PathError::Invalid(virt));
                }
                let target =
                    fs::read_link(&candidate).map_err(|_| PathError::Invalid(virt.clone()))?;
                let Some(target) = target.to_str() else {
                    return Err(PathError::Invalid(virt));
                };
                let remaining = rest[index + 1..].join("/");
                let joined = if target.starts_with('/') {
                    format!("{target}/{remaining}")
                } else {
                    format!("{current}/{target}/{remaining}")
                };
                virt = normalize(&joined, home)?;
                continue 'restart;
            }
            host = candidate;
            current.push('/');
            current.push_str(part);
        }
        if current.is_empty() {
            current.push('/');
        }
        return Ok(Resolved {
            host,
            virt: current,
            area_root,
        });
    }
}

fn strip_area<'p>(virt: &'p str, area: &str) -> Option<&'p str> {
    let rest = virt.strip_prefix(area)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// Creates the missing directories between `area_root` and `dir` (inclusive), giving
/// each new one to `owner`. Refuses to descend through anything that is not a real
/// directory.
pub(crate) fn create_dirs(
    area_root: &Path,
    dir: &Path,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    create_dirs_with(area_root, dir, |made| chown(made, owner))
}

/// [`create_dirs`], calling `made` on each directory it creates (to give it its owner and
/// mode).
pub(crate) fn create_dirs_with(
    area_root: &Path,
    dir: &Path,
    mut made: impl FnMut(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let Ok(relative) = dir.strip_prefix(area_root) else {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "directory outside the sandbox",
        ));
    };
    let mut current = area_root.to_path_buf();
    for part in relative.components() {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!(
                        "'{}' is not a directory",
                        part.as_os_str().to_string_lossy()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&current)?;
                made(&current)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Gives `path` (not following a symlink) to `owner`, when one is set.
pub(crate) fn chown(path: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    match owner {
        Some((uid, gid)) => std::os::unix::fs::lchown(path, Some(uid), Some(gid)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_maps_relative_tilde_and_dotdot() {
        assert_eq!(normalize("", HOME).unwrap(), "/home/user");
        assert_eq!(normalize("a/b", HOME).unwrap(), "/home/user/a/b");
        assert_eq!(normalize("~/x", HOME).unwrap(), "/home/user/x");
        assert_eq!(normalize("/home/user/../../etc", HOME).unwrap(), "/etc");
        assert_eq!(normalize("../../../..", HOME).unwrap(), "/");
        assert_eq!(normalize("/tmp//./x/", HOME).unwrap(), "/tmp/x");
        assert_eq!(normalize("~/x", OTHER_HOME).unwrap(), "/home/agent/x");
        assert_eq!(normalize("", OTHER_HOME).unwrap(), "/home/agent");
    }

    #[test]
    fn the_other_home_template_is_the_only_one_with_another_home() {
        assert_eq!(home_for_template(OTHER_HOME_TEMPLATE), "/home/agent");
        assert_eq!(home_for_template("base"), HOME);
        assert_eq!(home_for_template("custom"), HOME);
    }

    #[test]
    fn a_sandbox_with_another_home_serves_that_home_not_home_user() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let tmp = dir.path().join("tmp");
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let fsys = SandboxFs {
            home: &home,
            tmp: &tmp,
            virt_home: OTHER_HOME,
            mounts: &[],
        };
        let r = fsys.resolve("a.txt", Last::Follow).unwrap();
        assert_eq!(r.virt, "/home/agent/a.txt");
        assert_eq!(r.host, home.join("a.txt"));
        assert!(matches!(
            fsys.resolve("/home/user/a.txt", Last::Follow),
            Err(PathError::Outside(_))
        ));
    }

    #[test]
    fn resolve_refuses_escapes_and_follows_links_virtually() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let tmp = dir.path().join("tmp");
        fs::create_dir_all(home.join("sub")).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let fsys = SandboxFs {
            home: &home,
            tmp: &tmp,
            virt_home: HOME,
            mounts: &[],
        };
        let r = fsys.resolve("sub/f.txt", Last::Follow).unwrap();
        assert_eq!(r.host, home.join("sub/f.txt"));
        assert_eq!(r.virt, "/home/user/sub/f.txt");
        assert!(matches!(
            fsys.resolve("../../etc/passwd", Last::Follow),
            Err(PathError::Outside(_))
        ));
        // A link pointing at the host's /etc is refused; one pointing into /tmp maps to
        // the sandbox's private tmp.
        std::os::unix::fs::symlink("/etc", home.join("etc")).unwrap();
        assert!(matches!(
            fsys.resolve("etc/passwd", Last::Follow),
            Err(PathError::Outside(_))
        ));
        std::os::unix::fs::symlink("/tmp/t", home.join("t")).unwrap();
        let r = fsys.resolve("t/x", Last::Follow).unwrap();
        assert_eq!(r.host, tmp.join("t/x"));
        assert_eq!(r.virt, "/tmp/t/x");
        // Not following the last component names the link itself.
        let r = fsys.resolve("etc", Last::NoFollow).unwrap();
        assert_eq!(r.host, home.join("etc"));
        // A relative link climbing out is refused too.
        std::os::unix::fs::symlink("../../../..", home.join("up")).unwrap();
        assert!(matches!(
            fsys.resolve("up/x", Last::Follow),
            Err(PathError::Outside(_))
        ));
        // Link loops end with an error, not a hang.
        std::os::unix::fs::symlink("loop", home.join("loop")).unwrap();
        assert!(matches!(
            fsys.resolve("loop", Last::Follow),
            Err(PathError::Invalid(_))
        ));
    }

    #[test]
    fn a_mounted_volume_wins_over_the_area_that_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let (home, tmp, vol) = (
            dir.path().join("h"),
            dir.path().join("t"),
            dir.path().join("v"),
        );
        for d in [&home, &tmp, &vol] {
            fs::create_dir_all(d).unwrap();
        }
        let mounts = [Mount {
            virt: "/home/user/data".into(),
            host: vol.clone(),
        }];
        let fsys = SandboxFs {
            home: &home,
            tmp: &tmp,
            virt_home: HOME,
            mounts: &mounts,
        };
        let r = fsys.resolve("data/x.txt", Last::Follow).unwrap();
        assert_eq!(r.host, vol.join("x.txt"));
        assert_eq!(r.area_root, vol);
        assert_eq!(r.virt, "/home/user/data/x.txt");
        // The mount point's name only: a sibling is in the home.
        let r = fsys.resolve("database", Last::Follow).unwrap();
        assert_eq!(r.host, home.join("database"));
        // A link in the home into the mount reaches the volume.
        std::os::unix::fs::symlink("/home/user/data/y", home.join("l")).unwrap();
        assert_eq!(fsys.resolve("l", Last::Follow).unwrap().host, vol.join("y"));
    }

    #[test]
    fn a_volume_path_never_leaves_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        fs::create_dir_all(root.join("a")).unwrap();
        let r = resolve_in_volume(&root, "/a/../../../etc/passwd", Last::Follow).unwrap();
        assert_eq!(r.host, root.join("etc/passwd"));
        assert_eq!(r.virt, "/etc/passwd");
        assert_eq!(
            resolve_in_volume(&root, "/", Last::Follow).unwrap().virt,
            "/"
        );
        assert_eq!(
            resolve_in_volume(&root, "a", Last::Follow).unwrap().virt,
            "/a"
        );
        // Links resolve as in a chroot: an absolute target is the volume's.
        std::os::unix::fs::symlink("/etc", root.join("a/etc")).unwrap();
        let r = resolve_in_volume(&root, "/a/etc/passwd", Last::Follow).unwrap();
        assert_eq!(r.host, root.join("etc/passwd"));
        std::os::unix::fs::symlink("../../..", root.join("up")).unwrap();
        let r = resolve_in_volume(&root, "/up/x", Last::Follow).unwrap();
        assert_eq!(r.host, root.join("x"));
    }
}
