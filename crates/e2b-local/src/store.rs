//! The sandbox registry and E2B's lifecycle state machine (running, paused, gone).
//!
//! Every operation first applies lease expiry against the injected clock (lazy
//! evaluation); a periodic sweep does the same for idle servers. At `endAt` a sandbox
//! with `autoPause` becomes paused, any other sandbox is killed (files deleted).
//!
//! A pause keeps the files, and as on E2B either the memory too (the default, and at
//! `endAt` unless created with `autoPauseMemory: false`: the processes are frozen, and
//! the resume thaws them, same boot) or the files only (the processes are killed, and the
//! resume is a fresh boot: a new process table with a new boot id). Memory does not
//! outlive the server: after a restart every sandbox boots afresh.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::clock::{Clock, nanos};
use crate::egress::NetworkRecord;
use crate::sandbox_log::{Level, SandboxLogs};

mod knobs;
mod list;
mod network;

pub(crate) use self::list::{Cursor, ListQuery};

use self::network::process_table;
use crate::process_table::ProcessTable;
use crate::reply::ApiError;
use crate::sandbox_ns::NsCapability;
use crate::token::EnvdToken;

/// The longest lease accepted (E2B's paid-tier maximum).
pub(crate) const MAX_TIMEOUT_SECS: i64 = 24 * 3600;

/// The client id E2B appends to legacy composite sandbox ids.
pub(crate) const CLIENT_ID: &str = "6532622b";

const RECORD_FILE: &str = "sandbox.json";

/// The file holding the sandbox's boot id, bound over `/proc/sys/kernel/random/boot_id`
/// for its commands (mount namespaces) and served for that path by `/files`.
const BOOT_ID_FILE: &str = "boot_id";

/// The two states a client can observe (anything else is "gone").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SbState {
    Running,
    Paused,
}

impl SbState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SbState::Running => "running",
            SbState::Paused => "paused",
        }
    }
}

/// Everything the control plane knows about one sandbox; persisted as JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) id: String,
    pub(crate) template: String,
    /// Creation order, the tie-breaker of list ordering (a manual clock gives equal times).
    pub(crate) seq: u64,
    /// Unix nanoseconds.
    pub(crate) started_at: u64,
    /// Unix nanoseconds: lease end while running, pause time while paused.
    pub(crate) end_at: u64,
    pub(crate) state: SbState,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) env_vars: BTreeMap<String, String>,
    pub(crate) auto_pause: bool,
    pub(crate) auto_pause_memory: bool,
    pub(crate) auto_resume: bool,
    pub(crate) allow_internet_access: Option<bool>,
    pub(crate) secure: bool,
    pub(crate) token: Option<EnvdToken>,
    /// Required on traffic to the sandbox's own ports (header `e2b-traffic-access-token`);
    /// made when it was created with `network.allowPublicTraffic: false`.
    #[serde(default)]
    pub(crate) traffic_token: Option<EnvdToken>,
    /// Set when the sandbox was created from a snapshot (or forked from such a sandbox).
    #[serde(default)]
    pub(crate) origin: Option<SnapshotOrigin>,
    /// The `network` config (egress rules) as created or last updated.
    #[serde(default)]
    pub(crate) network: Option<NetworkRecord>,
    /// The lease it was created with, in seconds: what a resume by traffic gives it
    /// (`None` for a record written before it was kept: E2B's default, 300).
    #[serde(default)]
    pub(crate) lease_secs: Option<i64>,
    /// The volumes mounted at create, in the order asked.
    #[serde(default)]
    pub(crate) volume_mounts: Vec<crate::volumes::VolumeMount>,
    /// The workload tokens its header rules may name (`iam.tokens`).
    #[serde(default)]
    pub(crate) iam_tokens: BTreeMap<String, crate::identity::IamToken>,
    /// The template build this sandbox runs the steps of ([`crate::builder`]): left out of
    /// the list, and its commands write to a root layer of their own
    /// ([`crate::root_layer`]), or see the host's system read-only where the host allows
    /// no layer.
    #[serde(default)]
    pub(crate) build_of: Option<String>,
    /// The user and working directory a request that names none gets (a built template's).
    #[serde(default)]
    pub(crate) defaults: Option<crate::builds::RunDefaults>,
}

/// Where a sandbox made from a snapshot comes from, for what E2B reports about it and for
/// the home its user has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotOrigin {
    /// The snapshot's alias, reported as the sandbox's `alias` (`None`: unnamed).
    pub(crate) alias: Option<String>,
    /// The built-in template the snapshotted files started from (decides the home).
    pub(crate) base_template: String,
}

/// E2B's default lease, for a record that does not say its own.
const DEFAULT_LEASE_SECS: i64 = 300;

impl Record {
    /// The sandbox's workload identity, when its create named tokens.
    pub(crate) fn workload(&self) -> Option<crate::identity::Workload> {
        (!self.iam_tokens.is_empty()).then(|| crate::identity::Workload {
            sandbox_id: self.id.clone(),
            tokens: self.iam_tokens.clone(),
        })
    }

    /// The `alias` E2B reports: the template's name, or the snapshot's when made from one.
    pub(crate) fn alias(&self) -> Option<&str> {
        match &self.origin {
            None => Some(&self.template),
            Some(origin) => origin.alias.as_deref(),
        }
    }

    /// The built-in template whose user and home the sandbox has.
    pub(crate) fn base_template(&self) -> &str {
        self.origin
            .as_ref()
            .map_or(&self.template, |origin| &origin.base_template)
    }
}

/// What a create request asks for, already validated.
#[derive(Debug)]
pub(crate) struct CreateParams {
    pub(crate) template: String,
    pub(crate) timeout_secs: i64,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) env_vars: BTreeMap<String, String>,
    pub(crate) auto_pause: bool,
    pub(crate) auto_pause_memory: bool,
    pub(crate) auto_resume: bool,
    pub(crate) allow_internet_access: Option<bool>,
    pub(crate) secure: bool,
    pub(crate) with_token: bool,
    /// Set when the sandbox starts from a snapshot.
    pub(crate) origin: Option<SnapshotOrigin>,
    pub(crate) network: Option<NetworkRecord>,
    /// A directory holding `home/` and `tmp/` to start from (a snapshot's), copied in.
    pub(crate) files_from: Option<PathBuf>,
    /// The volumes to mount, checked ([`crate::volumes::Volumes::mounts_for`]).
    pub(crate) volume_mounts: Vec<crate::volumes::VolumeMount>,
    /// The workload tokens, checked ([`crate::identity::check`]).
    pub(crate) iam_tokens: BTreeMap<String, crate::identity::IamToken>,
    /// The build it runs the steps of, when it is a build's sandbox.
    pub(crate) build_of: Option<String>,
    /// A built template's default user and working directory.
    pub(crate) defaults: Option<crate::builds::RunDefaults>,
}

/// What envd handlers need to serve a running sandbox.
#[derive(Clone, Debug)]
pub(crate) struct RunningSandbox {
    pub(crate) id: String,
    pub(crate) token: Option<EnvdToken>,
    pub(crate) traffic_token: Option<EnvdToken>,
    pub(crate) env_vars: BTreeMap<String, String>,
    pub(crate) home: PathBuf,
    /// What the sandbox calls that home (its template's, [`crate::paths::home_for_template`]).
    pub(crate) virt_home: &'static str,
    pub(crate) tmp: PathBuf,
    /// The file holding this boot's id ([`crate::paths::BOOT_ID`] in the sandbox).
    pub(crate) boot_id: PathBuf,
    pub(crate) procs: Arc<ProcessTable>,
    /// The volumes mounted into it, as its path mapping sees them.
    pub(crate) mounts: Arc<[crate::paths::Mount]>,
    /// The same volumes, as its commands' mount namespaces bind them.
    pub(crate) volumes: Arc<[crate::volumes::VolumeMount]>,
    /// How its commands see the host's system outside its areas.
    pub(crate) system: crate::isolation::SystemView,
    /// The user and working directory of a request that names none.
    pub(crate) defaults: Option<crate::builds::RunDefaults>,
}

impl RunningSandbox {
    /// Its writable areas, for mapping the paths a client names.
    pub(crate) fn fs(&self) -> crate::paths::SandboxFs<'_> {
        crate::paths::SandboxFs {
            home: &self.home,
            tmp: &self.tmp,
            virt_home: self.virt_home,
            mounts: &self.mounts,
        }
    }
}

/// A sandbox as a snapshot sees it (see [`Store::snapshot_source`]).
#[derive(Debug)]
pub(crate) struct SnapshotSource {
    pub(crate) record: Record,
    /// Holds `home/` and `tmp/`.
    pub(crate) dir: PathBuf,
    pub(crate) procs: Arc<ProcessTable>,
}

#[derive(Debug)]
struct Entry {
    record: Record,
    procs: Arc<ProcessTable>,
    /// The record's volume mounts, as its path mapping and its commands' namespaces use
    /// them: made once (a sandbox's mounts never change), handed to every request by
    /// [`Store::running`] without a copy.
    mounts: Arc<[crate::paths::Mount]>,
    volumes: Arc<[crate::volumes::VolumeMount]>,
}

impl Entry {
    fn new(record: Record, procs: Arc<ProcessTable>) -> Entry {
        let volumes: Arc<[crate::volumes::VolumeMount]> = record.volume_mounts.clone().into();
        Entry {
            mounts: volumes
                .iter()
                .map(crate::volumes::VolumeMount::mount)
                .collect(),
            volumes,
            record,
            procs,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    next_seq: u64,
    /// The concurrency limit (`None`: none). Kept beside the entries so that counting
    /// the running sandboxes and adding one happen under the same lock: of two
    /// concurrent creates for the last slot exactly one wins.
    max_running: Option<u32>,
}

impl Inner {
    fn running_count(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.record.state == SbState::Running)
            .count()
    }

    /// Refuses one more running sandbox when the limit is reached (E2B's 429).
    fn admit_one_more(&self) -> Result<(), ApiError> {
        match self.max_running {
            Some(max) if self.running_count() >= usize::try_from(max).unwrap_or(usize::MAX) => {
                Err(ApiError::concurrency_limit(max))
            }
            _ => Ok(()),
        }
    }
}

/// The registry. All state changes happen under one short-held mutex.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    clock: Clock,
    dir: PathBuf,
    /// uid/gid that owns sandbox homes (None: leave the server's own ownership).
    owner: Option<(u32, u32)>,
    /// The namespaces sandboxes get (per sandbox: see [`NsCapability::plan`]).
    ns: NsCapability,
    /// Why egress rules cannot be enforced here (`None`: they can).
    egress_unavailable: Option<String>,
    /// The event log of every sandbox seen since start (in memory only).
    pub(crate) logs: SandboxLogs,
}

fn secs_to_nanos(secs: i64) -> u64 {
    u64::try_from(secs.max(0))
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
}

/// Checks a sandbox id like E2B does (`^[a-z0-9]+$`, legacy `<id>-<clientID>` accepted).
/// A malformed id names no sandbox: 404, the answer the spec documents for every route
/// that takes one (400 is not among them).
pub(crate) fn parse_sandbox_id(raw: &str) -> Result<String, ApiError> {
    let id = raw.split_once('-').map_or(raw, |(id, _client)| id);
    let valid = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if valid {
        Ok(id.to_owned())
    } else {
        Err(ApiError::sandbox_not_found(raw))
    }
}

fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut id = String::with_capacity(21);
    id.push('i');
    for _ in 0..20 {
        id.push(char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]));
    }
    id
}

impl Store {
    /// Opens (or creates) `<state_dir>/sandboxes` and loads every persisted record.
    pub(crate) fn open(
        state_dir: &Path,
        clock: Clock,
        owner: Option<(u32, u32)>,
        ns: NsCapability,
        egress_unavailable: Option<String>,
    ) -> io::Result<Store> {
        let dir = state_dir.join("sandboxes");
        fs::create_dir_all(&dir)?;
        let logs = SandboxLogs::new(clock.clone());
        let store = Store {
            inner: Mutex::new(Inner::default()),
            clock,
            dir,
            owner,
            ns,
            egress_unavailable,
            logs,
        };
        let mut inner = Inner::default();
        for entry in fs::read_dir(&store.dir)? {
            let entry = entry?;
            let record_path = entry.path().join(RECORD_FILE);
            let Ok(text) = fs::read_to_string(&record_path) else {
                continue;
            };
            match serde_json::from_str::<Record>(&text) {
                // A build's sandbox goes with the server that ran the build: the build
                // (its steps, its status) lived in that server's memory.
                Ok(record) if record.build_of.is_some() => {
                    tracing::info!(sandbox_id = %record.id, "removing the sandbox of a build a restart cut off");
                    store.delete_files(&record.id);
                }
                Ok(record) => {
                    inner.next_seq = inner.next_seq.max(record.seq + 1);
                    // No process outlives a server: a running sandbox boots afresh, and a
                    // paused one, whatever its pause kept, resumes with a fresh boot.
                    let procs = store.boot(&record);
                    if record.state == SbState::Paused {
                        procs.close_and_kill();
                    }
                    inner
                        .entries
                        .insert(record.id.clone(), Entry::new(record, procs));
                }
                Err(error) => {
                    tracing::warn!(path = %record_path.display(), %error, "skipping unreadable sandbox record");
                }
            }
        }
        *store.lock() = inner;
        Ok(store)
    }

    /// A new boot of a sandbox: a process table with a new boot id, written where its
    /// commands and `/files` read it.
    fn boot(&self, record: &Record) -> Arc<ProcessTable> {
        let procs = Arc::new(process_table(
            record,
            self.ns,
            crate::root_layer::RootLayer::of_sandbox(&self.sandbox_dir(&record.id))
                .filter(|_| self.ns.layer)
                .map(Arc::new),
            self.egress_unavailable.is_none(),
            self.logs.of(&record.id),
        ));
        let path = self.boot_id_file(&record.id);
        // A new file (not the old one rewritten): a command of an earlier boot that
        // still had it bound would see its own id to the end.
        let tmp = path.with_extension("tmp");
        let _ = fs::remove_file(&tmp);
        let written = fs::write(&tmp, format!("{}\n", procs.boot_id()))
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&tmp, fs::Permissions::from_mode(0o444))
            })
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(error) = written {
            tracing::warn!(sandbox_id = %record.id, %error, "writing the sandbox's boot id failed");
        }
        procs
    }

    /// Sets (or with `None` lifts) the limit on running sandboxes. Sandboxes already
    /// running above a lowered limit keep running; only new ones are refused.
    pub(crate) fn set_max_running(&self, max_running: Option<u32>) {
        self.lock().max_running = max_running;
    }

    /// The limit on running sandboxes and how many run now.
    pub(crate) fn running_limit(&self) -> (Option<u32>, usize) {
        self.sweep();
        let inner = self.lock();
        (inner.max_running, inner.running_count())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The host directory a sandbox sees as its home.
    pub(crate) fn home_dir(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("home")
    }

    /// The host directory a sandbox sees as `/tmp`.
    pub(crate) fn tmp_dir(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join("tmp")
    }

    /// The host file holding a sandbox's boot id.
    fn boot_id_file(&self, id: &str) -> PathBuf {
        self.sandbox_dir(id).join(BOOT_ID_FILE)
    }

    fn persist(&self, record: &Record) {
        let path = self.sandbox_dir(&record.id).join(RECORD_FILE);
        let tmp = path.with_extension("json.tmp");
        let result = serde_json::to_vec_pretty(record)
            .map_err(io::Error::other)
            .and_then(|bytes| {
                // Owner-only: a record can hold secrets (network.rules header values).
                use std::io::Write as _;
                use std::os::unix::fs::OpenOptionsExt as _;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                file.write_all(&bytes)
            })
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(error) = result {
            tracing::warn!(sandbox_id = %record.id, %error, "persisting sandbox record failed");
        }
    }

    fn delete_files(&self, id: &str) {
        let dir = self.sandbox_dir(id);
        if let Err(error) = fs::remove_dir_all(&dir)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(sandbox_id = %id, %error, "deleting sandbox files failed");
        }
    }

    /// Applies lease expiry to every sandbox whose `endAt` has passed.
    pub(crate) fn sweep(&self) {
        let now = nanos(self.clock.now());
        let mut killed = Vec::new();
        {
            let mut inner = self.lock();
            let expired: Vec<String> = inner
                .entries
                .values()
                .filter(|e| e.record.state == SbState::Running && e.record.end_at <= now)
                .map(|e| e.record.id.clone())
                .collect();
            for id in expired {
                let Some(entry) = inner.entries.get_mut(&id) else {
                    continue;
                };
                if entry.record.auto_pause {
                    tracing::info!(sandbox_id = %id, memory = entry.record.auto_pause_memory, "lease expired: pausing");
                    if entry.record.auto_pause_memory {
                        entry.procs.freeze();
                    } else {
                        entry.procs.close_and_kill();
                    }
                    entry.record.state = SbState::Paused;
                    entry.record.end_at = now;
                    let record = entry.record.clone();
                    self.persist(&record);
                } else {
                    tracing::info!(sandbox_id = %id, "lease expired: killing");
                    entry.procs.close_and_kill();
                    inner.entries.remove(&id);
                    killed.push(id);
                }
            }
        }
        for id in killed {
            self.delete_files(&id);
        }
    }

    pub(crate) fn create(&self, params: CreateParams) -> Result<Record, ApiError> {
        self.sweep();
        // Early answer before copying files; the check that counts is the one below,
        // made under the lock that adds the sandbox.
        self.lock().admit_one_more()?;
        let now = nanos(self.clock.now());
        let id = new_sandbox_id();
        let home = self.home_dir(&id);
        let tmp = self.tmp_dir(&id);
        let made = match &params.files_from {
            None => self.make_dirs(&home, &tmp),
            Some(files) => fs::create_dir_all(self.sandbox_dir(&id))
                .and_then(|()| crate::tree_copy::copy_tree(&files.join("home"), &home))
                .and_then(|_| crate::tree_copy::copy_tree(&files.join("tmp"), &tmp))
                .and_then(|_| crate::root_layer::copy_layer(files, &self.sandbox_dir(&id)))
                .map(|_| ()),
        };
        // A build's steps get a layer of their own to install into (the files it starts
        // from may have brought one already).
        let made = made.and_then(|()| match params.build_of {
            Some(_) if self.ns.layer => {
                let dir = self.sandbox_dir(&id);
                match crate::root_layer::RootLayer::of_sandbox(&dir) {
                    Some(_) => Ok(()),
                    None => crate::root_layer::RootLayer::create_empty(&dir).map(|_| ()),
                }
            }
            _ => Ok(()),
        });
        let virt_home = crate::paths::home_for_template(
            params
                .origin
                .as_ref()
                .map_or(&params.template, |origin| &origin.base_template),
        );
        let made = made.and_then(|()| {
            params
                .volume_mounts
                .iter()
                .try_for_each(|mount| mount.make_point(&home, &tmp, virt_home, self.owner))
        });
        if let Err(e) = made {
            self.delete_files(&id);
            return Err(ApiError::internal(format!(
                "creating sandbox {id} files failed: {e}"
            )));
        }
        let mut inner = self.lock();
        if let Err(refused) = inner.admit_one_more() {
            drop(inner);
            self.delete_files(&id);
            return Err(refused);
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let record = Record {
            id: id.clone(),
            template: params.template,
            seq,
            started_at: now,
            end_at: now.saturating_add(secs_to_nanos(params.timeout_secs)),
            state: SbState::Running,
            metadata: params.metadata,
            env_vars: params.env_vars,
            auto_pause: params.auto_pause,
            auto_pause_memory: params.auto_pause_memory,
            auto_resume: params.auto_resume,
            allow_internet_access: params.allow_internet_access,
            secure: params.secure,
            token: params.with_token.then(EnvdToken::generate),
            traffic_token: params
                .network
                .as_ref()
                .is_some_and(|network| network.allow_public_traffic == Some(false))
                .then(EnvdToken::generate),
            origin: params.origin,
            network: params.network,
            lease_secs: Some(params.timeout_secs),
            volume_mounts: params.volume_mounts,
            iam_tokens: params.iam_tokens,
            build_of: params.build_of,
            defaults: params.defaults,
        };
        self.persist(&record);
        inner
            .entries
            .insert(id.clone(), Entry::new(record.clone(), self.boot(&record)));
        self.logs.of(&id).push(
            Level::Info,
            "sandbox created",
            &[("templateID", record.template.clone())],
        );
        Ok(record)
    }

    fn make_dirs(&self, home: &Path, tmp: &Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(home)?;
        fs::create_dir_all(tmp)?;
        fs::set_permissions(tmp, fs::Permissions::from_mode(0o1777))?;
        fs::set_permissions(home, fs::Permissions::from_mode(0o755))?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(home, Some(uid), Some(gid))?;
        }
        Ok(())
    }

    pub(crate) fn get(&self, id: &str) -> Result<Record, ApiError> {
        self.sweep();
        self.lock()
            .entries
            .get(id)
            .map(|e| e.record.clone())
            .ok_or_else(|| ApiError::sandbox_not_found(id))
    }

    /// Extend-only connect; resumes a paused sandbox (thawing its processes when its pause
    /// kept them and `memory` asks for them, else booting it afresh). Returns the record and
    /// whether it resumed.
    pub(crate) fn connect(
        &self,
        id: &str,
        timeout_secs: i64,
        memory: bool,
    ) -> Result<(Record, bool), ApiError> {
        self.sweep();
        let now = nanos(self.clock.now());
        let wanted_end = now.saturating_add(secs_to_nanos(timeout_secs));
        let mut inner = self.lock();
        let state = inner
            .entries
            .get(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?
            .record
            .state;
        // A resume takes a slot like a create; a running sandbox is never refused.
        if state == SbState::Paused {
            inner.admit_one_more()?;
        }
        let entry = inner
            .entries
            .get_mut(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        let resumed = match entry.record.state {
            SbState::Running => {
                entry.record.end_at = entry.record.end_at.max(wanted_end);
                false
            }
            SbState::Paused => {
                entry.record.state = SbState::Running;
                entry.record.end_at = wanted_end;
                if memory && entry.procs.is_frozen() {
                    entry.procs.thaw();
                } else {
                    // The memory left behind, as E2B's resume from disk ignores it.
                    entry.procs.close_and_kill();
                    entry.procs = self.boot(&entry.record);
                }
                self.logs.of(id).push(Level::Info, "sandbox resumed", &[]);
                true
            }
        };
        let record = entry.record.clone();
        self.persist(&record);
        Ok((record, resumed))
    }

    /// Resumes a paused sandbox created with `autoResume` that traffic reached (a request
    /// to its envd or one of its ports), with its memory and the lease it was created with,
    /// as E2B's proxy wakes it; `true` when it resumed. Nothing happens to any other sandbox.
    pub(crate) fn wake_on_traffic(&self, id: &str) -> bool {
        // No sweep first: this runs on every envd request, and a sandbox paused by a lease
        // that just ran out is woken by the request after the sweep that pauses it.
        let lease = {
            let inner = self.lock();
            match inner.entries.get(id) {
                Some(entry)
                    if entry.record.state == SbState::Paused && entry.record.auto_resume =>
                {
                    entry.record.lease_secs.unwrap_or(DEFAULT_LEASE_SECS)
                }
                _ => return false,
            }
        };
        match self.connect(id, lease, true) {
            Ok((_, resumed)) => {
                if resumed {
                    self.logs
                        .of(id)
                        .push(Level::Info, "sandbox resumed by traffic", &[]);
                }
                resumed
            }
            Err(refused) => {
                tracing::debug!(sandbox_id = %id, error = %refused.message, "auto-resume refused");
                false
            }
        }
    }

    /// Overwrites the lease of a running sandbox (may shorten).
    pub(crate) fn set_timeout(&self, id: &str, timeout_secs: i64) -> Result<(), ApiError> {
        self.sweep();
        let now = nanos(self.clock.now());
        {
            let mut inner = self.lock();
            let entry = inner
                .entries
                .get_mut(id)
                .filter(|e| e.record.state == SbState::Running)
                .ok_or_else(|| ApiError::sandbox_not_found(id))?;
            entry.record.end_at = now.saturating_add(secs_to_nanos(timeout_secs));
            let record = entry.record.clone();
            self.persist(&record);
        }
        // A zero timeout expires right away.
        self.sweep();
        Ok(())
    }

    /// Pauses a running sandbox: with `memory` its processes are frozen for the resume to
    /// thaw (E2B's default), else they are killed and the resume boots it afresh (E2B's
    /// `memory: false`, a filesystem-only snapshot). 409 when it is paused already.
    pub(crate) fn pause(&self, id: &str, memory: bool) -> Result<(), ApiError> {
        self.sweep();
        let now = nanos(self.clock.now());
        let mut inner = self.lock();
        let entry = inner
            .entries
            .get_mut(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        if entry.record.state == SbState::Paused {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Error pausing sandbox - sandbox '{id}' is already paused"),
            ));
        }
        if memory {
            entry.procs.freeze();
        } else {
            entry.procs.close_and_kill();
        }
        entry.record.state = SbState::Paused;
        entry.record.end_at = now;
        let record = entry.record.clone();
        self.persist(&record);
        self.logs.of(id).push(Level::Info, "sandbox paused", &[]);
        Ok(())
    }

    pub(crate) fn kill(&self, id: &str) -> Result<(), ApiError> {
        self.sweep();
        let entry = self
            .lock()
            .entries
            .remove(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        entry.procs.close_and_kill();
        self.delete_files(id);
        self.logs.of(id).push(Level::Info, "sandbox killed", &[]);
        Ok(())
    }

    /// The envd view of a sandbox, only while it is running.
    pub(crate) fn running(&self, id: &str) -> Option<RunningSandbox> {
        self.sweep();
        let inner = self.lock();
        let entry = inner.entries.get(id)?;
        (entry.record.state == SbState::Running).then(|| RunningSandbox {
            id: id.to_owned(),
            token: entry.record.token.clone(),
            traffic_token: entry.record.traffic_token.clone(),
            env_vars: entry.record.env_vars.clone(),
            home: self.home_dir(id),
            virt_home: crate::paths::home_for_template(entry.record.base_template()),
            tmp: self.tmp_dir(id),
            boot_id: self.boot_id_file(id),
            procs: Arc::clone(&entry.procs),
            mounts: Arc::clone(&entry.mounts),
            volumes: Arc::clone(&entry.volumes),
            system: match entry.procs.layer() {
                Some(layer) => crate::isolation::SystemView::Layered(Arc::clone(layer)),
                None if entry.record.build_of.is_some() => crate::isolation::SystemView::ReadOnly,
                None => crate::isolation::SystemView::Shared,
            },
            defaults: entry.record.defaults.clone(),
        })
    }

    /// Every running sandbox (for locating pre-signed `/files` URLs).
    pub(crate) fn running_ids(&self) -> Vec<String> {
        self.sweep();
        self.lock()
            .entries
            .values()
            .filter(|e| e.record.state == SbState::Running)
            .map(|e| e.record.id.clone())
            .collect()
    }

    /// What a snapshot of a running sandbox needs: its record, its file areas and its
    /// processes (to hold them still during the copy). A missing sandbox is a 404; the
    /// caller decides what a paused one answers.
    pub(crate) fn snapshot_source(&self, id: &str) -> Result<SnapshotSource, ApiError> {
        self.sweep();
        let inner = self.lock();
        let entry = inner
            .entries
            .get(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        Ok(SnapshotSource {
            record: entry.record.clone(),
            dir: self.sandbox_dir(id),
            procs: Arc::clone(&entry.procs),
        })
    }
}
