//! Blocking readers over what a task receives: a command's standard output, downloads.

use std::io::{self, Read};

use bytes::{Bytes, BytesMut};
use e2b_client::{ProcessEvent, StartOptions};
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use super::StateTransport;
use crate::error::Error;

/// How much of a helper command's standard error is kept for its error message.
const STDERR_KEPT: usize = 2048;
/// Chunks of a streamed command output or download buffered between the network and the
/// reader.
const STREAM_BUFFER_CHUNKS: usize = 8;
/// A download's chunks already received are handed to the reader together up to this size
/// (with [`STREAM_BUFFER_CHUNKS`], at most about 8 MiB held).
const COALESCED_BYTES: usize = 1 << 20;

impl StateTransport {
    /// Starts `command` and returns a blocking reader over its standard output. The reader
    /// fails if the command exits non-zero; dropping it early kills the command by pid.
    pub(super) fn command_reader(
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

/// A small channel whose receiving end is a blocking reader: what a task receives (a
/// download's chunks) moves through it to the thread that reads.
pub(super) fn channel() -> (mpsc::Sender<io::Result<Bytes>>, ChannelReader) {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(STREAM_BUFFER_CHUNKS);
    (
        tx,
        ChannelReader {
            rx,
            current: Bytes::new(),
        },
    )
}

/// How forwarding a download into a [`channel`] ended.
pub(super) enum Forwarded {
    /// Every byte went through: this many.
    All(u64),
    /// The reader is gone (it stopped early: over the cap, a bad archive).
    ReaderGone,
    /// The download failed.
    Failed(e2b_client::Error),
}

/// Moves a download's chunks into `tx`. Chunks already received go together (up to
/// [`COALESCED_BYTES`]): one hand-over to the reading thread per batch, not per network read,
/// so a busy machine's scheduling delays do not stall the connection chunk by chunk.
pub(super) async fn forward(
    mut download: e2b_client::Download,
    tx: &mpsc::Sender<io::Result<Bytes>>,
) -> Forwarded {
    let mut total = 0u64;
    while let Some(first) = download.next().await {
        let mut batch = match first {
            Ok(chunk) => BytesMut::from(chunk),
            Err(error) => return Forwarded::Failed(error),
        };
        let mut failed = None;
        let mut ended = false;
        while batch.len() < COALESCED_BYTES {
            match download.next().now_or_never() {
                Some(Some(Ok(more))) => batch.extend_from_slice(&more),
                Some(Some(Err(error))) => {
                    failed = Some(error);
                    break;
                }
                Some(None) => {
                    ended = true;
                    break;
                }
                None => break,
            }
        }
        total += u64::try_from(batch.len()).unwrap_or(u64::MAX);
        if tx.send(Ok(batch.freeze())).await.is_err() {
            return Forwarded::ReaderGone;
        }
        if let Some(error) = failed {
            return Forwarded::Failed(error);
        }
        if ended {
            break;
        }
    }
    Forwarded::All(total)
}

/// A blocking reader over chunks a task sends (a command's standard output, a download).
pub(super) struct ChannelReader {
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

pub(super) fn stderr_text(bytes: &[u8]) -> String {
    let end = bytes.len().min(STDERR_KEPT);
    String::from_utf8_lossy(&bytes[..end]).trim().to_owned()
}
