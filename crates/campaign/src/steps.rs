//! The checkpoint steps of a cycle (checkpoint, rollback, fork and adopt), the faults inside
//! them, and the invariants they add: exactly one adoptable sandbox of the scope after a
//! recovery bring-up, and no Hermes state version lost across a rollback.
//!
//! The steps and their faults are drawn from a generator of their own (seeded from the
//! campaign's seed), so the schedule of everything else stays what it was for a seed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_sandbox::{ApiKey, ApiKeySource, Config};
use rand::Rng;
use sandbox_identity::{
    Adoption, BRANCH_KEY, Candidate, Mode, RESTORED_FROM_KEY, SUPERSEDES_KEY, ScopeIdentity,
};

use campaign::Side;

use crate::checks::contents;
use crate::edits::owned_like;
use crate::hosts::Host;
use crate::state::Campaign;
use crate::step_plan::{Step, StepFault, StepPlan};
use crate::{EPOCH_FILE, Error, FILES, QUIESCE_WAIT, TASK};

/// How often a step carries a fault of its own.
const STEP_FAULT_SHARE: f64 = 0.6;
/// Longest wait for the recovery host's bring-up.
const RECOVERY_BOUND: Duration = Duration::from_secs(90);

impl Campaign {
    /// Draws this cycle's step for host 0 (one host, a Rust host), inserting its lines into
    /// the host's script before the cleanup.
    pub(crate) fn draw_step(&mut self, host: &mut Host, processes: usize) {
        self.step = None;
        // One process of one machine: it is the writer, so its steps are carried out (a
        // reader's are refused, R1), and a request held at e2b-local is always its own.
        if self.hosts != 1
            || processes != 1
            || host.hermes
            || !self.steps_rng.random_bool(self.step_share)
        {
            return;
        }
        let epoch = format!("run cat ~/.hermes/{EPOCH_FILE} 2>/dev/null || echo NOSTATE");
        let step = match self.steps_rng.random_range(0..10) {
            0..=2 => Step::Checkpoint,
            3..=6 => Step::Rollback,
            _ => {
                let count = self.steps_rng.random_range(1..=3);
                Step::ForkAdopt {
                    count,
                    branch: self.steps_rng.random_range(0..count),
                }
            }
        };
        let lines: Vec<String> = match step {
            Step::Checkpoint => vec!["checkpoint".to_owned(), epoch.clone()],
            Step::Rollback => vec![
                "checkpoint".to_owned(),
                epoch.clone(),
                "rollback".to_owned(),
                epoch.clone(),
                "prune 2".to_owned(),
            ],
            Step::ForkAdopt { .. } => {
                vec![step.faulted_line(), epoch.clone(), "prune 2".to_owned()]
            }
        };
        let at = host
            .script
            .iter()
            .position(|line| line == "cleanup")
            .unwrap_or(host.script.len());
        host.script.splice(at..at, lines);
        let fault = if self.steps_rng.random_bool(STEP_FAULT_SHARE) {
            let holds = !matches!(step, Step::Checkpoint);
            match (self.steps_rng.random_range(0..3), step) {
                (0, Step::ForkAdopt { .. }) if holds => Some(StepFault::VanishMidFork {
                    skip: self.steps_rng.random_range(0..14),
                    parent: self.steps_rng.random_bool(0.5),
                }),
                (0 | 1, _) if holds => Some(StepFault::KillBetweenRequests {
                    skip: self.steps_rng.random_range(0..16),
                }),
                _ => Some(StepFault::SnapshotError {
                    status: [500, 502, 503][self.steps_rng.random_range(0..3)],
                    count: self.steps_rng.random_range(1..=3),
                }),
            }
        } else {
            None
        };
        self.note(format!("step: {} (fault: {fault:?})", step.name()));
        self.step = Some(StepPlan {
            step,
            fault,
            holding: false,
            before: None,
            agent_version: None,
        });
    }

    /// Called before a host is sent its next line: arms the step's fault when that line is
    /// the faulted one, and records the state versions before a rollback or an adoption.
    pub(crate) fn before_send(&mut self, index: usize, line: Option<&str>) -> Result<(), Error> {
        let Some(line) = line else { return Ok(()) };
        let Some(plan) = &self.step else {
            return Ok(());
        };
        if index != 0 || line != plan.step.faulted_line() {
            return Ok(());
        }
        let step = plan.step;
        if !matches!(step, Step::Checkpoint) {
            self.agent_writes_before_replacing()?;
            let mut before = HashSet::new();
            contents(&self.home.join("skills"), &mut before);
            contents(&self.home.join("memories"), &mut before);
            if let Some(id) = &self.sandbox {
                let remote = self.server.sandbox_hermes_home(id);
                contents(&remote.join("skills"), &mut before);
                contents(&remote.join("memories"), &mut before);
            }
            if let Some(plan) = self.step.as_mut() {
                plan.before = Some(before);
            }
        }
        let fault = self.step.as_ref().and_then(|plan| plan.fault);
        match fault {
            Some(StepFault::SnapshotError { status, count }) => {
                let Some(id) = self.sandbox.clone() else {
                    return Ok(());
                };
                self.server.admin_retrying(
                    "faults/fail",
                    &format!(
                        r#"{{"count":{count},"status":{status},"scope":"rest","pathPrefix":"/sandboxes/{id}/snapshots"}}"#
                    ),
                )?;
                self.count_step_fault(StepFault::SnapshotError { status, count });
            }
            Some(
                StepFault::KillBetweenRequests { skip } | StepFault::VanishMidFork { skip, .. },
            ) => {
                self.server
                    .admin_retrying("faults/hold", &format!(r#"{{"skip":{skip}}}"#))?;
                if let Some(plan) = self.step.as_mut() {
                    plan.holding = true;
                }
            }
            None => {}
        }
        Ok(())
    }

    /// The agent changes a memory or a skill in the sandbox just before the rollback or
    /// adoption, so the replaced sandbox holds a version the host does not have yet: what
    /// the recovery before retiring it must bring back (R8).
    fn agent_writes_before_replacing(&mut self) -> Result<(), Error> {
        let Some(id) = self.sandbox.clone() else {
            return Ok(());
        };
        let remote = self.server.sandbox_hermes_home(&id);
        if !remote.is_dir() {
            return Ok(());
        }
        // The cycle's faults are live (a dropped connection may meet these requests too).
        if !(0..5).any(|_| self.server.quiesce(QUIESCE_WAIT).is_ok()) {
            self.note("no sandbox edit before the step: e2b-local did not quiesce".to_owned());
            return Ok(());
        }
        // A sandbox a fault made vanish leaves its directory behind: an edit there would be
        // a version no sandbox holds. The host has replaced it with one the campaign does
        // not know yet, so this cycle's step goes without the edit (as when the list itself
        // meets one of the cycle's faults).
        let live = self.live_sandboxes();
        if !live.is_ok_and(|live| live.iter().any(|candidate| candidate.sandbox_id == id)) {
            self.note(format!(
                "no sandbox edit before the step: {id} is gone or unlisted"
            ));
            return Ok(());
        }
        // Drawn from the steps' generator: the main one's schedule stays as without steps.
        std::mem::swap(&mut self.rng, &mut self.steps_rng);
        let rel = FILES[self.rng.random_range(0..FILES.len())];
        let edited = self.edit_file(Side::Sandbox, self.cycle_no, rel, &remote.join(rel));
        std::mem::swap(&mut self.rng, &mut self.steps_rng);
        let described = edited?;
        owned_like(&remote, rel)?;
        let version = std::fs::read(remote.join(rel))?;
        if let Some(plan) = self.step.as_mut() {
            plan.agent_version = Some(version);
        }
        self.note(format!("sandbox {id} before the step: {described}"));
        Ok(())
    }

    /// While a hold is armed: once e2b-local holds a request, kill the host or make a
    /// sandbox vanish, then let the request go on. Returns whether a hold is still pending.
    pub(crate) fn poll_hold(&mut self, hosts: &mut [Host]) -> Result<bool, Error> {
        let Some(plan) = &self.step else {
            return Ok(false);
        };
        if !plan.holding {
            return Ok(false);
        }
        let Some(fault) = plan.fault else {
            return Ok(false);
        };
        // The cycle's faults are live: a dropped connection may meet this request too.
        let Some(status) = (0..5).find_map(|_| self.server.admin_get("faults/hold").ok()) else {
            return Err("e2b-local does not answer GET /_e2b_local/faults/hold".into());
        };
        let Some(held) = status["held"].as_str().map(str::to_owned) else {
            return Ok(true);
        };
        if let Some(plan) = self.step.as_mut() {
            plan.holding = false;
        }
        match fault {
            StepFault::KillBetweenRequests { skip } => {
                self.note(format!("held request {} (after {skip})", held));
                self.kill(&mut hosts[0])?;
                self.server
                    .admin_retrying("faults/release", r#"{"answer":"fail"}"#)?;
            }
            StepFault::VanishMidFork { skip, parent } => {
                self.note(format!("held request {} (after {skip})", held));
                let target = if parent {
                    self.sandbox.clone()
                } else {
                    self.live_sandboxes()?
                        .into_iter()
                        .find(|c| c.metadata.contains_key(BRANCH_KEY))
                        .map(|c| c.sandbox_id)
                };
                if let Some(id) = target {
                    self.vanish(&id)?;
                    self.note(format!("vanished {id}"));
                } else {
                    self.note("no branch yet to vanish".to_owned());
                }
                self.server
                    .admin_retrying("faults/release", r#"{"answer":"continue"}"#)?;
            }
            StepFault::SnapshotError { .. } => return Ok(false),
        }
        self.count_step_fault(fault);
        Ok(false)
    }

    /// Makes `id` vanish; what lived only there may be lost with it.
    pub(crate) fn vanish(&mut self, id: &str) -> Result<bool, Error> {
        let mut inside = HashSet::new();
        let remote = self.server.sandbox_hermes_home(id);
        contents(&remote.join("skills"), &mut inside);
        contents(&remote.join("memories"), &mut inside);
        for content in &inside {
            self.ledger.vanished(content);
        }
        Ok(self
            .server
            .admin_retrying(&format!("sandboxes/{id}/vanish"), "{}")?
            == 204)
    }

    fn count_step_fault(&mut self, fault: StepFault) {
        self.note(format!("fault: {}", fault.kind()));
        *self.step_stats.faults.entry(fault.kind()).or_default() += 1;
    }

    /// A step's answer (`op` is the line it answers): counts it, follows the scope's new
    /// sandbox, and after a rollback or an adoption checks that no Hermes state version
    /// the host or the replaced sandbox held was lost.
    pub(crate) fn step_answer(&mut self, op: &str, line: &str) -> Result<bool, Error> {
        let verb = op.split(' ').next().unwrap_or("");
        let kind = match verb {
            "checkpoint" => "checkpoint",
            "rollback" => "rollback",
            "fork-adopt" => "fork-adopt",
            "prune" => "prune",
            _ => return Ok(false),
        };
        let ok = !line.starts_with("error ");
        let entry = self.step_stats.done.entry(kind).or_default();
        if ok {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
        // The hold of a step that ended before reaching it is disarmed.
        if let Some(plan) = self.step.as_mut()
            && plan.holding
            && op == plan.step.faulted_line()
        {
            plan.holding = false;
            self.server
                .admin_retrying("faults/release", r#"{"answer":"continue"}"#)?;
        }
        // A step that failed leaves the session going on: campaign-host pushes every host
        // file before each command (Hermes pushes only what changed on the host), so the
        // agent's write made just before it is overwritten by the next push unless a
        // recovery ran first. That version may go, as one the user overwrote.
        if !ok
            && let Some(plan) = self.step.as_mut()
            && op == plan.step.faulted_line()
            && let Some(version) = plan.agent_version.take()
        {
            self.ledger.overwrite(&version);
        }
        let replaced = line
            .strip_prefix("rolledback ")
            .or_else(|| line.strip_prefix("adopted "));
        if let Some(rest) = replaced {
            if let Some(id) = rest.split(' ').next() {
                self.sandbox = Some(id.to_owned());
            }
            self.check_rollback_kept_state()?;
        }
        Ok(true)
    }

    /// "No Hermes state version lost across a rollback": every version the ledger knows that
    /// was on the host or in the replaced sandbox just before is, right after, on the host,
    /// in the new sandbox or in quarantine (unless the user overwrote it or it vanished).
    fn check_rollback_kept_state(&mut self) -> Result<(), Error> {
        let Some(before) = self.step.as_mut().and_then(|plan| plan.before.take()) else {
            return Ok(());
        };
        self.step_stats.rollbacks_checked += 1;
        let mut found = HashSet::new();
        contents(&self.home.join("skills"), &mut found);
        contents(&self.home.join("memories"), &mut found);
        contents(&self.home.join("cache").join("e2b-recovered"), &mut found);
        if let Some(id) = &self.sandbox {
            let remote = self.server.sandbox_hermes_home(id);
            contents(&remote.join("skills"), &mut found);
            contents(&remote.join("memories"), &mut found);
        }
        let lost: Vec<Vec<u8>> = self
            .ledger
            .lost(&found)
            .into_iter()
            .filter(|content| before.contains(*content))
            .map(<[u8]>::to_vec)
            .collect();
        for content in lost {
            let violation = format!(
                "a Hermes state version was lost across a rollback ({} bytes): {:?}",
                content.len(),
                String::from_utf8_lossy(&content)
            );
            self.note(format!("violation: {violation}"));
            self.violations.push(violation);
            self.ledger.reported(&content);
        }
        Ok(())
    }

    /// After a cycle with a step: a fresh host's bring-up (attach, cleanup), then "exactly
    /// one adoptable sandbox of the scope": the adoption rule over the live sandboxes picks
    /// the one that host attached to, with no duplicate, and no superseded sandbox is left.
    pub(crate) fn recover_and_check_adoption(&mut self) -> Result<(), Error> {
        if self.step.take().is_none() {
            return Ok(());
        }
        self.step_stats.recoveries += 1;
        let attached = self.recovery_host()?;
        let Some(attached) = attached else {
            return Ok(());
        };
        self.sandbox = Some(attached.clone());
        let candidates = self.live_sandboxes()?;
        let identity = self.identity();
        let superseded = sandbox_identity::superseded(&identity, &candidates);
        if !superseded.is_empty() {
            let ids: Vec<&str> = superseded.iter().map(|c| c.sandbox_id.as_str()).collect();
            self.violations.push(format!(
                "after recovery, superseded sandboxes are still alive: {ids:?}"
            ));
        }
        match sandbox_identity::choose(&identity, &candidates) {
            Adoption::Adopt {
                candidate,
                duplicates,
                ..
            } => {
                // Plain sandboxes of the template (no checkpoint key) beside the chosen one
                // are duplicate creates, which I5 tolerates with a warning (a create whose
                // answer was lost around an e2b-local restart); only a duplicate that a
                // checkpoint step made (a branch, a restored or replacing sandbox) breaks
                // "exactly one adoptable sandbox".
                let plain_duplicates = candidates
                    .iter()
                    .filter(|c| c.sandbox_id != candidate.sandbox_id)
                    .filter(|c| sandbox_identity::check(&identity, c).is_ok())
                    .filter(|c| {
                        [BRANCH_KEY, SUPERSEDES_KEY, RESTORED_FROM_KEY]
                            .iter()
                            .all(|k| !c.metadata.contains_key(*k))
                    })
                    .count();
                if duplicates > 0 && duplicates <= plain_duplicates {
                    self.step_stats.tolerated_duplicates += 1;
                } else if duplicates > 0 {
                    // Each live sandbox with the keys that decide adoption, to tell a
                    // left-over branch from a duplicate create.
                    let live: Vec<String> = candidates
                        .iter()
                        .map(|c| {
                            let keys: Vec<String> = [BRANCH_KEY, SUPERSEDES_KEY, RESTORED_FROM_KEY]
                                .iter()
                                .filter_map(|k| c.metadata.get(*k).map(|v| format!("{k}={v}")))
                                .collect();
                            format!("{} {:?} [{}]", c.sandbox_id, c.state, keys.join(" "))
                        })
                        .collect();
                    self.violations.push(format!(
                        "after recovery, {} adoptable sandboxes for the scope (chosen {}); live: {}",
                        duplicates + 1,
                        candidate.sandbox_id,
                        live.join("; ")
                    ));
                }
                if candidate.sandbox_id != attached {
                    self.violations.push(format!(
                        "after recovery, adoption picks {} but the bring-up attached {attached}",
                        candidate.sandbox_id
                    ));
                }
            }
            other => self.violations.push(format!(
                "after recovery, no adoptable sandbox for the scope ({other:?}); the bring-up \
                 attached {attached}"
            )),
        }
        Ok(())
    }

    /// Runs one `campaign-host` to attach and clean up, without faults; the sandbox it
    /// attached to (a violation when it could not).
    fn recovery_host(&mut self) -> Result<Option<String>, Error> {
        let stderr = std::fs::File::create(self.root.join("logs").join("host-recovery.err"))?;
        let mut command = std::process::Command::new(&self.host_bin);
        command
            .arg(self.server.url())
            .arg(&self.home)
            .arg(TASK)
            .arg(&self.push_log);
        let mut child = self
            .watched(&mut command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        writeln!(stdin, "attach\ncleanup\nquit")?;
        drop(stdin);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lines: Vec<String> = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect();
            let _ = tx.send(lines);
        });
        let started = Instant::now();
        let lines = match rx.recv_timeout(RECOVERY_BOUND) {
            Ok(lines) => lines,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                self.violations.push(format!(
                    "the recovery bring-up gave no answer within {RECOVERY_BOUND:?}"
                ));
                return Ok(None);
            }
        };
        let status = child.wait()?;
        for line in &lines {
            self.note(format!("recovery host: {line}"));
        }
        self.note(format!("recovery host done in {:?}", started.elapsed()));
        let attached = lines
            .iter()
            .find_map(|line| line.strip_prefix("attached "))
            .and_then(|rest| rest.split(' ').next())
            .map(str::to_owned);
        if attached.is_none() || !status.success() {
            self.violations.push(format!(
                "the recovery bring-up failed ({status}): {}",
                lines.join(" | ")
            ));
        }
        Ok(attached)
    }

    /// The scope as every campaign host's `Backend` computes it (`Config::new`'s defaults).
    fn identity(&self) -> ScopeIdentity {
        let config = Config::new(ApiKeySource::Key(ApiKey::new(crate::API_KEY.to_owned())));
        ScopeIdentity {
            profile_home: self.home.to_string_lossy().into_owned(),
            task_id: TASK.to_owned(),
            template: config.template,
            mode: Mode::Persistent,
            internet: config.internet,
            security: config.security,
        }
    }

    /// Every running or paused sandbox at e2b-local, as adoption candidates.
    pub(crate) fn live_sandboxes(&self) -> Result<Vec<Candidate>, Error> {
        self.server.live_sandboxes()
    }
}
