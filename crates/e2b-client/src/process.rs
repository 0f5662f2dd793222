//! Processes in a sandbox: start options, the event stream, and what List reports.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::error::Error;
use crate::framing::{Read, ServerStream};
use crate::http::Ctx;
use crate::json;

/// How to start a process: a program and its arguments, sent to envd as they are. Start from
/// [`StartOptions::shell`] (a script for a login bash, like the official SDK) or
/// [`StartOptions::exec`] (an argv, no shell in between); there is no `Default`.
#[derive(Clone, Debug)]
pub struct StartOptions {
    /// The program envd starts (envd's `cmd`), looked up on the sandbox's `PATH` when it has
    /// no slash.
    pub program: String,
    /// Its arguments, each passed as one argv entry (envd's `args`); nothing re-splits them.
    pub args: Vec<String>,
    /// Extra environment variables (they win over the sandbox's).
    pub envs: BTreeMap<String, String>,
    /// Working directory; `None` is envd's default (the user's home).
    pub cwd: Option<String>,
    /// Run as this user (`Authorization: Basic`); `None` is envd's default user.
    pub user: Option<String>,
    /// Process deadline, sent as `Connect-Timeout-Ms`: envd kills the process when it passes.
    /// `None` sends no deadline.
    pub timeout: Option<Duration>,
    /// How long envd may stay silent before sending a keepalive event
    /// (`Keepalive-Ping-Interval`). The client gives up on a stream silent for twice this (or
    /// the request deadline, whichever is longer).
    pub keepalive: Duration,
    /// Whether envd keeps the process's stdin open for input
    /// ([`Sandbox::stream_input`](crate::Sandbox::stream_input)); closed by default.
    pub stdin: ProcessStdin,
}

/// A process's standard input as envd starts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessStdin {
    /// No input: reading stdin ends at once (what the SDK's `commands.run` does by default).
    Closed,
    /// A pipe kept open for input until
    /// [`Sandbox::close_stdin`](crate::Sandbox::close_stdin) or the process's end.
    Open,
}

impl StartOptions {
    /// Runs `script` as `/bin/bash -l -c <script>`, the official SDK's form: a login shell, so
    /// the profile is read and the script may use any shell syntax.
    pub fn shell(script: String) -> StartOptions {
        StartOptions::exec(
            "/bin/bash".to_owned(),
            vec!["-l".to_owned(), "-c".to_owned(), script],
        )
    }

    /// Runs `program` with `args` as its argv, with no shell between (so nothing is quoted or
    /// expanded). Both constructors use envd's default user and directory, no process deadline,
    /// the official SDK's 50 s keepalive and stdin closed.
    pub fn exec(program: String, args: Vec<String>) -> StartOptions {
        StartOptions {
            program,
            args,
            envs: BTreeMap::new(),
            cwd: None,
            user: None,
            timeout: None,
            keepalive: Duration::from_secs(50),
            stdin: ProcessStdin::Closed,
        }
    }
}

/// One event of a process stream, in the order envd sends them: `Start` first, then output and
/// keepalives, then exactly one `End`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessEvent {
    /// The process started with this pid.
    Start {
        /// The pid inside the sandbox.
        pid: u32,
    },
    /// A chunk of standard output, as read by envd (at most 32 KiB).
    Stdout(Bytes),
    /// A chunk of standard error.
    Stderr(Bytes),
    /// A chunk of terminal output, for a process started on a PTY ([`crate::Sandbox::start_pty`];
    /// at most 16 KiB from envd).
    Pty(Bytes),
    /// envd is alive; the process has been silent.
    Keepalive,
    /// The process ended.
    End(ProcessEnd),
}

/// How a process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessEnd {
    /// The exit code; `-1` when killed by a signal.
    pub exit_code: i32,
    /// Whether it exited by itself (false when killed by a signal).
    pub exited: bool,
    /// envd's status text (`exit status 3`, `signal: killed`).
    pub status: String,
    /// envd's error text, when the process failed.
    pub error: Option<String>,
}

/// How long [`ProcessStream::collect_output`] waits for the rest of the response after the
/// `End` event (envd sends it right behind) before it gives the connection up.
pub const END_DRAIN_LIMIT: Duration = Duration::from_millis(250);

/// The events of one process, delivered as they arrive.
///
/// [`crate::Sandbox::start`] and [`crate::Sandbox::connect_process`] return it once envd has
/// sent the `Start` event, so [`ProcessStream::pid`] is known and failures before the process
/// started (unknown pid, bad working directory, refused user) come back from that call. The
/// stream then yields `Start` (again, for uniform consumption), output and keepalives, and ends
/// after `End`.
///
/// Bytes are decoded frame by frame from the response body: at most one frame (capped by
/// [`crate::Limits::max_frame_bytes`]) plus one network chunk is buffered, and each output
/// chunk is a fresh [`Bytes`] the consumer owns, so memory stays bounded however much the
/// command prints. Dropping the stream closes the connection; the process keeps running (use
/// [`crate::Sandbox::kill_process`] to stop it).
///
/// It yields an error (and then ends) when the server breaks the protocol (missing `End`, a bad
/// frame), reports an error in its end frame (for example `deadline_exceeded` when the process
/// deadline passed), the connection fails, or nothing at all arrives for the allowed silence.
pub struct ProcessStream {
    inner: Pin<Box<dyn Stream<Item = Result<ProcessEvent, Error>> + Send>>,
    pid: u32,
    pending_start: bool,
    ctx: Ctx,
}

impl fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessStream")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl ProcessStream {
    /// Reads the response up to the `Start` event.
    pub(crate) async fn open(reader: ServerStream) -> Result<ProcessStream, Error> {
        let ctx = reader.ctx().clone();
        let state = Decode {
            reader,
            order: EventOrder::default(),
            finished: false,
        };
        let mut inner: Pin<Box<dyn Stream<Item = Result<ProcessEvent, Error>> + Send>> =
            Box::pin(stream::unfold(state, |mut state| async move {
                let item = state.next_event().await?;
                Some((item, state))
            }));
        match inner.next().await {
            Some(Ok(ProcessEvent::Start { pid })) => Ok(ProcessStream {
                inner,
                pid,
                pending_start: true,
                ctx,
            }),
            Some(Err(error)) => Err(error),
            // The decoder turns any other first event, and an empty body, into an error.
            Some(Ok(_)) | None => Err(ctx.protocol("stream ended before the start event")),
        }
    }

    /// The pid of the process inside the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads what follows the `End` event (the end-of-stream message and the end of the
    /// response) for at most `limit`, so the connection serves the next request instead of
    /// being closed, as it is when a stream is dropped before its end. Returns whether the
    /// stream ended cleanly in time; either way the process's outcome is already known.
    pub async fn drain(mut self, limit: Duration) -> bool {
        let rest = async {
            while let Some(event) = self.next().await {
                if event.is_err() {
                    return false;
                }
            }
            true
        };
        tokio::time::timeout(limit, rest).await.unwrap_or(false)
    }

    /// Consumes the stream, keeping stdout and stderr up to `limit` bytes in total; more output
    /// is [`Error::LimitExceeded`] the moment it arrives.
    pub async fn collect_output(mut self, limit: u64) -> Result<CommandOutput, Error> {
        let mut stdout = BytesMut::new();
        let mut stderr = BytesMut::new();
        let mut kept: u64 = 0;
        while let Some(event) = self.next().await {
            let (target, chunk) = match event? {
                ProcessEvent::Stdout(chunk) | ProcessEvent::Pty(chunk) => (&mut stdout, chunk),
                ProcessEvent::Stderr(chunk) => (&mut stderr, chunk),
                ProcessEvent::End(end) => {
                    let pid = self.pid;
                    self.drain(END_DRAIN_LIMIT).await;
                    return Ok(CommandOutput {
                        pid,
                        stdout: stdout.freeze(),
                        stderr: stderr.freeze(),
                        end,
                    });
                }
                ProcessEvent::Start { .. } | ProcessEvent::Keepalive => continue,
            };
            kept = kept.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
            if kept > limit {
                return Err(self.ctx.limit(None, limit));
            }
            target.extend_from_slice(&chunk);
        }
        // Only reachable when the caller already consumed the end (or the failure).
        Err(self.ctx.protocol("stream ended without an end event"))
    }
}

impl Stream for ProcessStream {
    type Item = Result<ProcessEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.pending_start {
            self.pending_start = false;
            let pid = self.pid;
            return Poll::Ready(Some(Ok(ProcessEvent::Start { pid })));
        }
        self.inner.as_mut().poll_next(cx)
    }
}

/// Everything a finished command printed (see [`ProcessStream::collect_output`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CommandOutput {
    /// The pid it ran as.
    pub pid: u32,
    /// Standard output.
    pub stdout: Bytes,
    /// Standard error.
    pub stderr: Bytes,
    /// How it ended.
    pub end: ProcessEnd,
}

/// The event decoder behind [`ProcessStream`], over the shared stream reader.
struct Decode {
    reader: ServerStream,
    order: EventOrder,
    finished: bool,
}

/// The order a process stream's events must come in: one `Start` first, nothing after `End`.
#[derive(Default)]
pub(crate) struct EventOrder {
    seen_start: bool,
    seen_end: bool,
}

impl EventOrder {
    /// Whether the `End` event has come.
    pub(crate) fn ended(&self) -> bool {
        self.seen_end
    }

    /// `event` if it may come now, else the protocol error saying why not.
    pub(crate) fn check(&mut self, ctx: &Ctx, event: ProcessEvent) -> Result<ProcessEvent, Error> {
        let is_start = matches!(event, ProcessEvent::Start { .. });
        if self.seen_end {
            return Err(ctx.protocol("event after the end event"));
        }
        if !self.seen_start && !is_start {
            return Err(ctx.protocol("first event is not a start event"));
        }
        if self.seen_start && is_start {
            return Err(ctx.protocol("second start event"));
        }
        self.seen_start = true;
        if matches!(event, ProcessEvent::End(_)) {
            self.seen_end = true;
        }
        Ok(event)
    }
}

impl Decode {
    /// The next event or error; `None` once finished.
    async fn next_event(&mut self) -> Option<Result<ProcessEvent, Error>> {
        if self.finished {
            return None;
        }
        let result = self.step().await;
        if !matches!(result, Some(Ok(_))) {
            self.finished = true;
        }
        result
    }

    async fn step(&mut self) -> Option<Result<ProcessEvent, Error>> {
        loop {
            let read = match self.reader.next().await {
                Ok(read) => read,
                Err(error) => return Some(Err(error)),
            };
            match read {
                Read::Message(payload) => match parse_event(&payload) {
                    Err(detail) => return Some(Err(self.reader.ctx().protocol(detail))),
                    // An event kind this client does not know: ignored, like unknown fields.
                    Ok(None) => continue,
                    Ok(Some(event)) => return Some(self.order.check(self.reader.ctx(), event)),
                },
                Read::End | Read::BodyEnd if self.order.ended() => {
                    if matches!(read, Read::End) {
                        self.reader.read_to_body_end().await;
                    }
                    return None;
                }
                // No end event: on a sandbox that is gone, the sandbox ended under it.
                Read::End | Read::BodyEnd => {
                    let short = self
                        .reader
                        .ctx()
                        .protocol("stream ended without an end event");
                    return Some(Err(self.reader.lost(short).await));
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct EventMessage {
    #[serde(default)]
    event: Option<RawEvent>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default)]
    start: Option<RawStart>,
    #[serde(default)]
    data: Option<RawData>,
    #[serde(default)]
    end: Option<RawEnd>,
    #[serde(default)]
    keepalive: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct RawStart {
    #[serde(default, deserialize_with = "json::int")]
    pid: u32,
}

#[derive(Deserialize)]
struct RawData {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Deserialize)]
struct RawEnd {
    #[serde(
        rename = "exitCode",
        alias = "exit_code",
        default,
        deserialize_with = "json::int"
    )]
    exit_code: i32,
    #[serde(default)]
    exited: bool,
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<String>,
}

/// Decodes one stream message; `Ok(None)` for an event kind this client does not know.
pub(crate) fn parse_event(payload: &[u8]) -> Result<Option<ProcessEvent>, String> {
    let message: EventMessage =
        serde_json::from_slice(payload).map_err(|error| format!("invalid event: {error}"))?;
    let Some(event) = message.event else {
        return Ok(None);
    };
    if let Some(start) = event.start {
        return Ok(Some(ProcessEvent::Start { pid: start.pid }));
    }
    if let Some(data) = event.data {
        let decode = |text: String| {
            json::decode_bytes(&text)
                .map(Bytes::from)
                .ok_or_else(|| "output is not valid base64".to_owned())
        };
        if let Some(text) = data.stdout {
            return decode(text).map(|bytes| Some(ProcessEvent::Stdout(bytes)));
        }
        if let Some(text) = data.stderr {
            return decode(text).map(|bytes| Some(ProcessEvent::Stderr(bytes)));
        }
        if let Some(text) = data.pty {
            return decode(text).map(|bytes| Some(ProcessEvent::Pty(bytes)));
        }
        // A data event with no known output (proto3 may omit an empty one).
        return Ok(Some(ProcessEvent::Stdout(Bytes::new())));
    }
    if let Some(end) = event.end {
        return Ok(Some(ProcessEvent::End(ProcessEnd {
            exit_code: end.exit_code,
            exited: end.exited,
            status: end.status,
            error: end.error,
        })));
    }
    if event.keepalive.is_some() {
        return Ok(Some(ProcessEvent::Keepalive));
    }
    Ok(None)
}

/// The signals envd can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// `SIGKILL`.
    Kill,
    /// `SIGTERM`.
    Term,
}

impl Signal {
    /// The proto enum name envd expects.
    pub(crate) fn wire_name(self) -> &'static str {
        match self {
            Signal::Kill => "SIGNAL_SIGKILL",
            Signal::Term => "SIGNAL_SIGTERM",
        }
    }
}

/// The result of signalling a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOutcome {
    /// envd delivered the signal.
    Delivered,
    /// No process with that pid (Connect `not_found`).
    NotFound,
}

/// A process as envd's List reports it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct ProcessInfo {
    /// The pid.
    #[serde(default, deserialize_with = "json::int")]
    pub pid: u32,
    /// Its tag, if started with one.
    #[serde(default)]
    pub tag: Option<String>,
    /// How it was started.
    #[serde(default)]
    pub config: ProcessConfig,
}

/// The command line a process was started with.
#[derive(Clone, Debug, Default, Deserialize)]
#[non_exhaustive]
pub struct ProcessConfig {
    /// The program.
    #[serde(default)]
    pub cmd: String,
    /// Its arguments.
    #[serde(default, deserialize_with = "json::null_default")]
    pub args: Vec<String>,
    /// Its extra environment.
    #[serde(default, deserialize_with = "json::null_default")]
    pub envs: BTreeMap<String, String>,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<String>,
}

#[cfg(test)]
mod tests;
