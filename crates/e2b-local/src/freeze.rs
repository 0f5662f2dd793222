//! Freezing a sandbox's processes for a pause that keeps its memory, as E2B's VM pause
//! freezes them, and thawing them on resume.
//!
//! A freeze sends SIGSTOP to every process of the sandbox that is not stopped already,
//! parents before their children, one generation at a time, waiting until each one is
//! stopped (`T` in `/proc/<pid>/stat`) before stopping the next; then it looks again, for
//! processes forked before their parent stopped, until a look finds nothing new. A thaw
//! sends SIGCONT to exactly the processes the freeze stopped, children before their
//! parents. So a shell with job control never sees its foreground job stop: it is stopped
//! itself first and continued last, when its job runs again (it then learns at most that
//! the job was continued), and keeps the job in the foreground. A process the sandbox had stopped itself stays stopped, as it would across
//! E2B's pause. A process is known by its pid and its start time, so a pid reused
//! meanwhile is never signalled.
//!
//! Which processes belong to the sandbox is the caller's answer (see
//! [`crate::process_table::ProcessTable`]); this module only signals and waits.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Looks for processes forked while the freeze ran at most this many times.
const ROUNDS: usize = 32;

/// How long a freeze waits for one round's processes to stop (one in uninterruptible
/// sleep stops only once it leaves it).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// What `/proc/<pid>/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// The state letter (`R`, `S`, `D`, `T`, `t`, `Z`, ...).
    pub(crate) state: char,
    pub(crate) ppid: u32,
    /// The process group.
    pub(crate) pgrp: u32,
    /// Start time after boot, in clock ticks: with the pid, names one process.
    pub(crate) start: u64,
}

impl ProcStat {
    /// Reads `/proc/<pid>/stat`; `None` once the process is gone.
    pub(crate) fn of(pid: u32) -> Option<ProcStat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        ProcStat::parse(&text)
    }

    /// The command name may hold spaces and parentheses: the fields start after the last
    /// `)`.
    fn parse(text: &str) -> Option<ProcStat> {
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        Some(ProcStat {
            state: fields.first()?.chars().next()?,
            ppid: fields.get(1)?.parse().ok()?,
            pgrp: fields.get(2)?.parse().ok()?,
            start: fields.get(19)?.parse().ok()?,
        })
    }

    /// Stopped (by a signal or a tracer) or dead: nothing to freeze.
    fn is_still(&self) -> bool {
        matches!(self.state, 'T' | 't' | 'Z' | 'X' | 'x')
    }
}

/// Every process on the host: `(pid, stat)`.
pub(crate) fn all_processes() -> Vec<(u32, ProcStat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, ProcStat::of(pid)?)))
        .collect()
}

/// One process a freeze stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stopped {
    pid: u32,
    start: u64,
}

/// The processes one freeze stopped, continued by [`Frozen::thaw`].
#[derive(Debug, Default)]
pub(crate) struct Frozen {
    stopped: Vec<Stopped>,
}

impl Frozen {
    /// Stops every process `members` names (asked again after each round), but the server
    /// itself and pids 0 and 1, and returns those it stopped.
    pub(crate) fn freeze(mut members: impl FnMut() -> Vec<u32>) -> Frozen {
        let me = std::process::id();
        let mut seen = HashSet::new();
        let mut frozen = Frozen::default();
        for _ in 0..ROUNDS {
            let found: Vec<(u32, ProcStat)> = members()
                .into_iter()
                .filter(|pid| *pid > 1 && *pid != me && seen.insert(*pid))
                .filter_map(|pid| Some((pid, ProcStat::of(pid)?)))
                .filter(|(_, stat)| !stat.is_still())
                .collect();
            if found.is_empty() {
                return frozen;
            }
            let parent: HashMap<u32, u32> = found.iter().map(|(pid, s)| (*pid, s.ppid)).collect();
            let mut by_depth: Vec<(usize, u32, u64)> = found
                .iter()
                .map(|(pid, stat)| (depth(&parent, *pid), *pid, stat.start))
                .collect();
            by_depth.sort_unstable();
            for generation in by_depth.chunk_by(|a, b| a.0 == b.0) {
                let stopped: Vec<Stopped> = generation
                    .iter()
                    .filter(|(_, pid, _)| signal(*pid, libc::SIGSTOP))
                    .map(|&(_, pid, start)| Stopped { pid, start })
                    .collect();
                wait_stopped(&stopped);
                frozen.stopped.extend(stopped);
            }
        }
        tracing::warn!(
            stopped = frozen.stopped.len(),
            "processes kept forking while the sandbox was being frozen; some may still run"
        );
        frozen
    }

    /// How many processes it stopped.
    pub(crate) fn len(&self) -> usize {
        self.stopped.len()
    }

    /// Takes over what another freeze stopped (continued by this one's thaw).
    pub(crate) fn merge(&mut self, other: Frozen) {
        self.stopped.extend(other.stopped);
    }

    /// Continues every process it stopped that still exists, children before parents.
    pub(crate) fn thaw(self) {
        let alive: Vec<(Stopped, u32)> = self
            .stopped
            .into_iter()
            .filter_map(|stopped| {
                let stat = ProcStat::of(stopped.pid)?;
                (stat.start == stopped.start).then_some((stopped, stat.ppid))
            })
            .collect();
        let parent: HashMap<u32, u32> = alive.iter().map(|(s, ppid)| (s.pid, *ppid)).collect();
        let mut order: Vec<(usize, u32)> = alive
            .iter()
            .map(|(s, _)| (depth(&parent, s.pid), s.pid))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        for (_, pid) in order {
            signal(pid, libc::SIGCONT);
        }
    }
}

/// How many ancestors of `pid` are among `parent`'s keys (a map of pid to parent pid).
fn depth(parent: &HashMap<u32, u32>, mut pid: u32) -> usize {
    let mut depth = 0usize;
    while let Some(&up) = parent.get(&pid) {
        if !parent.contains_key(&up) || depth > parent.len() {
            break;
        }
        depth += 1;
        pid = up;
    }
    depth
}

/// Sends `signal` to `pid`; false when it could not be sent.
fn signal(pid: u32, signal: libc::c_int) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Waits (bounded) until every process of `stopped` is stopped or gone, so that none of
/// them forks once this returns.
fn wait_stopped(stopped: &[Stopped]) {
    let deadline = Instant::now() + STOP_WAIT;
    let mut waiting: Vec<u32> = stopped.iter().map(|s| s.pid).collect();
    loop {
        waiting.retain(|pid| ProcStat::of(*pid).is_some_and(|stat| !stat.is_still()));
        if waiting.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(pids = ?waiting, "processes did not stop in time");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_after_the_last_parenthesis() {
        let line =
            "4242 (a (b) c) T 17 4242 17 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(
            ProcStat::parse(line),
            Some(ProcStat {
                state: 'T',
                ppid: 17,
                pgrp: 4242,
                start: 123_456,
            })
        );
        assert_eq!(ProcStat::parse("garbage"), None);
    }

    #[test]
    fn a_freeze_stops_and_a_thaw_continues_only_what_it_stopped() {
        // contract: L18 (frozen processes go on after the resume; ones the sandbox
        // stopped itself stay stopped)
        let mut running = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut stopped_before = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (a, b) = (running.id(), stopped_before.id());
        assert!(signal(b, libc::SIGSTOP));
        wait_stopped(&[Stopped {
            pid: b,
            start: ProcStat::of(b).unwrap().start,
        }]);
        let state = |pid| ProcStat::of(pid).unwrap().state;
        assert_eq!(state(b), 'T');

        let frozen = Frozen::freeze(|| vec![a, b, 0, 1, std::process::id()]);
        assert_eq!(frozen.len(), 1, "only the running one was stopped");
        assert_eq!(state(a), 'T');
        frozen.thaw();
        let deadline = Instant::now() + Duration::from_secs(5);
        while state(a) == 'T' {
            assert!(
                Instant::now() < deadline,
                "the thawed process stays stopped"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            state(b),
            'T',
            "a process stopped before the freeze stays stopped"
        );
        for child in [&mut running, &mut stopped_before] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
