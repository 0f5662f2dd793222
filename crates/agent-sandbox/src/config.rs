//! What a backend is built from: settings, the scope, and injected services.
//!
//! [`Config::new`] is where every default is written. A framework binding names its own
//! user-facing settings (keys, descriptions, where a value comes from) and reads the defaults
//! it shows out of a fresh `Config`, so no default is written twice.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use e2b_client::{ApiKey, SandboxId};
use sandbox_identity::{Clock, InternetAccess, Security, SystemClock};

/// The task id Hermes' prompt builder uses for its throwaway backend probe (contract L11).
pub const PROBE_TASK_ID: &str = "prompt-backend-probe";

/// The default cap on the teardown pull and on the recovery snapshot: 2 GiB (contract S12).
pub const DEFAULT_STATE_CAP: u64 = state_sync::DEFAULT_MAX_BYTES;

/// How long a writer waits for another process's creation lock before giving up.
pub const CREATION_LOCK_WAIT: Duration = Duration::from_secs(120);

/// The home of E2B's own templates' user. Only a placeholder for places that must name a
/// path before any sandbox exists (a framework's static hints); the backend itself always
/// uses the home the sandbox reports ([`crate::SandboxHome`]).
pub const E2B_DEFAULT_HOME: &str = "/home/user";

/// The E2B template used when none is configured.
pub const DEFAULT_TEMPLATE: &str = "base";

/// The baseline lease when neither the setting nor the agent's idle lifetime gives one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// Lease headroom beyond a command's deadline when none is configured.
pub const DEFAULT_COMMAND_GRACE: Duration = Duration::from_secs(30);

/// How long past its own time a call may wait for the sandbox before the watchdog ends it
/// ([`Backend::within`](crate::Backend::within), O7), when none is configured.
pub const DEFAULT_WATCHDOG_GRACE: Duration = Duration::from_secs(45);

/// How long a create or resume refused for the account's limit of concurrently running
/// sandboxes waits for a slot when no sandbox of this process can be paused for it (L14),
/// when none is configured. Below the watchdog's grace, so the limit's own error, not the
/// watchdog's, ends such a call.
pub const DEFAULT_SLOT_WAIT: Duration = Duration::from_secs(30);

/// Egress policy when none is configured.
pub const DEFAULT_INTERNET: InternetAccess = InternetAccess::Allowed;

/// envd access-token protection when none is configured.
pub const DEFAULT_SECURITY: Security = Security::Secure;

/// Settings of one backend. Build with [`Config::new`] and adjust the public fields; there is
/// deliberately no `Default`.
#[derive(Clone, Debug)]
pub struct Config {
    /// E2B template name or id; part of the sandbox identity (contract I3).
    pub template: String,
    /// Starting directory of commands that name none; `None`: the sandbox user's home, as
    /// the sandbox reports it at attach.
    pub cwd: Option<String>,
    /// Where Hermes' state lives inside the sandbox; `None`: `<home>/.hermes` under the
    /// sandbox user's reported home.
    pub remote_hermes_home: Option<String>,
    /// Baseline lease (`lease_seconds`); extended per command, never shortened (L5).
    pub lease: Duration,
    /// Lease headroom beyond a command's own deadline (`command_grace_seconds`).
    pub command_grace: Duration,
    /// How long past its own time a call may wait for the sandbox before the watchdog ends
    /// it (`watchdog_grace_seconds`, O7).
    pub watchdog_grace: Duration,
    /// At most this many sandboxes of the process's [`Fleet`](crate::Fleet) run at once
    /// (`max_running`): before this scope creates or resumes one, the fleet's sandbox idle
    /// longest is paused while that many others run (L14). `None`: only E2B's own limit.
    pub max_running: Option<u32>,
    /// How long a create or resume refused for the account's limit waits for a slot when
    /// no sandbox of the process can be paused (`slot_wait_seconds`, L14).
    pub slot_wait: Duration,
    /// A quiet scope's sandbox is paused this long after its last command or file operation,
    /// whatever lease that command's deadline asked for (`pause_after_idle_seconds`, L17):
    /// off the command path, by the fleet's watcher. `None` leaves it to the lease.
    pub pause_after_idle: Option<Duration>,
    /// Egress policy; part of the identity (X6, I3).
    pub internet: InternetAccess,
    /// envd access-token protection; part of the identity (X6, I3).
    pub security: Security,
    /// Allowed and denied destinations beyond `internet` (X9, X10). Not part of the
    /// identity: a sandbox whose rules differ is adopted and updated live, once.
    pub egress: crate::egress::EgressPolicy,
    /// Variables whose real value E2B's egress adds as a header for their hosts, while the
    /// sandbox's commands see a stand-in (X16). Not part of the identity, like `egress`.
    pub credentials: crate::credentials::Credentials,
    /// The SOCKS5 proxy every allowed TCP connection of the sandbox goes through (X23), its
    /// password resolved like a credential's value; `None`: direct.
    pub egress_proxy: Option<crate::egress::EgressProxySetting>,
    /// Where the credentials' values are kept for E2B's egress (X22): E2B Secrets, with a
    /// placeholder in each sandbox's rules, or the rules themselves.
    pub credential_store: crate::secret_store::CredentialStore,
    /// Extra metadata stamped on created sandboxes; identity keys always win.
    pub metadata: BTreeMap<String, String>,
    /// Persistent, ephemeral, or attached to an externally owned sandbox.
    pub mode: SandboxMode,
    /// Where E2B is.
    pub endpoints: Endpoints,
    /// Where the API key comes from; resolved on first use, never at construction (L1).
    pub api_key: ApiKeySource,
    /// Host paths recovery never writes from sandbox data (credential files, `config.yaml`,
    /// `.env`, `platforms/`, the mirrored cache trees), absolute or relative to the profile
    /// home (contract S9).
    pub host_only: Vec<PathBuf>,
    /// Cap in bytes on the teardown pull and the recovery snapshot, enforced while streaming.
    pub state_cap: u64,
    /// Who arbitrates the writer role between hosts (`writer_arbitration`).
    pub writer_arbitration: WriterArbitration,
    /// The host coordination directory (writer lock, markers, host id); `None` is
    /// `<profile home>/cache/e2b`. Hosts that share a profile directory but not a kernel
    /// (tests that stand in for two machines) set one each.
    pub coordination_dir: Option<PathBuf>,
    /// Directories outside the sandbox user's home whose changes come back from a delegated
    /// child's fork like the home's (`subagent_paths`: `/workspace`, `/srv`), absolute.
    pub subagent_paths: Vec<String>,
    /// Who reads a command's output: [`CommandReads::OwnThread`] unless set otherwise.
    pub command_reads: CommandReads,
}

/// Who reads a command's output off the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandReads {
    /// The thread that forwards it (the caller waiting, or a pump thread) sends the start
    /// and reads the answer on a connection of its own, blocking
    /// ([`e2b_client::Sandbox::start_blocking`]): no thread hand-overs, a fraction of the
    /// CPU. Only where envd is plain HTTP without a proxy (e2b-local); elsewhere, as
    /// [`CommandReads::Runtime`].
    OwnThread,
    /// The async runtime's connection task reads it and hands it to the forwarding thread
    /// ([`e2b_client::Sandbox::start`]): the path for E2B's cloud (HTTPS).
    Runtime,
}

/// Who arbitrates the writer role of a persistent scope (`writer_arbitration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterArbitration {
    /// The host lock alone (`host`): one writer per scope per host (contract C1).
    Host,
    /// The host lock, then a record inside the sandbox (`sandbox`): one writer per scope
    /// across every host that serves the profile, fenced by generation (contracts C8–C11).
    Sandbox {
        /// How long a grant lasts without renewal; another host can take over after it.
        term: Duration,
    },
}

impl WriterArbitration {
    /// The setting's value: `host` or `sandbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            WriterArbitration::Host => "host",
            WriterArbitration::Sandbox { .. } => "sandbox",
        }
    }

    /// Parses the setting's value, with the default term for `sandbox`.
    pub fn parse(value: &str) -> Option<WriterArbitration> {
        match value {
            "host" => Some(WriterArbitration::Host),
            "sandbox" => Some(WriterArbitration::Sandbox {
                term: crate::arbitration::DEFAULT_WRITER_TERM,
            }),
            _ => None,
        }
    }
}

impl Config {
    /// Persistent mode on template `base`, cwd and state root following the sandbox user's
    /// real home (`<home>` and `<home>/.hermes`), a 300 s lease with 30 s command grace,
    /// a 45 s watchdog grace, no process cap on running sandboxes and a 30 s wait for a
    /// slot under the account's limit, no pause when quiet (the lease ends it), internet allowed, secure, no egress rules, no credentials (kept in E2B Secrets where offered), no extra metadata, no directories outside the home for subagents' work, E2B's public endpoints
    /// (`E2B_*` variables are not read here), a 2 GiB state cap. (The values are the
    /// `DEFAULT_*` constants.)
    pub fn new(api_key: ApiKeySource) -> Config {
        Config {
            template: DEFAULT_TEMPLATE.to_owned(),
            cwd: None,
            remote_hermes_home: None,
            lease: DEFAULT_LEASE,
            command_grace: DEFAULT_COMMAND_GRACE,
            watchdog_grace: DEFAULT_WATCHDOG_GRACE,
            max_running: None,
            slot_wait: DEFAULT_SLOT_WAIT,
            pause_after_idle: None,
            internet: DEFAULT_INTERNET,
            security: DEFAULT_SECURITY,
            egress: crate::egress::EgressPolicy::none(),
            credentials: crate::credentials::Credentials::none(),
            egress_proxy: None,
            credential_store: crate::secret_store::CredentialStore::Auto,
            metadata: BTreeMap::new(),
            mode: SandboxMode::Persistent,
            endpoints: Endpoints::e2b_cloud(),
            api_key,
            host_only: Vec::new(),
            state_cap: DEFAULT_STATE_CAP,
            writer_arbitration: WriterArbitration::Host,
            coordination_dir: None,
            subagent_paths: Vec::new(),
            command_reads: CommandReads::OwnThread,
        }
    }
}

impl Config {
    /// An E2B client for these settings; the key is resolved now (first use, L1).
    pub(crate) fn client(&self) -> Result<e2b_client::Client, crate::error::Error> {
        build_client(self.client_config()?)
    }

    /// [`Config::client`] whose every request must end within `deadline` (a check that must
    /// answer quickly).
    pub(crate) fn client_with_deadline(
        &self,
        deadline: Duration,
    ) -> Result<e2b_client::Client, crate::error::Error> {
        let mut config = self.client_config()?;
        config.request_deadline = deadline;
        build_client(config)
    }

    /// The control-plane URL these settings reach (credentials in it redacted).
    pub(crate) fn api_url(&self) -> Result<String, crate::error::Error> {
        Ok(e2b_client::redact(&self.client_config()?.api_base_url()))
    }

    /// The coordination directory for `profile_home`: the configured one, else
    /// `<profile home>/cache/e2b`.
    pub(crate) fn coordination_dir_for(&self, profile_home: &std::path::Path) -> PathBuf {
        self.coordination_dir
            .clone()
            .unwrap_or_else(|| profile_home.join("cache").join("e2b"))
    }

    /// The process's credential store of `profile_home` on these settings' endpoint.
    pub(crate) fn secret_store(
        &self,
        profile_home: &std::path::Path,
    ) -> Result<std::sync::Arc<crate::secret_store::ProfileStore>, crate::error::Error> {
        let dir = self.coordination_dir_for(profile_home);
        Ok(crate::secret_store::profile_store(
            &self.api_url()?,
            profile_home,
            Some(dir.as_path()),
        ))
    }

    pub(crate) fn client_config(&self) -> Result<e2b_client::Config, crate::error::Error> {
        let key = self
            .api_key
            .resolve()
            .ok_or(crate::error::Error::MissingApiKey)?;
        let mut config = e2b_client::Config::new(key);
        let endpoints = &self.endpoints;
        if let Some(domain) = &endpoints.domain {
            config.domain = domain.clone();
        }
        config.api_url = endpoints.api_url.clone();
        config.sandbox_url = endpoints.sandbox_url.clone();
        Ok(config)
    }
}

fn build_client(config: e2b_client::Config) -> Result<e2b_client::Client, crate::error::Error> {
    e2b_client::Client::new(config)
        .map_err(|source| crate::error::Error::e2b("configure client", None, source))
}

/// The sandbox lifecycle a backend manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxMode {
    /// One sandbox per scope, found again by metadata, paused by E2B at lease expiry and
    /// never paused or killed by the backend (L2, L3).
    Persistent,
    /// A fresh sandbox per backend, never adopted, killed at cleanup (L4).
    Ephemeral {
        /// Hermes' idle lifetime (`terminal.lifetime_seconds`); the lease never goes below it
        /// plus one reaper interval plus one control-plane request (L4).
        lifetime: Duration,
    },
    /// An externally owned sandbox, connected to by id; never paused or killed, no state
    /// protocol (L12).
    Attach {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
}

/// Where E2B is; `None` fields use E2B's public cloud.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// The E2B domain (`E2B_DOMAIN`).
    pub domain: Option<String>,
    /// The control-plane URL (`E2B_API_URL`).
    pub api_url: Option<String>,
    /// The envd URL (`E2B_SANDBOX_URL`).
    pub sandbox_url: Option<String>,
}

impl Endpoints {
    /// E2B's public cloud.
    pub fn e2b_cloud() -> Endpoints {
        Endpoints {
            domain: None,
            api_url: None,
            sandbox_url: None,
        }
    }

    /// One URL for both the control plane and envd, as e2b-local serves them.
    pub fn single(url: String) -> Endpoints {
        Endpoints {
            domain: None,
            api_url: Some(url.clone()),
            sandbox_url: Some(url),
        }
    }
}

/// A resolver for the API key, consulted on first use.
pub type KeyResolver = Arc<dyn Fn() -> Option<ApiKey> + Send + Sync>;

/// Where the API key comes from. It stays on the host: only e2b-client's headers carry it
/// (contract X1).
#[derive(Clone)]
pub enum ApiKeySource {
    /// This key.
    Key(ApiKey),
    /// Ask this function on first use (Hermes: the profile-aware secret lookup). `None` means
    /// unconfigured; there is no fallback to the process environment (X2).
    Resolver(KeyResolver),
}

impl fmt::Debug for ApiKeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiKeySource::Key(key) => f.debug_tuple("Key").field(key).finish(),
            ApiKeySource::Resolver(_) => f.write_str("Resolver(..)"),
        }
    }
}

impl ApiKeySource {
    pub(crate) fn resolve(&self) -> Option<ApiKey> {
        match self {
            ApiKeySource::Key(key) => Some(key.clone()),
            ApiKeySource::Resolver(resolve) => resolve(),
        }
    }
}

/// Which Hermes scope a backend serves: what Hermes already resolved for its environment
/// cache (contract I2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The profile home (`~/.hermes` or a profile's home). Coordination files live in its
    /// `cache/e2b/`, recovered files land under it.
    pub profile_home: PathBuf,
    /// Hermes' resolved container key (`default`, `session:<key>`, a task id, or
    /// [`PROBE_TASK_ID`]).
    pub task_id: String,
}

impl Scope {
    /// Whether this is the prompt probe's scope (L11).
    pub fn is_probe(&self) -> bool {
        self.task_id == PROBE_TASK_ID
    }
}

/// What the backend runs on: the tokio runtime its network work is driven by, the clock its
/// lease decisions read, and the fleet it shares the account's limit with. Injected so tests
/// control time; clone one `Services` for every backend of a process so they share a fleet.
#[derive(Clone, Debug)]
pub struct Services {
    /// A multi-thread runtime. The backend's blocking methods call `Handle::block_on`, so they
    /// must be called from threads that are not driving async tasks.
    pub runtime: tokio::runtime::Handle,
    /// The monotonic clock for lease arithmetic.
    pub clock: Arc<dyn Clock>,
    /// Told how long transfers and creation progress (a CLI draws a bar); `None` leaves the
    /// INFO log line every few seconds as the only report.
    pub progress: Option<crate::progress::ProgressObserver>,
    /// The backends this one shares the account's limit of concurrently running sandboxes
    /// with: a create or resume refused for it may pause another member's idle sandbox (L14).
    pub fleet: crate::fleet::Fleet,
    /// Where credential stand-ins' randomness comes from (X16).
    pub random: Arc<dyn crate::stand_in::RandomSource>,
}

impl Services {
    /// `runtime` with the system clock and a fleet of its own (shared by clones).
    pub fn new(runtime: tokio::runtime::Handle) -> Services {
        Services {
            runtime,
            clock: Arc::new(SystemClock),
            progress: None,
            fleet: crate::fleet::Fleet::new(),
            random: Arc::new(crate::stand_in::SystemRandom),
        }
    }
}
