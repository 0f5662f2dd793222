//! E2B volumes: named directories of persistent files that outlive sandboxes, mounted into
//! a sandbox at create and read and written directly through the volume content API
//! ([`content`]) with the volume's own token.
//!
//! The team's volumes are listed in `<state_dir>/volumes.json` (owner-only: it holds the
//! tokens; written to a temporary file and renamed), and each volume's files live in
//! `<state_dir>/volumes/<volumeID>/`. A restart finds both.
//!
//! Where a volume may be mounted ([`Volumes::mounts_for`]): under the sandbox user's home
//! or `/tmp`, under `/mnt` (which a tmpfs covers in the sandbox, as on a fresh machine), or
//! at an existing empty directory of the host; never where the mount would hide host files
//! the sandbox's commands need. With path mapping (no mount namespace) only the home and
//! `/tmp`, where the mount point is a symlink to the volume.

pub(crate) mod content;

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::paths::{Mount, normalize};
use crate::reply::ApiError;

const INDEX_FILE: &str = "volumes.json";
const DATA_DIR: &str = "volumes";

/// E2B's spec: `^[a-zA-Z0-9_-]+$`. E2B sets no length; a file name's limit is ours.
const MAX_NAME: usize = 255;

/// Where a volume may be mounted outside the sandbox's areas: this directory is covered by a
/// tmpfs in the sandbox, so the mount point can be made without touching the host.
pub(crate) const MOUNT_ROOT: &str = "/mnt";

/// One volume as persisted.
#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    id: String,
    name: String,
    /// The bearer token of its content API (`VolumeAndToken.token`).
    token: String,
}

impl Stored {
    fn with_token_json(&self) -> Value {
        json!({"volumeID": self.id, "name": self.name, "token": self.token})
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Index {
    /// In creation order, the list's order.
    volumes: Vec<Stored>,
}

/// A volume mounted into one sandbox, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VolumeMount {
    pub(crate) name: String,
    pub(crate) volume_id: String,
    /// Where the sandbox sees it (normalised, absolute).
    pub(crate) path: String,
    /// The volume's files on the host.
    pub(crate) host: PathBuf,
    pub(crate) point: MountPoint,
}

/// How the mount point is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum MountPoint {
    /// A directory in the sandbox's home or tmp, which each command's mount namespace binds
    /// the volume onto.
    InArea,
    /// A directory under [`MOUNT_ROOT`], made on the tmpfs that covers it in the namespace.
    UnderMountRoot,
    /// An empty directory of the host, bound over in the namespace only.
    EmptyHostDir,
    /// A symlink in the sandbox's home or tmp to the volume (path mapping, no namespace).
    Link,
}

impl VolumeMount {
    /// The mount as the sandbox's path mapping sees it.
    pub(crate) fn mount(&self) -> Mount {
        Mount {
            virt: self.path.clone(),
            host: self.host.clone(),
        }
    }

    /// The entry E2B lists under a sandbox's `volumeMounts`.
    pub(crate) fn json(&self) -> Value {
        json!({"name": self.name, "path": self.path})
    }

    /// Makes the mount point in the sandbox's areas (`home` and `tmp` on the host, the home
    /// called `virt_home` in the sandbox); nothing for points outside them.
    pub(crate) fn make_point(
        &self,
        home: &Path,
        tmp: &Path,
        virt_home: &str,
        owner: Option<(u32, u32)>,
    ) -> io::Result<()> {
        let Some((area, rest)) =
            area_of(&self.path, virt_home).map(|(area, rest)| (area.dir(home, tmp), rest))
        else {
            return Ok(());
        };
        let point = area.join(rest);
        match self.point {
            MountPoint::InArea => crate::paths::create_dirs(area, &point, owner),
            MountPoint::Link => {
                if let Some(parent) = point.parent() {
                    crate::paths::create_dirs(area, parent, owner)?;
                }
                match fs::symlink_metadata(&point) {
                    Ok(meta) if meta.is_dir() => fs::remove_dir_all(&point)?,
                    Ok(_) => fs::remove_file(&point)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                std::os::unix::fs::symlink(&self.host, &point)
            }
            MountPoint::UnderMountRoot | MountPoint::EmptyHostDir => Ok(()),
        }
    }
}

/// One of a sandbox's two areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Area {
    Home,
    Tmp,
}

impl Area {
    /// The area's host directory, of the sandbox's `home` and `tmp`.
    pub(crate) fn dir<'a>(self, home: &'a Path, tmp: &'a Path) -> &'a Path {
        match self {
            Area::Home => home,
            Area::Tmp => tmp,
        }
    }
}

/// Which of the sandbox's areas holds `path`, and the rest of it below that area (empty for
/// the area itself).
pub(crate) fn area_of<'p>(path: &'p str, virt_home: &str) -> Option<(Area, &'p str)> {
    let under = |root: &str| {
        let rest = path.strip_prefix(root)?;
        if rest.is_empty() {
            Some("")
        } else {
            rest.strip_prefix('/')
        }
    };
    under(virt_home)
        .map(|rest| (Area::Home, rest))
        .or_else(|| under("/tmp").map(|rest| (Area::Tmp, rest)))
}

/// A mount a create asks for (`SandboxVolumeMount`).
#[derive(Debug, Deserialize)]
pub(crate) struct MountRequest {
    pub(crate) name: String,
    pub(crate) path: String,
}

/// The team's volumes.
pub(crate) struct Volumes {
    index_path: PathBuf,
    data: PathBuf,
    index: Mutex<Index>,
}

impl std::fmt::Debug for Volumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volumes")
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

impl Volumes {
    /// Opens (or starts) the record under `state_dir`.
    pub(crate) fn open(state_dir: &Path) -> io::Result<Volumes> {
        let index_path = state_dir.join(INDEX_FILE);
        let index = crate::private_json::load(&index_path)?;
        let data = state_dir.join(DATA_DIR);
        fs::create_dir_all(&data)?;
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700))?;
        Ok(Volumes {
            index_path,
            data,
            index: Mutex::new(index),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn persist(&self, index: &Index) -> Result<(), ApiError> {
        crate::private_json::store(&self.index_path, index).map_err(|error| {
            ApiError::internal(format!(
                "saving the volume list to {} failed: {error}",
                self.index_path.display()
            ))
        })
    }

    /// Where a volume's files are.
    fn dir(&self, id: &str) -> PathBuf {
        self.data.join(id)
    }

    /// `POST /volumes`.
    pub(crate) fn create(&self, name: &str) -> Result<Value, ApiError> {
        check_name(name)?;
        let mut index = self.lock();
        if index.volumes.iter().any(|v| v.name == name) {
            return Err(ApiError::bad_request(format!(
                "Volume with name '{name}' already exists"
            )));
        }
        let stored = Stored {
            id: crate::token::new_uuid(),
            name: name.to_owned(),
            token: new_token(),
        };
        let dir = self.dir(&stored.id);
        // World-writable like E2B's volume root, so the sandbox's user can write into it.
        fs::create_dir(&dir)
            .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)))
            .map_err(|error| {
                ApiError::internal(format!(
                    "creating volume '{name}' at {} failed: {error}",
                    dir.display()
                ))
            })?;
        index.volumes.push(stored.clone());
        if let Err(error) = self.persist(&index) {
            index.volumes.pop();
            let _ = fs::remove_dir_all(&dir);
            return Err(error);
        }
        tracing::info!(volume_id = %stored.id, name, "volume created");
        Ok(stored.with_token_json())
    }

    /// `GET /volumes`.
    pub(crate) fn list(&self) -> Value {
        let index = self.lock();
        Value::Array(
            index
                .volumes
                .iter()
                .map(|v| json!({"volumeID": v.id, "name": v.name}))
                .collect(),
        )
    }

    /// `GET /volumes/{volumeID}`.
    pub(crate) fn get(&self, id: &str) -> Result<Value, ApiError> {
        check_id(id)?;
        let index = self.lock();
        find(&index, id).map(Stored::with_token_json)
    }

    /// `DELETE /volumes/{volumeID}`. As on E2B, a volume mounted by a sandbox may be
    /// deleted; that sandbox's next command then fails, naming it (see
    /// [`crate::isolation`]), and its files API answers not found.
    pub(crate) fn delete(&self, id: &str) -> Result<(), ApiError> {
        check_id(id)?;
        let mut index = self.lock();
        let position = index
            .volumes
            .iter()
            .position(|v| v.id == id)
            .ok_or_else(|| not_found(id))?;
        let removed = index.volumes.remove(position);
        if let Err(error) = self.persist(&index) {
            index.volumes.insert(position, removed);
            return Err(error);
        }
        drop(index);
        if let Err(error) = fs::remove_dir_all(self.dir(id)) {
            tracing::warn!(volume_id = %id, %error, "removing a deleted volume's files failed");
        }
        tracing::info!(volume_id = %id, name = %removed.name, "volume deleted");
        Ok(())
    }

    /// The root of volume `id` when `token` is its content token: what every content route
    /// checks first. A missing or wrong token is 401, an unknown volume 404.
    pub(crate) fn authorize(&self, id: &str, token: Option<&str>) -> Result<PathBuf, ApiError> {
        let Some(token) = token else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "a volume token is required (Authorization: Bearer <token>)",
            ));
        };
        let index = self.lock();
        let Some(volume) = index.volumes.iter().find(|v| v.id == id) else {
            // The same answer for an unknown id and a wrong token would hide which one is
            // wrong; an unknown id says nothing about other volumes.
            return Err(not_found(id));
        };
        if !crate::token::constant_time_eq(token, &volume.token) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!("the token is not volume {id}'s"),
            ));
        }
        Ok(self.dir(id))
    }

    /// Checks a create's `volumeMounts` and says how each will be made. `namespace`: the
    /// sandbox's commands run in a mount namespace of their own.
    pub(crate) fn mounts_for(
        &self,
        requests: &[MountRequest],
        virt_home: &str,
        isolation: MountIsolation,
    ) -> Result<Vec<VolumeMount>, ApiError> {
        let index = self.lock();
        let mut mounts: Vec<VolumeMount> = Vec::with_capacity(requests.len());
        for request in requests {
            let bad = |reason: String| {
                ApiError::bad_request(format!(
                    "volumeMounts: volume '{}' at '{}': {reason}",
                    request.name, request.path
                ))
            };
            let volume = index
                .volumes
                .iter()
                .find(|v| v.name == request.name)
                .ok_or_else(|| bad("no volume has this name".to_owned()))?;
            if !request.path.starts_with('/') {
                return Err(bad("the path must be absolute".to_owned()));
            }
            // As E2B: a mount path is said plainly, never by way of `.` or `..`.
            if request
                .path
                .split('/')
                .any(|part| part == "." || part == "..")
            {
                return Err(bad(
                    "the path must not contain any '.' or '..' components".to_owned()
                ));
            }
            let path = normalize(&request.path, virt_home).map_err(|e| bad(e.message()))?;
            if let Some(other) = mounts.iter().find(|m| {
                m.path == path
                    || path.starts_with(&format!("{}/", m.path))
                    || m.path.starts_with(&format!("{path}/"))
            }) {
                return Err(bad(format!(
                    "it overlaps the mount of '{}' at '{}'",
                    other.name, other.path
                )));
            }
            let point = mount_point(&path, virt_home, isolation).map_err(bad)?;
            mounts.push(VolumeMount {
                name: volume.name.clone(),
                volume_id: volume.id.clone(),
                path,
                host: self.dir(&volume.id),
                point,
            });
        }
        Ok(mounts)
    }
}

/// Whether a sandbox's commands get a mount namespace (where volumes are bound) or path
/// mapping (where they are symlinks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MountIsolation {
    Namespace,
    PathMapping,
}

/// How a volume is mounted at `path`, or why it cannot be.
fn mount_point(
    path: &str,
    virt_home: &str,
    isolation: MountIsolation,
) -> Result<MountPoint, String> {
    if let Some((_, rest)) = area_of(path, virt_home) {
        if rest.is_empty() {
            return Err(format!(
                "a volume is mounted below {virt_home} or /tmp, not over it"
            ));
        }
        return Ok(match isolation {
            MountIsolation::Namespace => MountPoint::InArea,
            MountIsolation::PathMapping => MountPoint::Link,
        });
    }
    if isolation == MountIsolation::PathMapping {
        return Err(format!(
            "without a mount namespace e2b-local mounts volumes only below {virt_home} or /tmp"
        ));
    }
    let under_mount_root = path
        .strip_prefix(MOUNT_ROOT)
        .is_some_and(|rest| rest.starts_with('/'));
    if under_mount_root && Path::new(MOUNT_ROOT).is_dir() {
        return Ok(MountPoint::UnderMountRoot);
    }
    let system = ["/home", "/proc", "/sys", "/dev", "/run", "/etc"];
    let in_system = path == "/"
        || system
            .iter()
            .any(|root| path == *root || path.starts_with(&format!("{root}/")));
    if !in_system && let Ok(mut entries) = fs::read_dir(path) {
        if entries.next().is_none() {
            return Ok(MountPoint::EmptyHostDir);
        }
        return Err(format!(
            "'{path}' holds the host's files, which the mount would hide"
        ));
    }
    Err(format!(
        "e2b-local mounts a volume below {virt_home}, /tmp or {MOUNT_ROOT}, or at an existing \
         empty directory"
    ))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Invalid volume name '{name}': 1 to {MAX_NAME} letters, digits, '_' or '-'"
        )))
    }
}

/// E2B's volume ids are UUIDs; anything else is a bad request, as there.
fn check_id(id: &str) -> Result<(), ApiError> {
    let groups: Vec<&str> = id.split('-').collect();
    let lengths = [8, 4, 4, 4, 12];
    let valid = groups.len() == lengths.len()
        && groups
            .iter()
            .zip(lengths)
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if valid {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!("Invalid volume ID '{id}'")))
    }
}

fn find<'i>(index: &'i Index, id: &str) -> Result<&'i Stored, ApiError> {
    index
        .volumes
        .iter()
        .find(|v| v.id == id)
        .ok_or_else(|| not_found(id))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("Volume '{id}' not found"))
}

fn new_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("e2b_vol_{hex}")
}

/// The mounts of a sandbox by path, for the sandbox's detail (`volumeMounts`).
pub(crate) fn mounts_json(mounts: &[VolumeMount]) -> Value {
    Value::Array(mounts.iter().map(VolumeMount::json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Volumes) {
        let dir = tempfile::tempdir().unwrap();
        let volumes = Volumes::open(dir.path()).unwrap();
        (dir, volumes)
    }

    #[test]
    fn names_ids_and_tokens_are_checked_as_e2b_checks_them() {
        let (_dir, volumes) = open();
        assert_eq!(
            volumes.create("bad name").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        let made = volumes.create("data_1").unwrap();
        let id = made["volumeID"].as_str().unwrap().to_owned();
        check_id(&id).unwrap();
        let err = volumes.create("data_1").unwrap_err();
        assert!(err.message.contains("already exists"), "{}", err.message);
        assert_eq!(
            volumes.get("not-a-uuid").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            volumes.get(&crate::token::new_uuid()).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        let token = made["token"].as_str().unwrap();
        assert!(volumes.authorize(&id, Some(token)).is_ok());
        assert_eq!(
            volumes
                .authorize(&id, Some("e2b_vol_wrong"))
                .unwrap_err()
                .status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            volumes.authorize(&id, None).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn a_restart_finds_every_volume_and_a_delete_removes_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let volumes = Volumes::open(dir.path()).unwrap();
            let made = volumes.create("keep").unwrap();
            made["volumeID"].as_str().unwrap().to_owned()
        };
        let volumes = Volumes::open(dir.path()).unwrap();
        assert_eq!(volumes.get(&id).unwrap()["name"], "keep");
        let mode = fs::metadata(dir.path().join(INDEX_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the index holds tokens");
        fs::write(volumes.dir(&id).join("f"), b"x").unwrap();
        volumes.delete(&id).unwrap();
        assert!(!volumes.dir(&id).exists());
        assert_eq!(
            volumes.delete(&id).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn mounts_go_where_they_hide_nothing_of_the_host() {
        let (_dir, volumes) = open();
        volumes.create("a").unwrap();
        volumes.create("b").unwrap();
        let ask = |name: &str, path: &str| MountRequest {
            name: name.to_owned(),
            path: path.to_owned(),
        };
        let ns = MountIsolation::Namespace;
        let made = volumes
            .mounts_for(
                &[ask("a", "/home/user/data/"), ask("b", "/tmp/x")],
                "/home/user",
                ns,
            )
            .unwrap();
        assert_eq!(made[0].path, "/home/user/data");
        assert_eq!(made[0].point, MountPoint::InArea);
        assert_eq!(made[1].point, MountPoint::InArea);
        let linked = volumes
            .mounts_for(
                &[ask("a", "/tmp/x")],
                "/home/user",
                MountIsolation::PathMapping,
            )
            .unwrap();
        assert_eq!(linked[0].point, MountPoint::Link);
        for (path, why) in [
            ("/home/user", "not over it"),
            ("/etc", "mounts a volume below"),
            ("/usr", "hide"),
            ("relative", "absolute"),
            ("/tmp/../etc", "'..'"),
        ] {
            let err = volumes
                .mounts_for(&[ask("a", path)], "/home/user", ns)
                .unwrap_err();
            assert!(err.message.contains(why), "{path}: {}", err.message);
        }
        let err = volumes
            .mounts_for(
                &[ask("a", "/tmp/x"), ask("b", "/tmp/x/y")],
                "/home/user",
                ns,
            )
            .unwrap_err();
        assert!(err.message.contains("overlaps"), "{}", err.message);
        let err = volumes
            .mounts_for(&[ask("missing", "/tmp/x")], "/home/user", ns)
            .unwrap_err();
        assert!(err.message.contains("no volume"), "{}", err.message);
        let err = volumes
            .mounts_for(
                &[ask("a", "/mnt/x")],
                "/home/user",
                MountIsolation::PathMapping,
            )
            .unwrap_err();
        assert!(
            err.message.contains("without a mount namespace"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_point_in_the_home_is_a_directory_or_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let (home, tmp) = (dir.path().join("home"), dir.path().join("tmp"));
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).unwrap();
        let mut mount = VolumeMount {
            name: "a".into(),
            volume_id: crate::token::new_uuid(),
            path: "/home/user/d/e".into(),
            host: volume.clone(),
            point: MountPoint::InArea,
        };
        mount.make_point(&home, &tmp, "/home/user", None).unwrap();
        assert!(home.join("d/e").is_dir());
        mount.path = "/tmp/l".into();
        mount.point = MountPoint::Link;
        mount.make_point(&home, &tmp, "/home/user", None).unwrap();
        assert_eq!(fs::read_link(tmp.join("l")).unwrap(), volume);
    }
}
