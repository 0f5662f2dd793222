//! Pushing state: uploads and deletes, a fenced writer's staging (`writer_arbitration:
//! sandbox`, C10), and the push base recovery reads (S15).

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::PoisonError;

use bytes::Bytes;
use e2b_client::{StartOptions, UploadFile};
use state_sync::{DeletePlan, UploadPlan};

use super::stream::stderr_text;
use super::{StateTransport, Transfer};
use crate::error::Error;
use crate::progress::ProgressUnit;

/// Files up to this size are uploaded from memory (retryable); larger ones are streamed.
const IN_MEMORY_UPLOAD: u64 = 8 << 20;

/// What a fenced writer staged since the last commit.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    pub(crate) dir: String,
    pub(crate) uploads: usize,
    pub(crate) deletes: Vec<String>,
}

impl StateTransport {
    /// Stages every later upload under the Hermes home into `dir` and holds deletes back
    /// (`Some`), or writes straight into the home again (`None`); drops what was staged.
    pub(crate) fn stage_into(&self, dir: Option<String>) {
        *self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = dir.map(|dir| Staging {
            dir,
            ..Staging::default()
        });
    }

    /// What was staged since the last call: `(uploads, delete commands)`; staging goes on.
    pub(crate) fn take_staged(&self) -> (usize, Vec<String>) {
        match &mut *self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(staging) => (
                std::mem::take(&mut staging.uploads),
                std::mem::take(&mut staging.deletes),
            ),
            None => (0, Vec::new()),
        }
    }

    /// Puts back what a failed commit took, so the next commit applies it.
    pub(crate) fn restage(&self, uploads: usize, deletes: Vec<String>) {
        if let Some(staging) = &mut *self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            staging.uploads += uploads;
            let later = std::mem::replace(&mut staging.deletes, deletes);
            staging.deletes.extend(later);
        }
    }

    /// Uploads many files in one request; every parent directory is created (contract S4).
    /// `files` are Hermes' `(host path, remote path)` pairs; the host path may be a temporary
    /// copy and nothing is inferred from it. Returns how many files were sent.
    pub fn upload_many(&self, files: Vec<(PathBuf, String)>) -> Result<usize, Error> {
        let result = self.upload_inner(files);
        self.record(Transfer::Push, result)
    }

    fn upload_inner(&self, files: Vec<(PathBuf, String)>) -> Result<usize, Error> {
        let home = self.remote_hermes_home()?;
        let files = self.staged_paths(home, files);
        let plan = UploadPlan::new(files).map_err(|source| Error::StateSync {
            operation: "plan upload",
            sandbox_id: self.id(),
            source,
        })?;
        if plan.is_empty() {
            return Ok(0);
        }
        let mut uploads = Vec::with_capacity(plan.parts().len());
        // Each upload's content when it is in memory, for the push base, by the path it
        // lands at once committed (a staged upload is recorded now: if its commit is fenced,
        // the base only names content this host itself sent, which supersedes nothing the
        // sandbox wrote).
        let mut sent: Vec<(String, Option<Bytes>)> = Vec::with_capacity(plan.parts().len());
        for part in plan.parts() {
            let io_error = |source| Error::Io {
                operation: "read file to upload",
                path: part.host_path.clone(),
                source,
            };
            let file = std::fs::File::open(&part.host_path).map_err(io_error)?;
            let len = file.metadata().map_err(io_error)?.len();
            let upload = if len <= IN_MEMORY_UPLOAD {
                let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
                let mut file = file;
                file.read_to_end(&mut data).map_err(io_error)?;
                let data = Bytes::from(data);
                sent.push((self.unstaged(home, &part.remote_path), Some(data.clone())));
                UploadFile::bytes(part.remote_path.clone(), data)
            } else {
                sent.push((self.unstaged(home, &part.remote_path), None));
                UploadFile::stream(part.remote_path.clone(), file_stream(file))
            };
            uploads.push(upload);
        }
        let count = uploads.len();
        let sandbox = self.sandbox();
        // One request carries every file, so progress moves from none to all of them.
        let meter = self.meter("upload files", ProgressUnit::Files, Some(count as u64));
        // A failed request may still have written some files: no base for any of them.
        self.update_push_base(home, |base| {
            for (remote, _) in &sent {
                base.forget(remote);
            }
        });
        self.inner
            .runtime
            .block_on(sandbox.write_files(uploads))
            .map_err(|source| Error::e2b("upload files", Some(&self.id()), source))?;
        self.update_push_base(home, |base| {
            for (remote, content) in &sent {
                if let Some(content) = content {
                    base.record(remote, content);
                }
            }
        });
        let mut meter = meter;
        meter.advance(count as u64);
        meter.finish();
        Ok(count)
    }

    /// The path a staged upload lands at once committed (the inverse of [`Self::staged_paths`]);
    /// any other path as is.
    fn unstaged(&self, home: &str, remote: &str) -> String {
        let staging = self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match staging
            .as_ref()
            .and_then(|staging| remote.strip_prefix(staging.dir.as_str()))
        {
            Some(rest) if rest.starts_with('/') => {
                format!("{}{rest}", home.trim_end_matches('/'))
            }
            _ => remote.to_owned(),
        }
    }

    /// Redirects uploads under the Hermes home into the staging directory, if staging.
    fn staged_paths(&self, home: &str, files: Vec<(PathBuf, String)>) -> Vec<(PathBuf, String)> {
        let mut staging = self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(staging) = &mut *staging else {
            return files;
        };
        let home = home.trim_end_matches('/');
        files
            .into_iter()
            .map(|(host, remote)| match remote.strip_prefix(home) {
                Some(rest) if rest.starts_with('/') => {
                    staging.uploads += 1;
                    (host, format!("{}{rest}", staging.dir))
                }
                _ => (host, remote),
            })
            .collect()
    }

    /// Deletes remote paths; a path already gone is not an error, so a retried sync can send
    /// the same list again.
    pub fn delete_many(&self, paths: Vec<String>) -> Result<(), Error> {
        let result = self.delete_inner(paths);
        self.record(Transfer::Push, result)
    }

    fn delete_inner(&self, paths: Vec<String>) -> Result<(), Error> {
        let home = self.remote_hermes_home()?;
        let plan = DeletePlan::new(paths).map_err(|source| Error::StateSync {
            operation: "plan delete",
            sandbox_id: self.id(),
            source,
        })?;
        self.update_push_base(home, |base| {
            for path in plan.paths() {
                base.forget(path);
            }
        });
        if let Some(staging) = &mut *self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            staging.deletes.extend(plan.commands());
            return Ok(());
        }
        let sandbox = self.sandbox();
        for command in plan.commands() {
            let output = self
                .inner
                .runtime
                .block_on(sandbox.run(StartOptions::shell(command), 64 * 1024))
                .map_err(|source| Error::e2b("delete files", Some(&self.id()), source))?;
            if output.end.exit_code != 0 {
                return Err(Error::SandboxCommand {
                    operation: "delete files",
                    sandbox_id: self.id(),
                    exit_code: output.end.exit_code,
                    stderr: stderr_text(&output.stderr),
                });
            }
        }
        Ok(())
    }

    /// Starts tracking what this attachment's uploads put in the sandbox, from `base` (what
    /// earlier sessions pushed, as recovery read it).
    pub(crate) fn track_push_base(&self, base: recovery::PushBase) {
        *self
            .inner
            .push_base
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((base, false));
    }

    /// Whether the tracked push base changed since it was last taken.
    pub(crate) fn push_base_changed(&self) -> bool {
        matches!(
            &*self
                .inner
                .push_base
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            Some((_, true))
        )
    }

    /// The tracked push base if uploads or deletes changed it since the last call.
    pub(crate) fn take_changed_push_base(&self) -> Option<recovery::PushBase> {
        match &mut *self
            .inner
            .push_base
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some((base, changed)) if *changed => {
                *changed = false;
                Some(base.clone())
            }
            _ => None,
        }
    }

    /// Applies `change` to the tracked push base, if any, with remote paths as members.
    fn update_push_base(&self, home: &str, change: impl FnOnce(&mut RemoteBase<'_>)) {
        let mut tracked = self
            .inner
            .push_base
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((base, changed)) = &mut *tracked {
            change(&mut RemoteBase { base, prefix: home });
            *changed = true;
        }
    }
}

/// The push base seen through remote paths: `<remote home>/skills/...` is member
/// `skills/...`; a path elsewhere names no member and changes nothing.
struct RemoteBase<'a> {
    base: &'a mut recovery::PushBase,
    prefix: &'a str,
}

impl RemoteBase<'_> {
    fn member<'p>(&self, remote: &'p str) -> Option<&'p str> {
        remote
            .strip_prefix(self.prefix)
            .and_then(|rest| rest.strip_prefix('/'))
    }

    fn record(&mut self, remote: &str, content: &[u8]) {
        if let Some(member) = self.member(remote) {
            self.base.record(member, content);
        }
    }

    fn forget(&mut self, remote: &str) {
        let remote = remote.trim_end_matches('/');
        if let Some(member) = self.member(remote) {
            self.base.forget(member);
        } else if remote.is_empty()
            || self.prefix == remote
            || self.prefix.starts_with(&format!("{remote}/"))
        {
            // The Hermes home itself or one of its ancestors: every member goes.
            for root in recovery::RECOVERABLE_ROOTS {
                self.base.forget(root);
            }
        }
    }
}

fn file_stream(
    file: std::fs::File,
) -> impl futures::Stream<Item = io::Result<Bytes>> + Send + 'static {
    futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            Err(error) => Some((Err(error), None)),
        }
    })
}
