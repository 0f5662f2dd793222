//! The follower thread: reads a live process's stream (the runner's, then followers'),
//! hands its output over exactly once, and takes it up again after a cut.

use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use bytes::Bytes;
use e2b_client::{ProcessEvent, ProcessStream, Sandbox, StartOptions};
use futures::StreamExt;

use super::script::{Control, follower};
use super::{LiveEnd, LiveEvent, LiveSignal, LostReason, Shared};
use crate::error::{Error, ErrorChain};

/// The backend, as a live process sees it: implemented by the backend's core, reached
/// weakly (a live process never keeps a dropped backend alive).
pub(crate) trait LiveHost: Send + Sync {
    /// Where a follower may be started now for the process of `sandbox_id` (blocking: it may
    /// wait for the scope's state).
    fn target(&self, sandbox_id: &str) -> Target;
    /// A number that changes at every use of the scope's sandbox (a command, a file
    /// operation) and when the scope closes.
    fn uses(&self) -> u64;
    /// Blocks until [`uses`](Self::uses) differs from `since`, or `stop`.
    fn wait_for_use(&self, since: u64, stop: &super::Stop);
    /// The runtime to drive streams on.
    fn runtime(&self) -> tokio::runtime::Handle;
    /// Records that live process `id` has ended and been reported: its directory may go.
    fn finished(&self, id: &str);
    /// Writes `data` to the stdin of `pid`, live process `id` (a use of the sandbox, whose
    /// lease is made to cover `cover` from now; after a resume the pid is checked to still be
    /// that process first).
    fn input(
        &self,
        sandbox_id: &str,
        pid: u32,
        id: &str,
        data: &[u8],
        cover: Duration,
    ) -> Result<(), Error>;
    /// Closes the stdin of `pid`, live process `id`.
    fn close_input(&self, sandbox_id: &str, pid: u32, id: &str) -> Result<(), Error>;
    /// Counts `what` as running in the scope (a kernel's cell: the sandbox is not paused
    /// for quiet or the limit under it, and a cleanup waits for it) until the guard drops.
    fn busy(&self, what: String) -> Busy;
    /// Sends `signal` to live process `id`.
    fn signal(&self, sandbox_id: &str, id: &str, signal: LiveSignal) -> Result<(), Error>;
}

/// A scope's running thing, counted until dropped.
pub(crate) struct Busy(Option<Box<dyn FnOnce() + Send>>);

impl Busy {
    pub(crate) fn new(leave: Box<dyn FnOnce() + Send>) -> Busy {
        Busy(Some(leave))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(leave) = self.0.take() {
            leave();
        }
    }
}

/// Where a follower can be started.
pub(crate) enum Target {
    /// The process's sandbox runs, as far as the host knows.
    Running(Box<Sandbox>),
    /// It is paused (or its state is unknown): wait for the next use.
    Wait,
    /// The scope uses another sandbox now.
    Replaced,
    /// The backend was cleaned up.
    Closed,
}

/// How long a follower may stay silent before envd sends a keepalive (a process that prints
/// nothing for hours keeps its stream).
const KEEPALIVE: Duration = Duration::from_secs(30);

/// How many times in a row a follower start that failed for another reason than a paused or
/// gone sandbox is tried again (after 0.5, 1, 2 s) before waiting for the next use.
const START_RETRIES: u32 = 3;

/// Starts the follower thread of `shared`: `stream` is the runner's own (its output from
/// byte 0), or `None` to start a follower from `offset` first. `serving` is held as long as
/// the thread follows (the scope's count of background processes it serves).
pub(crate) fn spawn_follower(
    shared: Arc<Shared>,
    events: SyncSender<LiveEvent>,
    stream: Option<ProcessStream>,
    offset: u64,
    serving: Option<Busy>,
) -> Result<(), Error> {
    let name = format!("live-{}", shared.id);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let _serving = serving;
            let mut follow = Follow {
                shared,
                events,
                offset,
            };
            let end = follow.run(stream);
            if let Some(end) = end {
                if matches!(end, LiveEnd::Exited { .. } | LiveEnd::Killed)
                    && let Some(host) = follow.shared.host.upgrade()
                {
                    host.finished(&follow.shared.id);
                }
                // The reader may be gone: nothing to tell then.
                let _ = follow.events.send(LiveEvent::End(end));
            }
        })
        .map(drop)
        .map_err(|source| Error::Io {
            operation: "follow a live process",
            path: std::path::PathBuf::new(),
            source,
        })
}

struct Follow {
    shared: Arc<Shared>,
    events: SyncSender<LiveEvent>,
    /// Bytes of the log handed to the reader so far.
    offset: u64,
}

/// How one stream ended.
enum Pumped {
    /// A report told how the process ended.
    Ended(LiveEnd),
    /// The stream broke or ended without a report: take the process up again.
    Cut,
    /// The reader is gone.
    Stopped,
}

impl Follow {
    /// Follows until the process ends (`Some(end)`) or nobody reads any more (`None`).
    fn run(&mut self, first: Option<ProcessStream>) -> Option<LiveEnd> {
        let mut next = first;
        loop {
            let stream = match next.take() {
                Some(stream) => stream,
                None => match self.reconnect() {
                    Ok(stream) => stream,
                    Err(end) => return end,
                },
            };
            match self.pump(stream) {
                Pumped::Ended(end) => return Some(end),
                Pumped::Cut => {}
                Pumped::Stopped => return None,
            }
        }
    }

    fn host(&self) -> Option<Arc<dyn LiveHost>> {
        self.shared.host.upgrade()
    }

    /// Reads one stream to its end or its cut.
    fn pump(&mut self, mut stream: ProcessStream) -> Pumped {
        let Some(host) = self.host() else {
            return Pumped::Stopped;
        };
        let runtime = host.runtime();
        drop(host);
        let mut control = ControlLines::default();
        loop {
            let next = runtime.block_on(async {
                tokio::select! {
                    event = stream.next() => Some(event),
                    () = self.shared.stop.stopped() => None,
                }
            });
            let Some(event) = next else {
                return Pumped::Stopped;
            };
            match event {
                Some(Ok(ProcessEvent::Stdout(bytes))) => {
                    self.offset += bytes.len() as u64;
                    if self.events.send(LiveEvent::Output(bytes)).is_err() {
                        return Pumped::Stopped;
                    }
                }
                Some(Ok(ProcessEvent::Stderr(bytes))) => {
                    for line in control.push(&bytes) {
                        match line {
                            Control::Pid(pid) if pid != self.shared.pid => {
                                // Another process answers under this id: not ours to follow.
                                tracing::debug!(sandbox_id = %self.shared.sandbox_id, "live process {} reports pid {pid}, expected {}", self.shared.id, self.shared.pid);
                                return Pumped::Ended(LiveEnd::Lost(LostReason::Gone));
                            }
                            Control::Pid(_) => {}
                            Control::Exit(code) => return Pumped::Ended(LiveEnd::Exited { code }),
                            Control::Killed => return Pumped::Ended(LiveEnd::Killed),
                            Control::LostReboot => {
                                return Pumped::Ended(LiveEnd::Lost(LostReason::Restarted));
                            }
                            Control::LostGone => {
                                return Pumped::Ended(LiveEnd::Lost(LostReason::Gone));
                            }
                        }
                    }
                }
                Some(Ok(_)) => {}
                // The stream ended before its report (a kill took the runner's follower with
                // it), or broke: the next follower tells.
                Some(Err(error)) => {
                    tracing::debug!(sandbox_id = %self.shared.sandbox_id, "the stream of live process {} was cut: {}", self.shared.id, ErrorChain(&error));
                    return Pumped::Cut;
                }
                None => return Pumped::Cut,
            }
        }
    }

    /// Starts a follower from the offset reached, once the sandbox runs; `Err(end)` when the
    /// process cannot be followed any more (`None`: the reader is gone).
    fn reconnect(&self) -> Result<ProcessStream, Option<LiveEnd>> {
        let mut failures = 0;
        loop {
            if self.shared.stop.is_stopped() {
                return Err(None);
            }
            let Some(host) = self.host() else {
                return Err(Some(LiveEnd::Detached));
            };
            let since = host.uses();
            let sandbox = match host.target(&self.shared.sandbox_id) {
                Target::Closed => return Err(Some(LiveEnd::Detached)),
                Target::Replaced => return Err(Some(LiveEnd::Lost(LostReason::Replaced))),
                Target::Wait => {
                    host.wait_for_use(since, &self.shared.stop);
                    continue;
                }
                Target::Running(sandbox) => *sandbox,
            };
            let mut options = StartOptions::exec(
                "/bin/bash".to_owned(),
                vec![
                    "-c".to_owned(),
                    follower(&self.shared.id, self.offset),
                    "agent-sandbox".to_owned(),
                ],
            );
            options.cwd = Some("/".to_owned());
            options.keepalive = KEEPALIVE;
            let started = host.runtime().block_on(async {
                tokio::select! {
                    started = sandbox.start(options) => Some(started),
                    () = self.shared.stop.stopped() => None,
                }
            });
            match started {
                None => return Err(None),
                Some(Ok(stream)) => return Ok(stream),
                Some(Err(error)) if error.is_sandbox_gone() => {
                    // Paused behind the host's back (its lease ended) or killed: the next use
                    // resumes it or replaces it, and tells which.
                    failures = 0;
                    host.wait_for_use(since, &self.shared.stop);
                }
                Some(Err(error)) => {
                    failures += 1;
                    tracing::debug!(sandbox_id = %self.shared.sandbox_id, "following live process {} again failed: {}", self.shared.id, ErrorChain(&error));
                    if failures > START_RETRIES {
                        failures = 0;
                        host.wait_for_use(since, &self.shared.stop);
                    } else {
                        let backoff = Duration::from_millis(250 << failures);
                        host.runtime().block_on(async {
                            tokio::select! {
                                () = tokio::time::sleep(backoff) => {}
                                () = self.shared.stop.stopped() => {}
                            }
                        });
                    }
                }
            }
        }
    }
}

/// The follower's stderr split into lines, bounded: a line longer than
/// [`MAX_CONTROL_LINE`] is dropped whole (it is no control line).
#[derive(Default)]
struct ControlLines {
    partial: Vec<u8>,
    overlong: bool,
}

const MAX_CONTROL_LINE: usize = 256;

impl ControlLines {
    fn push(&mut self, bytes: &Bytes) -> Vec<Control> {
        let mut lines = Vec::new();
        for &byte in bytes.iter() {
            if byte == b'\n' {
                if !self.overlong
                    && let Ok(text) = std::str::from_utf8(&self.partial)
                    && let Some(control) = Control::parse(text)
                {
                    lines.push(control);
                }
                self.partial.clear();
                self.overlong = false;
            } else if self.partial.len() < MAX_CONTROL_LINE {
                self.partial.push(byte);
            } else {
                self.overlong = true;
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_split_across_chunks_and_overlong_lines_are_dropped() {
        let mut lines = ControlLines::default();
        assert!(lines.push(&Bytes::from_static(b"pi")).is_empty());
        assert_eq!(
            lines.push(&Bytes::from_static(b"d 12\ntail: noise\nexi")),
            vec![Control::Pid(12)]
        );
        assert_eq!(
            lines.push(&Bytes::from_static(b"t 3\n")),
            vec![Control::Exit(3)]
        );
        let mut long = vec![b'x'; 1000];
        long.extend_from_slice(b"exit 4\nkilled\n");
        assert_eq!(
            lines.push(&Bytes::from(long)),
            vec![Control::Killed],
            "the overlong line is dropped whole, its tail too"
        );
    }
}
