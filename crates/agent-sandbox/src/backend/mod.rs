//! The backend: one scope's lifecycle (`Phase`) and role (`Role`), and its public API.
//!
//! The steps live in submodules that share this module's private types: `attach` (find,
//! adopt, create, connect), `gates` (bring-up, admission, per-command sync), `lease`
//! (top-up before a command), `start` (starting a command) and `teardown` (cleanup,
//! finalize, detach).

pub(super) mod attach;
mod checkpoint;
mod egress;
mod replace;
pub(crate) mod subagent;
pub use subagent::{BranchBack, BringBack, ChildSandbox, StateBack};
mod turns;
pub use checkpoint::MAX_BRANCHES;
pub(crate) use egress::noted_for as noted_egress_for;
pub use turns::{MAX_TURN_KEEP, TURN_STORE, TurnCheckpoint, TurnRequest, TurnRestore};
mod fence;
mod fetch;
mod files;
mod fleet;
mod gates;
mod holder;
use holder::{StateGuard, StateHolder};
mod watchdog;
pub use watchdog::{CallDeadline, STALLED_RETRY};
mod inflight;
mod lease;
mod leftover;
mod live;
pub use live::SharedPort;
pub(crate) mod pull;
use inflight::Inflight;
mod start;
mod teardown;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use e2b_client::{Client, Sandbox, SandboxId};
use sandbox_identity::{LeaseKind, LeasePolicy, LeaseTracker, Mode, ScopeIdentity};
use writer_lease::{Holder, ScopeFiles, ScopeKey, WriterLease};

use crate::command::{self, Launch, RunOptions, RunningCommand};
use crate::config::{Config, SandboxMode, Scope, Services};
use crate::error::{Error, ErrorChain};
use crate::hooks::StateHooks;
use crate::report::{AttachInfo, RoleKind, ScopeHolder, Stats};
use crate::sink::OutputSink;
use crate::transport::{FailureLog, StateTransport};

/// How long a teardown transfer may take; the reconnect before it asks for a lease covering
/// this (plus grace and one control-plane request).
pub const TRANSFER_WINDOW: Duration = Duration::from_secs(120);

/// What a persistent or ephemeral sandbox's extension asks for beyond what the command
/// needs (the prompt probe asks for exactly its need). Every
/// command still finds its full `max(lease, deadline + grace)` covered (L5); the headroom
/// lets the commands of the next minute find it covered without a request, so in steady
/// state a command costs exactly its start request. An idle persistent sandbox therefore
/// pauses between `lease` and `lease + LEASE_HEADROOM` after its last command.
pub const LEASE_HEADROOM: Duration = Duration::from_secs(60);

/// The lease a file read or write asks for beyond the baseline.
const FILE_OPERATION_WINDOW: Duration = Duration::from_secs(60);

/// The retry hint a refused reader command carries.
pub const RETRY_HINT: &str = "Retry: the command proceeds as soon as the writer session \
completes a state sync, and this session takes the writer role over if it is released.";

/// One sandbox scope's backend. See the crate docs for the lifecycle.
///
/// Every method blocks the calling thread and must be called from a thread that is not
/// driving async tasks (async callers use `spawn_blocking`); [`Backend::finalize`] is the
/// exception. Dropping a backend does no network work: it releases the writer role (the lock
/// dies with its file) and leaves an ephemeral sandbox to its on-timeout kill; call
/// [`Backend::cleanup`] or [`Backend::finalize`] first.
pub struct Backend {
    inner: Arc<Inner>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("template", &self.inner.config.template)
            .field("mode", &self.inner.config.mode)
            .field("task_id", &self.inner.scope.task_id)
            .field("attached", &self.info().map(|info| info.sandbox_id))
            .finish_non_exhaustive()
    }
}

/// One backend's shared core.
///
/// Locks, by what they guard, and their order (a lock is only ever taken while holding
/// locks listed before it):
///
/// 1. `state`: the scope's one attachment, its role and lease (`Phase`). Every public call
///    that attaches, admits, syncs or starts takes it first and holds it across that
///    network I/O on purpose: one scope's transitions are serial, so a per-command sync
///    never interleaves with another thread's admission or start (S3, C7), and a reader's
///    takeover happens once. What a command does after its start request (its output, its
///    wait) runs outside it, on the pump; cleanup waits for commands without it (L8).
/// 2. `inflight`: the count of running commands (with its condvar); `run` enters it under
///    `state`, a command's end leaves it on the pump, cleanup waits on it alone.
/// 3. `handoff` and `arbitration`: leaf locks, held for a read or a write of the value and
///    never across I/O or another lock: what the state hooks and other threads reach
///    without the state lock (the transport, its failure record, the replaced sandbox), and
///    sandbox arbitration's host-side memory (this host's holder id, the other host's
///    grant).
/// 4. `holder` and `stalls`: leaf locks, held to write or read who holds `state` (its
///    guard keeps the record true) and the last call the watchdog gave up on; what a
///    caller that waited too long reads without taking `state` (O7).
/// 5. `note_serial`: a leaf lock held across one read-modify-write of the scope note's file
///    (host file I/O only, never network I/O or another lock), so the note the bring-up
///    writes beside its requests and the recovery's note never lose each other's lines.
struct Inner {
    // What the backend was given and derived once: immutable.
    config: Config,
    scope: Scope,
    services: Services,
    hooks: Arc<dyn StateHooks>,
    identity: ScopeIdentity,
    policy: LeasePolicy,
    files: Option<ScopeFiles>,
    /// Leaf lock inside: the scope's activity record as this process keeps it (with `files`).
    activity: Option<Arc<writer_lease::ActivityRecorder>>,
    /// Lock 1.
    state: Mutex<Phase>,
    /// Leaf lock: lock 1's holder, operation and step (O7).
    holder: StateHolder,
    /// Leaf lock: the last call the watchdog gave up on, while it runs (O7).
    stalls: watchdog::Stalls,
    /// Lock 2.
    inflight: Arc<Inflight>,
    /// Leaf locks: what the hooks and other threads reach without `state`.
    handoff: Handoff,
    /// Leaf locks: `writer_arbitration: sandbox`'s memory on this host.
    arbitration: ArbitrationMemory,
    /// Leaf lock: one scope-note update at a time.
    note_serial: Mutex<()>,
    /// Leaf lock: the egress policy in force from now on (the config's, until
    /// [`Backend::set_egress`] changes it); read before every command (X10).
    egress: Mutex<crate::egress::EgressPolicy>,
    /// Leaf lock: the credentials in force from now on (the config's, until
    /// [`Backend::set_credentials`] changes them); read before every command (X16).
    credentials: Mutex<crate::credentials::Credentials>,
    /// The process's credential store of this profile, found on first need (X22).
    secret_store: std::sync::OnceLock<Arc<crate::secret_store::ProfileStore>>,
    /// Delegated children (R15): whose fork this is, or the children waiting for forks.
    subagents: subagent::Subagents,
    /// Live processes: the uses their followers wait for after a cut, and ended ones'
    /// directories (a watch and a leaf lock).
    live: live::LiveMemory,
    /// The last checkpoint time this process named (Unix milliseconds): names never repeat.
    last_checkpoint_ms: AtomicU64,
    /// When the scope was last used ([`Clock::since_boot`](crate::Clock::since_boot), in
    /// milliseconds): a command's start and end, a file operation. Shared with the pump,
    /// which records a command's end; the fleet pauses the idlest first (L14).
    last_use: Arc<AtomicU64>,
    /// When a watcher last polled a background process in the sandbox (as `last_use`; 0:
    /// never): the fleet pauses such a scope for the limit last (L17).
    last_watch: AtomicU64,
    stats: Counters,
    /// This core as the fleet and the state transport hold it: weakly, so neither keeps a
    /// dropped backend alive.
    me: std::sync::Weak<Inner>,
}

/// What the state hooks and other threads reach without the state lock (leaf locks).
#[derive(Default)]
struct Handoff {
    /// The attached sandbox's transport, for the hooks' callbacks; cloned out, never used
    /// under the lock.
    transport: Mutex<Option<StateTransport>>,
    /// Transport failures recorded during a hook (the hooks' sync engine may swallow them).
    failures: FailureLog,
    /// The sandbox an attach replaced because it was gone, until the caller takes it.
    replaced: Mutex<Option<String>>,
}

/// Sandbox arbitration's host-side memory (leaf locks).
#[derive(Default)]
struct ArbitrationMemory {
    /// This host's identity in the sandbox's writer record, loaded on first use.
    holder: Mutex<Option<Holder>>,
    /// Until when (a [`Clock::since_boot`](crate::Clock::since_boot) reading) another host's
    /// grant keeps this host from asking the record again, and the refusal to repeat
    /// meanwhile.
    held_elsewhere: Mutex<Option<(std::time::Duration, String)>>,
}

#[derive(Default)]
struct Counters {
    creates: AtomicU64,
    lists: AtomicU64,
    connects: AtomicU64,
    lease_extensions: AtomicU64,
    commands: AtomicU64,
    sandbox_kills: AtomicU64,
    home_probes: AtomicU64,
    snapshots: AtomicU64,
    snapshot_lists: AtomicU64,
    snapshot_deletes: AtomicU64,
    network_updates: AtomicU64,
}

/// The activity record is best effort: a failed write leaves `list` an estimate.
fn record_activity(written: Result<(), writer_lease::Error>) {
    if let Err(error) = written {
        tracing::debug!(
            "the scope's activity record was not written: {}",
            ErrorChain(&error)
        );
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

enum Phase {
    Detached,
    Attached(Box<Attached>),
    /// Cleanup began: no new command is admitted.
    Closing(Option<Box<Attached>>),
    Closed {
        sandbox_id: Option<String>,
    },
}

struct Attached {
    client: Client,
    sandbox: Sandbox,
    id: SandboxId,
    lease: LeaseTracker,
    role: Role,
    info: AttachInfo,
    /// A reader found the scope prepared for another sandbox: re-attach on next use.
    stale: bool,
    /// This process created the sandbox and no bring-up has run on it yet: there is
    /// nothing in it to recover (S5 is about resumed sandboxes), so the bring-up skips the
    /// snapshot request.
    fresh: bool,
    /// The writer's grant in the sandbox's record (`writer_arbitration: sandbox`).
    grant: Option<fence::Grant>,
    /// The digest of the egress rules in force on the sandbox, as far as this host knows.
    egress: String,
    /// The credential stand-ins its commands see, by variable name (X16).
    stand_ins: std::collections::BTreeMap<String, String>,
    /// The sandbox's home: known, or asked at attach and waited for by the first step that
    /// needs it (`settle_home` completes `info` with it).
    home: Arc<crate::home::HomeSlot>,
    /// When this attachment was made (the clock's wall time): a teardown finds the state
    /// unchanged when nothing used the sandbox since (L16).
    attached_at: std::time::SystemTime,
    /// Whether this process ran a command or a file operation in the sandbox, or replaced
    /// its contents, since it attached: the teardown pull has something to bring back.
    used: bool,
    /// Why this process paused it behind the session (its quiet time, L17, or the account's
    /// limit, L14), until a use resumes it: a watcher's poll is refused rather than
    /// resuming it.
    paused_for: Option<crate::error::PausedFor>,
}

impl Attached {
    /// Whether the attach report holds the home yet (an empty home is never accepted, so
    /// it marks a report `settle_home` has not completed).
    fn home_settled(&self) -> bool {
        !self.info.home.home.is_empty()
    }
}

/// By when an attach's home probe must have answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HomeNeeded {
    /// Before the call returns (its caller reads the attach report or a state path).
    Now,
    /// Once the command's start request has gone out: a command that names no directory
    /// starts in `$HOME` itself (L13), so the probe and the start travel together.
    AfterStart,
}

enum Role {
    /// Holds the writer lease; the bring-up has not completed yet.
    PendingWriter(WriterLease),
    Writer(WriterLease),
    Reader,
    Owner {
        pushed: bool,
    },
    Probe,
    External,
}

impl Role {
    fn kind(&self) -> RoleKind {
        match self {
            Role::Writer(_) => RoleKind::Writer,
            Role::PendingWriter(_) | Role::Reader => RoleKind::Reader,
            Role::Owner { .. } => RoleKind::Owner,
            Role::Probe => RoleKind::Probe,
            Role::External => RoleKind::External,
        }
    }
}

impl Backend {
    /// A backend for `scope`. Nothing is contacted and no file is touched until first use
    /// (contract L1).
    pub fn new(
        config: Config,
        scope: Scope,
        services: Services,
        hooks: Arc<dyn StateHooks>,
    ) -> Result<Backend, Error> {
        if config.template.is_empty() {
            return Err(Error::InvalidConfig {
                reason: "the template is empty".to_owned(),
            });
        }
        if let Some(root) = &config.remote_hermes_home
            && !root.starts_with('/')
        {
            return Err(Error::InvalidConfig {
                reason: "the remote Hermes home must be an absolute path".to_owned(),
            });
        }
        let probe = scope.is_probe();
        let (mode, kind) = match (&config.mode, probe) {
            (SandboxMode::Attach { .. }, _) => (Mode::Persistent, LeaseKind::Persistent),
            (_, true) => (Mode::Ephemeral, LeaseKind::Probe),
            (SandboxMode::Persistent, false) => (Mode::Persistent, LeaseKind::Persistent),
            (SandboxMode::Ephemeral { lifetime }, false) => (
                Mode::Ephemeral,
                LeaseKind::Ephemeral {
                    lifetime: *lifetime,
                },
            ),
        };
        let identity = ScopeIdentity {
            profile_home: scope.profile_home.to_string_lossy().into_owned(),
            task_id: scope.task_id.clone(),
            template: config.template.clone(),
            mode,
            internet: config.internet,
            security: config.security,
        };
        let policy = LeasePolicy {
            lease: config.lease,
            command_grace: config.command_grace,
            kind,
        };
        let files = match (&config.mode, probe) {
            (SandboxMode::Persistent, false) => Some(ScopeFiles::new(
                config
                    .coordination_dir
                    .clone()
                    .unwrap_or_else(|| scope.profile_home.join("cache").join("e2b")),
                ScopeKey::from_bytes(*identity.digest().as_bytes()),
            )),
            _ => None,
        };
        let egress = Mutex::new(config.egress.clone());
        let credentials = Mutex::new(config.credentials.clone());
        let last_use = Arc::new(AtomicU64::new(0));
        fleet::touch(&last_use, &*services.clock);
        let inner = Arc::new_cyclic(|me| Inner {
            config,
            scope,
            services,
            hooks,
            identity,
            policy,
            activity: files
                .as_ref()
                .map(|files| Arc::new(files.activity_recorder())),
            files,
            state: Mutex::new(Phase::Detached),
            holder: StateHolder::default(),
            stalls: watchdog::Stalls::default(),
            inflight: Arc::new(Inflight::default()),
            handoff: Handoff::default(),
            arbitration: ArbitrationMemory::default(),
            note_serial: Mutex::new(()),
            egress,
            credentials,
            secret_store: std::sync::OnceLock::new(),
            subagents: subagent::Subagents::default(),
            live: live::LiveMemory::default(),
            last_checkpoint_ms: AtomicU64::new(0),
            last_use,
            last_watch: AtomicU64::new(0),
            stats: Counters::default(),
            me: me.clone(),
        });
        inner.services.fleet.join(inner.me.clone());
        Ok(Backend { inner })
    }

    /// The scope digest this backend's sandboxes carry in their metadata (I1).
    pub fn scope_digest(&self) -> String {
        self.inner.identity.digest().to_hex()
    }

    /// The lease policy in force.
    pub fn lease_policy(&self) -> LeasePolicy {
        self.inner.policy
    }

    /// What is attached, if anything.
    pub fn info(&self) -> Option<AttachInfo> {
        match &*self.inner.lock_state("read attachment") {
            Phase::Attached(attached) => Some(attached.info.clone()),
            Phase::Closing(Some(attached)) => Some(attached.info.clone()),
            _ => None,
        }
    }

    /// What holds this scope's state now (an attach, a command's admission and sync, a
    /// checkpoint, ...), at which step and for how long; `None` when nothing does. Waits for
    /// nothing: what a caller that gave up waiting names (O7).
    pub fn holder(&self) -> Option<ScopeHolder> {
        self.inner.holder.current()
    }

    /// The backend's request counters.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.stats;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            creates: load(&c.creates),
            lists: load(&c.lists),
            connects: load(&c.connects),
            lease_extensions: load(&c.lease_extensions),
            commands: load(&c.commands),
            sandbox_kills: load(&c.sandbox_kills),
            home_probes: load(&c.home_probes),
            snapshots: load(&c.snapshots),
            snapshot_lists: load(&c.snapshot_lists),
            snapshot_deletes: load(&c.snapshot_deletes),
            network_updates: load(&c.network_updates),
        }
    }

    /// Attaches now if not yet attached: find by metadata, adopt the newest or create (writer
    /// only, under the creation lock), resume a paused one, then bring up the writer role
    /// (L1, L2, I4, I5, I6, C1). Normally implicit in [`run`](Self::run).
    pub fn attach(&self) -> Result<AttachInfo, Error> {
        let mut state = self.inner.lock_state("attach");
        let attached = self.inner.ensure_attached(&mut state, "attach")?;
        Ok(attached.info.clone())
    }

    /// The transport of the attached sandbox, for a sync engine's callbacks. Does not attach.
    pub fn transport(&self) -> Result<StateTransport, Error> {
        self.inner
            .handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::NotAttached {
                operation: "state transfer",
            })
    }

    /// Runs `command`, streaming its output into `sink` as it arrives (O1).
    ///
    /// Before it starts: attach if needed; a reader tries to take the writer role over and
    /// otherwise must pass the gates (C2, C4); a writer or ephemeral owner syncs state (S3);
    /// the lease is extended to cover `max(lease, deadline + grace)` unless the known expiry
    /// already does (L5). Returns once the command runs; its pid is known.
    pub fn run(
        &self,
        command: &str,
        options: RunOptions,
        sink: Box<dyn OutputSink>,
    ) -> Result<RunningCommand, Error> {
        let inner = &self.inner;
        let mut state = inner.lock_state("start command");
        let attached =
            inner.ensure_attached_for(&mut state, "start command", HomeNeeded::AfterStart)?;
        let watch = options.purpose == command::Purpose::Watch;
        if watch && let Some(paused_for) = inner.paused_by_backend(attached) {
            let sandbox_id = attached.id.as_str().to_owned();
            return match &options.answer_while_paused {
                Some(answer) => {
                    inner.watched();
                    tracing::debug!(sandbox_id = %sandbox_id, "E2B poll answered on the host: sandbox {sandbox_id} is paused ({paused_for}) and the poll must not resume it");
                    Ok(command::answered(&sandbox_id, answer, sink))
                }
                None => Err(Error::PausedByBackend {
                    sandbox_id,
                    paused_for,
                }),
            };
        }
        if watch {
            inner.watched();
        }
        // Kept only while the home is still being asked (to stop the command if it is refused).
        let pending = (!attached.home_settled()).then(|| attached.sandbox.clone());
        let started = inner.prepare_and_start(
            attached,
            command,
            &options,
            e2b_client::ProcessStdin::Closed,
            start::Reader::Thread,
        );
        // The home probe of an attach made by this call has travelled with the start.
        let settled = inner.settle_or_forget(&mut state);
        let (stream, pid) = match (started, settled) {
            (Ok(started), Ok(())) => started,
            (Ok((stream, pid)), Err(error)) => {
                // The command started while the probe was out and the host then refused the
                // home or could not learn it (with a home the sandbox's own check refuses,
                // the command did not run: `start::START_IN_HOME`): stop it, best effort.
                drop(stream);
                if let Some(sandbox) = pending
                    && let Err(source) = inner.block_on(sandbox.kill_process(pid))
                {
                    tracing::debug!(
                        sandbox_id = %sandbox.id(),
                        "stopping a command whose sandbox home was refused failed: {}",
                        ErrorChain(&source)
                    );
                }
                return Err(error);
            }
            (Err(error), Err(_)) => return Err(error),
            (Err(error), Ok(())) => {
                let Phase::Attached(attached) = &mut *state else {
                    unreachable!("attached above and settled")
                };
                // A sandbox that is gone, or a reader attached to a sandbox the writer no
                // longer prepares, is let go here; the next use attaches afresh (and, as the
                // writer, recreates it with a full bring-up). Nothing is replaced now.
                if error.is_sandbox_gone() || attached.stale {
                    inner.detach(&mut state);
                }
                return Err(error);
            }
        };
        let Phase::Attached(attached) = &mut *state else {
            unreachable!("attached above and not detached on success")
        };
        bump(&inner.stats.commands);
        // A watcher's poll is no use of the sandbox: it leaves the quiet time running (L17).
        if !watch {
            inner.touch();
            attached.used = true;
            attached.paused_for = None;
        }
        let activity = inner
            .activity
            .clone()
            .filter(|_| !watch)
            .map(|recorder| (recorder, attached.id.as_str().to_owned()));
        if let Some((recorder, sandbox_id)) = &activity {
            record_activity(recorder.command_started(sandbox_id, inner.services.clock.wall()));
        }
        let token = inner.inflight.enter_command(pid, command);
        let inflight = Arc::clone(&inner.inflight);
        let (last_use, clock) = (
            Arc::clone(&inner.last_use),
            Arc::clone(&inner.services.clock),
        );
        let launched = command::spawn(Launch {
            runtime: inner.services.runtime.clone(),
            sandbox: attached.sandbox.clone(),
            stream,
            sandbox_pid: pid,
            deadline: options.deadline,
            kill_grace: options.kill_grace,
            sink,
            on_done: Box::new(move || {
                if !watch {
                    fleet::touch(&last_use, &*clock);
                }
                inflight.leave(token);
                // The host's record of the scope's last use (what `list` shows): ended once
                // nothing of the scope runs.
                if let Some((recorder, sandbox_id)) = &activity
                    && inflight.is_idle()
                {
                    record_activity(recorder.command_ended(sandbox_id, clock.wall()));
                }
            }),
        });
        if launched.is_err() {
            inner.inflight.leave(token);
        }
        launched
    }
}

impl Inner {
    /// Lock 1, taken for `operation`: who holds it, since when, is what [`Backend::holder`]
    /// tells a caller that waited too long (O7).
    pub(super) fn lock_state(&self, operation: &'static str) -> StateGuard<'_> {
        let guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        StateGuard::new(guard, &self.holder, operation)
    }

    pub(super) fn clear_transport(&self) {
        *self
            .handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn ensure_attached<'a>(
        &self,
        state: &'a mut Phase,
        operation: &'static str,
    ) -> Result<&'a mut Attached, Error> {
        self.ensure_attached_for(state, operation, HomeNeeded::Now)
    }

    fn ensure_attached_for<'a>(
        &self,
        state: &'a mut Phase,
        operation: &'static str,
        needed: HomeNeeded,
    ) -> Result<&'a mut Attached, Error> {
        match state {
            Phase::Closing(attached) => {
                return Err(Error::Closed {
                    operation,
                    sandbox_id: attached.as_ref().map(|a| a.id.as_str().to_owned()),
                });
            }
            Phase::Closed { sandbox_id } => {
                return Err(Error::Closed {
                    operation,
                    sandbox_id: sandbox_id.clone(),
                });
            }
            Phase::Detached => {
                let attached = self.attach_new()?;
                *state = Phase::Attached(Box::new(attached));
            }
            Phase::Attached(_) => {}
        }
        let Phase::Attached(attached) = state else {
            unreachable!("the state was attached just above")
        };
        // Before the bring-up's own commands and the caller's (X10).
        if let Err(error) = self.keep_egress(attached) {
            // A sandbox gone is let go; the next use attaches afresh (with the policy).
            if error.is_sandbox_gone() {
                self.detach(state);
            }
            return Err(error);
        }
        let established = self.establish(attached);
        // A bring-up that failed may have failed for want of the home: its cause goes first.
        if needed == HomeNeeded::Now || established.is_err() {
            self.settle_or_forget(state)?;
        }
        established?;
        let Phase::Attached(attached) = state else {
            unreachable!("settled above without letting go")
        };
        Ok(attached)
    }

    /// Completes the attach report with the home (waiting for the probe if it is out); a
    /// refused or failed probe lets the attachment go, as an attach whose probe fails
    /// attaches nothing (L13), and its error is returned.
    fn settle_or_forget(&self, state: &mut Phase) -> Result<(), Error> {
        let Phase::Attached(attached) = state else {
            return Ok(());
        };
        if let Err(error) = self.settle_home(attached) {
            *state = Phase::Detached;
            self.clear_transport();
            return Err(error);
        }
        Ok(())
    }

    /// Completes what attaching leaves pending: the writer's bring-up, the ephemeral initial
    /// push. Kept out of `attach_new` so that a failure leaves the sandbox attached (as a
    /// reader) and the next use retries only this part.
    fn establish(&self, attached: &mut Attached) -> Result<(), Error> {
        match std::mem::replace(&mut attached.role, Role::Reader) {
            Role::PendingWriter(writer) => self.bring_up(attached, writer),
            Role::Owner { pushed: false } => {
                attached.role = Role::Owner { pushed: false };
                self.owner_push(attached)
            }
            other => {
                attached.role = other;
                Ok(())
            }
        }
    }

    pub(super) fn client(&self) -> Result<Client, Error> {
        // On the process's shared pools: a scope holds no connection pool of its own.
        self.shared_client()
    }

    pub(super) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.services.runtime.block_on(future)
    }
}
