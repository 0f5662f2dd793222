//! The backend: lazy attach, roles and admission, leases, commands, cleanup.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use e2b_client::{
    Client, ConnectState, CreateOptions, KillOutcome, ListQuery, ListedSandbox, OnTimeout,
    PauseMemory, Sandbox, SandboxId, StartOptions, StateFilter,
};
use futures::TryStreamExt;
use sandbox_identity::{
    Adoption, Candidate, IdentityMetadata, LeaseKind, LeasePlan, LeasePolicy, LeaseTracker, Mode,
    SCOPE_KEY, ScopeIdentity,
};
use writer_lease::{
    Admission, CreationAccess, Role as LeaseRole, ScopeFiles, ScopeKey, WriterLease, WriterPhase,
};

use crate::command::{self, Launch, RunOptions, RunningCommand, Shell};
use crate::config::{ApiKeySource, CREATION_LOCK_WAIT, Config, SandboxMode, Scope, Services};
use crate::error::Error;
use crate::sink::OutputSink;
use crate::transport::{FailureLog, StateTransport, TransportParts};

/// How long a teardown transfer may take; the reconnect before it asks for a lease covering
/// this (plus grace and one control-plane request).
pub const TRANSFER_WINDOW: Duration = Duration::from_secs(120);

/// What a persistent sandbox's extension asks for beyond what the command needs. Every
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

/// A failure reported by a [`StateHooks`] callback.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Which push the backend asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PushKind {
    /// The full push of a bring-up (after recovery); a failure is fatal (contract S2).
    Initial,
    /// The per-command incremental sync; a failure aborts the command and marks the scope
    /// dirty (contract S3).
    Incremental,
}

/// The caller's state synchronisation, driven by the backend at the right moments and only
/// in the writer role (C1). Hermes' binding implements it with its FileSyncManager, whose
/// callbacks use the [`StateTransport`] handed in here.
///
/// A callback fails by returning an error, and also when any transport call made during it
/// failed (the transport records failures), so a sync engine that swallows exceptions still
/// fails closed.
///
/// Callbacks run on the thread that called into the backend, while the backend holds its
/// attach state: they must use the transport they are given and must not call back into the
/// same [`Backend`] (that would wait on itself).
pub trait StateHooks: Send + Sync {
    /// Push host state into the sandbox.
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError>;
    /// Pull sandbox state back to the host at teardown.
    fn pull(&self, transport: &StateTransport) -> Result<(), HookError>;
}

/// Hooks that move no state: for callers that only run commands.
#[derive(Debug, Clone, Copy)]
pub struct NoStateHooks;

impl StateHooks for NoStateHooks {
    fn push(&self, _transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

/// How the backend came to hold its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It created it.
    Created,
    /// It adopted an existing sandbox of its scope found by metadata.
    Adopted {
        /// How many other sandboxes matched the scope (warned about once, contract I5).
        duplicates: usize,
    },
    /// Attach mode: connected to the sandbox id it was given (L12).
    Connected,
}

/// The backend's part in its scope's state protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoleKind {
    /// Persistent writer: recovers, pushes, syncs and pulls (C1).
    Writer,
    /// Persistent reader: runs commands once the gates pass (C2).
    Reader,
    /// Ephemeral owner: sole user of its own sandbox; pushes, pulls, kills.
    Owner,
    /// The prompt probe: no state, killed at cleanup (L11).
    Probe,
    /// Attach mode: an externally owned sandbox; no state protocol, never paused or killed.
    External,
}

/// What [`Backend::attach`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttachInfo {
    /// The sandbox.
    pub sandbox_id: String,
    /// How it was obtained.
    pub origin: Origin,
    /// Whether connect found it paused and resumed it.
    pub resumed: bool,
    /// The role at attach time.
    pub role: RoleKind,
    /// Set when this host cannot protect concurrent sessions (C6); logged once.
    pub degradation: Option<String>,
    /// The sandbox this attachment replaced because it was gone (Hermes: mark the environment
    /// recreated).
    pub replaced: Option<String>,
}

/// Counters of the backend's own E2B requests, for accounting tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Sandboxes created.
    pub creates: u64,
    /// List requests (paged lists count once).
    pub lists: u64,
    /// Connect requests (attach, resume, lease top-up).
    pub connects: u64,
    /// Of those, lease top-ups before a command.
    pub lease_extensions: u64,
    /// Commands started.
    pub commands: u64,
    /// Kill requests for whole sandboxes.
    pub sandbox_kills: u64,
}

/// What a teardown pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullOutcome {
    /// Not this role's job, or nothing was attached.
    NotAttempted,
    /// The pull completed.
    Pulled,
    /// The pull failed; logged with the sandbox id, recovered by the next resume (S12).
    Failed(String),
}

/// What happened to the sandbox itself at cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillOutcomeReport {
    /// Left alone (persistent, reader, attach mode: never paused or killed, L3, L12).
    LeftRunning,
    /// Killed (ephemeral, probe).
    Killed,
    /// It was already gone.
    AlreadyGone,
    /// The kill failed; logged.
    Failed(String),
}

/// What [`Backend::cleanup`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupReport {
    /// The sandbox that was attached, if any.
    pub sandbox_id: Option<String>,
    /// Whether an earlier cleanup had already run (this one did nothing, L7).
    pub repeated: bool,
    /// The teardown pull.
    pub pull: PullOutcome,
    /// The sandbox's fate.
    pub sandbox: KillOutcomeReport,
}

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

struct Inner {
    config: Config,
    scope: Scope,
    services: Services,
    hooks: Arc<dyn StateHooks>,
    identity: ScopeIdentity,
    policy: LeasePolicy,
    files: Option<ScopeFiles>,
    state: Mutex<Phase>,
    transport: Mutex<Option<StateTransport>>,
    replaced: Mutex<Option<String>>,
    failures: FailureLog,
    inflight: Arc<Inflight>,
    stats: Counters,
    degradation_warned: AtomicBool,
}

#[derive(Default)]
struct Counters {
    creates: AtomicU64,
    lists: AtomicU64,
    connects: AtomicU64,
    lease_extensions: AtomicU64,
    commands: AtomicU64,
    sandbox_kills: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Default)]
struct Inflight {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Inflight {
    fn enter(&self) {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }

    fn leave(&self) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.idle.notify_all();
        }
    }

    fn wait_idle(&self) {
        let count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let _idle = self
            .idle
            .wait_while(count, |count| *count > 0)
            .unwrap_or_else(PoisonError::into_inner);
    }
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
        if !config.remote_hermes_home.starts_with('/') {
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
                scope.profile_home.join("cache").join("e2b"),
                ScopeKey::from_bytes(*identity.digest().as_bytes()),
            )),
            _ => None,
        };
        Ok(Backend {
            inner: Arc::new(Inner {
                config,
                scope,
                services,
                hooks,
                identity,
                policy,
                files,
                state: Mutex::new(Phase::Detached),
                transport: Mutex::new(None),
                replaced: Mutex::new(None),
                failures: FailureLog::default(),
                inflight: Arc::new(Inflight::default()),
                stats: Counters::default(),
                degradation_warned: AtomicBool::new(false),
            }),
        })
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
        match &*self.inner.lock_state() {
            Phase::Attached(attached) => Some(attached.info.clone()),
            Phase::Closing(Some(attached)) => Some(attached.info.clone()),
            _ => None,
        }
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
        }
    }

    /// Attaches now if not yet attached: find by metadata, adopt the newest or create (writer
    /// only, under the creation lock), resume a paused one, then bring up the writer role
    /// (L1, L2, I4, I5, I6, C1). Normally implicit in [`run`](Self::run).
    pub fn attach(&self) -> Result<AttachInfo, Error> {
        let mut state = self.inner.lock_state();
        let attached = self.inner.ensure_attached(&mut state, "attach")?;
        Ok(attached.info.clone())
    }

    /// The transport of the attached sandbox, for a sync engine's callbacks. Does not attach.
    pub fn transport(&self) -> Result<StateTransport, Error> {
        self.inner
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
        let mut state = inner.lock_state();
        let attached = inner.ensure_attached(&mut state, "start command")?;
        let (stream, pid) = match inner.prepare_and_start(attached, command, &options) {
            Ok(started) => started,
            Err(error) => {
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
        inner.inflight.enter();
        let inflight = Arc::clone(&inner.inflight);
        let launched = command::spawn(Launch {
            runtime: inner.services.runtime.clone(),
            sandbox: attached.sandbox.clone(),
            stream,
            sandbox_pid: pid,
            deadline: options.deadline,
            sink,
            on_done: Box::new(move || inflight.leave()),
        });
        if launched.is_err() {
            inner.inflight.leave();
        }
        launched
    }

    /// Reads a sandbox file, refusing it the moment it passes `max_bytes` (checked while
    /// downloading). Admitted like a command: attach, lease, gates, sync (C2, C7).
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        self.file_operation("read file", |inner, sandbox| {
            let id = sandbox.id().as_str().to_owned();
            inner
                .block_on(sandbox.read_file(path, max_bytes))
                .map(|bytes| bytes.to_vec())
                .map_err(|source| Error::e2b("read file", Some(&id), source))
        })
    }

    /// Writes a sandbox file (parents created, replaced if present). Admitted like a command.
    pub fn write_file(&self, path: &str, data: Vec<u8>) -> Result<(), Error> {
        self.file_operation("write file", |inner, sandbox| {
            let id = sandbox.id().as_str().to_owned();
            let file = e2b_client::UploadFile::bytes(path.to_owned(), data.clone().into());
            inner
                .block_on(sandbox.write_files(vec![file]))
                .map(|_| ())
                .map_err(|source| Error::e2b("write file", Some(&id), source))
        })
    }

    fn file_operation<T>(
        &self,
        operation: &'static str,
        op: impl Fn(&Inner, &Sandbox) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let inner = &*self.inner;
        let mut state = inner.lock_state();
        let attached = inner.ensure_attached(&mut state, operation)?;
        let result = inner
            .prepare(attached, FILE_OPERATION_WINDOW)
            .and_then(|()| match op(inner, &attached.sandbox) {
                Err(error) if error.is_sandbox_gone() => {
                    attached.lease.forget();
                    inner.top_up_lease(attached, FILE_OPERATION_WINDOW)?;
                    op(inner, &attached.sandbox)
                }
                other => other,
            });
        if let Err(error) = &result
            && (error.is_sandbox_gone() || attached.stale)
        {
            inner.detach(&mut state);
        }
        result
    }

    /// Cleanup for session close, idle reaping and exit (L7, L8): waits for in-flight
    /// commands; persistent writer: pull, release the role, never pause or kill (L3);
    /// ephemeral: pull, kill (L4); probe: kill without a pull (L11); reader and attach mode:
    /// detach only (L12). Never creates or replaces a sandbox; repeated or after the sandbox
    /// vanished it does nothing harmful. Failures are logged and reported, never raised:
    /// release and destruction always run.
    pub fn cleanup(&self) -> CleanupReport {
        let inner = &self.inner;
        let attached = {
            let mut state = inner.lock_state();
            match std::mem::replace(&mut *state, Phase::Closing(None)) {
                Phase::Detached => {
                    *state = Phase::Closed { sandbox_id: None };
                    return CleanupReport {
                        sandbox_id: None,
                        repeated: false,
                        pull: PullOutcome::NotAttempted,
                        sandbox: KillOutcomeReport::LeftRunning,
                    };
                }
                Phase::Attached(attached) => {
                    let id = attached.id.as_str().to_owned();
                    *state = Phase::Closing(Some(attached));
                    id
                }
                previous @ (Phase::Closing(_) | Phase::Closed { .. }) => {
                    let sandbox_id = match &previous {
                        Phase::Closing(Some(attached)) => Some(attached.id.as_str().to_owned()),
                        Phase::Closed { sandbox_id } => sandbox_id.clone(),
                        _ => None,
                    };
                    *state = previous;
                    return CleanupReport {
                        sandbox_id,
                        repeated: true,
                        pull: PullOutcome::NotAttempted,
                        sandbox: KillOutcomeReport::LeftRunning,
                    };
                }
            }
        };
        // Outside the state lock: commands finishing need nothing from it.
        inner.inflight.wait_idle();
        let taken = {
            let mut state = inner.lock_state();
            let previous = std::mem::replace(
                &mut *state,
                Phase::Closed {
                    sandbox_id: Some(attached.clone()),
                },
            );
            match previous {
                Phase::Closing(Some(attached)) => Some(attached),
                _ => None,
            }
        };
        let Some(attached) = taken else {
            return CleanupReport {
                sandbox_id: Some(attached),
                repeated: true,
                pull: PullOutcome::NotAttempted,
                sandbox: KillOutcomeReport::LeftRunning,
            };
        };
        inner.teardown(*attached)
    }

    /// The finalizer path, for a dropped last reference (L9): releases the writer role
    /// locally and never pulls state; an ephemeral or probe sandbox is still killed. Does not
    /// wait for commands. Safe to call from any thread, including async ones (the kill is
    /// then sent in the background).
    pub fn finalize(&self) {
        let inner = &self.inner;
        let previous = {
            let mut state = inner.lock_state();
            let sandbox_id = match &*state {
                Phase::Attached(attached) | Phase::Closing(Some(attached)) => {
                    Some(attached.id.as_str().to_owned())
                }
                Phase::Closed { sandbox_id } => sandbox_id.clone(),
                Phase::Detached | Phase::Closing(None) => None,
            };
            std::mem::replace(&mut *state, Phase::Closed { sandbox_id })
        };
        inner.clear_transport();
        let attached = match previous {
            Phase::Attached(attached) | Phase::Closing(Some(attached)) => attached,
            _ => return,
        };
        let Attached {
            client, id, role, ..
        } = *attached;
        match role {
            Role::Writer(lease) | Role::PendingWriter(lease) => lease.release(),
            Role::Owner { .. } | Role::Probe => {
                bump(&inner.stats.sandbox_kills);
                let kill = async move {
                    if let Err(error) = client.kill(&id).await {
                        tracing::warn!(sandbox_id = %id, "E2B kill failed in finalizer: {}", crate::error::neutralise(&error.to_string()));
                    }
                };
                if tokio::runtime::Handle::try_current().is_ok() {
                    inner.services.runtime.spawn(kill);
                } else {
                    inner.services.runtime.block_on(kill);
                }
            }
            Role::Reader | Role::External => {}
        }
    }
}

impl Inner {
    fn lock_state(&self) -> MutexGuard<'_, Phase> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn clear_transport(&self) {
        *self
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn ensure_attached<'a>(
        &self,
        state: &'a mut Phase,
        operation: &'static str,
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
        self.establish(attached)?;
        Ok(attached)
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

    fn client(&self) -> Result<Client, Error> {
        let key = self
            .config
            .api_key
            .resolve()
            .ok_or_else(|| Error::InvalidConfig {
                reason: "no E2B API key is configured for this profile".to_owned(),
            })?;
        let mut config = e2b_client::Config::new(key);
        let endpoints = &self.config.endpoints;
        if let Some(domain) = &endpoints.domain {
            config.domain = domain.clone();
        }
        config.api_url = endpoints.api_url.clone();
        config.sandbox_url = endpoints.sandbox_url.clone();
        Client::new(config).map_err(|source| Error::e2b("configure client", None, source))
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.services.runtime.block_on(future)
    }

    fn attach_new(&self) -> Result<Attached, Error> {
        let client = self.client()?;
        match &self.config.mode {
            SandboxMode::Attach { sandbox_id } => {
                let (sandbox, lease, resumed) = self.connect(&client, sandbox_id)?;
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::External,
                    Origin::Connected,
                    resumed,
                    None,
                )
            }
            _ if self.scope.is_probe() => {
                let (sandbox, lease) = self.create(&client, OnTimeout::Kill)?;
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::Probe,
                    Origin::Created,
                    false,
                    None,
                )
            }
            SandboxMode::Ephemeral { .. } => {
                let (sandbox, lease) = self.create(&client, OnTimeout::Kill)?;
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::Owner { pushed: false },
                    Origin::Created,
                    false,
                    None,
                )
            }
            SandboxMode::Persistent => self.attach_persistent(client),
        }
    }

    fn attach_persistent(&self, client: Client) -> Result<Attached, Error> {
        let files = self.files.as_ref().ok_or_else(|| Error::InvalidConfig {
            reason: "persistent mode without coordination files".to_owned(),
        })?;
        let role = files
            .try_acquire_writer()
            .map_err(|source| Error::Coordination {
                operation: "acquire writer role",
                sandbox_id: None,
                source,
            })?;
        let mut degradation = None;
        let role = match role {
            LeaseRole::Writer(lease) => {
                if let Some(found) = lease.degradation() {
                    degradation = Some(found.to_string());
                    self.warn_degraded(&found.to_string());
                }
                Role::PendingWriter(lease)
            }
            LeaseRole::Reader => Role::Reader,
        };
        let (sandbox, lease, origin, resumed) = match self.find_existing(&client)? {
            Some(found) => found,
            None => {
                if !matches!(role, Role::PendingWriter(_)) {
                    // Only the writer creates (I6); a reader waits for it.
                    return Err(Error::NotReady {
                        sandbox_id: None,
                        reason: "no sandbox exists for this scope yet and another session holds the writer role".to_owned(),
                        retry_hint: RETRY_HINT.to_owned(),
                    });
                }
                self.create_under_lock(&client, files)?
            }
        };
        self.attached(client, sandbox, lease, role, origin, resumed, degradation)
    }

    fn warn_degraded(&self, text: &str) {
        if !self.degradation_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("{text}");
        }
    }

    /// Lists the scope's sandboxes and adopts the newest match, resuming it if paused.
    #[allow(clippy::type_complexity)]
    fn find_existing(
        &self,
        client: &Client,
    ) -> Result<Option<(Sandbox, LeaseTracker, Origin, bool)>, Error> {
        let mut query = ListQuery::all();
        query.metadata = BTreeMap::from([(SCOPE_KEY.to_owned(), self.identity.digest().to_hex())]);
        query.state = StateFilter::Any;
        bump(&self.stats.lists);
        let listed: Vec<ListedSandbox> = self
            .block_on(client.list(query).try_collect())
            .map_err(|source| Error::e2b("list sandboxes", None, source))?;
        let candidates: Vec<Candidate> = listed.iter().map(candidate).collect();
        match sandbox_identity::choose(&self.identity, &candidates) {
            Adoption::Adopt {
                candidate,
                duplicates,
                ..
            } => {
                if duplicates > 0 {
                    tracing::warn!(
                        sandbox_id = %candidate.sandbox_id,
                        "found {} sandboxes for this scope; adopting the newest, {}; the others pause on their own leases",
                        duplicates + 1,
                        candidate.sandbox_id
                    );
                }
                let id = SandboxId::parse(candidate.sandbox_id.clone()).ok_or_else(|| {
                    Error::InvalidConfig {
                        reason: "E2B listed a sandbox id that is not valid".to_owned(),
                    }
                })?;
                let (sandbox, lease, resumed) = self.connect(client, &id)?;
                Ok(Some((
                    sandbox,
                    lease,
                    Origin::Adopted { duplicates },
                    resumed,
                )))
            }
            Adoption::Create { .. } | Adoption::NeverAdopt => Ok(None),
        }
    }

    fn create_under_lock(
        &self,
        client: &Client,
        files: &ScopeFiles,
    ) -> Result<(Sandbox, LeaseTracker, Origin, bool), Error> {
        let access = files
            .creation_lock_within(CREATION_LOCK_WAIT)
            .map_err(|source| Error::Coordination {
                operation: "take creation lock",
                sandbox_id: None,
                source,
            })?;
        let _guard = match access {
            CreationAccess::Locked(guard) => Some(guard),
            CreationAccess::Unprotected(degradation) => {
                self.warn_degraded(&degradation.to_string());
                None
            }
            CreationAccess::Busy => {
                return Err(Error::NotReady {
                    sandbox_id: None,
                    reason: "another session is creating this scope's sandbox".to_owned(),
                    retry_hint: RETRY_HINT.to_owned(),
                });
            }
        };
        // Whoever held the lock before may have created it meanwhile.
        if let Some(found) = self.find_existing(client)? {
            return Ok(found);
        }
        let (sandbox, lease) = self.create(client, OnTimeout::Pause(PauseMemory::Discard))?;
        Ok((sandbox, lease, Origin::Created, false))
    }

    fn create(
        &self,
        client: &Client,
        on_timeout: OnTimeout,
    ) -> Result<(Sandbox, LeaseTracker), Error> {
        let mut lease = LeaseTracker::new();
        let asked = self.with_headroom(self.policy.baseline());
        let request = match lease.plan(&*self.services.clock, asked) {
            LeasePlan::Extend(request) => request,
            LeasePlan::Covered => unreachable!("a new tracker covers nothing"),
        };
        let identity = IdentityMetadata::for_scope(&self.identity);
        let mut options = CreateOptions::new(self.config.template.clone());
        options.timeout = Some(Duration::from_secs(request.timeout_secs()));
        options.on_timeout = on_timeout;
        options.metadata = sandbox_identity::stamp(&self.config.metadata, &identity).metadata;
        options.allow_internet_access = Some(matches!(
            self.config.internet,
            sandbox_identity::InternetAccess::Allowed
        ));
        options.secure = Some(matches!(
            self.config.security,
            sandbox_identity::Security::Secure
        ));
        bump(&self.stats.creates);
        let info = self
            .block_on(client.create(options))
            .map_err(|source| Error::e2b("create", None, source))?;
        lease.confirm(&request);
        let sandbox = client
            .sandbox(info.envd_access())
            .map_err(|source| Error::e2b("create", Some(info.sandbox_id.as_str()), source))?;
        Ok((sandbox, lease))
    }

    /// Connects with the baseline lease (extend-only; resumes a paused sandbox).
    fn connect(
        &self,
        client: &Client,
        id: &SandboxId,
    ) -> Result<(Sandbox, LeaseTracker, bool), Error> {
        let mut lease = LeaseTracker::new();
        let asked = self.with_headroom(self.policy.baseline());
        let request = match lease.plan(&*self.services.clock, asked) {
            LeasePlan::Extend(request) => request,
            LeasePlan::Covered => unreachable!("a new tracker covers nothing"),
        };
        bump(&self.stats.connects);
        let connected = self
            .block_on(client.connect(id, request.timeout()))
            .map_err(|source| Error::e2b("connect", Some(id.as_str()), source))?;
        lease.confirm(&request);
        let sandbox = client
            .sandbox(connected.sandbox.envd_access())
            .map_err(|source| Error::e2b("connect", Some(id.as_str()), source))?;
        Ok((sandbox, lease, connected.state == ConnectState::Resumed))
    }

    #[allow(clippy::too_many_arguments)]
    fn attached(
        &self,
        client: Client,
        sandbox: Sandbox,
        lease: LeaseTracker,
        role: Role,
        origin: Origin,
        resumed: bool,
        degradation: Option<String>,
    ) -> Result<Attached, Error> {
        let id = sandbox.id().clone();
        let transport = StateTransport::new(TransportParts {
            runtime: self.services.runtime.clone(),
            client: client.clone(),
            sandbox: sandbox.clone(),
            remote_home: self.config.remote_hermes_home.clone(),
            cap: self.config.state_cap,
            transfer_lease: self.policy.transfer_lease(TRANSFER_WINDOW),
            failures: Arc::clone(&self.failures),
        });
        *self
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(transport);
        let info = AttachInfo {
            sandbox_id: id.as_str().to_owned(),
            origin,
            resumed,
            role: role.kind(),
            degradation,
            replaced: self
                .replaced
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        };
        Ok(Attached {
            client,
            sandbox,
            id,
            lease,
            role,
            info,
            stale: false,
        })
    }

    fn current_transport(&self, id: &str) -> Result<StateTransport, Error> {
        self.transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed {
                operation: "state transfer",
                sandbox_id: Some(id.to_owned()),
            })
    }

    /// Runs a hook and folds in transport failures recorded while it ran.
    fn run_hook(
        &self,
        operation: &'static str,
        id: &str,
        hook: impl FnOnce(&StateTransport) -> Result<(), HookError>,
    ) -> Result<(), Error> {
        let transport = self.current_transport(id)?;
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let returned = hook(&transport);
        let recorded =
            std::mem::take(&mut *self.failures.lock().unwrap_or_else(PoisonError::into_inner));
        let mut problems: Vec<String> = recorded.into_iter().map(|(_, text)| text).collect();
        if let Err(error) = returned {
            problems.push(error.to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::StateHook {
                operation,
                sandbox_id: id.to_owned(),
                detail: problems.join("; "),
            })
        }
    }

    /// The writer's bring-up (C3, C4, S5, S11, S2): mark dirty and invalidate the stamp,
    /// recover skills/ and memories/ from the sandbox, push, stamp prepared. On failure the
    /// role is released (C5) and the backend stays attached as a reader.
    fn bring_up(&self, attached: &mut Attached, mut writer: WriterLease) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        let result = (|| {
            writer
                .begin_transition()
                .map_err(|source| Error::Coordination {
                    operation: "begin writer transition",
                    sandbox_id: Some(id.clone()),
                    source,
                })?;
            let transport = self.current_transport(&id)?;
            let report = transport.recover(&recovery::RecoveryConfig {
                hermes_home: self.scope.profile_home.clone(),
                sandbox_id: id.clone(),
                host_only: self.config.host_only.clone(),
                max_snapshot_bytes: self.config.state_cap,
            })?;
            for warning in report.warnings() {
                tracing::warn!(sandbox_id = %id, "{warning}");
            }
            self.run_hook("initial push", &id, |t| {
                self.hooks.push(t, PushKind::Initial)
            })?;
            writer
                .complete_push(&id)
                .map_err(|source| Error::Coordination {
                    operation: "stamp prepared",
                    sandbox_id: Some(id.clone()),
                    source,
                })?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                attached.role = Role::Writer(writer);
                attached.info.role = RoleKind::Writer;
                Ok(())
            }
            Err(error) => {
                writer.release();
                attached.role = Role::Reader;
                attached.info.role = RoleKind::Reader;
                Err(error)
            }
        }
    }

    fn owner_push(&self, attached: &mut Attached) -> Result<(), Error> {
        let Role::Owner { pushed } = &mut attached.role else {
            return Ok(());
        };
        let (operation, kind) = if *pushed {
            ("sync", PushKind::Incremental)
        } else {
            ("initial push", PushKind::Initial)
        };
        let id = attached.id.as_str().to_owned();
        self.run_hook(operation, &id, |t| self.hooks.push(t, kind))?;
        *pushed = true;
        Ok(())
    }

    /// The per-command gates and sync.
    fn admit(&self, attached: &mut Attached) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        match &mut attached.role {
            Role::Probe | Role::External | Role::PendingWriter(_) => Ok(()),
            Role::Owner { .. } => self.owner_push(attached),
            Role::Reader => {
                let files = self.files.as_ref().ok_or_else(|| Error::InvalidConfig {
                    reason: "a reader without coordination files".to_owned(),
                })?;
                let role = files
                    .try_acquire_writer()
                    .map_err(|source| Error::Coordination {
                        operation: "acquire writer role",
                        sandbox_id: Some(id.clone()),
                        source,
                    })?;
                if let LeaseRole::Writer(writer) = role {
                    // Hand-off: a full recover-then-push (C4).
                    return self.bring_up(attached, writer);
                }
                match files.admission(&id) {
                    Admission::Admitted { .. } => Ok(()),
                    Admission::Refused(refusal) => {
                        if matches!(refusal, writer_lease::Refusal::OtherSandbox) {
                            attached.stale = true;
                        }
                        Err(Error::NotReady {
                            sandbox_id: Some(id),
                            reason: refusal.to_string(),
                            retry_hint: RETRY_HINT.to_owned(),
                        })
                    }
                }
            }
            Role::Writer(writer) => {
                let synced =
                    self.run_hook("sync", &id, |t| self.hooks.push(t, PushKind::Incremental));
                match synced {
                    Ok(()) => {
                        if writer.phase() == WriterPhase::Stale {
                            writer
                                .record_sync_success()
                                .map_err(|source| Error::Coordination {
                                    operation: "clear dirty marker",
                                    sandbox_id: Some(id.clone()),
                                    source,
                                })?;
                        }
                        Ok(())
                    }
                    Err(error) => {
                        if let Err(marker) = writer.record_sync_failure() {
                            tracing::warn!(sandbox_id = %id, "E2B mark scope dirty failed: {marker}");
                        }
                        Err(error)
                    }
                }
            }
        }
    }

    /// Makes sure the known expiry covers `max(baseline, deadline + grace)` (L5); when it does
    /// not, extends through an extend-only connect, asking for [`LEASE_HEADROOM`] more on a
    /// persistent sandbox. Never set-timeout.
    fn top_up_lease(&self, attached: &mut Attached, deadline: Duration) -> Result<(), Error> {
        let needed = self.policy.command_lease(deadline);
        let clock = &*self.services.clock;
        if attached.lease.covers(clock.now(), needed) {
            return Ok(());
        }
        let LeasePlan::Extend(request) = attached.lease.plan(clock, self.with_headroom(needed))
        else {
            return Ok(());
        };
        if matches!(self.config.api_key, ApiKeySource::Resolver(_)) {
            // Command reconnects use the key the profile has now, so a rotation takes effect;
            // the teardown transport keeps the attach-time client (the profile's secret scope
            // may be gone by then).
            attached.client = self.client()?;
        }
        bump(&self.stats.connects);
        bump(&self.stats.lease_extensions);
        let connected = self
            .block_on(attached.client.connect(&attached.id, request.timeout()))
            .map_err(|source| Error::e2b("connect", Some(attached.id.as_str()), source))?;
        attached.lease.confirm(&request);
        // A resumed sandbox may come back with new envd connection details.
        let sandbox = attached
            .client
            .sandbox(connected.sandbox.envd_access())
            .map_err(|source| Error::e2b("connect", Some(attached.id.as_str()), source))?;
        if let Some(transport) = &*self
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            transport.replace_sandbox(sandbox.clone());
        }
        attached.sandbox = sandbox;
        if connected.state == ConnectState::Resumed {
            attached.info.resumed = true;
        }
        Ok(())
    }

    /// The lease to ask for when `needed` is not covered. A persistent sandbox asks for
    /// [`LEASE_HEADROOM`] more, so the next commands are covered without a request.
    /// Ephemeral and probe sandboxes ask for exactly what they need: their on-timeout kill is
    /// the backstop for an abandoned session and should not fire later than that.
    fn with_headroom(&self, needed: Duration) -> Duration {
        match self.policy.kind {
            LeaseKind::Persistent => needed.saturating_add(LEASE_HEADROOM),
            LeaseKind::Ephemeral { .. } | LeaseKind::Probe => needed,
        }
    }

    /// The lease first (so a paused sandbox is resumed and a vanished one detected before any
    /// state work), then the gates and the sync, then the start.
    fn prepare_and_start(
        &self,
        attached: &mut Attached,
        command: &str,
        options: &RunOptions,
    ) -> Result<(e2b_client::ProcessStream, u32), Error> {
        self.prepare(attached, options.deadline)?;
        let start = self.start_options(command, options);
        match self.start(&attached.sandbox, start.clone()) {
            Err(error) if error.is_sandbox_gone() => {
                // Paused behind our back while the known lease still covered it: connect
                // resumes it; a sandbox that is really gone fails the connect.
                attached.lease.forget();
                self.top_up_lease(attached, options.deadline)?;
                self.start(&attached.sandbox, start)
            }
            other => other,
        }
    }

    /// Lease, then gates and sync, for an operation that may take `deadline`.
    fn prepare(&self, attached: &mut Attached, deadline: Duration) -> Result<(), Error> {
        self.top_up_lease(attached, deadline)?;
        if let Err(error) = self.admit(attached) {
            if error.is_state_failure() {
                // The sandbox may have paused or vanished under a lease we believed covered:
                // the next use reconnects first, which tells.
                attached.lease.forget();
            }
            return Err(error);
        }
        Ok(())
    }

    /// Lets the attached sandbox go without touching it: the writer role is released, the
    /// transport cleared; the next use attaches afresh and reports what it replaced.
    fn detach(&self, state: &mut Phase) {
        let Phase::Attached(attached) = std::mem::replace(state, Phase::Detached) else {
            return;
        };
        self.clear_transport();
        let id = attached.id.as_str().to_owned();
        tracing::warn!(sandbox_id = %id, "E2B sandbox {id} is gone or no longer prepared; the next use attaches afresh");
        *self.replaced.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
        // Dropping the attachment drops its writer lease, if any.
        drop(attached);
    }

    fn start_options(&self, command: &str, options: &RunOptions) -> StartOptions {
        let mut start = match options.shell {
            Shell::Login => StartOptions::shell(command.to_owned()),
            Shell::Plain => StartOptions::exec(
                "/bin/bash".to_owned(),
                vec!["-c".to_owned(), command.to_owned()],
            ),
        };
        start.cwd = Some(
            options
                .cwd
                .clone()
                .unwrap_or_else(|| self.config.cwd.clone()),
        );
        start.envs = options.env.clone();
        start
    }

    fn start(
        &self,
        sandbox: &Sandbox,
        options: StartOptions,
    ) -> Result<(e2b_client::ProcessStream, u32), Error> {
        self.block_on(async {
            let stream = sandbox.start(options).await?;
            let pid = stream.pid();
            Ok((stream, pid))
        })
        .map_err(|source| Error::e2b("start command", Some(sandbox.id().as_str()), source))
    }

    fn teardown(&self, attached: Attached) -> CleanupReport {
        let id = attached.id.as_str().to_owned();
        let pull = match &attached.role {
            Role::Writer(_) | Role::Owner { .. } => {
                match self.run_hook("pull", &id, |t| self.hooks.pull(t)) {
                    Ok(()) => PullOutcome::Pulled,
                    Err(error) => {
                        tracing::error!(sandbox_id = %id, "{error}");
                        PullOutcome::Failed(error.to_string())
                    }
                }
            }
            Role::PendingWriter(_) | Role::Reader | Role::Probe | Role::External => {
                PullOutcome::NotAttempted
            }
        };
        self.clear_transport();
        let Attached { client, role, .. } = attached;
        let sandbox = match role {
            Role::Writer(lease) | Role::PendingWriter(lease) => {
                lease.release();
                KillOutcomeReport::LeftRunning
            }
            Role::Reader | Role::External => KillOutcomeReport::LeftRunning,
            Role::Owner { .. } | Role::Probe => {
                bump(&self.stats.sandbox_kills);
                match self.block_on(client.kill(&attached.id)) {
                    Ok(KillOutcome::Killed) => KillOutcomeReport::Killed,
                    Ok(KillOutcome::NotFound) => KillOutcomeReport::AlreadyGone,
                    Err(error) => {
                        let error = Error::e2b("kill", Some(&id), error);
                        tracing::error!(sandbox_id = %id, "{error}");
                        KillOutcomeReport::Failed(error.to_string())
                    }
                }
            }
        };
        CleanupReport {
            sandbox_id: Some(id),
            repeated: false,
            pull,
            sandbox,
        }
    }
}

fn candidate(listed: &ListedSandbox) -> Candidate {
    Candidate {
        sandbox_id: listed.sandbox_id.as_str().to_owned(),
        template_id: listed.template_id.clone(),
        template_alias: listed.alias.clone(),
        metadata: listed.metadata.clone(),
        started_at: SystemTime::from(listed.started_at),
        state: match listed.state {
            e2b_client::SandboxState::Running => sandbox_identity::SandboxState::Running,
            e2b_client::SandboxState::Paused => sandbox_identity::SandboxState::Paused,
            _ => sandbox_identity::SandboxState::Other,
        },
    }
}
