//! Pulling state: the teardown pull (the Hermes home as the tar a caller extracts) and,
//! beside it, the recovery snapshot (`skills/` and `memories/` into `recovery::recover`),
//! plain or behind the writer's gate.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{ProcessEvent, ProcessStream, Sandbox, StartOptions};
use futures::{FutureExt, StreamExt};
use state_sync::{ArchiveSummary, ReadConfig, UnsafeMembers};
use tokio::sync::mpsc;

use super::stream::{self, ChannelReader, Forwarded, stderr_text};
use super::{PullSummary, StateTransport, Transfer};
use crate::error::{Error, ErrorChain};
use crate::progress::{MeteredRead, ProgressUnit};

/// Standard output kept from the command that makes the teardown archive: its path and
/// the archive's size, two short lines.
const ARCHIVE_COMMAND_OUTPUT: usize = 4096;
/// Standard error kept from it, for the error when `tar` fails.
const ARCHIVE_COMMAND_STDERR: usize = 2048;
/// A tar archive with no member: its end marker, two zero blocks.
const EMPTY_TAR: [u8; 1024] = [0; 1024];
/// A range that brought less than this while `tar` still writes means the download has
/// caught up with it: the next range waits for [`CATCH_UP_WAIT`] (or `tar`'s end).
const CAUGHT_UP_BYTES: u64 = 1 << 20;
/// How long the download waits for `tar` to write more once it has caught up: one such
/// range per interval at most (envd cannot say when a file grows).
const CATCH_UP_WAIT: Duration = Duration::from_millis(20);

impl StateTransport {
    /// The teardown pull: reconnects first with a transfer-sized lease (extend-only, so it
    /// also resumes a sandbox E2B paused), has the sandbox write its Hermes home as a tar to a
    /// private temp file outside the synced state and, while `tar` still writes it, downloads
    /// it by ranges of `/files` into `dest` as the tar Hermes extracts (members named by
    /// absolute remote path without the leading `/`): the archive is made and downloaded at
    /// once. The temp file is removed once the last range has it open, and after a failure
    /// all the same (and `tar` stopped). The cap is enforced while downloading: no range asks
    /// for a byte past the first one over the cap, and that byte fails the pull (contract
    /// S12). On error `dest` holds an unfinished archive.
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
        let remote_home = self.remote_hermes_home()?;
        let command = state_sync::teardown_file_command(remote_home).map_err(state_error)?;
        let sandbox = self.sandbox();
        let archiver = self
            .inner
            .runtime
            .block_on(sandbox.start(StartOptions::shell(command)))
            .map_err(|source| Error::e2b("teardown pull", Some(&self.id()), source))?;
        let pid = archiver.pid();
        let (tx, reader) = stream::channel();
        let download = self.inner.runtime.spawn(
            GrowingArchive {
                sandbox,
                sandbox_id: self.id(),
                archiver: Archiver::new(archiver),
                // The first byte past the cap is fetched (and fails the reader), no more.
                last_byte: self.inner.cap,
                tx,
            }
            .download(),
        );
        let config = ReadConfig {
            max_bytes: self.inner.cap,
            unsafe_members: UnsafeMembers::Skip,
        };
        let mut meter = self.meter("teardown pull", ProgressUnit::Bytes, None);
        let mut source = MeteredRead {
            inner: reader,
            meter: &mut meter,
        };
        let pulled =
            state_sync::pull_teardown(&mut source, &config, remote_home, dest).map_err(state_error);
        // The reader goes first: a download still sending learns it stopped.
        drop(source);
        let downloaded = match self.inner.runtime.block_on(download) {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(Error::CommandLost {
                sandbox_id: self.id(),
                sandbox_pid: pid,
            }),
        };
        // The download's failure is the cause of the reader's, when both failed.
        downloaded?;
        let (summary, _) = pulled?;
        meter.finish();
        Ok(pull_summary(summary))
    }

    /// The connect resumes a paused sandbox, so it may meet the account's limit: refused
    /// for it, another idle sandbox of the process is paused and the connect made again
    /// (L14), without waiting for a slot.
    fn reconnect_for_transfer(&self) -> Result<(), Error> {
        let id = &self.inner.sandbox_id;
        let mut connect = || {
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
        };
        match self.inner.slots.upgrade() {
            Some(backend) => backend.start_within_limit("connect", id, &mut connect)?,
            // The backend is gone: nothing of this process to pause for a slot.
            None => connect()?,
        }
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
        let command = recovery::snapshot_command(self.remote_hermes_home()?).map_err(|source| {
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
        let command = recovery::snapshot_command(self.remote_hermes_home()?).map_err(|source| {
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

fn pull_summary(summary: ArchiveSummary) -> PullSummary {
    PullSummary {
        files: summary.files,
        file_bytes: summary.file_bytes,
        rejected: summary.rejected.into_iter().map(|r| r.name).collect(),
    }
}

/// The teardown archive's download while the sandbox's `tar` writes it: ranges of the
/// growing file, each from where the last ended, until the size `tar` reports at its end.
struct GrowingArchive {
    sandbox: Sandbox,
    sandbox_id: String,
    archiver: Archiver,
    /// The last byte offset ever asked for: the cap's (the first byte past it fails the
    /// reader, so none further is downloaded).
    last_byte: u64,
    tx: mpsc::Sender<io::Result<Bytes>>,
}

impl GrowingArchive {
    /// Runs the download to its end, then cleans up in the sandbox whatever happened: stops
    /// `tar` if it still runs and removes the archive. `Ok` when the reader got the whole
    /// archive or stopped reading (its own error says why).
    async fn download(mut self) -> Result<(), Error> {
        let path = match self.archive_path().await {
            Ok(Some(path)) => path,
            Ok(None) => {
                // No Hermes home verifiably means nothing to pull: an empty archive.
                let _ = self.tx.send(Ok(Bytes::from_static(&EMPTY_TAR))).await;
                return Ok(());
            }
            Err(error) => {
                self.stop_archiver().await;
                return Err(error);
            }
        };
        let mut removal = None;
        let result = self.transfer(&path, &mut removal).await;
        self.stop_archiver().await;
        let failed = |error| {
            ErrorChain(&Error::e2b("remove file", Some(&self.sandbox_id), error)).to_string()
        };
        let removed = match removal {
            Some(removal) => match removal.await {
                Ok(removed) => removed.map_err(failed),
                Err(error) => Err(format!("the removal did not finish: {error}")),
            },
            None => self.sandbox.remove(&path).await.map_err(failed),
        };
        if let Err(error) = removed {
            tracing::warn!(
                sandbox_id = %self.sandbox_id,
                "E2B teardown pull: the sandbox's temporary archive was not removed: {error}"
            );
        }
        // The reader has all it gets; the command's stream is read to its end so its
        // connection serves the next request.
        let GrowingArchive { archiver, tx, .. } = self;
        drop(tx);
        if archiver.exit_code.is_some() {
            archiver.stream.drain(e2b_client::END_DRAIN_LIMIT).await;
        }
        result
    }

    /// The archive's path, the command's first line (`None`: nothing to pull).
    async fn archive_path(&mut self) -> Result<Option<String>, Error> {
        loop {
            if let Some(end) = self.archiver.stdout.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.archiver.stdout.drain(..=end).collect();
                return state_sync::teardown_archive_path(&line)
                    .map(Some)
                    .map_err(|source| Error::StateSync {
                        operation: "teardown pull",
                        sandbox_id: self.sandbox_id.clone(),
                        source,
                    });
            }
            if let Some(exit_code) = self.archiver.exit_code {
                if exit_code == 0 && self.archiver.stdout.is_empty() {
                    return Ok(None);
                }
                self.archiver.succeeded(&self.sandbox_id)?;
                return Err(self.untrusted("the archive command printed no path"));
            }
            self.archiver.next(&self.sandbox_id).await?;
        }
    }

    /// Downloads the growing archive at `path` into the channel. `removal` receives the
    /// archive's removal once the last range has it open.
    async fn transfer(
        &mut self,
        path: &str,
        removal: &mut Option<tokio::task::JoinHandle<Result<(), e2b_client::Error>>>,
    ) -> Result<(), Error> {
        // A small archive is usually done by now: one range then fetches all of it.
        self.archiver.wait(CATCH_UP_WAIT, &self.sandbox_id).await?;
        let mut offset = 0u64;
        loop {
            self.archiver.poll_ready(&self.sandbox_id)?;
            let size = match self.archiver.exit_code {
                Some(_) => {
                    self.archiver.succeeded(&self.sandbox_id)?;
                    let size = state_sync::teardown_archive_size(&self.archiver.stdout)
                        .ok_or_else(|| self.untrusted("the archive command printed no size"))?;
                    Some(size)
                }
                None => None,
            };
            if size.is_some_and(|size| offset >= size) || offset > self.last_byte {
                // All of it, or the first byte past the cap (the reader fails on it).
                return Ok(());
            }
            let last = size.map_or(self.last_byte, |size| (size - 1).min(self.last_byte));
            let range = self
                .sandbox
                .read_file_range(path, offset, last)
                .await
                .map_err(|source| Error::e2b("teardown pull", Some(&self.sandbox_id), source))?;
            let Some(range) = range else {
                if size.is_some() {
                    return Err(self.untrusted("the archive is shorter than its size"));
                }
                self.archiver.wait(CATCH_UP_WAIT, &self.sandbox_id).await?;
                continue;
            };
            if removal.is_none() && size.is_some_and(|size| range.file_size == size) {
                // The server has the complete file open: it can go while the body streams.
                let sandbox = self.sandbox.clone();
                let path = path.to_owned();
                *removal = Some(tokio::spawn(async move { sandbox.remove(&path).await }));
            }
            let got = match stream::forward(range.download, &self.tx).await {
                Forwarded::All(got) => got,
                Forwarded::ReaderGone => return Ok(()),
                Forwarded::Failed(source) => {
                    return Err(Error::e2b("teardown pull", Some(&self.sandbox_id), source));
                }
            };
            offset += got;
            if size.is_none() && got < CAUGHT_UP_BYTES {
                self.archiver.wait(CATCH_UP_WAIT, &self.sandbox_id).await?;
            }
        }
    }

    /// Kills `tar` (its command) unless it has ended.
    async fn stop_archiver(&mut self) {
        if self.archiver.exit_code.is_none() {
            let _ = self.sandbox.kill_process(self.archiver.stream.pid()).await;
        }
    }

    fn untrusted(&self, reason: &str) -> Error {
        Error::UntrustedAnswer {
            operation: "teardown pull",
            sandbox_id: self.sandbox_id.clone(),
            reason: reason.to_owned(),
        }
    }
}

/// The command writing the teardown archive, as far as its events have arrived.
struct Archiver {
    stream: ProcessStream,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: Option<i32>,
}

impl Archiver {
    fn new(stream: ProcessStream) -> Archiver {
        Archiver {
            stream,
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit_code: None,
        }
    }

    /// Waits for the command's next event and records it.
    async fn next(&mut self, sandbox_id: &str) -> Result<(), Error> {
        let event = self.stream.next().await;
        self.record(event, sandbox_id)
    }

    /// Records the events already received, without waiting.
    fn poll_ready(&mut self, sandbox_id: &str) -> Result<(), Error> {
        while self.exit_code.is_none() {
            match self.stream.next().now_or_never() {
                Some(event) => self.record(event, sandbox_id)?,
                None => break,
            }
        }
        Ok(())
    }

    /// Waits for the command's next event, at most `limit`.
    async fn wait(&mut self, limit: Duration, sandbox_id: &str) -> Result<(), Error> {
        if self.exit_code.is_some() {
            return Ok(());
        }
        match tokio::time::timeout(limit, self.stream.next()).await {
            Ok(event) => self.record(event, sandbox_id),
            Err(_) => Ok(()),
        }
    }

    fn record(
        &mut self,
        event: Option<Result<ProcessEvent, e2b_client::Error>>,
        sandbox_id: &str,
    ) -> Result<(), Error> {
        match event {
            Some(Ok(ProcessEvent::Stdout(bytes))) => {
                if self.stdout.len() + bytes.len() > ARCHIVE_COMMAND_OUTPUT {
                    return Err(Error::UntrustedAnswer {
                        operation: "teardown pull",
                        sandbox_id: sandbox_id.to_owned(),
                        reason: "the archive command printed more than its path and size"
                            .to_owned(),
                    });
                }
                self.stdout.extend_from_slice(&bytes);
            }
            Some(Ok(ProcessEvent::Stderr(bytes))) => {
                let room = ARCHIVE_COMMAND_STDERR.saturating_sub(self.stderr.len());
                self.stderr
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Some(Ok(ProcessEvent::End(end))) => self.exit_code = Some(end.exit_code),
            Some(Ok(_)) => {}
            Some(Err(source)) => {
                return Err(Error::e2b("teardown pull", Some(sandbox_id), source));
            }
            None => {
                return Err(Error::CommandLost {
                    sandbox_id: sandbox_id.to_owned(),
                    sandbox_pid: self.stream.pid(),
                });
            }
        }
        Ok(())
    }

    /// The command's failure, once it has ended non-zero.
    fn succeeded(&self, sandbox_id: &str) -> Result<(), Error> {
        match self.exit_code {
            Some(exit_code) if exit_code != 0 => Err(Error::SandboxCommand {
                operation: "teardown pull",
                sandbox_id: sandbox_id.to_owned(),
                exit_code,
                stderr: stderr_text(&self.stderr),
            }),
            _ => Ok(()),
        }
    }
}
