//! Directory watches: what envd reports, and the stream that delivers it.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, stream};
use serde::Deserialize;

use crate::files::EntryInfo;

use crate::error::Error;
use crate::framing::{Read, ServerStream};

/// How deep a watch reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchDepth {
    /// The directory's own entries.
    Direct,
    /// Every directory below it too, including ones created later.
    Recursive,
}

/// How to watch a directory ([`crate::Sandbox::watch_dir`]). Start from [`WatchOptions::new`];
/// there is no `Default`.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// How deep the watch reaches.
    pub depth: WatchDepth,
    /// How long the watch may last (`Connect-Timeout-Ms`); `None` for as long as the stream is
    /// read.
    pub timeout: Option<Duration>,
    /// How long envd may stay silent before a keepalive (`Keepalive-Ping-Interval`).
    pub keepalive: Duration,
    /// Whether each event carries the entry it concerns (the SDK's `include_entry`).
    pub entries: EventEntries,
}

impl WatchOptions {
    /// A watch of `depth` with no time limit, the official SDK's 50 s keepalive and events
    /// without their entries.
    pub fn new(depth: WatchDepth) -> WatchOptions {
        WatchOptions {
            depth,
            timeout: None,
            keepalive: Duration::from_secs(50),
            entries: EventEntries::Omitted,
        }
    }
}

/// Whether a watch's events carry the [`EntryInfo`] of what they concern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventEntries {
    /// Names and kinds only (envd's default).
    Omitted,
    /// Each event also carries the entry as it is after the event, when envd can stat it
    /// (not for a removal or a rename away; envd 0.6.3 or later).
    Included,
}

/// What happened to an entry (envd's `EventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FsEventKind {
    /// Created, or moved here.
    Create,
    /// Written to.
    Write,
    /// Removed.
    Remove,
    /// Moved away (renamed).
    Rename,
    /// Its permissions or other attributes changed.
    Chmod,
    /// A kind this client does not know, as envd named it.
    Other,
}

impl FsEventKind {
    fn from_wire(name: &str) -> FsEventKind {
        match name.trim_start_matches("EVENT_TYPE_") {
            "CREATE" | "1" => FsEventKind::Create,
            "WRITE" | "2" => FsEventKind::Write,
            "REMOVE" | "3" => FsEventKind::Remove,
            "RENAME" | "4" => FsEventKind::Rename,
            "CHMOD" | "5" => FsEventKind::Chmod,
            _ => FsEventKind::Other,
        }
    }
}

/// One filesystem event.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FsEvent {
    /// The entry's path relative to the watched directory (`.` for the directory itself).
    pub name: String,
    /// What happened.
    pub kind: FsEventKind,
    /// The entry after the event, for a watch with [`EventEntries::Included`] when envd sent
    /// it.
    pub entry: Option<Box<EntryInfo>>,
}

/// A polling watcher's id ([`crate::Sandbox::create_watcher`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WatcherId(pub(crate) String);

impl WatcherId {
    /// The id as envd gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Deserialize)]
pub(crate) struct RawFsEvent {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "type")]
    kind: serde_json::Value,
    #[serde(default)]
    entry: Option<Box<EntryInfo>>,
}

impl RawFsEvent {
    pub(crate) fn into_event(self) -> FsEvent {
        let kind = match &self.kind {
            serde_json::Value::String(name) => FsEventKind::from_wire(name),
            serde_json::Value::Number(n) => FsEventKind::from_wire(&n.to_string()),
            _ => FsEventKind::Other,
        };
        FsEvent {
            name: self.name,
            kind,
            entry: self.entry,
        }
    }
}

#[derive(Deserialize)]
struct WatchMessage {
    #[serde(default)]
    start: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    filesystem: Option<RawFsEvent>,
}

/// The events of a directory watch, delivered as they arrive ([`crate::Sandbox::watch_dir`]).
///
/// Returned once envd confirmed the watch (so a missing path or a file fails that call). Frames
/// are decoded one at a time as the consumer asks, so at most one frame (capped by
/// [`crate::Limits::max_frame_bytes`]) plus one network chunk is held however long the watch
/// lasts; a consumer that stops reading makes the server wait, and envd ends the watch with an
/// error rather than buffer without bound. Keepalives are consumed silently. Dropping the
/// stream ends the watch. It ends with `None` when envd closes it cleanly, and yields an error
/// (then ends) for a failure in the end frame (`deadline_exceeded` when the timeout passed),
/// a broken connection, a protocol violation or too long a silence.
pub struct WatchStream {
    inner: Pin<Box<dyn Stream<Item = Result<FsEvent, Error>> + Send>>,
}

impl fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchStream").finish_non_exhaustive()
    }
}

/// The event decoder behind [`WatchStream`], over the shared stream reader.
struct Decode {
    reader: ServerStream,
    finished: bool,
}

/// What one step of decoding produced.
enum Step {
    Start,
    Event(FsEvent),
}

impl Decode {
    async fn next(&mut self) -> Option<Result<Step, Error>> {
        if self.finished {
            return None;
        }
        let result = self.step().await;
        if !matches!(result, Some(Ok(_))) {
            self.finished = true;
        }
        result
    }

    async fn step(&mut self) -> Option<Result<Step, Error>> {
        loop {
            let payload = match self.reader.next().await {
                Ok(Read::Message(payload)) => payload,
                Ok(Read::End) => return None,
                Ok(Read::BodyEnd) => {
                    let short = self
                        .reader
                        .ctx()
                        .protocol("watch stream ended without an end-of-stream message");
                    return Some(Err(self.reader.lost(short).await));
                }
                Err(error) => return Some(Err(error)),
            };
            let message: WatchMessage = match serde_json::from_slice(&payload) {
                Ok(message) => message,
                Err(error) => {
                    return Some(Err(self
                        .reader
                        .ctx()
                        .protocol(format!("invalid watch event: {error}"))));
                }
            };
            if message.start.is_some() {
                return Some(Ok(Step::Start));
            }
            if let Some(event) = message.filesystem {
                return Some(Ok(Step::Event(event.into_event())));
            }
            // A keepalive, or a kind this client does not know.
        }
    }
}

impl WatchStream {
    /// Reads the response up to the `start` event.
    pub(crate) async fn open(reader: ServerStream) -> Result<WatchStream, Error> {
        let ctx = reader.ctx().clone();
        let mut state = Decode {
            reader,
            finished: false,
        };
        match state.next().await {
            Some(Ok(Step::Start)) => {}
            Some(Err(error)) => return Err(error),
            Some(Ok(Step::Event(_))) | None => {
                return Err(ctx.protocol("watch stream did not begin with a start event"));
            }
        }
        let inner = stream::unfold(state, |mut state| async move {
            let item = match state.next().await? {
                Ok(Step::Event(event)) => Ok(event),
                Ok(Step::Start) => {
                    state.finished = true;
                    Err(state.reader.ctx().protocol("second start event"))
                }
                Err(error) => Err(error),
            };
            Some((item, state))
        });
        Ok(WatchStream {
            inner: Box::pin(inner),
        })
    }
}

impl Stream for WatchStream {
    type Item = Result<FsEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
