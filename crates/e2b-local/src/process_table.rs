//! The processes of each sandbox: spawning under the table lock, pumping output to
//! subscribers with backpressure, retaining finished processes for late `Connect`
//! calls, freezing everything a sandbox started when it pauses with its memory (and
//! thawing it on resume), and killing everything when it dies or pauses without memory.
//!
//! Below both the store (which owns one table per sandbox) and the envd Process RPCs
//! (which serve it): it knows nothing of HTTP or the Connect wire format. A table
//! also holds the sandbox's namespaces ([`SandboxNs`]) while it has any. One table is one
//! boot of the sandbox: it carries the boot id its commands read, kept across a freeze,
//! new with the next table.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::egress::LivePolicy;
use crate::freeze::{Frozen, all_processes};
use crate::pty::PtyMaster;
use crate::sandbox_ns::{self, NsPlan, SandboxNs};

mod supervise;
use supervise::supervise;

/// Largest chunk of output in one `data` event (envd reads 32 KiB at a time).
pub(crate) const CHUNK: usize = 32 * 1024;

/// Largest chunk of terminal output in one `data` event (envd reads 16 KiB at a time).
const PTY_CHUNK: usize = 16 * 1024;

/// Finished processes kept per sandbox for late `Connect` calls.
const RETAINED: usize = 256;

/// After the main process exited, output still arriving this quickly is forwarded;
/// a pipe held open longer by a background child is abandoned.
const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// Events per subscriber buffered before the producer waits (backpressure).
const SUBSCRIBER_BUFFER: usize = 8;

/// The final state of a process, as envd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndInfo {
    pub(crate) exit_code: i32,
    pub(crate) exited: bool,
    pub(crate) status: String,
    pub(crate) error: Option<String>,
}

impl EndInfo {
    pub(crate) fn from_status(status: std::process::ExitStatus) -> EndInfo {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(0), _) => EndInfo {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            },
            (Some(code), _) => EndInfo {
                exit_code: code,
                exited: true,
                status: format!("exit status {code}"),
                error: Some(format!("exit status {code}")),
            },
            (None, signal) => {
                let text = format!("signal: {}", signal_name(signal.unwrap_or(0)));
                EndInfo {
                    exit_code: -1,
                    exited: false,
                    status: text.clone(),
                    error: Some(text),
                }
            }
        }
    }
}

/// Go's names for the signals a process is likely to die of.
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        other => format!("signal {other}"),
    }
}

/// One event of a process stream.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    Stdout(Bytes),
    Stderr(Bytes),
    /// Output of a process on a terminal (stdout and stderr are one stream there).
    Pty(Bytes),
    End(EndInfo),
    /// The process died with its sandbox (paused or killed): envd dies with it, so its
    /// streams break off without an `end` event, as on E2B.
    SandboxGone,
}

/// What List reports about a process: its start request as given.
#[derive(Clone, Debug)]
pub(crate) struct ProcConfig {
    pub(crate) cmd: String,
    pub(crate) args: Vec<String>,
    pub(crate) envs: BTreeMap<String, String>,
    pub(crate) cwd: Option<String>,
    pub(crate) listing: Listing,
}

/// Whether envd's `List` shows a process: what a client started, yes; a service the
/// server runs in the sandbox (a code-interpreter kernel) no, as E2B's envd lists only
/// the processes it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listing {
    Listed,
    Service,
}

/// One started process.
#[derive(Debug)]
pub(crate) struct Proc {
    /// The pid as the sandbox sees it (the one envd reports: Start, List, SendSignal).
    pub(crate) pid: u32,
    /// The pid as the server sees it (the one signals go to).
    pub(crate) host_pid: u32,
    pub(crate) tag: Option<String>,
    pub(crate) config: ProcConfig,
    shared: Mutex<Shared>,
    /// The stdin pipe while open (`None` without `stdin: true`, after CloseStdin, or
    /// after the end).
    pub(crate) stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// The terminal's master side, for a process started with a `pty`.
    pub(crate) tty: Option<Arc<PtyMaster>>,
}

#[derive(Debug, Default)]
struct Shared {
    subscribers: Vec<mpsc::Sender<Event>>,
    end: Option<EndInfo>,
}

impl Proc {
    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the process ended, once it has.
    pub(crate) fn end(&self) -> Option<EndInfo> {
        self.shared().end.clone()
    }

    /// Subscribes to future events; `Err(end)` when the process already finished.
    pub(crate) fn subscribe(&self) -> Result<mpsc::Receiver<Event>, EndInfo> {
        let mut shared = self.shared();
        if let Some(end) = &shared.end {
            return Err(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        shared.subscribers.push(tx);
        Ok(rx)
    }

    /// Delivers an event to every subscriber, waiting for slow ones (backpressure);
    /// subscribers that went away are forgotten.
    async fn broadcast(&self, event: Event) {
        let subscribers = self.shared().subscribers.clone();
        let mut gone = Vec::new();
        for (index, tx) in subscribers.iter().enumerate() {
            if tx.send(event.clone()).await.is_err() {
                gone.push(index);
            }
        }
        if !gone.is_empty() {
            self.shared().subscribers.retain(|tx| !tx.is_closed());
        }
    }
}

/// The processes of one sandbox.
#[derive(Debug)]
pub(crate) struct ProcessTable {
    sandbox_id: String,
    /// The sandbox's event log (commands started and ended).
    log: crate::sandbox_log::SandboxLog,
    plan: NsPlan,
    /// The sandbox's root layer, mounted in its namespaces ([`crate::root_layer`]); only
    /// with a PID namespace, whose init holds the mount.
    layer: Option<Arc<crate::root_layer::RootLayer>>,
    /// This boot's id, as `/proc/sys/kernel/random/boot_id` shows it (a random UUID, [`crate::token::new_uuid`]).
    boot_id: String,
    inner: Mutex<TableInner>,
    /// Whether the sandbox is frozen, and how many times it was: streams break off at a
    /// freeze, and deadlines stand still while frozen.
    life: watch::Sender<Life>,
}

/// What [`ProcessTable::life`] tells its watchers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Life {
    /// Freezes so far.
    freezes: u64,
    frozen: bool,
}

#[derive(Debug, Default)]
struct TableInner {
    /// Set when the sandbox died or paused without its memory: its processes were killed
    /// and no new process may start.
    closed: bool,
    /// Set while the sandbox is paused with its memory: the processes it stopped.
    frozen: Option<Frozen>,
    /// Started with the first command when the plan asks for namespaces.
    ns: Option<SandboxNs>,
    /// The egress policy every command is filtered by, when the sandbox has one.
    egress: Option<Arc<LivePolicy>>,
    /// By the pid the sandbox sees (unique within its PID namespace).
    running: HashMap<u32, Arc<Proc>>,
    finished: VecDeque<Arc<Proc>>,
    /// A command started without a filter while there was no PID namespace to look for
    /// what it left behind: rules can no longer be held over the whole sandbox.
    unfiltered_untracked: bool,
}

/// Why a process could not be started.
#[derive(Debug)]
pub(crate) enum SpawnError {
    Closed,
    Io(std::io::Error),
}

impl ProcessTable {
    pub(crate) fn new(
        sandbox_id: &str,
        plan: NsPlan,
        layer: Option<Arc<crate::root_layer::RootLayer>>,
        egress: Option<Arc<LivePolicy>>,
        log: crate::sandbox_log::SandboxLog,
    ) -> ProcessTable {
        ProcessTable {
            sandbox_id: sandbox_id.to_owned(),
            log,
            layer: layer.filter(|_| plan.pid),
            plan,
            boot_id: crate::token::new_uuid(),
            inner: Mutex::new(TableInner {
                egress,
                ..TableInner::default()
            }),
            life: watch::Sender::new(Life::default()),
        }
    }

    /// This boot's id (lowercase hex UUID, no newline).
    pub(crate) fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The policy new commands are filtered by (`None`: they are not filtered).
    pub(crate) fn egress(&self) -> Option<Arc<LivePolicy>> {
        self.lock().egress.clone()
    }

    /// The sandbox's root layer, when its commands have one.
    pub(crate) fn layer(&self) -> Option<&Arc<crate::root_layer::RootLayer>> {
        self.layer.as_ref()
    }

    /// Whether the sandbox runs in a network namespace with only loopback.
    pub(crate) fn offline(&self) -> bool {
        self.plan.offline
    }

    /// Sets the policy of a sandbox that had none; refused (with the pids) while a command
    /// started without a filter still runs, since nothing could hold it to the rules.
    ///
    /// Not only the commands envd started: a process one of them left behind (`setsid`,
    /// `nohup … &`, a daemon) would keep reaching everywhere, so every process of the
    /// sandbox's PID namespace that runs under no seccomp filter counts (its host pid).
    /// Without a PID namespace to look in, any command ever started unfiltered refuses.
    pub(crate) fn start_filtering(&self, egress: Arc<LivePolicy>) -> Result<(), Vec<u32>> {
        let mut inner = self.lock();
        let mut pids: Vec<u32> = inner.running.keys().copied().collect();
        if let Some(ns) = &inner.ns {
            match ns.unfiltered_pids() {
                Ok(found) => pids.extend(found),
                // Fail closed: what runs cannot be told.
                Err(_) => pids.push(0),
            }
        }
        if inner.unfiltered_untracked && pids.is_empty() {
            pids.push(0);
        }
        if !pids.is_empty() {
            pids.sort_unstable();
            pids.dedup();
            return Err(pids);
        }
        inner.egress = Some(egress);
        Ok(())
    }

    /// True when commands run in a PID namespace of the sandbox's own (and so must
    /// mount a /proc of their own to see it).
    pub(crate) fn own_pid_namespace(&self) -> bool {
        self.plan.pid
    }

    /// True once the sandbox died or paused without its memory (its processes were
    /// killed). A sandbox paused with its memory is frozen, not closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// True while the sandbox is paused with its memory ([`ProcessTable::freeze`]).
    pub(crate) fn is_frozen(&self) -> bool {
        self.lock().frozen.is_some()
    }

    /// Watches for the sandbox's next freeze, from now on (see [`PauseWatch`]).
    pub(crate) fn pause_watch(&self) -> PauseWatch {
        let rx = self.life.subscribe();
        let since = rx.borrow().freezes;
        PauseWatch { rx, since }
    }

    /// Pauses the sandbox keeping its memory: refuses new processes and stops every
    /// process of the sandbox (SIGSTOP; see [`crate::freeze`]), which keep their pids,
    /// pipes and output; every stream of the sandbox breaks off (its [`PauseWatch`]es
    /// fire), as envd's connections go with E2B's paused VM. The processes' deadlines
    /// stand still until [`ProcessTable::thaw`]. Nothing happens to a table already
    /// frozen or closed.
    pub(crate) fn freeze(&self) {
        let mut inner = self.lock();
        if inner.closed || inner.frozen.is_some() {
            return;
        }
        let frozen = Frozen::freeze(|| self.members(&inner));
        tracing::debug!(sandbox_id = %self.sandbox_id, stopped = frozen.len(), "sandbox frozen");
        inner.frozen = Some(frozen);
        self.life.send_modify(|life| {
            life.freezes += 1;
            life.frozen = true;
        });
    }

    /// Resumes a frozen sandbox: continues (SIGCONT) what the freeze stopped, children
    /// before parents, and lets new processes start. Their output is read on as before,
    /// by whoever re-attaches (`Connect`) or by nobody.
    pub(crate) fn thaw(&self) {
        let mut inner = self.lock();
        let Some(frozen) = inner.frozen.take() else {
            return;
        };
        self.life.send_modify(|life| life.frozen = false);
        // Under the lock, so a snapshot's hold cannot take them for stopped by the sandbox.
        frozen.thaw();
    }

    /// The host pids of every process of the sandbox: its PID namespace's, where it has
    /// one; else each running command, what shares its process group, their descendants,
    /// and every process carrying the sandbox's `E2B_SANDBOX_ID`.
    fn members(&self, inner: &TableInner) -> Vec<u32> {
        let commands = inner.running.values().map(|p| p.host_pid);
        if let Some(Ok(mut pids)) = inner.ns.as_ref().map(SandboxNs::member_pids) {
            pids.extend(commands);
            return pids;
        }
        let mut found: HashSet<u32> = commands.filter(|pid| *pid > 0).collect();
        let all = all_processes();
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        let roots = found.clone();
        for (pid, stat) in &all {
            if roots.contains(&stat.pgrp) {
                found.insert(*pid);
            }
            children.entry(stat.ppid).or_default().push(*pid);
        }
        let mut parents: Vec<u32> = found.iter().copied().collect();
        while let Some(parent) = parents.pop() {
            for child in children.get(&parent).into_iter().flatten() {
                if found.insert(*child) {
                    parents.push(*child);
                }
            }
        }
        found.extend(sandbox_pids(&self.sandbox_id));
        found.remove(&std::process::id());
        found.into_iter().collect()
    }

    fn lock(&self) -> MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses new processes and kills every process of the sandbox: its PID
    /// namespace when it has one, each command's process group, plus any descendant
    /// that left it but still carries the sandbox's `E2B_SANDBOX_ID`.
    pub(crate) fn close_and_kill(&self) {
        let (pids, ns): (Vec<u32>, _) = {
            let mut inner = self.lock();
            inner.closed = true;
            // Stopped or not, SIGKILL ends them.
            inner.frozen = None;
            let pids = inner.running.values().map(|p| p.host_pid).collect();
            (pids, inner.ns.take())
        };
        if let Some(ns) = ns {
            ns.kill();
        }
        for pid in pids {
            let Ok(pid) = i32::try_from(pid) else {
                continue;
            };
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        kill_tagged(&self.sandbox_id);
    }

    /// Stops every process of the sandbox (as [`ProcessTable::freeze`] does, but
    /// breaking no stream) until the returned guard is dropped (SIGCONT): a snapshot
    /// copies files that nothing writes meanwhile, as E2B's brief pause gives, and no
    /// process is killed. A sandbox paused meanwhile keeps them stopped until its resume.
    pub(crate) fn hold_still(self: &Arc<Self>) -> HeldStill {
        let inner = self.lock();
        let held = if inner.closed || inner.frozen.is_some() {
            Frozen::default()
        } else {
            Frozen::freeze(|| self.members(&inner))
        };
        drop(inner);
        HeldStill {
            table: Arc::clone(self),
            held: Some(held),
        }
    }

    /// The process named by `pid`, else by `tag` (envd's `ProcessSelector`), running
    /// or among the retained finished ones.
    pub(crate) fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Option<Arc<Proc>> {
        let inner = self.lock();
        let matches = |p: &&Arc<Proc>| match (pid, tag) {
            (Some(pid), _) => p.pid == pid,
            (None, Some(tag)) => p.tag.as_deref() == Some(tag),
            (None, None) => false,
        };
        inner
            .running
            .values()
            .find(matches)
            .or_else(|| inner.finished.iter().rev().find(matches))
            .cloned()
    }

    /// Like [`ProcessTable::find`], but only a process still running.
    pub(crate) fn find_running(&self, pid: Option<u32>, tag: Option<&str>) -> Option<Arc<Proc>> {
        self.find(pid, tag)
            .filter(|p| self.lock().running.contains_key(&p.pid))
    }

    /// The running processes, by pid.
    pub(crate) fn running(&self) -> Vec<Arc<Proc>> {
        let inner = self.lock();
        let mut procs: Vec<Arc<Proc>> = inner.running.values().cloned().collect();
        procs.sort_by_key(|p| p.pid);
        procs
    }

    fn finish(&self, pid: u32) {
        let mut inner = self.lock();
        if let Some(proc) = inner.running.remove(&pid) {
            inner.finished.push_back(proc);
            while inner.finished.len() > RETAINED {
                inner.finished.pop_front();
            }
        }
    }

    /// Starts a process and subscribes to its events before any output is read.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        mut command: tokio::process::Command,
        config: ProcConfig,
        tag: Option<String>,
        tty: Option<PtyMaster>,
        deadline: Option<Instant>,
        egress: Option<&Arc<LivePolicy>>,
    ) -> Result<(Arc<Proc>, mpsc::Receiver<Event>), SpawnError> {
        let mut inner = self.lock();
        if inner.closed || inner.frozen.is_some() {
            return Err(SpawnError::Closed);
        }
        // Rules set while the command was being prepared: it must not start unfiltered.
        if inner.egress.is_some() && egress.is_none() {
            return Err(SpawnError::Io(std::io::Error::other(
                "the sandbox got egress rules while the command was starting; start it again",
            )));
        }
        // Spawned under the table lock so that a concurrent pause/kill either refuses
        // this process or sees it and kills it.
        let mut child = if self.plan.pid {
            if inner.ns.is_none() {
                inner.ns = Some(
                    SandboxNs::create(self.plan.offline, self.layer.as_deref())
                        .map_err(SpawnError::Io)?,
                );
            }
            let ns = inner.ns.as_ref().ok_or(SpawnError::Closed)?;
            ns.run_inside(|| command.spawn()).map_err(SpawnError::Io)?
        } else {
            inner.unfiltered_untracked |= egress.is_none();
            command.spawn().map_err(SpawnError::Io)?
        };
        let host_pid = child.id().unwrap_or(0);
        let pid = if self.plan.pid {
            sandbox_ns::inner_pid(host_pid).unwrap_or(host_pid)
        } else {
            host_pid
        };
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let proc = Arc::new(Proc {
            pid,
            host_pid,
            tag,
            config,
            shared: Mutex::new(Shared {
                subscribers: vec![tx],
                end: None,
            }),
            stdin: tokio::sync::Mutex::new(child.stdin.take()),
            tty: tty.map(Arc::new),
        });
        inner.running.insert(pid, Arc::clone(&proc));
        drop(inner);
        // The command and its arguments only: never its env.
        let line = std::iter::once(proc.config.cmd.as_str())
            .chain(proc.config.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        self.log.push(
            crate::sandbox_log::Level::Info,
            format!("process {pid} started"),
            &[
                ("pid", pid.to_string()),
                ("cmd", crate::sandbox_log::shorten(&line)),
            ],
        );
        tokio::spawn(supervise(
            Arc::clone(self),
            Arc::clone(&proc),
            child,
            deadline,
        ));
        Ok((proc, rx))
    }
}

/// Kills every process whose environment names this sandbox.
fn kill_tagged(sandbox_id: &str) {
    for pid in sandbox_pids(sandbox_id) {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The host pids of every process whose environment names this sandbox (`E2B_SANDBOX_ID`,
/// set for every command and inherited by what it starts), the server itself excepted.
pub(crate) fn sandbox_pids(sandbox_id: &str) -> Vec<u32> {
    let needle = format!("E2B_SANDBOX_ID={sandbox_id}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            (pid != me
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var == needle.as_bytes()))
            .then_some(pid)
        })
        .collect()
}

/// Sleeps until `deadline`; without one, forever.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Continues the processes [`ProcessTable::hold_still`] stopped, when dropped; if the
/// sandbox was paused with its memory meanwhile, its resume continues them.
#[derive(Debug)]
pub(crate) struct HeldStill {
    table: Arc<ProcessTable>,
    held: Option<Frozen>,
}

impl Drop for HeldStill {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let mut inner = self.table.lock();
        let closed = inner.closed;
        match &mut inner.frozen {
            Some(frozen) => frozen.merge(held),
            // Killed with the sandbox.
            None if closed => {}
            None => held.thaw(),
        }
    }
}

/// Fires once its sandbox has been frozen since the watch was taken (or at once when it
/// is frozen now): a stream of the sandbox then breaks off, as envd's connections do
/// when E2B pauses the VM.
#[derive(Debug)]
pub(crate) struct PauseWatch {
    rx: watch::Receiver<Life>,
    since: u64,
}

impl PauseWatch {
    /// Resolves at the freeze; never, for a table that is gone (cancel-safe).
    pub(crate) async fn paused(&mut self) {
        let since = self.since;
        if self
            .rx
            .wait_for(|life| life.frozen || life.freezes != since)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}
