//! The faults drawn from the seed (`inject` injects them), and the signal a fault sends to a
//! process.

use std::process::Command;

use crate::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    KillHostTimed,
    KillHostAtPush,
    KillHostAtPull,
    ServerError,
    DropConnections,
    DropStream,
    Vanish,
    Pause,
    LeaseExpiry,
    ServerRestart,
    /// maxRunning at or below the running count, lifted after a drawn span (`lift_limit`).
    AccountLimit,
    /// One-host mode only: the host SIGKILLed while idle (a gateway crashed), the limit set
    /// at the running count, and a new session of another task of the profile must start
    /// without waiting (it pauses the killed host's leftover, L15).
    RestartUnderLimit,
    /// Two-host mode only.
    StopWriter,
}

pub(crate) const FAULTS: [Fault; 12] = [
    Fault::KillHostTimed,
    Fault::KillHostAtPush,
    Fault::KillHostAtPull,
    Fault::ServerError,
    Fault::DropConnections,
    Fault::DropStream,
    Fault::Vanish,
    Fault::Pause,
    Fault::LeaseExpiry,
    Fault::ServerRestart,
    Fault::AccountLimit,
    Fault::RestartUnderLimit,
];

impl Fault {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::KillHostTimed => "SIGKILL host at a random moment",
            Fault::KillHostAtPush => "SIGKILL host mid-push",
            Fault::KillHostAtPull => "SIGKILL host mid-pull",
            Fault::ServerError => "injected 5xx",
            Fault::DropConnections => "dropped connections",
            Fault::DropStream => "stream cut mid-transfer",
            Fault::Vanish => "sandbox vanished",
            Fault::Pause => "sandbox paused",
            Fault::LeaseExpiry => "lease expired (clock jump)",
            Fault::ServerRestart => "e2b-local killed and restarted (refusing meanwhile)",
            Fault::AccountLimit => "account's limit of running sandboxes reached",
            Fault::RestartUnderLimit => "idle host SIGKILLed, a new session under the limit",
            Fault::StopWriter => "SIGSTOP host past its term, then SIGCONT",
        }
    }
}

/// Sends `kill -<name>` to `pid` (SIGSTOP / SIGCONT of a host process the campaign started).
pub(crate) fn signal(pid: u32, name: &str) -> Result<(), Error> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid}: {status}").into())
    }
}
