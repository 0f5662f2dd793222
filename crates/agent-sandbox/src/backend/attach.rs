//! Attaching: connect to a given sandbox, or find the scope's by metadata and adopt the
//! newest, or create one (only the writer, under the creation lock; or an ephemeral or probe
//! scope).

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use e2b_client::{
    Client, ConnectState, CreateOptions, ListQuery, ListedSandbox, OnTimeout, PauseMemory, Sandbox,
    SandboxId, StateFilter,
};
use futures::TryStreamExt;
use sandbox_identity::{Adoption, Candidate, ExtensionRequest, LeasePlan, LeaseTracker, SCOPE_KEY};
use writer_lease::{CreationAccess, Degradation, Role as LeaseRole, ScopeFiles, WriterLease};

use super::egress::EgressKnown;
use super::{Attached, Inner, RETRY_HINT, Role, TRANSFER_WINDOW, bump};
use crate::config::{CREATION_LOCK_WAIT, SandboxMode};
use crate::egress::EGRESS_KEY;
use crate::error::Error;
use crate::home::{HomeCache, HomeSlot, RemoteHome, SandboxHome};
use crate::note::NOTE_SANDBOX;
use crate::progress::{Meter, ProgressUnit};
use crate::report::{AttachInfo, Origin};
use crate::transport::{StateTransport, TransportParts};
use crate::warn_once;

impl Inner {
    pub(super) fn attach_new(&self) -> Result<Attached, Error> {
        let client = self.client()?;
        // Before any request that may resume or create (the early connect of a remembered
        // sandbox included), the process's own cap (L14).
        self.keep_under_cap();
        match &self.config.mode {
            SandboxMode::Attach { sandbox_id } => {
                // A fork this process just made needs no connect: its create's lease holds.
                let (sandbox, lease, resumed) = match self.made_fork(sandbox_id) {
                    Some((sandbox, lease)) => (sandbox, lease, false),
                    None => self.connect(&client, sandbox_id)?,
                };
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::External,
                    Origin::Connected,
                    resumed,
                    None,
                    EgressKnown::External,
                )
            }
            _ if self.scope.is_probe() => {
                let (sandbox, lease, egress) = self.create(&client, OnTimeout::Kill)?;
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::Probe,
                    Origin::Created,
                    false,
                    None,
                    egress,
                )
            }
            SandboxMode::Ephemeral { .. } => {
                let (sandbox, lease, egress) = self.create(&client, OnTimeout::Kill)?;
                self.attached(
                    client,
                    sandbox,
                    lease,
                    Role::Owner { pushed: false },
                    Origin::Created,
                    false,
                    None,
                    egress,
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
        let mut role = match role {
            LeaseRole::Writer(lease) => {
                if let Some(found) = lease.degradation() {
                    degradation = Some(found.to_string());
                    self.warn_degraded(found);
                }
                Role::PendingWriter(lease)
            }
            LeaseRole::Reader => Role::Reader,
        };
        let (sandbox, lease, origin, resumed, egress) = if let Role::PendingWriter(writer) =
            &mut role
        {
            self.find_or_create_under_lock(&client, files, writer)?
        } else {
            self.find_existing(&client, Retire::Nothing, || Ok(()))?
                .ok_or_else(|| Error::NotReady {
                // Only the writer creates (I6); a reader waits for it.
                sandbox_id: None,
                    reason: "no sandbox exists for this scope yet and another session holds the writer role".to_owned(),
                    retry_hint: RETRY_HINT.to_owned(),
                })?
        };
        self.attached(
            client,
            sandbox,
            lease,
            role,
            origin,
            resumed,
            degradation,
            egress,
        )
    }

    /// Once per process for each kind of degradation (C6), however many backends find it:
    /// the paths differ by scope (lock files), the cause is the host's.
    fn warn_degraded(&self, degradation: &Degradation) {
        if warn_once::first_time(&format!("degraded: {}", degradation.cause)) {
            tracing::warn!("{}", e2b_client::redact(&degradation.to_string()));
        }
    }

    /// Lists the scope's sandboxes and adopts the newest match, resuming it if paused.
    ///
    /// When this host remembers the scope's last sandbox, its connect is sent together with
    /// the list instead of after it. The list alone still decides (I3, I5): the early connect
    /// is used only when the list chose that very sandbox, and nothing is sent to a sandbox's
    /// envd before the list chose it. A connect only extends and resumes, so a wrong guess
    /// (a newer duplicate made elsewhere) costs that sandbox one lease of running time, and
    /// the chosen one is connected after the list as before.
    ///
    /// `during` runs on this thread while those requests are in flight (the writer's host-side
    /// transition); its failure is returned once they have answered.
    #[allow(clippy::type_complexity)]
    pub(super) fn find_existing(
        &self,
        client: &Client,
        retire: Retire,
        during: impl FnOnce() -> Result<(), Error>,
    ) -> Result<Option<Found>, Error> {
        let mut query = ListQuery::all();
        query.metadata = BTreeMap::from([(SCOPE_KEY.to_owned(), self.identity.digest().to_hex())]);
        query.state = StateFilter::Any;
        bump(&self.stats.lists);
        let list = client.list(query).try_collect::<Vec<ListedSandbox>>();
        let hint = self.last_sandbox_hint();
        let connect = hint
            .as_ref()
            .map(|hint| self.connect_async(client, hint, "connect"));
        let lookup = self.services.runtime.spawn(async move {
            match connect {
                Some(connect) => {
                    let (listed, connected) = futures::future::join(list, connect).await;
                    (listed, Some(connected))
                }
                None => (list.await, None),
            }
        });
        let done = during();
        let (listed, connected) = match self.block_on(lookup) {
            Ok(answers) => answers,
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => {
                return Err(Error::Io {
                    operation: "list sandboxes",
                    path: std::path::PathBuf::new(),
                    source: std::io::Error::other("the async runtime is shutting down"),
                });
            }
        };
        done?;
        let early = hint.zip(connected);
        let listed = listed.map_err(|source| Error::e2b("list sandboxes", None, source))?;
        let candidates: Vec<Candidate> = listed.iter().map(candidate).collect();
        if retire == Retire::Superseded {
            self.retire_superseded(client, &candidates);
        }
        let stamp_of = |id: &str| {
            listed
                .iter()
                .find(|listed| listed.sandbox_id.as_str() == id)
                .and_then(|listed| listed.metadata.get(EGRESS_KEY).cloned())
        };
        match sandbox_identity::choose(&self.identity, &candidates) {
            Adoption::Adopt {
                candidate,
                duplicates,
                ..
            } => {
                let cause = format!(
                    "duplicates {} {} {duplicates}",
                    self.identity.digest().to_hex(),
                    candidate.sandbox_id
                );
                if duplicates > 0 && warn_once::first_time(&cause) {
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
                let (sandbox, lease, resumed) = match early {
                    Some((hint, Ok(connected))) if hint == id => connected,
                    _ => self.connect(client, &id)?,
                };
                let stamp = stamp_of(id.as_str());
                Ok(Some((
                    sandbox,
                    lease,
                    Origin::Adopted { duplicates },
                    resumed,
                    EgressKnown::Stamped(stamp),
                )))
            }
            Adoption::Create { .. } | Adoption::NeverAdopt => Ok(None),
        }
    }

    /// Kills what `sandbox_identity::retirable` names: the scope's sandboxes another of its
    /// sandboxes replaces (a rollback or an adoption interrupted between its create and its
    /// kill, R5) and branches left beside an adopted branch (R6). Adoption already never
    /// chooses them; this stops their cost and keeps one adoptable sandbox. A failed kill is
    /// warned about and tried again at the next bring-up.
    fn retire_superseded(&self, client: &Client, candidates: &[Candidate]) {
        let retired: Vec<SandboxId> = sandbox_identity::retirable(&self.identity, candidates)
            .into_iter()
            .filter_map(|candidate| SandboxId::parse(candidate.sandbox_id.clone()))
            .collect();
        if retired.is_empty() {
            return;
        }
        let (killed, failed) = self.kill_all(client, &retired);
        for id in killed {
            tracing::warn!(sandbox_id = %id, "E2B sandbox {id} was replaced by an interrupted rollback or adoption, or is a fork branch left beside the adopted one; killed it (the checkpoint taken before keeps the state it started from)");
        }
        for (id, why) in failed {
            tracing::warn!(sandbox_id = %id, "E2B sandbox {id} was replaced by an interrupted rollback or adoption, or is a fork branch left beside the adopted one; its kill failed ({why}); the next bring-up tries again");
        }
    }

    /// The sandbox this scope last attached on this host (the scope note's hint), if any.
    /// A hint only: an unreadable or foreign value costs at most one connect the list then
    /// ignores.
    fn last_sandbox_hint(&self) -> Option<SandboxId> {
        let note = self.files.as_ref()?.note().ok().flatten()?;
        SandboxId::parse(note.get(NOTE_SANDBOX)?.to_owned())
    }

    /// The writer's lookup: the creation lock first, then one list, then a create if the list
    /// found nothing (I4, I6). Taking the lock before the list (not between two lists) costs
    /// no request: whoever held it before has finished creating, so one list sees its sandbox.
    ///
    /// The writer's transition (dirty marker, new generation, stamp removed) is written while
    /// the list is in flight: the gate lock, held since the role was taken, admits no reader
    /// until the transition began, and nothing is read from or written to any sandbox before
    /// the lookup has answered and the transition is complete (C3).
    fn find_or_create_under_lock(
        &self,
        client: &Client,
        files: &ScopeFiles,
        writer: &mut WriterLease,
    ) -> Result<Found, Error> {
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
                self.warn_degraded(&degradation);
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
        let transition = || {
            writer
                .begin_transition()
                .map(drop)
                .map_err(|source| Error::Coordination {
                    operation: "begin writer transition",
                    sandbox_id: None,
                    source,
                })
        };
        if let Some(found) = self.find_existing(client, Retire::Superseded, transition)? {
            return Ok(found);
        }
        let (sandbox, lease, egress) =
            self.create(client, OnTimeout::Pause(PauseMemory::Discard))?;
        Ok((sandbox, lease, Origin::Created, false, egress))
    }

    fn create(
        &self,
        client: &Client,
        on_timeout: OnTimeout,
    ) -> Result<(Sandbox, LeaseTracker, EgressKnown), Error> {
        let (mut lease, request) = self.opening_lease();
        let mut options = CreateOptions::new(self.config.template.clone());
        options.timeout = Some(Duration::from_secs(request.timeout_secs()));
        options.on_timeout = on_timeout;
        options.metadata =
            sandbox_identity::stamp_scope(&self.config.metadata, &self.identity).metadata;
        options.allow_internet_access = Some(matches!(
            self.config.internet,
            sandbox_identity::InternetAccess::Allowed
        ));
        // The policy travels with the create, so it holds before the sandbox's first
        // command, and its digest rides in the metadata adoption lists (X9).
        let egress = self.stamp_egress(&mut options)?;
        options.secure = Some(matches!(
            self.config.security,
            sandbox_identity::Security::Secure
        ));
        bump(&self.stats.creates);
        let meter = Meter::start(
            self.services.progress.clone(),
            "create",
            None,
            ProgressUnit::Steps,
            Some(1),
        );
        // A create refused for the account's limit pauses an idle sandbox of this process
        // and tries again, or waits a bounded time for a slot (L14).
        let info = self.within_limit("create", None, || {
            self.block_on(client.create(options.clone()))
                .map_err(|source| Error::e2b("create", None, source))
        })?;
        let mut meter = meter;
        meter.advance(1);
        meter.finish();
        lease.confirm(&request);
        let sandbox = client
            .sandbox(info.envd_access())
            .map_err(|source| Error::e2b("create", Some(info.sandbox_id.as_str()), source))?;
        Ok((sandbox, lease, EgressKnown::Created(egress)))
    }

    /// Connects with the baseline lease (extend-only; resumes a paused sandbox).
    fn connect(
        &self,
        client: &Client,
        id: &SandboxId,
    ) -> Result<(Sandbox, LeaseTracker, bool), Error> {
        // A resume refused for the account's limit pauses an idle sandbox of this process
        // and tries again, or waits a bounded time for a slot (L14).
        self.within_limit("connect", Some(id), || {
            self.block_on(self.connect_async(client, id, "connect"))
        })
    }

    /// [`connect`](Self::connect) as a future, to overlap with other requests; its errors
    /// name `operation`.
    pub(super) fn connect_async(
        &self,
        client: &Client,
        id: &SandboxId,
        operation: &'static str,
    ) -> impl std::future::Future<Output = Result<(Sandbox, LeaseTracker, bool), Error>> + use<>
    {
        let (mut lease, request) = self.opening_lease();
        bump(&self.stats.connects);
        let client = client.clone();
        let id = id.clone();
        async move {
            let connected = client
                .connect(&id, request.timeout())
                .await
                .map_err(|source| Error::e2b(operation, Some(id.as_str()), source))?;
            lease.confirm(&request);
            let sandbox = client
                .sandbox(connected.sandbox.envd_access())
                .map_err(|source| Error::e2b(operation, Some(id.as_str()), source))?;
            Ok((sandbox, lease, connected.state == ConnectState::Resumed))
        }
    }

    /// A new lease tracker and the extension that opens it (the baseline with headroom),
    /// for a sandbox about to be created or connected to.
    pub(super) fn opening_lease(&self) -> (LeaseTracker, ExtensionRequest) {
        let lease = LeaseTracker::new();
        let asked = self.with_headroom(self.policy.baseline());
        match lease.plan(&*self.services.clock, asked) {
            LeasePlan::Extend(request) => (lease, request),
            LeasePlan::Covered => unreachable!("a new tracker covers nothing"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attached(
        &self,
        client: Client,
        sandbox: Sandbox,
        lease: LeaseTracker,
        role: Role,
        origin: Origin,
        resumed: bool,
        degradation: Option<String>,
        egress: EgressKnown,
    ) -> Result<Attached, Error> {
        let id = sandbox.id().clone();
        // Before the home probe, the first request to the sandbox's envd (X9).
        let egress = self.egress_at_attach(&client, &id, egress)?;
        let home = self.sandbox_home(&sandbox);
        let transport = StateTransport::new(TransportParts {
            runtime: self.services.runtime.clone(),
            client: client.clone(),
            sandbox: sandbox.clone(),
            remote_home: RemoteHome::new(self.config.remote_hermes_home.clone(), Arc::clone(&home)),
            cap: self.config.state_cap,
            transfer_lease: self.policy.transfer_lease(TRANSFER_WINDOW),
            failures: Arc::clone(&self.handoff.failures),
            progress: self.services.progress.clone(),
            slots: self.me.clone(),
        });
        *self
            .handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(transport);
        let mut info = AttachInfo {
            sandbox_id: id.as_str().to_owned(),
            origin,
            resumed,
            role: role.kind(),
            degradation,
            replaced: self
                .handoff
                .replaced
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
            // Filled from the home once it is known (`settle_home`), before any caller sees it.
            home: SandboxHome {
                home: String::new(),
                user: String::new(),
            },
            remote_hermes_home: String::new(),
            default_cwd: String::new(),
        };
        if let Some(known) = home.peek() {
            self.fill_home(&mut info, known);
        }
        Ok(Attached {
            client,
            sandbox,
            id,
            lease,
            role,
            info,
            stale: false,
            fresh: matches!(origin, Origin::Created),
            grant: None,
            egress,
            stand_ins: std::collections::BTreeMap::new(),
            home,
            attached_at: self.services.clock.wall(),
            used: false,
            paused_for: None,
        })
    }

    /// What the attach report derives from the home: the state root and the default start
    /// directory (a configured one wins over the home, L13).
    pub(super) fn fill_home(&self, info: &mut AttachInfo, home: &SandboxHome) {
        info.remote_hermes_home = self
            .config
            .remote_hermes_home
            .clone()
            .unwrap_or_else(|| home.hermes_home());
        info.default_cwd = self.config.cwd.clone().unwrap_or_else(|| home.home.clone());
        info.home = home.clone();
    }

    /// Waits for the attachment's home if it is still being asked, and completes the attach
    /// report with it. A refused or failed probe fails the caller; it then lets the attachment
    /// go (`forget_attachment`), as an attach whose probe fails attaches nothing.
    pub(super) fn settle_home(&self, attached: &mut Attached) -> Result<(), Error> {
        if attached.home_settled() {
            return Ok(());
        }
        let home = Arc::clone(&attached.home);
        let known = home.wait_for_cause()?;
        self.fill_home(&mut attached.info, known);
        Ok(())
    }

    /// The sandbox's real home: from this host's cache of earlier answers for this sandbox
    /// id, else asked once (one start request, sent now and waited for by the first step that
    /// needs the answer) and cached. Only persistent scopes keep the cache, beside their
    /// coordination files: the probe scope and ephemeral sandboxes are never seen again, and
    /// attach mode touches no scope file (L12), so those ask each time they attach.
    fn sandbox_home(&self, sandbox: &Sandbox) -> Arc<HomeSlot> {
        let id = sandbox.id().as_str();
        let runtime = self.services.runtime.clone();
        let cache = self.files.as_ref().map(|files| HomeCache::new(files.dir()));
        if let Some(home) = self.fork_home() {
            return HomeSlot::known(id, runtime, home);
        }
        if let Some(home) = cache.as_ref().and_then(|cache| cache.get(id)) {
            return HomeSlot::known(id, runtime, home);
        }
        bump(&self.stats.home_probes);
        HomeSlot::ask(sandbox, runtime, cache)
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

/// What a lookup found: the sandbox, its lease, how it was found, whether it was resumed,
/// and what is known of its egress rules.
pub(super) type Found = (Sandbox, LeaseTracker, Origin, bool, EgressKnown);

/// Whether a lookup kills the scope's superseded sandboxes (the writer's, under the creation
/// lock) or leaves them (a reader's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Retire {
    Superseded,
    Nothing,
}
