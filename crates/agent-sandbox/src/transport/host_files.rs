//! The host side of a push: the files under a profile home's state directories.

use std::path::{Path, PathBuf};

/// Every file under `home`'s `dirs` (e.g. `skills`, `memories`) as the `(host path, remote
/// path)` pairs [`StateTransport::upload_many`](crate::StateTransport::upload_many) takes, the remote path being the same relative
/// path under `remote_home`; sorted. Unreadable directories are skipped: a push sends what it
/// can read, and the next one sends the rest.
pub fn host_state_files(home: &Path, dirs: &[&str], remote_home: &str) -> Vec<(PathBuf, String)> {
    fn walk(root: &Path, dir: &Path, remote_home: &str, out: &mut Vec<(PathBuf, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, remote_home, out);
            } else if let Ok(rel) = path.strip_prefix(root) {
                let remote = format!("{remote_home}/{}", rel.to_string_lossy());
                out.push((path, remote));
            }
        }
    }
    let mut files = Vec::new();
    for dir in dirs {
        walk(home, &home.join(dir), remote_home, &mut files);
    }
    files.sort();
    files
}
