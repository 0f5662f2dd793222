//! Where command output goes: a caller-supplied sink, fed chunk by chunk.

use std::fmt;
use std::io::{self, Write};
use std::sync::mpsc;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives a command's output as E2B delivers it (contract O1).
///
/// Each chunk is handed over once and the backend keeps no copy, so host memory stays bounded
/// by what the sink itself keeps. The sink is called from a plain thread, never from an async
/// task, so a blocking write (to a pipe whose reader is slow) is fine: a pump thread of the
/// backend's, or the caller's own thread while it waits in [`crate::RunningCommand::wait`]
/// for a command no pump thread had taken up yet.
pub trait OutputSink: Send + 'static {
    /// Takes one chunk. An error stops further forwarding (the command keeps running to its
    /// end, and the failure is reported in [`crate::CommandExit::sink_error`]).
    fn chunk(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()>;

    /// Called once after the last chunk and before the command is reported finished, so a
    /// reader draining a pipe sees end-of-file no later than the exit status (Hermes stops
    /// draining shortly after `poll()` reports completion).
    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes stdout and stderr merged, in arrival order, into any [`Write`]: a file, or the
/// write end of a pipe (`File::from(OwnedFd)`). `finish` flushes and drops the writer, which
/// closes a pipe's write end.
pub struct WriteSink<W: Write + Send + 'static> {
    writer: Option<W>,
}

impl<W: Write + Send + 'static> WriteSink<W> {
    /// A sink over `writer`.
    pub fn new(writer: W) -> WriteSink<W> {
        WriteSink {
            writer: Some(writer),
        }
    }
}

impl<W: Write + Send + 'static> fmt::Debug for WriteSink<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteSink")
            .field("open", &self.writer.is_some())
            .finish()
    }
}

impl<W: Write + Send + 'static> OutputSink for WriteSink<W> {
    fn chunk(&mut self, _stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        match &mut self.writer {
            Some(writer) => writer.write_all(bytes),
            None => Err(io::Error::other("the output sink is closed")),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self.writer.take() {
            Some(mut writer) => writer.flush(),
            None => Ok(()),
        }
    }
}

/// One chunk sent through a [`ChannelSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Where it came from.
    pub stream: OutputStream,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Sends every chunk into a channel. A bounded `sync_channel` applies back-pressure: the
/// backend stops reading from E2B while the channel is full. Dropping the receiver makes
/// further chunks fail, which stops forwarding.
#[derive(Debug)]
pub struct ChannelSink {
    sender: ChannelSender,
}

#[derive(Debug)]
enum ChannelSender {
    Bounded(mpsc::SyncSender<Chunk>),
    Unbounded(mpsc::Sender<Chunk>),
}

impl ChannelSink {
    /// A sink feeding a bounded channel (back-pressure, bounded memory).
    pub fn bounded(sender: mpsc::SyncSender<Chunk>) -> ChannelSink {
        ChannelSink {
            sender: ChannelSender::Bounded(sender),
        }
    }

    /// A sink feeding an unbounded channel: memory is bounded only by the receiver's pace.
    pub fn unbounded(sender: mpsc::Sender<Chunk>) -> ChannelSink {
        ChannelSink {
            sender: ChannelSender::Unbounded(sender),
        }
    }
}

impl OutputSink for ChannelSink {
    fn chunk(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        let chunk = Chunk {
            stream,
            bytes: bytes.to_vec(),
        };
        let sent = match &self.sender {
            ChannelSender::Bounded(sender) => sender.send(chunk).is_ok(),
            ChannelSender::Unbounded(sender) => sender.send(chunk).is_ok(),
        };
        if sent {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the output channel's receiver is gone",
            ))
        }
    }
}

/// Calls a closure for every chunk.
pub struct FnSink<F>(pub F)
where
    F: FnMut(OutputStream, &[u8]) -> io::Result<()> + Send + 'static;

impl<F> fmt::Debug for FnSink<F>
where
    F: FnMut(OutputStream, &[u8]) -> io::Result<()> + Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnSink(..)")
    }
}

impl<F> OutputSink for FnSink<F>
where
    F: FnMut(OutputStream, &[u8]) -> io::Result<()> + Send + 'static,
{
    fn chunk(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        (self.0)(stream, bytes)
    }
}

/// Discards everything.
#[derive(Debug, Clone, Copy)]
pub struct DiscardSink;

impl OutputSink for DiscardSink {
    fn chunk(&mut self, _stream: OutputStream, _bytes: &[u8]) -> io::Result<()> {
        Ok(())
    }
}
