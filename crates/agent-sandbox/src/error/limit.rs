//! What a start refused for the account's limit knew (L14, L15), and why this process paused
//! a sandbox behind its session (L17): the detail types of those errors and their words.

use std::fmt;

/// What [`Error::ConcurrencyLimit`](crate::Error::ConcurrencyLimit) knew when it gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitDetail {
    /// The sandbox being resumed; `None` for a create.
    pub sandbox_id: Option<String>,
    /// Sandboxes running on the account, if one bounded list request could tell.
    pub running: Option<u64>,
    /// Other sandboxes of this process's fleet running at the time.
    pub this_process: usize,
    /// This profile's running sandboxes of other processes held by a live session on this
    /// host (L15).
    pub held_elsewhere: usize,
    /// This profile's running sandboxes of no live session that run a command, as this
    /// host's activity record says (L15).
    pub busy_elsewhere: usize,
    /// This profile's running sandboxes of scopes this host never coordinated (another
    /// host's) or whose records it cannot read (L15).
    pub unknown: usize,
    /// How long the start waited for a slot.
    pub waited: std::time::Duration,
}

/// Why this process paused a sandbox behind its session ([`Error::PausedByBackend`](crate::Error::PausedByBackend)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PausedFor {
    /// It was quiet this long (`pause_after_idle`, L17).
    Quiet(std::time::Duration),
    /// To free a slot under the account's limit of running sandboxes (L14).
    Limit,
}

impl fmt::Display for PausedFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PausedFor::Quiet(quiet) => write!(
                f,
                "it was paused after {} s without a command (pause_after_idle_seconds)",
                quiet.as_secs()
            ),
            PausedFor::Limit => f.write_str(
                "it was paused to free a slot under the account's limit of concurrently running sandboxes",
            ),
        }
    }
}

/// Renders the leftover census of a limit error.
pub(super) struct Census<'a>(pub(super) &'a LimitDetail);

impl fmt::Display for Census<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_census(
            f,
            self.0.held_elsewhere,
            self.0.busy_elsewhere,
            self.0.unknown,
        )
    }
}

/// Says why none of this profile's running sandboxes of other processes could be paused.
pub(crate) fn write_census(
    f: &mut fmt::Formatter<'_>,
    held: usize,
    busy: usize,
    unknown: usize,
) -> fmt::Result {
    if held + busy + unknown == 0 {
        return f.write_str("no sandbox of this profile left by another process runs");
    }
    write!(
        f,
        "of this profile's sandboxes of other processes, {held} are held by a live Hermes session on this host, {busy} run a command and {unknown} belong to another host"
    )
}

/// Renders " (<n> running now)" or nothing.
pub(super) struct Running(pub(super) Option<u64>);

impl fmt::Display for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(count) => write!(f, " ({count} running now)"),
            None => Ok(()),
        }
    }
}
