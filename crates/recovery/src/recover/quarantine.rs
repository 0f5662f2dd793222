//! The quarantine: where a sandbox file goes when it cannot be restored in place, saved under
//! `cache/e2b-recovered/<sandbox id>/` through a tree verified to resolve to exactly itself.

use std::io;
use std::path::Path;

use cap_fs_ext::DirExt;
use cap_std::fs::Dir;

use super::{
    Body, MAX_ALTERNATES, MEMORY_SPOOL_LIMIT, PATH_MAX, QUARANTINE_DIR, Run, Verdict,
    host_write_verdict, skipped,
};
use crate::Error;
use crate::host::{Spool, TempError, commit_temp, same_content, write_temp};
use crate::report::{Outcome, QuarantineReason, SkipReason};

impl Run<'_> {
    /// Reads the member's content into a spool that can be read again.
    pub(super) fn spool(&mut self, path: &str, body: Body<'_>) -> Result<Spool, Error> {
        let Body {
            content,
            size,
            executable,
        } = body;
        if size <= MEMORY_SPOOL_LIMIT {
            let mut data = Vec::with_capacity(size as usize);
            content
                .read_to_end(&mut data)
                .map_err(|e| self.content_failed(path, e))?;
            if data.len() as u64 != size {
                return Err(self.content_short(path));
            }
            return Ok(Spool::Memory { data, executable });
        }
        let base = self.quarantine_base()?;
        match write_temp(&base, &mut self.seq, content, size, executable) {
            Ok(name) => Ok(Spool::File { dir: base, name }),
            Err(TempError::Source(e)) => Err(self.content_failed(path, e)),
            Err(TempError::Short) => Err(self.content_short(path)),
            Err(TempError::Create(source) | TempError::Write(source)) => {
                Err(self.host_io("spool", path, source))
            }
        }
    }

    pub(super) fn quarantine_stream(
        &mut self,
        path: &str,
        body: Body<'_>,
        reason: QuarantineReason,
    ) -> Result<Outcome, Error> {
        let spool = self.spool(path, body)?;
        let outcome = self.quarantine_spool(path, &spool, reason);
        spool.discard();
        outcome
    }

    /// Saves `spool` at `cache/e2b-recovered/<id>/<path>` (or `<path>~N` when an earlier,
    /// different copy holds that name), through the verified quarantine tree.
    pub(super) fn quarantine_spool(
        &mut self,
        path: &str,
        spool: &Spool,
        reason: QuarantineReason,
    ) -> Result<Outcome, Error> {
        let prefix = format!("{QUARANTINE_DIR}/{}", self.id);
        let rel = format!("{prefix}/{path}");
        if self.home_len + 1 + rel.len() + 4 >= PATH_MAX {
            return Ok(skipped(SkipReason::PathTooLong));
        }
        if self.host_only.covers(&rel) {
            return Err(self.refuse(&rel, "a host-only path inside the quarantine tree"));
        }
        let comps: Vec<&str> = path.split('/').collect();
        let name = comps[comps.len() - 1];
        let mut dir = self.quarantine_base()?;
        for (index, comp) in comps[..comps.len() - 1].iter().enumerate() {
            let at = format!("{prefix}/{}", comps[..=index].join("/"));
            match dir.symlink_metadata(comp) {
                Ok(meta) if meta.is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(self.refuse(&at, "a symlink inside the quarantine tree"));
                }
                Ok(_) => return Ok(skipped(SkipReason::AncestorIsFile { at })),
                Err(e) if e.kind() == io::ErrorKind::NotFound => match dir.create_dir(comp) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => match host_write_verdict(&e, &at) {
                        Verdict::Skip(reason) => return Ok(skipped(reason)),
                        _ => return Err(self.host_io("create", &at, e)),
                    },
                },
                Err(source) => return Err(self.host_io("inspect", &at, source)),
            }
            dir = dir.open_dir_nofollow(comp).map_err(|_| {
                self.refuse(&at, "a directory inside the quarantine tree was redirected")
            })?;
        }
        let mut temp: Option<String> = None;
        let mut outcome = None;
        for attempt in 0..MAX_ALTERNATES {
            let candidate = if attempt == 0 {
                name.to_owned()
            } else {
                format!("{name}~{attempt}")
            };
            let candidate_rel = format!(
                "{}/{candidate}",
                rel.rsplit_once('/').map_or(rel.as_str(), |(d, _)| d)
            );
            if self.host_only.covers(&candidate_rel) {
                return Err(self.refuse(
                    &candidate_rel,
                    "a host-only path inside the quarantine tree",
                ));
            }
            match dir.symlink_metadata(&candidate) {
                Ok(meta) if meta.is_file() => {
                    // An earlier recovery may already have saved exactly this copy.
                    let same = same_content(&dir, &candidate, spool)
                        .map_err(|e| self.host_io("compare", &candidate_rel, e))?;
                    if same {
                        outcome = Some(quarantined(candidate_rel, reason.clone()));
                        break;
                    }
                    continue;
                }
                Ok(meta) if meta.is_dir() => continue,
                Ok(_) => {
                    return Err(self.refuse(
                        &candidate_rel,
                        "a symlink or special file inside the quarantine tree",
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(self.host_io("inspect", &candidate_rel, source)),
            }
            let temp_name = match &temp {
                Some(existing) => existing.clone(),
                None => {
                    let mut reader = spool
                        .reader()
                        .map_err(|e| self.host_io("read spool", path, e))?;
                    let (size, executable) =
                        spool_shape(spool).map_err(|e| self.host_io("read spool", path, e))?;
                    match write_temp(&dir, &mut self.seq, &mut reader, size, executable) {
                        Ok(name) => {
                            temp = Some(name.clone());
                            name
                        }
                        Err(TempError::Source(e)) => return Err(self.content_failed(path, e)),
                        Err(TempError::Short) => return Err(self.content_short(path)),
                        Err(TempError::Create(e) | TempError::Write(e)) => {
                            return Err(self.host_io("write", &candidate_rel, e));
                        }
                    }
                }
            };
            match commit_temp(&dir, &temp_name, &candidate) {
                Ok(true) => {
                    temp = None;
                    outcome = Some(quarantined(candidate_rel, reason.clone()));
                    break;
                }
                Ok(false) => continue,
                Err(e) => match host_write_verdict(&e, &candidate_rel) {
                    Verdict::Skip(skip) => {
                        outcome = Some(skipped(skip));
                        break;
                    }
                    _ => return Err(self.host_io("rename", &candidate_rel, e)),
                },
            }
        }
        if let Some(name) = temp {
            let _ = dir.remove_file(&name);
        }
        outcome.ok_or_else(|| self.refuse(&rel, "every alternative name is taken"))
    }

    /// Opens (creating as needed) `cache/e2b-recovered/<id>`, each level a real directory:
    /// the tree must resolve to exactly itself (contract S8).
    pub(super) fn quarantine_base(&mut self) -> Result<Dir, Error> {
        if self.quarantine.is_none() {
            let mut dir = self.try_clone(&self.home)?;
            let mut at = String::new();
            for comp in QUARANTINE_DIR.split('/').chain(std::iter::once(self.id)) {
                if !at.is_empty() {
                    at.push('/');
                }
                at.push_str(comp);
                match dir.symlink_metadata(comp) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(meta) if meta.file_type().is_symlink() => {
                        return Err(
                            self.refuse(&at, "the quarantine tree is redirected by a symlink")
                        );
                    }
                    Ok(_) => return Err(self.refuse(&at, "the quarantine tree is not a directory")),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => match dir.create_dir(comp) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(source) => return Err(self.host_io("create", &at, source)),
                    },
                    Err(source) => return Err(self.host_io("inspect", &at, source)),
                }
                dir = dir
                    .open_dir_nofollow(comp)
                    .map_err(|_| self.refuse(&at, "the quarantine tree is redirected"))?;
            }
            self.quarantine = Some(dir);
        }
        self.try_clone(self.quarantine.as_ref().expect("opened above"))
    }
}

fn spool_shape(spool: &Spool) -> io::Result<(u64, bool)> {
    match spool {
        Spool::Memory { data, executable } => Ok((data.len() as u64, *executable)),
        Spool::File { dir, name } => {
            let meta = dir.metadata(name)?;
            Ok((meta.len(), is_executable(&meta)))
        }
    }
}

#[cfg(unix)]
fn is_executable(meta: &cap_std::fs::Metadata) -> bool {
    use cap_std::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &cap_std::fs::Metadata) -> bool {
    false
}

fn quarantined(at: String, reason: QuarantineReason) -> Outcome {
    Outcome::Quarantined {
        at: Path::new(&at).to_path_buf(),
        reason,
    }
}
