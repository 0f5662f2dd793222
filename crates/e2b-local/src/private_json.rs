//! Owner-only JSON records of the state directory (the secrets, the volumes with their
//! tokens): read back at start, made owner-only again if an older one was not, and
//! written whole to a temporary file and renamed, so a crash never leaves half a record.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The record at `path`, or the default when there is none yet.
pub(crate) fn load<T: DeserializeOwned + Default>(path: &Path) -> io::Result<T> {
    match fs::read(path) {
        Ok(bytes) => {
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
            serde_json::from_slice(&bytes).map_err(io::Error::other)
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(T::default()),
        Err(error) => Err(error),
    }
}

/// Replaces the record at `path` with `value`, durably; the error is the I/O one, for the
/// caller to word (it must never quote the record).
pub(crate) fn store<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}
