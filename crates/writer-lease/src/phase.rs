//! Where a writer is in its protocol: a plain value the writer and the errors both name.

use std::fmt;

/// Where a writer is in its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriterPhase {
    /// Holds the role; has not begun a transition. The scope is as the
    /// previous writer left it.
    Idle,
    /// Began a transition (scope dirty, previous stamp invalidated); the
    /// push has not completed.
    InTransition,
    /// Its last push or sync established the host's state; scope clean.
    Prepared,
    /// A sync failed after a completed push; scope dirty until a sync
    /// succeeds.
    Stale,
}

impl fmt::Display for WriterPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WriterPhase::Idle => "idle",
            WriterPhase::InTransition => "in a transition",
            WriterPhase::Prepared => "prepared",
            WriterPhase::Stale => "stale after a failed sync",
        })
    }
}
