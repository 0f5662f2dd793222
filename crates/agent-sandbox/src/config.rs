//! What a backend is built from: settings, the scope, and injected services.

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

/// Settings of one backend. Build with [`Config::new`] and adjust the public fields; there is
/// deliberately no `Default`.
#[derive(Clone, Debug)]
pub struct Config {
    /// E2B template name or id; part of the sandbox identity (contract I3).
    pub template: String,
    /// Starting directory of commands that name none.
    pub cwd: String,
    /// Where Hermes' state lives inside the sandbox (`/home/user/.hermes`).
    pub remote_hermes_home: String,
    /// Baseline lease (`lease_seconds`); extended per command, never shortened (L5).
    pub lease: Duration,
    /// Lease headroom beyond a command's own deadline (`command_grace_seconds`).
    pub command_grace: Duration,
    /// Egress policy; part of the identity (X6, I3).
    pub internet: InternetAccess,
    /// envd access-token protection; part of the identity (X6, I3).
    pub security: Security,
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
}

impl Config {
    /// Persistent mode on template `base`, cwd `/home/user`, state in `/home/user/.hermes`,
    /// a 300 s lease with 30 s command grace, internet allowed, secure, no extra metadata,
    /// E2B's public endpoints (`E2B_*` variables are not read here), a 2 GiB state cap.
    pub fn new(api_key: ApiKeySource) -> Config {
        Config {
            template: "base".to_owned(),
            cwd: "/home/user".to_owned(),
            remote_hermes_home: "/home/user/.hermes".to_owned(),
            lease: Duration::from_secs(300),
            command_grace: Duration::from_secs(30),
            internet: InternetAccess::Allowed,
            security: Security::Secure,
            metadata: BTreeMap::new(),
            mode: SandboxMode::Persistent,
            endpoints: Endpoints::e2b_cloud(),
            api_key,
            host_only: Vec::new(),
            state_cap: DEFAULT_STATE_CAP,
        }
    }
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

/// What the backend runs on: the tokio runtime its network work is driven by, and the clock
/// its lease decisions read. Injected so tests control time.
#[derive(Clone, Debug)]
pub struct Services {
    /// A multi-thread runtime. The backend's blocking methods call `Handle::block_on`, so they
    /// must be called from threads that are not driving async tasks.
    pub runtime: tokio::runtime::Handle,
    /// The monotonic clock for lease arithmetic.
    pub clock: Arc<dyn Clock>,
}

impl Services {
    /// `runtime` with the system clock.
    pub fn new(runtime: tokio::runtime::Handle) -> Services {
        Services {
            runtime,
            clock: Arc::new(SystemClock),
        }
    }
}
