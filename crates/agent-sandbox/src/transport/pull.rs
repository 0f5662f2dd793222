//! Pulling state: the teardown pull (the Hermes home as the tar a caller extracts) and,
//! beside it, the recovery snapshot (`skills/` and `memories/` into `recovery::recover`),
//! plain or behind the writer's gate.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;

use e2b_client::StartOptions;
use state_sync::{ArchiveSummary, ReadConfig, UnsafeMembers};

use super::stream::{ChannelReader, stderr_text};
use super::{PullSummary, StateTransport, Transfer};
use crate::error::{Error, ErrorChain};
use crate::progress::{MeteredRead, ProgressUnit};

/// Output kept from the command that makes the teardown archive: its path, and `tar`'s
/// complaints when it fails.
const ARCHIVE_COMMAND_OUTPUT: u64 = 1 << 20;
/// A tar archive with no member: its end marker, two zero blocks.
const EMPTY_TAR: [u8; 1024] = [0; 1024];

impl StateTransport {
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
