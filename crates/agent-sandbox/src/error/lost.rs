//! Why a live process was lost (shared by the live processes and the error they raise).

use std::fmt;

/// Why a live process was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The sandbox restarted since the command started (a pause that keeps only the files):
    /// the command was killed with it.
    Restarted,
    /// The scope now uses another sandbox (the old one was gone and got replaced).
    Replaced,
    /// The sandbox no longer has the process's directory.
    Gone,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Restarted => {
                "the sandbox restarted (it was paused without its memory), which ended the process"
            }
            LostReason::Replaced => "the sandbox it ran in is gone and was replaced",
            LostReason::Gone => "the sandbox no longer has the process",
        })
    }
}
