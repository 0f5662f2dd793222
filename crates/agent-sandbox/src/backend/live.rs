//! The backend's side of live processes: starting one (admitted like a command), where a
//! follower may go after a cut, and input and signals (each a use of the sandbox).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use e2b_client::ProcessStdin;

use super::start::Reader;
use super::{Backend, HomeNeeded, Inner, Phase, bump};
use crate::command::{Events, Purpose, RunOptions, Shell};
use crate::error::{Error, ErrorChain};
use crate::kernel::{Kernel, KernelOptions};
use crate::live::{
    Busy, LIVE_TAG, LiveHost, LiveOptions, LiveProcess, LiveSignal, LostReason, PortForward,
    Target, runner, signal_script, spawn_follower, valid_id,
};
use crate::sink::DiscardSink;

/// The lease a live process's start asks for (the start itself; the process then runs as long
/// as the sandbox does, and never keeps it from pausing).
const START_WINDOW: Duration = Duration::from_secs(60);

/// How long a signal's command may take.
const SIGNAL_WINDOW: Duration = Duration::from_secs(30);

/// Prints `<port in hex> <inode>` for each listening TCP socket: every one with `$all` set,
/// else those whose inode is in `$inodes` (space-separated, with a space on each side).
const LISTENING: &str = r#"for t in /proc/net/tcp /proc/net/tcp6; do
  [ -r "$t" ] || continue
  while read -r _ local _ st _ _ _ _ _ inode _; do
    [ "$st" = 0A ] || continue
    if [ -z "$all" ]; then case "$inodes" in *" $inode "*) ;; *) continue;; esac; fi
    printf '%s %s\n' "${local##*:}" "$inode"
  done < "$t"
done"#;

/// What [`Backend::share_ports`] did for one port.
#[derive(Debug)]
#[non_exhaustive]
pub enum SharedPort {
    /// The sandboxes share a network: the port is reachable as it is.
    Reachable {
        /// The port.
        port: u16,
    },
    /// Forwarded through the host.
    Forwarded(PortForward),
    /// Not forwarded (the port is taken here, or a relay could not start).
    Refused {
        /// The port.
        port: u16,
        /// Why.
        reason: String,
    },
}

impl SharedPort {
    /// The port.
    pub fn port(&self) -> u16 {
        match self {
            SharedPort::Reachable { port } | SharedPort::Refused { port, .. } => *port,
            SharedPort::Forwarded(forward) => forward.port(),
        }
    }
}

/// The scope's memory of its live processes (a leaf lock inside, and a watch): the uses
/// followers wait for after a cut, and the directories of ended processes for the next runner
/// to remove.
pub(super) struct LiveMemory {
    /// Uses of the sandbox so far.
    uses: std::sync::atomic::AtomicU64,
    /// Wakes followers waiting for a use; made by the first of them (most scopes never have
    /// one, and an idle scope's memory is counted: the scale bench).
    wake: std::sync::OnceLock<tokio::sync::watch::Sender<()>>,
    finished: Mutex<Vec<String>>,
    /// Background processes followed now (not kernels): the scope serves them, and is paused
    /// for the account's limit after every idle scope without one (L17).
    serving: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for LiveMemory {
    fn default() -> LiveMemory {
        LiveMemory {
            uses: std::sync::atomic::AtomicU64::new(0),
            wake: std::sync::OnceLock::new(),
            finished: Mutex::new(Vec::new()),
            serving: Arc::default(),
        }
    }
}

/// What a live process is to the scope.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serving {
    /// A background process: the scope serves it while it is followed.
    Background,
    /// A session kernel: idle between cells like the session (its cells count as running).
    Kernel,
}

impl LiveMemory {
    /// A use of the sandbox (or the scope's close): followers waiting after a cut look again.
    pub(super) fn used(&self) {
        // Counted before the wake: a follower subscribing between the two sees the count.
        self.uses.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(wake) = self.wake.get() {
            wake.send_replace(());
        }
    }

    /// Whether a background process of the scope is being followed now.
    pub(super) fn serving(&self) -> bool {
        self.serving.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Counts one followed background process until the returned guard drops.
    fn serve(&self) -> crate::live::Busy {
        let serving = Arc::clone(&self.serving);
        serving.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        crate::live::Busy::new(Box::new(move || {
            serving.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }))
    }

    fn take_finished(&self) -> Vec<String> {
        std::mem::take(&mut *self.finished.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// At most this many ended processes' directories wait for removal (the rest are removed by
/// age, a day after their last output).
const MAX_FINISHED: usize = 64;

impl Backend {
    /// Starts `command` as live process `id` (letters, digits, `_` and `-`; the caller's
    /// name for it, unique in the scope): admitted like [`run`](Self::run) (attach, lease,
    /// gates, sync), with its stdin open. Returns once it runs; its output is read with
    /// [`LiveProcess::read`]. Nothing polls it: its output streams as it is written, and a
    /// cut stream is taken up again where it broke (see the [`live`](crate::LiveProcess)
    /// docs).
    pub fn start_live(
        &self,
        id: &str,
        command: &str,
        options: LiveOptions,
    ) -> Result<LiveProcess, Error> {
        self.start_live_as(id, command, options, Serving::Background)
    }

    fn start_live_as(
        &self,
        id: &str,
        command: &str,
        options: LiveOptions,
        serving: Serving,
    ) -> Result<LiveProcess, Error> {
        if !valid_id(id) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "a live process id must be 1 to 64 letters, digits, '_' or '-', not {id:?}"
                ),
            });
        }
        let inner = &self.inner;
        let mut state = inner.lock_state("start live process");
        let attached =
            inner.ensure_attached_for(&mut state, "start live process", HomeNeeded::Now)?;
        let finished = inner.live.take_finished();
        let script = runner(id, command, options.live_shell(), options.io(), &finished);
        let mut run = RunOptions::new(START_WINDOW);
        run.cwd = options.cwd;
        run.env = options.env;
        // In envd's record of the process too: after a resume, a pid is checked to still be
        // this process (List) before anything is written to it.
        run.env.insert(LIVE_TAG.to_owned(), id.to_owned());
        run.shell = Shell::Plain;
        let started =
            inner.prepare_and_start(attached, &script, &run, ProcessStdin::Open, Reader::Runtime);
        let (stream, pid) = match started {
            Ok((Events::Async(stream), pid)) => (stream, pid),
            Ok((Events::Blocking(_), _)) => {
                unreachable!("a live process is started for the runtime")
            }
            Err(error) => {
                // Not removed: the next runner tries again.
                inner
                    .live
                    .finished
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(finished);
                if error.is_sandbox_gone() {
                    inner.detach(&mut state);
                }
                return Err(error);
            }
        };
        let Phase::Attached(attached) = &mut *state else {
            unreachable!("attached above and not detached on success")
        };
        bump(&inner.stats.commands);
        attached.used = true;
        attached.paused_for = None;
        inner.touch();
        let sandbox_id = attached.id.as_str().to_owned();
        drop(state);
        let host: Arc<dyn LiveHost> = self.inner.clone();
        let (process, shared, events) =
            LiveProcess::new(id.to_owned(), sandbox_id, pid, Arc::downgrade(&host));
        let serving = (serving == Serving::Background).then(|| self.inner.live.serve());
        spawn_follower(shared, events, Some(stream), 0, serving)?;
        Ok(process)
    }

    /// Starts a session kernel (a Python interpreter that runs cells in one namespace, see
    /// [`Kernel`]) as a live process of this scope's sandbox: any template with the options'
    /// `python`. Two requests (the start, the bootstrap message); fails with
    /// [`Error::KernelUnavailable`] naming what the interpreter said when it cannot start.
    pub fn start_kernel(&self, options: KernelOptions) -> Result<Kernel, Error> {
        let mut bytes = [0u8; 48];
        self.inner.services.random.fill(&mut bytes);
        let (key, rest) = bytes.split_at(32);
        let id = format!("kernel-{}", hex::encode(&rest[..8]));
        let marker = format!("@@AGENT-SANDBOX-KERNEL-{}@@", hex::encode(&rest[8..]));
        let process = self.start_live_as(
            &id,
            &crate::kernel::command(&options.python),
            crate::kernel::live_options(&options),
            Serving::Kernel,
        )?;
        let host: Arc<dyn LiveHost> = self.inner.clone();
        let key: [u8; 32] = key.try_into().expect("32 bytes");
        Kernel::start(process, Arc::downgrade(&host), key, marker, &options)
    }

    /// Makes `port_there` of `target`'s sandbox reachable at `127.0.0.1:<port_here>` (and
    /// `[::1]`) in this scope's sandbox: a listening relay here, a connecting one there (live
    /// processes of each scope, `python3` on both templates), and two host threads carrying
    /// their frames. Each connection's bytes are a use of the sandbox they go to (a paused
    /// one is resumed by them, as by a command). Fails, ending what it started, when the port
    /// is taken here or a relay cannot start; dropping the forward ends it.
    pub fn forward_port(
        &self,
        port_here: u16,
        target: &Backend,
        port_there: u16,
    ) -> Result<PortForward, Error> {
        let mut bytes = [0u8; 4];
        self.inner.services.random.fill(&mut bytes);
        let id = format!("forward-{port_here}-{}", hex::encode(bytes));
        let relay = |mode: &str, port: u16| {
            format!(
                "exec python3 -c {} {mode} {port}",
                crate::subagent::shell_quote(crate::live::RELAY)
            )
        };
        let connector = target.start_live(
            &id,
            &relay("connect", port_there),
            LiveOptions::pipes(Shell::Plain),
        )?;
        let listener = match self.start_live(
            &id,
            &relay("listen", port_here),
            LiveOptions::pipes(Shell::Plain),
        ) {
            Ok(listener) => listener,
            Err(error) => {
                let _ = connector.signal(LiveSignal::Kill);
                return Err(error);
            }
        };
        PortForward::start(port_here, listener, connector)
    }

    /// Makes every TCP port live process `id` of `target` listens on reachable at the same
    /// port in this scope's sandbox ([`Backend::forward_port`]), unless the two sandboxes
    /// share a network already (the listening socket itself is seen here: then nothing is
    /// needed). What was done for each port, in order; a port that cannot be forwarded (taken
    /// here) is reported, not fatal.
    pub fn share_ports(&self, target: &Backend, id: &str) -> Result<Vec<SharedPort>, Error> {
        let sockets = target.listening_sockets(id)?;
        if sockets.is_empty() {
            return Ok(Vec::new());
        }
        let seen_here = self.listening_inodes()?;
        Ok(sockets
            .into_iter()
            .map(|(port, inode)| {
                if seen_here.contains(&(port, inode)) {
                    return SharedPort::Reachable { port };
                }
                match self.forward_port(port, target, port) {
                    Ok(forward) => SharedPort::Forwarded(forward),
                    Err(error) => SharedPort::Refused {
                        port,
                        reason: error.to_string(),
                    },
                }
            })
            .collect())
    }

    /// The TCP ports live process `id` of this scope (and what it started) listens on, read
    /// in the sandbox (`/proc`: its processes by their [`LIVE_TAG`], their sockets in the
    /// listening state). One command.
    pub fn listening_ports(&self, id: &str) -> Result<Vec<u16>, Error> {
        let mut ports: Vec<u16> = self
            .listening_sockets(id)?
            .into_iter()
            .map(|(port, _)| port)
            .collect();
        ports.dedup();
        Ok(ports)
    }

    /// The listening sockets (port, inode) of live process `id` and what it started.
    fn listening_sockets(&self, id: &str) -> Result<Vec<(u16, u64)>, Error> {
        if !valid_id(id) {
            return Err(Error::InvalidConfig {
                reason: format!("{id:?} is not a live process id"),
            });
        }
        let script = crate::subagent::fill(
            r#"all=; inodes=' '
for p in /proc/[0-9]*; do
  tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "TAG=ID" || continue
  for f in "$p"/fd/*; do
    l=$(readlink "$f" 2>/dev/null) || continue
    case "$l" in socket:\[*\]) i=${l#socket:[}; inodes="$inodes${i%]} ";; esac
  done
done
LISTING"#,
            &[("TAG", LIVE_TAG), ("ID", id), ("LISTING", LISTENING)],
        );
        let mut sockets = self.read_sockets(&script)?;
        sockets.sort_unstable();
        sockets.dedup();
        Ok(sockets)
    }

    /// Every listening TCP socket this scope's sandbox sees (port, inode).
    fn listening_inodes(&self) -> Result<Vec<(u16, u64)>, Error> {
        self.read_sockets(&format!("all=1; {LISTENING}"))
    }

    fn read_sockets(&self, script: &str) -> Result<Vec<(u16, u64)>, Error> {
        let output = self.file_operation("listening ports", SIGNAL_WINDOW, |inner, sandbox| {
            inner.script(sandbox, "listening ports", script)
        })?;
        let untrusted = |line: &str| Error::UntrustedAnswer {
            operation: "listening ports",
            sandbox_id: self.info().map(|info| info.sandbox_id).unwrap_or_default(),
            reason: format!("{line:?} is not a port in hex and an inode"),
        };
        let mut sockets = Vec::new();
        for line in String::from_utf8_lossy(&output).lines().map(str::trim) {
            if line.is_empty() {
                continue;
            }
            let (port, inode) = line.split_once(' ').ok_or_else(|| untrusted(line))?;
            let port = u16::from_str_radix(port, 16).map_err(|_| untrusted(line))?;
            let inode: u64 = inode.parse().map_err(|_| untrusted(line))?;
            if port != 0 {
                sockets.push((port, inode));
            }
        }
        Ok(sockets)
    }

    /// Takes up live process `id` of sandbox `sandbox_id` again (started by an earlier
    /// backend, a process that restarted), its output from byte `offset` on (0: all of it,
    /// as far as the sandbox kept it). Never resumes a paused sandbox: the follower starts at
    /// the sandbox's next use. The process must belong to this scope's sandbox: another one
    /// reports [`LiveEnd::Lost`](crate::LiveEnd::Lost) at once.
    pub fn follow_live(
        &self,
        id: &str,
        sandbox_id: &str,
        pid: u32,
        offset: u64,
    ) -> Result<LiveProcess, Error> {
        if !valid_id(id) {
            return Err(Error::InvalidConfig {
                reason: format!("{id:?} is not a live process id"),
            });
        }
        let host: Arc<dyn LiveHost> = self.inner.clone();
        let (process, shared, events) = LiveProcess::new(
            id.to_owned(),
            sandbox_id.to_owned(),
            pid,
            Arc::downgrade(&host),
        );
        spawn_follower(shared, events, None, offset, Some(self.inner.live.serve()))?;
        Ok(process)
    }
}

impl LiveHost for Inner {
    fn target(&self, sandbox_id: &str) -> Target {
        let state = self.lock_state("follow a live process");
        match &*state {
            Phase::Attached(attached) => {
                if attached.id.as_str() != sandbox_id {
                    Target::Replaced
                } else if self.paused_by_backend(attached).is_some() || !self.lease_live(attached) {
                    Target::Wait
                } else {
                    Target::Running(Box::new(attached.sandbox.clone()))
                }
            }
            // A gone sandbox was let go; the next use attaches and tells which it is.
            Phase::Detached => Target::Wait,
            Phase::Closing(_) | Phase::Closed { .. } => Target::Closed,
        }
    }

    fn uses(&self) -> u64 {
        self.live.uses.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn wait_for_use(&self, since: u64, stop: &crate::live::Stop) {
        let mut wake = self
            .live
            .wake
            .get_or_init(|| tokio::sync::watch::Sender::new(()))
            .subscribe();
        let uses = &self.live.uses;
        self.services.runtime.block_on(async {
            tokio::select! {
                // The predicate reads the count itself: checked at once, then at each wake.
                _ = wake.wait_for(|()| uses.load(std::sync::atomic::Ordering::SeqCst) != since) => {}
                () = stop.stopped() => {}
            }
        });
    }

    fn runtime(&self) -> tokio::runtime::Handle {
        self.services.runtime.clone()
    }

    fn finished(&self, id: &str) {
        let mut finished = self
            .live
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if finished.len() < MAX_FINISHED {
            finished.push(id.to_owned());
        }
    }

    fn input(
        &self,
        sandbox_id: &str,
        pid: u32,
        id: &str,
        data: &[u8],
        cover: Duration,
    ) -> Result<(), Error> {
        self.live_call(
            "write to a live process",
            sandbox_id,
            (pid, id),
            cover,
            |inner, sandbox| {
                inner
                    .block_on(sandbox.send_stdin(pid, data))
                    .map_err(|source| {
                        Error::e2b(
                            "write to a live process",
                            Some(sandbox.id().as_str()),
                            source,
                        )
                    })
            },
        )
    }

    fn close_input(&self, sandbox_id: &str, pid: u32, id: &str) -> Result<(), Error> {
        self.live_call(
            "close a live process's stdin",
            sandbox_id,
            (pid, id),
            START_WINDOW,
            |inner, sandbox| {
                inner.block_on(sandbox.close_stdin(pid)).map_err(|source| {
                    Error::e2b(
                        "close a live process's stdin",
                        Some(sandbox.id().as_str()),
                        source,
                    )
                })
            },
        )
    }

    fn busy(&self, what: String) -> Busy {
        let token = self.inflight.enter(e2b_client::redact(&what));
        self.touch();
        let inflight = Arc::clone(&self.inflight);
        let (last_use, clock) = (Arc::clone(&self.last_use), Arc::clone(&self.services.clock));
        Busy::new(Box::new(move || {
            super::fleet::touch(&last_use, &*clock);
            inflight.leave(token);
        }))
    }

    fn signal(&self, sandbox_id: &str, id: &str, signal: LiveSignal) -> Result<(), Error> {
        let Some(me) = self.me.upgrade() else {
            return Err(Error::Closed {
                operation: "signal a live process",
                sandbox_id: Some(sandbox_id.to_owned()),
            });
        };
        if self.attached_id().as_deref() != Some(sandbox_id) {
            return Err(lost(
                "signal a live process",
                sandbox_id,
                LostReason::Replaced,
            ));
        }
        let backend = Backend { inner: me };
        let mut options = RunOptions::new(SIGNAL_WINDOW);
        options.purpose = Purpose::Use;
        let command = backend.run(&signal_script(id, signal), options, Box::new(DiscardSink))?;
        match command.wait() {
            Ok(_) => Ok(()),
            Err(error) => {
                tracing::debug!(sandbox_id = %sandbox_id, "signalling live process {id} failed: {}", ErrorChain(&*error));
                Err(Error::CommandLost {
                    sandbox_id: sandbox_id.to_owned(),
                    sandbox_pid: command.sandbox_pid(),
                })
            }
        }
    }
}

impl Inner {
    /// The attached sandbox's id, if any (waits for the state lock).
    fn attached_id(&self) -> Option<String> {
        match &*self.lock_state("follow a live process") {
            Phase::Attached(attached) => Some(attached.id.as_str().to_owned()),
            _ => None,
        }
    }

    /// A call on a live process's sandbox, as a use of it: the lease first, covering `cover`
    /// (which resumes a paused sandbox), never an attach or create; the process's sandbox must
    /// be the scope's. After a resume, the pid is checked (envd's List) to still be live
    /// process `id`: a sandbox that restarted meanwhile may have given it to another process.
    fn live_call(
        &self,
        operation: &'static str,
        sandbox_id: &str,
        (pid, id): (u32, &str),
        cover: Duration,
        call: impl Fn(&Inner, &e2b_client::Sandbox) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut state = self.lock_state(operation);
        let attached = match &mut *state {
            Phase::Attached(attached) => attached,
            Phase::Detached => return Err(lost(operation, sandbox_id, LostReason::Replaced)),
            Phase::Closing(_) | Phase::Closed { .. } => {
                return Err(Error::Closed {
                    operation,
                    sandbox_id: Some(sandbox_id.to_owned()),
                });
            }
        };
        if attached.id.as_str() != sandbox_id {
            return Err(lost(operation, sandbox_id, LostReason::Replaced));
        }
        let mut running = self.paused_by_backend(attached).is_none() && self.lease_live(attached);
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.top_up_lease(attached, cover)?;
            attached.used = true;
            attached.paused_for = None;
            let sandbox = attached.sandbox.clone();
            if !running {
                self.check_pid(&sandbox, operation, pid, id)?;
            }
            let result = call(self, &sandbox);
            self.touch();
            match result {
                // Paused behind the host's back while its lease seemed to cover it: resume,
                // check, once more.
                Err(error) if error.is_sandbox_gone() && attempt == 1 => {
                    attached.lease.forget();
                    running = false;
                }
                other => return other,
            }
        }
    }

    /// Whether `pid` is still live process `id` in `sandbox` (envd's List: its record of the
    /// process carries the id).
    fn check_pid(
        &self,
        sandbox: &e2b_client::Sandbox,
        operation: &'static str,
        pid: u32,
        id: &str,
    ) -> Result<(), Error> {
        let processes = self
            .block_on(sandbox.list_processes())
            .map_err(|source| Error::e2b(operation, Some(sandbox.id().as_str()), source))?;
        let ours = processes.iter().any(|process| {
            process.pid == pid && process.config.envs.get(LIVE_TAG).map(String::as_str) == Some(id)
        });
        if ours {
            Ok(())
        } else {
            Err(lost(
                operation,
                sandbox.id().as_str(),
                LostReason::Restarted,
            ))
        }
    }
}

fn lost(operation: &'static str, sandbox_id: &str, reason: LostReason) -> Error {
    Error::LiveProcessLost {
        operation,
        sandbox_id: sandbox_id.to_owned(),
        reason,
    }
}
