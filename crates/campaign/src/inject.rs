//! How each fault drawn from the seed is injected into a running cycle.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::checks::contents;
use crate::faults::{Fault, signal};
use crate::hosts::Host;
use crate::state::Campaign;
use crate::{Error, TWO_HOST_TERM};

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
