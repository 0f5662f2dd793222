//! Progress of long transfers (teardown pull, resume recovery, uploads, creation): an
//! observer the caller injects (a CLI draws a bar), and an INFO log line every few seconds
//! whoever observes, never one per chunk.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a transfer that is still running is logged at INFO.
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// How often the observer is called while a transfer runs (it is always called at the start
/// and at the end).
const OBSERVER_INTERVAL: Duration = Duration::from_millis(100);

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProgressUnit {
    /// Bytes moved.
    Bytes,
    /// Files moved.
    Files,
    /// Steps of an operation (creation: one).
    Steps,
    /// Seconds waited (for a sandbox slot under the account's limit, L14).
    Seconds,
}

impl ProgressUnit {
    /// `bytes`, `files` or `steps`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProgressUnit::Bytes => "bytes",
            ProgressUnit::Files => "files",
            ProgressUnit::Steps => "steps",
            ProgressUnit::Seconds => "seconds",
        }
    }
}

/// One progress report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// `teardown pull`, `state recovery`, `upload files`, `create`, `wait for a sandbox slot`.
    pub operation: &'static str,
    /// The sandbox, once known.
    pub sandbox_id: Option<String>,
    /// What `done` and `total` count.
    pub unit: ProgressUnit,
    /// How much is done.
    pub done: u64,
    /// How much there is, when known in advance (a tar stream's size is not).
    pub total: Option<u64>,
    /// The last report of this transfer.
    pub finished: bool,
}

/// The caller's progress observer. Called from the thread doing the transfer; it must
/// return quickly (drawing a bar is fine, network work is not).
#[derive(Clone)]
pub struct ProgressObserver(Arc<dyn Fn(&Progress) + Send + Sync>);

impl ProgressObserver {
    /// Wraps `observe`.
    pub fn new(observe: impl Fn(&Progress) + Send + Sync + 'static) -> ProgressObserver {
        ProgressObserver(Arc::new(observe))
    }
}

impl fmt::Debug for ProgressObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressObserver(..)")
    }
}

/// Counts one transfer and reports it: to the observer at most every 100 ms, to the log at
/// INFO every [`PROGRESS_LOG_INTERVAL`].
pub(crate) struct Meter {
    report: Progress,
    observer: Option<ProgressObserver>,
    started: Instant,
    last_observed: Instant,
    last_logged: Instant,
}

impl Meter {
    pub(crate) fn start(
        observer: Option<ProgressObserver>,
        operation: &'static str,
        sandbox_id: Option<&str>,
        unit: ProgressUnit,
        total: Option<u64>,
    ) -> Meter {
        let now = Instant::now();
        let meter = Meter {
            report: Progress {
                operation,
                sandbox_id: sandbox_id.map(str::to_owned),
                unit,
                done: 0,
                total,
                finished: false,
            },
            observer,
            started: now,
            last_observed: now,
            last_logged: now,
        };
        meter.observe();
        meter
    }

    fn observe(&self) {
        if let Some(observer) = &self.observer {
            (observer.0)(&self.report);
        }
    }

    pub(crate) fn advance(&mut self, by: u64) {
        self.report.done = self.report.done.saturating_add(by);
        let now = Instant::now();
        if now.duration_since(self.last_observed) >= OBSERVER_INTERVAL {
            self.last_observed = now;
            self.observe();
        }
        if now.duration_since(self.last_logged) >= PROGRESS_LOG_INTERVAL {
            self.last_logged = now;
            tracing::info!(
                sandbox_id = self.report.sandbox_id.as_deref().unwrap_or(""),
                "E2B {}: {} so far ({} s)",
                self.report.operation,
                amount(&self.report),
                self.started.elapsed().as_secs()
            );
        }
    }

    pub(crate) fn finish(mut self) {
        self.report.finished = true;
        if self.report.total.is_none() {
            self.report.total = Some(self.report.done);
        }
        self.observe();
        // A transfer long enough to have been logged while running says when it ended.
        if self.started.elapsed() >= PROGRESS_LOG_INTERVAL {
            tracing::info!(
                sandbox_id = self.report.sandbox_id.as_deref().unwrap_or(""),
                "E2B {}: {} done in {} s",
                self.report.operation,
                amount(&self.report),
                self.started.elapsed().as_secs()
            );
        }
    }
}

fn amount(report: &Progress) -> String {
    match report.total {
        Some(total) => format!("{} of {total} {}", report.done, report.unit.as_str()),
        None => format!("{} {}", report.done, report.unit.as_str()),
    }
}

/// A reader that feeds a [`Meter`] with the bytes it passes on.
pub(crate) struct MeteredRead<'a, R> {
    pub(crate) inner: R,
    pub(crate) meter: &'a mut Meter,
}

impl<R: Read> Read for MeteredRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.meter.advance(read as u64);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn the_observer_sees_the_start_and_the_end_with_the_total() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let observer = ProgressObserver::new(move |p: &Progress| {
            sink.lock().unwrap().push((p.done, p.total, p.finished));
        });
        let mut meter = Meter::start(
            Some(observer),
            "teardown pull",
            Some("isb1"),
            ProgressUnit::Bytes,
            None,
        );
        let mut copied = Vec::new();
        MeteredRead {
            inner: &[7u8; 10_000][..],
            meter: &mut meter,
        }
        .read_to_end(&mut copied)
        .expect("read");
        meter.finish();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.first(), Some(&(0, None, false)));
        assert_eq!(seen.last(), Some(&(10_000, Some(10_000), true)));
        assert_eq!(copied.len(), 10_000);
    }
}
