//! The scope note's keys and line format: what the backend writes for people (writer-lease's
//! `ScopeNote`) and the inventory reads back, in one place.

use std::time::SystemTime;

/// Which task (scope) the note's scope is.
pub(crate) const NOTE_TASK: &str = "task";
/// The template the scope's sandbox uses.
pub(crate) const NOTE_TEMPLATE: &str = "template";
/// The pid of the last writer on this host.
pub(crate) const NOTE_WRITER_PID: &str = "writer-pid";
/// The last teardown pull: when, from which sandbox, and its outcome.
pub(crate) const NOTE_PULL: &str = "last-pull";
/// The sandbox this scope last attached on this host: a hint that lets a resume send its
/// connect together with its list (the list still decides which sandbox is adopted).
pub(crate) const NOTE_SANDBOX: &str = "sandbox";
/// The egress policy this host last applied live to the scope's sandbox: `<sandbox>
/// <digest>`. It outlives the creation stamp in the sandbox's metadata, which E2B cannot
/// change (X9).
pub(crate) const NOTE_EGRESS: &str = "egress";
/// The credential stand-ins of the scope's sandbox on this host: `<sandbox> NAME=stand-in
/// ...` (X16). Not secrets: they are what the sandbox sees.
pub(crate) const NOTE_STAND_INS: &str = "stand-ins";
/// The last recovery: when, its counts or failure, and from which sandbox.
pub(crate) const NOTE_RECOVERY: &str = "last-recovery";

/// `text` prefixed with the current UTC time, for a note line.
pub(crate) fn stamped(text: &str) -> String {
    let now = time::OffsetDateTime::from(SystemTime::now());
    let when = now
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    format!("{when} {text}")
}
