//! When a listed sandbox was last used and how long it has been idle.
//!
//! Two sources, the better first:
//! - this host's activity record of the scope (`<key>.activity`, writer-lease's
//!   `ScopeActivity`): the start and end of the last command a process on this host ran in
//!   that sandbox; a start after the last end, while a session still holds the scope, is a
//!   command running now;
//! - E2B's own answer: a running sandbox's `endAt` is its lease end, set by its last lease
//!   extension (the attach, or a command the known lease did not cover) to the baseline lease
//!   plus [`LEASE_HEADROOM`](crate::LEASE_HEADROOM) ahead, so `endAt − (lease + headroom)` is
//!   that extension's time; a paused sandbox's `endAt` is when it paused, which for one paused
//!   by its lease is the same lease span after its last extension. An estimate: a command
//!   inside the headroom of the last extension does not move `endAt` (the estimate lags by up
//!   to the headroom), a command longer than the lease moves it further (clamped to now).

use std::time::{Duration, SystemTime};

use writer_lease::ScopeActivity;

use super::EntryState;

/// Where a sandbox's last use comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UseSource {
    /// This host's activity record of the scope: the last command's start or end.
    Host,
    /// Estimated from E2B's lease end (`endAt`) and the profile's lease settings.
    Lease,
}

impl UseSource {
    /// `host` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            UseSource::Host => "host",
            UseSource::Lease => "lease",
        }
    }
}

/// What a sandbox is doing, as far as this host can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Activity {
    /// A command started at this time runs now (this host's record, a live session).
    RunningCommand {
        /// When it started.
        since: SystemTime,
    },
    /// Idle for this long since its last use.
    Idle(Duration),
    /// No use known.
    Unknown,
}

/// A sandbox's last use, idle time and pause time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// When it was last used, when known.
    pub last_used: Option<SystemTime>,
    /// Where [`Usage::last_used`] comes from.
    pub source: Option<UseSource>,
    /// Running a command, idle, or unknown.
    pub activity: Activity,
    /// When it paused (a paused sandbox's `endAt`).
    pub paused_at: Option<SystemTime>,
}

/// What [`usage`] reads about one listed sandbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observed<'a> {
    pub(crate) sandbox_id: &'a str,
    pub(crate) state: EntryState,
    /// When E2B started (or resumed) it.
    pub(crate) started_at: SystemTime,
    /// E2B's `endAt`: the lease end (running) or the pause time (paused).
    pub(crate) end_at: SystemTime,
    /// The lease a use leaves ahead: the baseline lease plus
    /// [`LEASE_HEADROOM`](crate::LEASE_HEADROOM).
    pub(crate) lease_span: Duration,
    /// This host's activity record of the scope, if any (of any sandbox).
    pub(crate) record: Option<&'a ScopeActivity>,
    /// Whether a live session on this host holds the scope (its writer role).
    pub(crate) session_live: bool,
}

/// The last use of one sandbox at `now`: this host's record of that sandbox when it has one,
/// else the estimate from E2B's lease end.
pub(crate) fn usage(seen: Observed<'_>, now: SystemTime) -> Usage {
    let paused_at = (seen.state == EntryState::Paused).then_some(seen.end_at);
    let record = seen
        .record
        .filter(|record| record.sandbox_id == seen.sandbox_id);
    if let Some(record) = record {
        let running =
            seen.state == EntryState::Running && seen.session_live && record.command_running();
        let last_used = if running {
            record.started
        } else {
            record.last_used()
        };
        let activity = if running {
            Activity::RunningCommand {
                since: record.started,
            }
        } else {
            Activity::Idle(idle(now, last_used))
        };
        return Usage {
            last_used: Some(last_used),
            source: Some(UseSource::Host),
            activity,
            paused_at,
        };
    }
    let estimate = match seen.state {
        EntryState::Running | EntryState::Paused => seen
            .end_at
            .checked_sub(seen.lease_span)
            .map(|at| at.max(seen.started_at))
            .map(|at| at.min(now).min(paused_at.unwrap_or(now))),
        _ => None,
    };
    Usage {
        last_used: estimate,
        source: estimate.map(|_| UseSource::Lease),
        activity: estimate.map_or(Activity::Unknown, |at| Activity::Idle(idle(now, at))),
        paused_at,
    }
}

fn idle(now: SystemTime, since: SystemTime) -> Duration {
    now.duration_since(since).unwrap_or(Duration::ZERO)
}
