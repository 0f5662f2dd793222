//! The faults drawn from the seed and how each is injected.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::checks::contents;
use crate::cycle::Campaign;
use crate::hosts::Host;
use crate::{Error, TWO_HOST_TERM};

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
    /// Two-host mode only.
    StopWriter,
}

pub(crate) const FAULTS: [Fault; 10] = [
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
            Fault::StopWriter => "SIGSTOP host past its term, then SIGCONT",
        }
    }
}

impl Campaign {
    pub(crate) fn count(&mut self, fault: Fault) {
        self.note(format!("fault: {}", fault.name()));
        *self.injected.entry(fault).or_default() += 1;
    }

    pub(crate) fn inject(&mut self, fault: Fault, hosts: &mut [Host]) -> Result<(), Error> {
        match fault {
            Fault::KillHostTimed | Fault::KillHostAtPush | Fault::KillHostAtPull => {
                let live: Vec<usize> = (0..hosts.len())
                    .filter(|&i| !hosts[i].done && !hosts[i].killed)
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                let i = live[self.rng.random_range(0..live.len())];
                self.kill(&mut hosts[i])?;
            }
            Fault::ServerError => {
                let status = [500, 502, 503, 504][self.rng.random_range(0..4)];
                let count = self.rng.random_range(1..=4);
                self.server.admin_retrying(
                    "faults/fail",
                    &format!(r#"{{"count":{count},"status":{status}}}"#),
                )?;
            }
            Fault::DropConnections => {
                let count = self.rng.random_range(1..=3);
                self.server.admin_retrying(
                    "faults/drop-connections",
                    &format!(r#"{{"count":{count}}}"#),
                )?;
            }
            Fault::DropStream => {
                let count = self.rng.random_range(1..=2);
                let after = self.rng.random_range(0..4096);
                self.server.admin_retrying(
                    "faults/drop-stream",
                    &format!(r#"{{"count":{count},"afterBytes":{after},"scope":"envd"}}"#),
                )?;
            }
            Fault::Vanish | Fault::Pause => {
                let Some(id) = self.sandbox.clone() else {
                    return Ok(());
                };
                if fault == Fault::Vanish {
                    // What lived only in this sandbox may be lost with it.
                    let mut inside = HashSet::new();
                    let remote = self.server.sandbox_hermes_home(&id);
                    contents(&remote.join("skills"), &mut inside);
                    contents(&remote.join("memories"), &mut inside);
                    for content in &inside {
                        self.ledger.vanished(content);
                    }
                }
                let action = if fault == Fault::Vanish {
                    "vanish"
                } else {
                    "pause"
                };
                // 404 when it is already gone: nothing was injected.
                if self
                    .server
                    .admin_retrying(&format!("sandboxes/{id}/{action}"), "{}")?
                    != 204
                {
                    return Ok(());
                }
            }
            Fault::LeaseExpiry => {
                self.server
                    .admin_retrying("clock/advance", r#"{"seconds":200000}"#)?;
            }
            Fault::ServerRestart => {
                let gap = Duration::from_millis(self.rng.random_range(0..300));
                if let Some(violation) = self.server.restart(gap)? {
                    self.note(format!("violation: {violation}"));
                    self.violations.push(violation);
                }
            }
            Fault::StopWriter => {
                let live: Vec<usize> = (0..hosts.len())
                    .filter(|&i| {
                        !hosts[i].done
                            && !hosts[i].killed
                            && !self.stopped.iter().any(|(_, s)| *s == i)
                    })
                    .collect();
                if live.is_empty() {
                    return Ok(());
                }
                let i = live[self.rng.random_range(0..live.len())];
                signal(hosts[i].pid, "STOP")?;
                // Past the term on the sandbox's clock, so another host may take over.
                let hold = TWO_HOST_TERM + Duration::from_millis(self.rng.random_range(300..1500));
                self.stopped.push((Instant::now() + hold, i));
                self.note(format!("host {i} stopped for {hold:?}"));
            }
        }
        self.count(fault);
        Ok(())
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
