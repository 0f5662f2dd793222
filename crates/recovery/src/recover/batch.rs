//! Restored files waiting for their names: written to temp names unsynced, made durable a
//! batch at a time, then named.
//!
//! Naming later does not change what a member meets on the host: the snapshot reader
//! refuses a second member at a path and any member below a file member, so no member
//! depends on one still waiting.
//!
//! The order is what makes a crash safe: (1) every temp file of the batch is written;
//! (2) one `syncfs(2)` per filesystem makes their data durable; (3) each temp takes its name
//! (a no-replace hard link); (4) a second `syncfs` makes the names durable, before recovery
//! returns and so before the push overwrites the sandbox's copy. A crash before (3) leaves
//! only hidden temp names; after it, a name never points at data that was not on disk
//! first. One `fdatasync` per file cost about three quarters of a 10,000-file recovery.

use std::collections::HashMap;

use cap_std::fs::{Dir, MetadataExt};

use super::{Run, Verdict, host_write_verdict, skipped};
use crate::Error;
use crate::host::{Spool, commit_temp, sync_filesystems};
use crate::report::Outcome;

/// Most restored files held before a batch is synced and named.
const MAX_FILES: usize = 4096;
/// Most distinct directory handles held (each an open descriptor) before a batch is synced.
const MAX_DIRS: usize = 128;

/// The files of the current batch, grouped by directory.
#[derive(Default)]
pub(super) struct Batch {
    groups: Vec<Group>,
    /// Where each directory's group is, by device and inode: members of the same
    /// directory share one handle however the archive interleaves them.
    by_identity: HashMap<(u64, u64), usize>,
    files: usize,
}

struct Group {
    dir: Dir,
    files: Vec<Waiting>,
}

struct Waiting {
    /// The member path (for errors and the report).
    path: String,
    /// The temp name in the group's directory.
    temp: String,
    /// The name the file takes.
    name: String,
    /// Its entry in the report, provisionally [`Outcome::Restored`].
    report: usize,
}

impl Batch {
    pub(super) fn is_full(&self) -> bool {
        self.files >= MAX_FILES || self.groups.len() >= MAX_DIRS
    }
}

impl Run<'_> {
    /// Queues temp file `temp` in `dir` to take `name` when the batch is settled. `report` is
    /// the index of the member's report entry.
    pub(super) fn wait_for_name(
        &mut self,
        path: &str,
        dir: Dir,
        temp: String,
        name: &str,
        report: usize,
    ) {
        let identity = dir.dir_metadata().ok().map(|meta| (meta.dev(), meta.ino()));
        let waiting = Waiting {
            path: path.to_owned(),
            temp,
            name: name.to_owned(),
            report,
        };
        let batch = &mut self.pending;
        batch.files += 1;
        let known = identity.and_then(|id| batch.by_identity.get(&id).copied());
        match known {
            Some(index) => batch.groups[index].files.push(waiting),
            None => {
                if let Some(id) = identity {
                    batch.by_identity.insert(id, batch.groups.len());
                }
                batch.groups.push(Group {
                    dir,
                    files: vec![waiting],
                });
            }
        }
    }

    /// Syncs the batch, names its files and syncs the names (see the module comment). Every
    /// temp file of the batch is gone afterwards, on success or not.
    pub(super) fn settle(&mut self) -> Result<(), Error> {
        let batch = std::mem::take(&mut self.pending);
        let Some(first) = batch.groups.first().and_then(|g| g.files.first()) else {
            return Ok(());
        };
        if let Err(source) = sync_filesystems(batch.groups.iter().map(|g| &g.dir)) {
            let error = self.host_io("sync", &first.path, source);
            for group in &batch.groups {
                for file in &group.files {
                    let _ = group.dir.remove_file(&file.temp);
                }
            }
            return Err(error);
        }
        let mut failed = None;
        for group in &batch.groups {
            for file in &group.files {
                if failed.is_some() {
                    let _ = group.dir.remove_file(&file.temp);
                    continue;
                }
                match self.name_one(&group.dir, file) {
                    Ok(outcome) => self.files[file.report].outcome = outcome,
                    Err(error) => {
                        let _ = group.dir.remove_file(&file.temp);
                        failed = Some(error);
                    }
                }
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        sync_filesystems(batch.groups.iter().map(|g| &g.dir))
            .map_err(|source| self.host_io("sync", &first.path, source))
    }

    /// Gives one synced temp file its name, unless the name appeared meanwhile (then the host
    /// copy is settled against it, as for any file the host has).
    fn name_one(&mut self, dir: &Dir, file: &Waiting) -> Result<Outcome, Error> {
        let spool = Spool::File {
            dir: self.try_clone(dir)?,
            name: file.temp.clone(),
        };
        let outcome = match commit_temp(dir, &file.temp, &file.name) {
            Ok(true) => return Ok(Outcome::Restored),
            // The name appeared while the file was being written: the host now has a copy.
            Ok(false) => self.settle_against_host(dir, &file.name, &file.path, &spool),
            Err(e) => match host_write_verdict(&e, &file.path) {
                Verdict::Skip(reason) => Ok(skipped(reason)),
                Verdict::Quarantine(reason) => self.quarantine_spool(&file.path, &spool, reason),
                Verdict::Fail => Err(self.host_io("rename", &file.path, e)),
            },
        };
        spool.discard();
        outcome
    }
}
