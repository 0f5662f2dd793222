//! The user's edits of skills and memories, on the host and in the sandbox, recorded in the
//! ledger.

use std::path::Path;

use campaign::{EditKind, Side};
use rand::Rng;

use crate::state::Campaign;
use crate::{EPOCH_FILE, Error, FILES, QUIESCE_WAIT};

/// How often each kind of edit is drawn, per side. Appends lead on both (agents add to
/// MEMORY.md all day); in the sandbox they also put a longer version over the host's copy,
/// the case a comparison that stops at the shorter file's end gets wrong.
const WEIGHTS: [(EditKind, u32, u32); 4] = [
    // (kind, host weight, sandbox weight)
    (EditKind::Rewrite, 3, 2),
    (EditKind::Append, 4, 5),
    (EditKind::Truncate, 2, 2),
    (EditKind::LastByte, 1, 1),
];

impl Campaign {
    pub(crate) fn edit(&mut self, cycle: u64) -> Result<(), Error> {
        self.cycle_no = cycle;
        write_atomic(
            &self.home.join(EPOCH_FILE),
            format!("epoch {cycle}\n").as_bytes(),
        )?;
        for _ in 0..self.rng.random_range(0..=2) {
            let rel = FILES[self.rng.random_range(0..FILES.len())];
            let path = self.home.join(rel);
            let described = self.edit_file(Side::Host, cycle, rel, &path)?;
            self.note(format!("host {described}"));
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
                    let described = self.edit_file(Side::Sandbox, cycle, rel, &remote.join(rel))?;
                    // As if the sandbox's user had written it: the fenced commit runs as
                    // that user and must be able to replace it.
                    owned_like(&remote, rel)?;
                    self.note(format!("sandbox {id}: {described}"));
                }
            }
        }
        Ok(())
    }

    /// One edit of `rel` at `path` on `side`, drawn from [`WEIGHTS`], recorded in the ledger
    /// and counted; what was done, for the trace.
    pub(crate) fn edit_file(
        &mut self,
        side: Side,
        cycle: u64,
        rel: &str,
        path: &Path,
    ) -> Result<String, Error> {
        let weight = |w: &(EditKind, u32, u32)| if side == Side::Host { w.1 } else { w.2 };
        let mut draw = self
            .rng
            .random_range(0..WEIGHTS.iter().map(weight).sum::<u32>());
        let mut kind = EditKind::Rewrite;
        for entry in &WEIGHTS {
            if draw < weight(entry) {
                kind = entry.0;
                break;
            }
            draw -= weight(entry);
        }
        // One truncation in four goes to empty; the rest anywhere short of the whole file.
        let cut = if self.rng.random_bool(0.25) {
            0
        } else {
            self.rng.random_range(1..usize::MAX)
        };
        let old = std::fs::read(path).ok();
        let (kind, content) = self
            .ledger
            .edit(kind, old.as_deref(), side, cycle, rel, cut);
        write_atomic(path, &content)?;
        *self.edits.entry((side, kind)).or_default() += 1;
        let tail =
            String::from_utf8_lossy(&content[content.len().saturating_sub(24)..]).into_owned();
        Ok(format!(
            "{kind:?} {rel}: {} -> {} bytes, ending {tail:?}",
            old.map_or(0, |o| o.len()),
            content.len()
        ))
    }
}

/// Writes `content` to `path` atomically (a temp file beside it, then rename).
fn write_atomic(path: &Path, content: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("campaign-tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// Gives each component of `rel` below `root` the owner of `root`.
pub(crate) fn owned_like(root: &Path, rel: &str) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root)?;
    let mut path = root.to_path_buf();
    for part in Path::new(rel).components() {
        path.push(part);
        std::os::unix::fs::chown(&path, Some(meta.uid()), Some(meta.gid()))?;
    }
    Ok(())
}
