//! How each fault drawn from the seed is injected into a running cycle.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use agent_sandbox::{
    ApiKey, ApiKeySource, Backend, Config, DiscardSink, Endpoints, ErrorChain, NoStateHooks,
    RunOptions, SandboxMode, Scope, Services,
};

use crate::checks::contents;
use crate::cycle::IDLE_PAUSE;
use crate::faults::{Fault, signal};
use crate::hosts::Host;
use crate::state::Campaign;
use crate::{API_KEY, Error, TWO_HOST_TERM};

/// The task of the new session a restart under the limit starts.
const NEWCOMER_TASK: &str = "campaign-newcomer";
/// How long the new session may wait for a slot: far below a lease, so waiting on the killed
/// host's sandbox fails it.
const NEWCOMER_WAIT: Duration = Duration::from_secs(20);

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
            Fault::AccountLimit => {
                // A running sandbox keeps its slot, so the limit bites at a create or a resume:
                // half the time the scope's sandbox is paused first (as its timeout would), and
                // its hosts' next request must resume it past the limit.
                if let Some(id) = self.sandbox.clone()
                    && self.rng.random_bool(0.5)
                    && self
                        .server
                        .admin_retrying(&format!("sandboxes/{id}/pause"), "{}")?
                        == 204
                {
                    self.note(format!("paused {id} before the limit"));
                }
                // The admin GET may meet an injected fault too: a few attempts, else nothing
                // was injected.
                let Some(running) = (0..5)
                    .find_map(|_| self.server.admin_get("limits").ok())
                    .and_then(|limits| limits["running"].as_u64())
                else {
                    return Ok(());
                };
                // At or below what runs now: creates and resumes are refused (E2B's 429) and
                // the hosts wait for a slot (L14) until the limit is lifted.
                let max = self.rng.random_range(0..=running);
                let hold = Duration::from_millis(self.rng.random_range(200..2500));
                // Lifted by the cycle (`lift_limit`) when due, at its end in any case.
                self.limit_until = Some(Instant::now() + hold);
                if self
                    .server
                    .admin_retrying("limits", &format!(r#"{{"maxRunning":{max}}}"#))?
                    != 200
                {
                    self.limit_until = None;
                    return Ok(());
                }
                self.note(format!("maxRunning {max} ({running} running) for {hold:?}"));
            }
            Fault::RestartUnderLimit => {
                let idle = (0..hosts.len()).find(|&i| {
                    let host = &hosts[i];
                    !host.done
                        && !host.killed
                        && host.waiting_since.is_some()
                        && host
                            .script
                            .get(host.next.wrapping_sub(1))
                            .map(String::as_str)
                            == Some(IDLE_PAUSE)
                });
                let Some(i) = idle else {
                    return Ok(());
                };
                self.kill(&mut hosts[i])?;
                if !self.restart_under_limit()? {
                    return Ok(());
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

    /// Lifts the account limit `Fault::AccountLimit` set, if any, when `force` or once its
    /// span is over. An e2b-local restarted meanwhile has no limit: lifting is idempotent.
    /// After an idle host's SIGKILL: the limit at what runs now, and a new session of another
    /// task of the profile (as a restarted gateway's next chat) runs a command; it must not
    /// wait for a slot (L15: the killed host's sandbox is an idle leftover, paused for it).
    /// Whether the fault was injected (nothing runs: nothing to test).
    fn restart_under_limit(&mut self) -> Result<bool, Error> {
        // Other faults would fail the new session for their own reasons.
        self.server.admin_retrying("faults/clear", "{}")?;
        let Some(running) = (0..5)
            .find_map(|_| self.server.admin_get("limits").ok())
            .and_then(|limits| limits["running"].as_u64())
            .filter(|running| *running > 0)
        else {
            return Ok(false);
        };
        self.limit_until = Some(Instant::now() + NEWCOMER_WAIT * 2);
        if self
            .server
            .admin_retrying("limits", &format!(r#"{{"maxRunning":{running}}}"#))?
            != 200
        {
            self.limit_until = None;
            return Ok(false);
        }
        let outcome = self.newcomer();
        self.lift_limit(true)?;
        match outcome {
            Ok(took) => self.note(format!(
                "maxRunning {running}: a new session ran its command in {took:?}"
            )),
            Err(error) => self.violations.push(format!(
                "a new session under the limit ({running} running) after an idle host was \
                 killed did not get a slot (L15): {error}"
            )),
        }
        Ok(true)
    }

    /// The new session: a persistent backend of task [`NEWCOMER_TASK`] on the campaign's
    /// profile, without state hooks (the ledger's files are the scope's), that runs `true`
    /// and cleans up (pausing its sandbox); how long the command took.
    fn newcomer(&self) -> Result<Duration, String> {
        let runtime = tokio::runtime::Runtime::new().map_err(|error| error.to_string())?;
        let mut config = Config::new(ApiKeySource::Key(ApiKey::new(API_KEY.to_owned())));
        config.endpoints = Endpoints::single(self.server.url());
        config.mode = SandboxMode::Persistent;
        config.slot_wait = NEWCOMER_WAIT;
        let scope = Scope {
            profile_home: self.home.clone(),
            task_id: NEWCOMER_TASK.to_owned(),
        };
        let backend = Backend::new(
            config,
            scope,
            Services::new(runtime.handle().clone()),
            Arc::new(NoStateHooks),
        )
        .map_err(|error| ErrorChain(&error).to_string())?;
        let started = Instant::now();
        let ran = backend
            .run(
                "true",
                RunOptions::new(Duration::from_secs(30)),
                Box::new(DiscardSink),
            )
            .map_err(|error| ErrorChain(&error).to_string())
            .and_then(|command| {
                command
                    .wait()
                    .map_err(|error| ErrorChain(&*error).to_string())
            });
        let took = started.elapsed();
        backend.cleanup();
        match ran {
            Ok(exit) if exit.exit_code == 0 => Ok(took),
            Ok(exit) => Err(format!("`true` exited {}", exit.exit_code)),
            Err(error) => Err(error),
        }
    }

    pub(crate) fn lift_limit(&mut self, force: bool) -> Result<(), Error> {
        let Some(until) = self.limit_until else {
            return Ok(());
        };
        if !force && Instant::now() < until {
            return Ok(());
        }
        self.server
            .admin_retrying("limits", r#"{"maxRunning":null}"#)?;
        self.limit_until = None;
        self.note("limit lifted (maxRunning null)".to_owned());
        Ok(())
    }
}
