//! The state transport: what Hermes' FileSyncManager (or any caller's sync) moves state with.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use e2b_client::{Client, ProcessEvent, Sandbox, SandboxId, StartOptions, UploadFile};
use futures::{FutureExt, StreamExt};
use state_sync::{ArchiveSummary, DeletePlan, ReadConfig, UnsafeMembers, UploadPlan};
use tokio::sync::mpsc;

use crate::error::{Error, ErrorChain};
use crate::progress::{Meter, MeteredRead, ProgressObserver, ProgressUnit};

/// Files up to this size are uploaded from memory (retryable); larger ones are streamed.
const IN_MEMORY_UPLOAD: u64 = 8 << 20;
/// How much of a helper command's standard error is kept for its error message.
const STDERR_KEPT: usize = 2048;
/// Chunks of a streamed command output or download buffered between the network and the
/// reader.
const STREAM_BUFFER_CHUNKS: usize = 8;
/// Output kept from the command that makes the teardown archive: its path, and `tar`'s
/// complaints when it fails.
const ARCHIVE_COMMAND_OUTPUT: u64 = 1 << 20;
/// A download's chunks already received are handed to the reader together up to this size
/// (with [`STREAM_BUFFER_CHUNKS`], at most about 8 MiB held).
const COALESCED_BYTES: usize = 1 << 20;
/// A tar archive with no member: its end marker, two zero blocks.
const EMPTY_TAR: [u8; 1024] = [0; 1024];

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
    /// A fenced writer's staging (`writer_arbitration: sandbox`): uploads under the Hermes
    /// home go to the staging directory and deletes wait, until a commit applies both under
    /// the generation check (contract C10).
    staging: Mutex<Option<Staging>>,
    /// What the uploads of this attachment put in the sandbox (recovery's push base), once
    /// the backend starts tracking at bring-up; `changed` says it needs storing.
    push_base: Mutex<Option<(recovery::PushBase, bool)>>,
    /// Set by each transfer reconnect, taken by the teardown recovery: after the teardown
    /// pull reconnected, the recovery that follows needs no connect of its own.
    transfer_connected: AtomicBool,
}

/// What a fenced writer staged since the last commit.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    pub(crate) dir: String,
    pub(crate) uploads: usize,
    pub(crate) deletes: Vec<String>,
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
                staging: Mutex::new(None),
                push_base: Mutex::new(None),
                transfer_connected: AtomicBool::new(false),
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
        let files = self.staged_paths(files);
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
                sent.push((self.unstaged(&part.remote_path), Some(data.clone())));
                UploadFile::bytes(part.remote_path.clone(), data)
            } else {
                sent.push((self.unstaged(&part.remote_path), None));
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

    /// The path a staged upload lands at once committed (the inverse of [`Self::staged_paths`]);
    /// any other path as is.
    fn unstaged(&self, remote: &str) -> String {
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
                format!("{}{rest}", self.inner.remote_home.trim_end_matches('/'))
            }
            _ => remote.to_owned(),
        }
    }

    /// Redirects uploads under the Hermes home into the staging directory, if staging.
    fn staged_paths(&self, files: Vec<(PathBuf, String)>) -> Vec<(PathBuf, String)> {
        let mut staging = self
            .inner
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(staging) = &mut *staging else {
            return files;
        };
        let home = self.inner.remote_home.trim_end_matches('/');
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
    /// also resumes a sandbox E2B paused), has the sandbox write its Hermes home as a tar to a
    /// private temp file outside the synced state, then streams that file from `/files` into
    /// `dest` as the tar Hermes extracts (members named by absolute remote path without the
    /// leading `/`). The temp file is removed as soon as the download has it open, and after
    /// a failed download all the same. The cap is enforced while downloading: the first byte
    /// past it fails the pull and stops the transfer (contract S12). On error `dest` holds an
    /// unfinished archive.
    pub fn download_state(&self, dest: &mut dyn Write) -> Result<PullSummary, Error> {
        let result = self.download_inner(dest);
        self.record(Transfer::Pull, result)
    }

    fn download_inner(&self, dest: &mut dyn Write) -> Result<PullSummary, Error> {
        self.reconnect_for_transfer()?;
        let state_error = |source| Error::StateSync {
            operation: "teardown pull",
            sandbox_id: self.id(),
            source,
        };
        let command =
            state_sync::teardown_file_command(&self.inner.remote_home).map_err(state_error)?;
        let sandbox = self.sandbox();
        let made = self
            .inner
            .runtime
            .block_on(sandbox.run(StartOptions::shell(command), ARCHIVE_COMMAND_OUTPUT))
            .map_err(|source| Error::e2b("teardown pull", Some(&self.id()), source))?;
        if made.end.exit_code != 0 {
            return Err(Error::SandboxCommand {
                operation: "teardown pull",
                sandbox_id: self.id(),
                exit_code: made.end.exit_code,
                stderr: stderr_text(&made.stderr),
            });
        }
        let config = ReadConfig {
            max_bytes: self.inner.cap,
            unsafe_members: UnsafeMembers::Skip,
        };
        let mut meter = self.meter("teardown pull", ProgressUnit::Bytes, None);
        let Some(path) = state_sync::teardown_archive_path(&made.stdout).map_err(state_error)?
        else {
            // No Hermes home verifiably means nothing to pull: an empty archive, not a failure.
            let mut source = MeteredRead {
                inner: io::Cursor::new(EMPTY_TAR),
                meter: &mut meter,
            };
            let (summary, _) =
                state_sync::pull_teardown(&mut source, &config, &self.inner.remote_home, dest)
                    .map_err(state_error)?;
            meter.finish();
            return Ok(pull_summary(summary));
        };
        // The cap is the capped reader's (the first byte past it fails the pull with the
        // reader's over-cap error); the download itself is not capped a second time.
        let download = self
            .inner
            .runtime
            .block_on(sandbox.read_file_stream(&path, u64::MAX));
        // The server opened the file before it answered, so it can go now, while the body
        // streams; after a failed request it goes all the same.
        let removal = {
            let sandbox = sandbox.clone();
            let path = path.clone();
            self.inner
                .runtime
                .spawn(async move { sandbox.remove(&path).await })
        };
        let pulled = download
            .map_err(|source| Error::e2b("teardown pull", Some(&self.id()), source))
            .and_then(|download| {
                let mut source = MeteredRead {
                    inner: self.stream_reader(download),
                    meter: &mut meter,
                };
                state_sync::pull_teardown(&mut source, &config, &self.inner.remote_home, dest)
                    .map_err(state_error)
            });
        match self.inner.runtime.block_on(removal) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(
                sandbox_id = %self.inner.sandbox_id,
                "E2B teardown pull: the sandbox's temporary archive was not removed: {}",
                ErrorChain(&Error::e2b("remove file", Some(&self.id()), error))
            ),
            Err(error) => tracing::warn!(
                sandbox_id = %self.inner.sandbox_id,
                "E2B teardown pull: removing the sandbox's temporary archive did not finish: {error}"
            ),
        }
        let (summary, _) = pulled?;
        meter.finish();
        Ok(pull_summary(summary))
    }

    /// A blocking reader over a download: a task moves its chunks through a small channel.
    /// Dropping the reader early (over the cap, a bad archive) drops the download, which
    /// closes the connection.
    fn stream_reader(&self, mut download: e2b_client::Download) -> ChannelReader {
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(STREAM_BUFFER_CHUNKS);
        self.inner.runtime.spawn(async move {
            while let Some(first) = download.next().await {
                // Chunks already received go together (up to COALESCED_BYTES): one hand-over
                // to the reading thread per batch, not per network read, so a busy machine's
                // scheduling delays do not stall the connection chunk by chunk.
                let mut item = first.map(BytesMut::from);
                let mut ended = false;
                while let Ok(batch) = &mut item {
                    if batch.len() >= COALESCED_BYTES {
                        break;
                    }
                    match download.next().now_or_never() {
                        Some(Some(Ok(more))) => batch.extend_from_slice(&more),
                        Some(Some(Err(error))) => item = Err(error),
                        Some(None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let item = item.map(BytesMut::freeze).map_err(io::Error::other);
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed || ended {
                    return;
                }
            }
        });
        ChannelReader {
            rx,
            current: Bytes::new(),
        }
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
        self.inner.transfer_connected.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Forgets earlier transfer reconnects: the teardown starts counting from here.
    pub(crate) fn forget_transfer_connection(&self) {
        self.inner.transfer_connected.store(false, Ordering::SeqCst);
    }

    /// Before the teardown recovery: reconnects with a transfer-sized lease (resuming a
    /// sandbox E2B paused meanwhile) unless the teardown pull just did, so a pull hook that
    /// downloaded nothing still leaves a reachable sandbox and one that did costs no more.
    pub(crate) fn prepare_teardown_transfer(&self) -> Result<(), Error> {
        if self.inner.transfer_connected.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.reconnect_for_transfer()
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

    /// Starts the snapshot behind a gate: `script` wraps the snapshot command so that the
    /// sandbox first prints one answer line and goes on to the snapshot only when it says so
    /// (the writer's acquire, `writer_arbitration: sandbox`). Returns that line as sent, at
    /// most `line_limit` bytes whatever the sandbox sends, and the rest of the output for
    /// [`GatedSnapshot::recover`]; dropping it unread stops the command.
    pub(crate) fn gated_snapshot(
        &self,
        operation: &'static str,
        line_limit: u64,
        script: impl FnOnce(&str) -> String,
    ) -> Result<(Vec<u8>, GatedSnapshot), Error> {
        let command = recovery::snapshot_command(&self.inner.remote_home).map_err(|source| {
            Error::Recovery {
                sandbox_id: self.id(),
                source,
            }
        })?;
        let mut rest = io::BufReader::new(self.command_reader(script(&command), operation)?);
        let mut line = Vec::new();
        io::BufRead::read_until(&mut (&mut rest).take(line_limit), b'\n', &mut line).map_err(
            |error| Error::Arbitration {
                operation,
                sandbox_id: self.id(),
                detail: format!("the answer could not be read: {error}"),
            },
        )?;
        Ok((
            line,
            GatedSnapshot {
                transport: self.clone(),
                rest,
            },
        ))
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
    ) -> Result<ChannelReader, Error> {
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
        Ok(ChannelReader {
            rx,
            current: Bytes::new(),
        })
    }
}

/// The snapshot that follows a gate's answer line ([`StateTransport::gated_snapshot`]).
pub(crate) struct GatedSnapshot {
    transport: StateTransport,
    rest: io::BufReader<ChannelReader>,
}

impl GatedSnapshot {
    /// Resume recovery from the rest of the output, as [`StateTransport::recover`] does.
    pub(crate) fn recover(
        mut self,
        config: &recovery::RecoveryConfig,
    ) -> Result<recovery::RecoveryReport, Error> {
        let transport = &self.transport;
        let mut meter = transport.meter("state recovery", ProgressUnit::Bytes, None);
        let mut source = MeteredRead {
            inner: &mut self.rest,
            meter: &mut meter,
        };
        let report = recovery::recover(config, &mut source).map_err(|source| Error::Recovery {
            sandbox_id: transport.id(),
            source,
        })?;
        meter.finish();
        Ok(report)
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

/// A blocking reader over chunks a task sends (a command's standard output, a download).
struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
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
