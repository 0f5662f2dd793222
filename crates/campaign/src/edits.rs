//! The user's edits of skills and memories, on the host and in the sandbox, recorded in the
//! ledger.

use std::path::Path;

use campaign::Side;
use rand::Rng;

use crate::cycle::Campaign;
use crate::{EPOCH_FILE, Error, FILES, QUIESCE_WAIT};

impl Campaign {
    pub(crate) fn edit(&mut self, cycle: u64) -> Result<(), Error> {
        write_atomic(&self.home.join(EPOCH_FILE), &format!("epoch {cycle}\n"))?;
        for _ in 0..self.rng.random_range(0..=2) {
            let rel = FILES[self.rng.random_range(0..FILES.len())];
            let path = self.home.join(rel);
            if let Ok(old) = std::fs::read_to_string(&path) {
                self.ledger.overwrite(&old);
            }
            let content = self.ledger.write(Side::Host, cycle, rel);
            write_atomic(&path, &content)?;
            self.host_edits += 1;
            self.note(format!("host edit: {}", content.trim_end()));
        }
        let edits = self.rng.random_range(0..=2);
        if edits > 0 && self.sandbox.is_some() {
            self.server.quiesce(QUIESCE_WAIT)?;
        }
        if let Some(id) = self.sandbox.clone() {
            let remote = self.server.sandbox_hermes_home(&id);
            if remote.is_dir() {
                for _ in 0..edits {
                    let rel = FILES[self.rng.random_range(0..FILES.len())];
                    let path = remote.join(rel);
                    if let Ok(old) = std::fs::read_to_string(&path) {
                        self.ledger.overwrite(&old);
                    }
                    let content = self.ledger.write(Side::Sandbox, cycle, rel);
                    write_atomic(&path, &content)?;
                    // As if the sandbox's user had written it: the fenced commit runs as
                    // that user and must be able to replace it.
                    owned_like(&remote, rel)?;
                    self.sandbox_edits += 1;
                    self.note(format!("sandbox edit in {id}: {}", content.trim_end()));
                }
            }
        }
        Ok(())
    }
}

/// Writes `content` to `path` atomically (a temp file beside it, then rename).
fn write_atomic(path: &Path, content: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("campaign-tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// Gives each component of `rel` below `root` the owner of `root`.
fn owned_like(root: &Path, rel: &str) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root)?;
    let mut path = root.to_path_buf();
    for part in Path::new(rel).components() {
        path.push(part);
        std::os::unix::fs::chown(&path, Some(meta.uid()), Some(meta.gid()))?;
    }
    Ok(())
}
