//! The state transport: what Hermes' FileSyncManager (or any caller's sync) moves state with.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{Client, ProcessEvent, Sandbox, SandboxId, StartOptions, UploadFile};
use futures::StreamExt;
use state_sync::{ArchiveSummary, DeletePlan, ReadConfig, UnsafeMembers, UploadPlan};
use tokio::sync::mpsc;

use crate::error::{Error, ErrorChain};
use crate::progress::{Meter, MeteredRead, ProgressObserver, ProgressUnit};

/// Files up to this size are uploaded from memory (retryable); larger ones are streamed.
const IN_MEMORY_UPLOAD: u64 = 8 << 20;
/// How much of a helper command's standard error is kept for its error message.
const STDERR_KEPT: usize = 2048;
/// Chunks of a streamed command output buffered between the network and the reader.
const STREAM_BUFFER_CHUNKS: usize = 8;

/// Failures recorded by transport calls, shared with the backend that checks them after each
/// push or pull (Hermes' FileSyncManager swallows exceptions, contracts S2, S3).
pub(crate) type FailureLog = Arc<Mutex<Vec<(Transfer, String)>>>;

/// Which kind of transport call recorded a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// Uploads and deletes: any failure spoils the push it belongs to.
    Push,
    /// The teardown pull: Hermes retries it, so a later success supersedes earlier failures.
    Pull,
}

/// Moves state in and out of one attached sandbox. Cheap to clone; every method blocks the
/// calling thread (which must not be driving async tasks).
///
/// Every failure is returned and also recorded, so a caller whose sync machinery hides
/// exceptions still fails closed: the backend checks the record after each push or pull.
#[derive(Clone)]
pub struct StateTransport {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: tokio::runtime::Handle,
    client: Client,
    sandbox: Mutex<Sandbox>,
    sandbox_id: SandboxId,
    remote_home: String,
    cap: u64,
    transfer_lease: Duration,
    failures: FailureLog,
    progress: Option<ProgressObserver>,
    /// What the uploads of this attachment put in the sandbox (recovery's push base), once
    /// the backend starts tracking at bring-up; `changed` says it needs storing.
    push_base: Mutex<Option<(recovery::PushBase, bool)>>,
}

impl fmt::Debug for StateTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateTransport")
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("remote_home", &self.inner.remote_home)
            .field("cap", &self.inner.cap)
            .finish_non_exhaustive()
    }
}

/// What a teardown pull delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PullSummary {
    /// Regular files written to the destination archive.
    pub files: u64,
    /// Bytes of file content.
    pub file_bytes: u64,
    /// Members refused (links, devices, unsafe names), by name.
    pub rejected: Vec<String>,
}

pub(crate) struct TransportParts {
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) client: Client,
    pub(crate) sandbox: Sandbox,
    pub(crate) remote_home: String,
    pub(crate) cap: u64,
    pub(crate) transfer_lease: Duration,
    pub(crate) failures: FailureLog,
    pub(crate) progress: Option<ProgressObserver>,
}

impl StateTransport {
    pub(crate) fn new(parts: TransportParts) -> StateTransport {
        let sandbox_id = parts.sandbox.id().clone();
        StateTransport {
            inner: Arc::new(Inner {
                runtime: parts.runtime,
                client: parts.client,
                sandbox: Mutex::new(parts.sandbox),
                sandbox_id,
                remote_home: parts.remote_home,
                cap: parts.cap,
                transfer_lease: parts.transfer_lease,
                failures: parts.failures,
                progress: parts.progress,
                push_base: Mutex::new(None),
            }),
        }
    }

    /// The sandbox this transport moves state for.
    pub fn sandbox_id(&self) -> &str {
        self.inner.sandbox_id.as_str()
    }

    /// Where Hermes' state lives in the sandbox.
    pub fn remote_hermes_home(&self) -> &str {
        &self.inner.remote_home
    }

    pub(crate) fn replace_sandbox(&self, sandbox: Sandbox) {
        *self
            .inner
            .sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sandbox;
    }

    fn sandbox(&self) -> Sandbox {
        self.inner
            .sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn id(&self) -> String {
        self.inner.sandbox_id.as_str().to_owned()
    }

    fn record<T>(&self, kind: Transfer, result: Result<T, Error>) -> Result<T, Error> {
        let mut failures = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &result {
            Err(error) => failures.push((kind, ErrorChain(error).to_string())),
            // A pull that succeeds after failed attempts has delivered the state.
            Ok(_) if kind == Transfer::Pull => failures.retain(|(k, _)| *k != Transfer::Pull),
            Ok(_) => {}
        }
        drop(failures);
        result
    }

    /// Uploads many files in one request; every parent directory is created (contract S4).
    /// `files` are Hermes' `(host path, remote path)` pairs; the host path may be a temporary
    /// copy and nothing is inferred from it. Returns how many files were sent.
    pub fn upload_many(&self, files: Vec<(PathBuf, String)>) -> Result<usize, Error> {
        let result = self.upload_inner(files);
        self.record(Transfer::Push, result)
    }

    fn upload_inner(&self, files: Vec<(PathBuf, String)>) -> Result<usize, Error> {
        let plan = UploadPlan::new(files).map_err(|source| Error::StateSync {
            operation: "plan upload",
            sandbox_id: self.id(),
            source,
        })?;
        if plan.is_empty() {
            return Ok(0);
        }
        let mut uploads = Vec::with_capacity(plan.parts().len());
        // Each upload's content when it is in memory, for the push base.
        let mut sent: Vec<(&str, Option<Bytes>)> = Vec::with_capacity(plan.parts().len());
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
                sent.push((&part.remote_path, Some(data.clone())));
                UploadFile::bytes(part.remote_path.clone(), data)
            } else {
                sent.push((&part.remote_path, None));
                UploadFile::stream(part.remote_path.clone(), file_stream(file))
            };
            uploads.push(upload);
        }
        let count = uploads.len();
        let sandbox = self.sandbox();
        // One request carries every file, so progress moves from none to all of them.
        let meter = self.meter("upload files", ProgressUnit::Files, Some(count as u64));
        // A failed request may still have written some files: no base for any of them.
        self.update_push_base(|base| {
            for (remote, _) in &sent {
                base.forget(remote);
            }
        });
        self.inner
            .runtime
            .block_on(sandbox.write_files(uploads))
            .map_err(|source| Error::e2b("upload files", Some(&self.id()), source))?;
        self.update_push_base(|base| {
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

    /// Deletes remote paths; a path already gone is not an error, so a retried sync can send
    /// the same list again.
    pub fn delete_many(&self, paths: Vec<String>) -> Result<(), Error> {
        let result = self.delete_inner(paths);
        self.record(Transfer::Push, result)
    }

    fn delete_inner(&self, paths: Vec<String>) -> Result<(), Error> {
        let plan = DeletePlan::new(paths).map_err(|source| Error::StateSync {
            operation: "plan delete",
            sandbox_id: self.id(),
            source,
        })?;
        self.update_push_base(|base| {
            for path in plan.paths() {
                base.forget(path);
            }
        });
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
    fn update_push_base(&self, change: impl FnOnce(&mut RemoteBase<'_>)) {
        let mut tracked = self
            .inner
            .push_base
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((base, changed)) = &mut *tracked {
            change(&mut RemoteBase {
                base,
                prefix: &self.inner.remote_home,
            });
            *changed = true;
        }
    }

    /// The teardown pull: reconnects first with a transfer-sized lease (extend-only, so it
    /// also resumes a sandbox E2B paused), then streams the sandbox's Hermes home into `dest`
    /// as the tar Hermes extracts (members named by absolute remote path without the leading
    /// `/`). The cap is enforced while downloading: the first byte past it fails the pull and
    /// stops the transfer (contract S12). On error `dest` holds an unfinished archive.
    pub fn download_state(&self, dest: &mut dyn Write) -> Result<PullSummary, Error> {
        let result = self.download_inner(dest);
        self.record(Transfer::Pull, result)
    }

    fn download_inner(&self, dest: &mut dyn Write) -> Result<PullSummary, Error> {
        self.reconnect_for_transfer()?;
        let command = state_sync::teardown_command(&self.inner.remote_home).map_err(|source| {
            Error::StateSync {
                operation: "teardown pull",
                sandbox_id: self.id(),
                source,
            }
        })?;
        // A sandbox without a Hermes home verifiably has nothing to pull: an empty archive,
        // not a failure (state-sync's command alone makes tar fail on a missing root).
        let command = format!(
            "if [ -d {root} ]; then {command}; else exec tar -cf - -T /dev/null; fi",
            root = state_sync::shell_quote(&self.inner.remote_home)
        );
        let mut meter = self.meter("teardown pull", ProgressUnit::Bytes, None);
        let mut source = MeteredRead {
            inner: self.command_reader(command, "teardown pull")?,
            meter: &mut meter,
        };
        let config = ReadConfig {
            max_bytes: self.inner.cap,
            unsafe_members: UnsafeMembers::Skip,
        };
        let (summary, _) =
            state_sync::pull_teardown(&mut source, &config, &self.inner.remote_home, dest)
                .map_err(|source| Error::StateSync {
                    operation: "teardown pull",
                    sandbox_id: self.id(),
                    source,
                })?;
        meter.finish();
        Ok(pull_summary(summary))
    }

    fn reconnect_for_transfer(&self) -> Result<(), Error> {
        let id = &self.inner.sandbox_id;
        let connected = self
            .inner
            .runtime
            .block_on(self.inner.client.connect(id, self.inner.transfer_lease))
            .map_err(|source| Error::e2b("connect", Some(id.as_str()), source))?;
        let sandbox = self
            .inner
            .client
            .sandbox(connected.sandbox.envd_access())
            .map_err(|source| Error::e2b("connect", Some(id.as_str()), source))?;
        self.replace_sandbox(sandbox);
        Ok(())
    }

    /// Resume recovery: streams the sandbox's skills/ and memories/ into `recovery::recover`.
    pub(crate) fn recover(
        &self,
        config: &recovery::RecoveryConfig,
    ) -> Result<recovery::RecoveryReport, Error> {
        let command = recovery::snapshot_command(&self.inner.remote_home).map_err(|source| {
            Error::Recovery {
                sandbox_id: self.id(),
                source,
            }
        })?;
        let mut meter = self.meter("state recovery", ProgressUnit::Bytes, None);
        let mut source = MeteredRead {
            inner: self.command_reader(command, "state snapshot")?,
            meter: &mut meter,
        };
        let report = recovery::recover(config, &mut source).map_err(|source| Error::Recovery {
            sandbox_id: self.id(),
            source,
        })?;
        meter.finish();
        Ok(report)
    }

    fn meter(&self, operation: &'static str, unit: ProgressUnit, total: Option<u64>) -> Meter {
        Meter::start(
            self.inner.progress.clone(),
            operation,
            Some(self.inner.sandbox_id.as_str()),
            unit,
            total,
        )
    }

    /// Starts `command` and returns a blocking reader over its standard output. The reader
    /// fails if the command exits non-zero; dropping it early kills the command by pid.
    fn command_reader(
        &self,
        command: String,
        operation: &'static str,
    ) -> Result<CommandReader, Error> {
        let sandbox = self.sandbox();
        let id = self.id();
        let mut stream = self
            .inner
            .runtime
            .block_on(sandbox.start(StartOptions::shell(command)))
            .map_err(|source| Error::e2b(operation, Some(&id), source))?;
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(STREAM_BUFFER_CHUNKS);
        self.inner.runtime.spawn(async move {
            let pid = stream.pid();
            let mut stderr = Vec::new();
            while let Some(event) = stream.next().await {
                let item = match event {
                    Ok(ProcessEvent::Stdout(bytes)) => Ok(bytes),
                    Ok(ProcessEvent::Stderr(bytes)) => {
                        let room = STDERR_KEPT.saturating_sub(stderr.len());
                        stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                        continue;
                    }
                    Ok(ProcessEvent::End(end)) if end.exit_code == 0 => return,
                    Ok(ProcessEvent::End(end)) => Err(io::Error::other(format!(
                        "exit code {}: {}",
                        end.exit_code,
                        stderr_text(&stderr)
                    ))),
                    Ok(_) => continue,
                    Err(error) => Err(io::Error::other(error)),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() {
                    // The reader gave up (over the cap, or a bad archive): stop the producer.
                    let _ = sandbox.kill_process(pid).await;
                    return;
                }
                if failed {
                    return;
                }
            }
            let _ = tx
                .send(Err(io::Error::other(
                    "the stream ended without an exit status",
                )))
                .await;
        });
        Ok(CommandReader {
            rx,
            current: Bytes::new(),
        })
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

struct CommandReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for CommandReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(bytes)) => self.current = bytes,
                Some(Err(error)) => return Err(error),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
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

fn stderr_text(bytes: &[u8]) -> String {
    let end = bytes.len().min(STDERR_KEPT);
    String::from_utf8_lossy(&bytes[..end]).trim().to_owned()
}

fn pull_summary(summary: ArchiveSummary) -> PullSummary {
    PullSummary {
        files: summary.files,
        file_bytes: summary.file_bytes,
        rejected: summary.rejected.into_iter().map(|r| r.name).collect(),
    }
}

/// Every file under `home`'s `dirs` (e.g. `skills`, `memories`) as the `(host path, remote
/// path)` pairs [`StateTransport::upload_many`] takes, the remote path being the same relative
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
