//! What `GET /sandboxes/{id}/logs` and `GET /v2/sandboxes/{id}/logs` answer: the events
//! e2b-local itself saw for a sandbox (lifecycle, egress updates, connections the rules
//! refused), in a bounded ring per sandbox, in memory only (gone after a restart).
//! Never holds env values or tokens: callers log ids, pids, addresses and ports.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::UNIX_EPOCH;

use crate::clock::Clock;

/// Entries kept per sandbox; the oldest go first.
pub(crate) const RING_CAPACITY: usize = 1000;

/// Sandboxes whose logs are kept: past this, the log of the sandbox first seen longest ago
/// goes, so a server that outlives many sandboxes holds a bounded amount.
pub(crate) const SANDBOXES_KEPT: usize = 1024;

/// Severity, ordered as E2B's `LogLevel` (a minimum filter keeps this and above).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    pub(crate) fn parse(raw: &str) -> Option<Level> {
        match raw {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Milliseconds since the Unix epoch, by the server's clock.
    pub(crate) millis: u64,
    pub(crate) level: Level,
    pub(crate) message: String,
    pub(crate) fields: BTreeMap<String, String>,
}

/// The rings of the last [`SANDBOXES_KEPT`] sandboxes seen since the server started.
#[derive(Clone, Debug)]
pub(crate) struct SandboxLogs {
    clock: Clock,
    rings: Arc<Mutex<Rings>>,
}

#[derive(Debug, Default)]
struct Rings {
    by_id: HashMap<String, SandboxLog>,
    /// Ids in the order they were first seen (the eviction order).
    seen: VecDeque<String>,
}

impl SandboxLogs {
    pub(crate) fn new(clock: Clock) -> SandboxLogs {
        SandboxLogs {
            clock,
            rings: Arc::default(),
        }
    }

    /// The ring of `id`, made on first use.
    pub(crate) fn of(&self, id: &str) -> SandboxLog {
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(log) = rings.by_id.get(id) {
            return log.clone();
        }
        if rings.seen.len() == SANDBOXES_KEPT
            && let Some(oldest) = rings.seen.pop_front()
        {
            rings.by_id.remove(&oldest);
        }
        let log = SandboxLog {
            clock: self.clock.clone(),
            ring: Arc::default(),
        };
        rings.seen.push_back(id.to_owned());
        rings.by_id.insert(id.to_owned(), log.clone());
        log
    }

    /// The ring of `id` if anything was logged for it (and it is still kept).
    pub(crate) fn existing(&self, id: &str) -> Option<SandboxLog> {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id
            .get(id)
            .cloned()
    }
}

/// A handle onto one sandbox's ring.
#[derive(Clone, Debug)]
pub(crate) struct SandboxLog {
    clock: Clock,
    ring: Arc<Mutex<VecDeque<Entry>>>,
}

impl SandboxLog {
    /// Appends an event stamped with the server's clock.
    pub(crate) fn push(&self, level: Level, message: impl Into<String>, fields: &[(&str, String)]) {
        let millis = self
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let entry = Entry {
            millis,
            level,
            message: message.into(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        };
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == RING_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// Every entry, oldest first.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }
}

/// A command line cut short for the log (its arguments may be long; never its env).
pub(crate) fn shorten(cmd: &str) -> String {
    const MAX: usize = 120;
    match cmd.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &cmd[..cut]),
        None => cmd.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logs_of_the_sandboxes_first_seen_longest_ago_go_past_the_bound() {
        let logs = SandboxLogs::new(Clock::manual(std::time::SystemTime::UNIX_EPOCH));
        for n in 0..=SANDBOXES_KEPT {
            logs.of(&format!("sbx{n}"))
                .push(Level::Info, "created", &[]);
        }
        assert!(logs.existing("sbx0").is_none(), "the first one is evicted");
        for n in 1..=SANDBOXES_KEPT {
            let log = logs.existing(&format!("sbx{n}")).expect("kept");
            assert_eq!(log.entries().len(), 1);
        }
        // Seen again, a kept sandbox's ring is the same (it is not renewed or evicted).
        logs.of("sbx1").push(Level::Info, "paused", &[]);
        assert_eq!(logs.existing("sbx1").unwrap().entries().len(), 2);
    }

    #[test]
    fn a_ring_keeps_its_newest_entries() {
        let logs = SandboxLogs::new(Clock::manual(std::time::SystemTime::UNIX_EPOCH));
        let log = logs.of("sbx");
        for n in 0..RING_CAPACITY + 5 {
            log.push(Level::Info, format!("event {n}"), &[]);
        }
        let entries = log.entries();
        assert_eq!(entries.len(), RING_CAPACITY);
        assert_eq!(entries[0].message, "event 5");
    }
}
