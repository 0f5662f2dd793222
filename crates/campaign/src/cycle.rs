//! One cycle: edits, host processes with their scripts, the faults at their moments, and the
//! checks after.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use campaign::stateless_command;
use rand::Rng;

use crate::faults::{FAULTS, Fault, signal};
use crate::hosts::{Host, Msg};
use crate::state::Campaign;
use crate::{API_KEY, EPOCH_FILE, Error, TWO_HOST_TERM};

/// Longest wait for one answer of a host process (every operation has its own deadline).
const ANSWER_BOUND: Duration = Duration::from_secs(90);

/// The pause a host idles in when a restart under the limit is drawn: the fault kills it
/// there.
pub(crate) const IDLE_PAUSE: &str = "pause 3000";

/// A fault scheduled in this cycle.
struct Planned {
    fault: Fault,
    at: Instant,
    armed: bool,
}

impl Campaign {
    pub(crate) fn cycle(&mut self, cycle: u64) -> Result<(), Error> {
        let result = self.cycle_inner(cycle);
        if result.is_err() {
            // The campaign stops at an error; the account limit goes with the cycle anyway.
            let _ = self.lift_limit(true);
        }
        result
    }

    fn cycle_inner(&mut self, cycle: u64) -> Result<(), Error> {
        self.previous_trace = std::mem::take(&mut self.trace);
        self.cycle_start = Instant::now();
        self.edit(cycle)?;
        let epoch = format!("epoch {cycle}");
        let _ = std::fs::remove_file(&self.push_log);
        let processes = if self.rng.random_bool(0.4) { 2 } else { 1 };
        // The faults are drawn before the scripts in the two-host mode, so a cycle with a
        // stopped writer gives the other host commands past the term.
        let faults = match self.rng.random_range(0..10) {
            0..=1 => 0,
            2..=6 => 1,
            _ => 2,
        };
        let mut drawn = Vec::new();
        for _ in 0..faults {
            let fault = if self.hosts == 2 && self.rng.random_bool(0.3) {
                Fault::StopWriter
            } else {
                FAULTS[self.rng.random_range(0..FAULTS.len())]
            };
            drawn.push((fault, Duration::from_millis(self.rng.random_range(0..600))));
        }
        let stops = drawn.iter().any(|(f, _)| *f == Fault::StopWriter);
        // The restart under the limit kills the scope's only session while it is idle.
        let restart = self.hosts == 1 && drawn.iter().any(|(f, _)| *f == Fault::RestartUnderLimit);
        let processes = if stops {
            2
        } else if restart {
            1
        } else {
            processes
        };
        let (tx, rx): (Sender<Msg>, Receiver<Msg>) = channel();
        let mut hosts = Vec::new();
        self.machine_pids.clear();
        for index in 0..processes {
            let mut script = vec!["attach".to_owned()];
            // The epoch lives under skills/, which Hermes pushes too (`iter_sync_files`), so
            // "no command without this cycle's state" holds unchanged for Hermes hosts. Hermes
            // never pushes memories/ (the sandbox may lack the host's): no command reads them.
            for _ in 0..self.rng.random_range(1..=3) {
                let pause = self.rng.random_range(0..30);
                script.push(format!(
                    "run cat ~/.hermes/{EPOCH_FILE} 2>/dev/null || echo NOSTATE; sleep 0.{pause:02}"
                ));
            }
            if stops {
                // Commands spaced past the term: the host that is not stopped asks again.
                let span = TWO_HOST_TERM.as_millis() as u64 + 2000;
                for _ in 0..(span / 500) {
                    script.push("pause 500".to_owned());
                    script.push(format!(
                        "run cat ~/.hermes/{EPOCH_FILE} 2>/dev/null || echo NOSTATE"
                    ));
                }
            }
            if restart {
                // The idle moment the fault is armed by (the host waits between commands).
                script.push(IDLE_PAUSE.to_owned());
            }
            script.push("cleanup".to_owned());
            script.push("quit".to_owned());
            // Two processes in the two-host mode: one per machine when a stop is drawn,
            // else either machine (the same one exercises its host lock).
            let machine = match (self.hosts, stops) {
                (1, _) => 0,
                (_, true) => index,
                (_, false) => self.rng.random_range(0..2),
            };
            // Drawn only when Hermes hosts are on, so a seed's schedule without them is as before.
            let hermes = self.hermes_python.is_some() && self.rng.random_bool(self.hermes_share);
            let mut host = self.spawn_host(index, machine, hermes, script, tx.clone())?;
            if index == 0 {
                self.draw_step(&mut host, processes);
            }
            self.processes += 1;
            self.hermes_processes += u64::from(hermes);
            self.machine_pids.push((host.pid.to_string(), machine));
            self.note(format!(
                "host {index} is pid {} on machine {machine}{}",
                host.pid,
                if hermes { " (Hermes)" } else { "" }
            ));
            hosts.push(host);
        }
        drop(tx);
        // The faults' moments count from when every host can act: a Hermes host first spends
        // seconds starting Hermes, and faults drawn for its first 600 ms would all land before
        // it did anything.
        for host in &mut hosts {
            if let Some(ready) = host.ready.take() {
                let _ = ready.recv_timeout(ANSWER_BOUND);
            }
        }
        if hosts.iter().any(|h| h.hermes) {
            self.note("Hermes hosts started".to_owned());
        }
        let start = Instant::now();
        let mut planned = Vec::new();
        for (fault, delay) in drawn {
            let armed = !matches!(
                fault,
                Fault::KillHostAtPush | Fault::KillHostAtPull | Fault::RestartUnderLimit
            );
            planned.push(Planned {
                fault,
                at: start + delay,
                armed,
            });
        }
        for index in 0..hosts.len() {
            self.send_next(&mut hosts, index)?;
        }
        let mut open = hosts.len();
        while open > 0 {
            let holding = self.poll_hold(&mut hosts)?;
            let now = Instant::now();
            self.resume_due(&hosts, now)?;
            self.lift_limit(false)?;
            self.observe_generations();
            // Due faults first.
            let mut i = 0;
            while i < planned.len() {
                if planned[i].armed && planned[i].at <= now {
                    let fault = planned.remove(i).fault;
                    self.inject(fault, &mut hosts)?;
                } else {
                    i += 1;
                }
            }
            for (index, host) in hosts.iter_mut().enumerate() {
                if let Some(since) = host.waiting_since
                    && since.elapsed() > ANSWER_BOUND
                {
                    self.violations.push(format!(
                        "host process {index} gave no answer to {:?} within {ANSWER_BOUND:?}",
                        host.script[host.next - 1]
                    ));
                    self.kill(host)?;
                }
            }
            let wait = planned
                .iter()
                .filter(|p| p.armed)
                .map(|p| p.at)
                .chain(self.stopped.iter().map(|(at, _)| *at))
                .chain(self.limit_until)
                .map(|at| at.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(1))
                .min(if holding {
                    // A request held at e2b-local is looked for often: it stops its host.
                    Duration::from_millis(5)
                } else {
                    Duration::from_secs(1)
                })
                .max(Duration::from_millis(1));
            match rx.recv_timeout(wait) {
                Ok(Msg::Line(index, line)) => {
                    self.note(format!("host {index} (pid {}): {line}", hosts[index].pid));
                    if line.contains(API_KEY) {
                        self.violations
                            .push(format!("the API key appeared in a host answer: {line:?}"));
                    }
                    if let Some(phase) = line.strip_prefix("phase ") {
                        let wanted = if phase == "push" {
                            Fault::KillHostAtPush
                        } else {
                            Fault::KillHostAtPull
                        };
                        if let Some(at) = planned.iter().position(|p| p.fault == wanted && !p.armed)
                        {
                            // Kill the host that announced the transfer, a moment into it.
                            planned.remove(at);
                            std::thread::sleep(Duration::from_millis(self.rng.random_range(0..8)));
                            if !hosts[index].killed && !hosts[index].done {
                                self.kill(&mut hosts[index])?;
                                self.count(wanted);
                            }
                        }
                        continue;
                    }
                    let op = hosts[index]
                        .script
                        .get(hosts[index].next.saturating_sub(1))
                        .cloned()
                        .unwrap_or_default();
                    if !self.step_answer(&op, &line)? {
                        self.answer(&line, &epoch, hosts[index].hermes);
                    }
                    if !hosts[index].killed {
                        self.send_next(&mut hosts, index)?;
                        let sent = hosts[index].script.get(hosts[index].next.saturating_sub(1));
                        if sent.is_some_and(|op| op == IDLE_PAUSE)
                            && let Some(due) = planned
                                .iter_mut()
                                .find(|p| p.fault == Fault::RestartUnderLimit && !p.armed)
                        {
                            // A moment into the pause: its last command's end is on record.
                            due.armed = true;
                            due.at = Instant::now() + Duration::from_millis(200);
                        }
                    }
                }
                Ok(Msg::Eof(index)) => {
                    let host = &mut hosts[index];
                    if !host.killed {
                        let status = host.child.wait()?;
                        if !status.success() || host.next < host.script.len() {
                            let log = std::fs::read_to_string(
                                self.root.join("logs").join(format!("host-{index}.err")),
                            )
                            .unwrap_or_default();
                            self.violations.push(format!(
                                "host process {index} exited on its own ({status}) after {:?}: {}",
                                host.script.get(host.next.saturating_sub(1)),
                                log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                            ));
                        }
                    }
                    host.done = true;
                    host.waiting_since = None;
                    open -= 1;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Phase kills that never met their phase are not counted.
        self.stopped.clear();
        // Before the recovery host and the checks: they run without the limit.
        self.lift_limit(true)?;
        self.server.admin_retrying("faults/clear", "{}")?;
        self.recover_and_check_adoption()?;
        self.check()?;
        Ok(())
    }

    /// Sends host `index` its next line, arming a checkpoint step's fault first.
    fn send_next(&mut self, hosts: &mut [Host], index: usize) -> Result<(), Error> {
        let line = hosts[index].script.get(hosts[index].next).cloned();
        self.before_send(index, line.as_deref())?;
        hosts[index].send_next();
        Ok(())
    }

    fn answer(&mut self, line: &str, epoch: &str, hermes: bool) {
        if let Some(rest) = line.strip_prefix("attached ") {
            if let Some(id) = rest.split(' ').next() {
                self.sandbox = Some(id.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("exit ") {
            self.commands_ok += 1;
            self.hermes_commands_ok += u64::from(hermes);
            let output = rest
                .split_once(' ')
                .map_or("", |(_, out)| out)
                .replace("\\n", "\n");
            if let Some(problem) = stateless_command(&output, epoch) {
                self.violations.push(problem);
            }
        } else if line.starts_with("error ") {
            self.commands_failed += 1;
            self.hermes_commands_failed += u64::from(hermes);
            if line.contains("no longer the writer") {
                self.fenced += 1;
            }
        }
    }

    /// SIGCONT to stopped processes whose time has come.
    fn resume_due(&mut self, hosts: &[Host], now: Instant) -> Result<(), Error> {
        let (due, later): (Vec<_>, Vec<_>) = self.stopped.drain(..).partition(|(at, _)| *at <= now);
        self.stopped = later;
        for (_, i) in due {
            if !hosts[i].killed && !hosts[i].done {
                signal(hosts[i].pid, "CONT")?;
                self.note(format!("host {i} continued"));
            }
        }
        Ok(())
    }
}
