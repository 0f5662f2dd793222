//! How a [`Server`](crate::Server) is started: [`ServerConfig`] and the
//! [`ApiKeyPolicy`] in it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::isolation::IsolationMode;

/// Which `X-API-Key` values the control plane accepts.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiKeyPolicy {
    /// Any non-empty key (the default for local use: the SDK insists on having one).
    AnyNonEmpty,
    /// Exactly this key; anything else gets 401.
    Exact(String),
}

impl fmt::Debug for ApiKeyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiKeyPolicy::AnyNonEmpty => f.write_str("AnyNonEmpty"),
            // The key itself never appears in Debug output.
            ApiKeyPolicy::Exact(_) => f.write_str("Exact(<redacted>)"),
        }
    }
}

/// How to start a [`Server`](crate::Server). Build it with [`ServerConfig::loopback`]
/// and adjust fields.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port (see
    /// [`Server::addr`](crate::Server::addr)).
    pub listen: SocketAddr,
    /// Which API keys the control plane accepts.
    pub api_key: ApiKeyPolicy,
    /// Where sandbox files and records live. `None`: a temporary directory removed on
    /// shutdown. With a directory, paused (and running) sandboxes survive a restart.
    pub state_dir: Option<PathBuf>,
    /// Template names that exist; must include `"base"`. Unknown templates get 404.
    pub templates: Vec<String>,
    /// The clock that drives leases; share a [`Clock::manual`] to control expiry.
    pub clock: Clock,
    /// How commands are isolated.
    pub isolation: IsolationMode,
    /// Latency added to every request from the start (a knob; `Duration::ZERO` for none).
    pub latency: Duration,
    /// How many sandboxes may run at once, like an E2B account's concurrency limit:
    /// a create or a resume past it is answered 429. `None`: no limit.
    pub max_running: Option<u32>,
    /// PEM files of extra roots trusted when e2b-local connects, for a sandbox's header
    /// rules (`network.rules`), to the real upstream (besides the host's trust store).
    pub upstream_ca: Vec<PathBuf>,
    /// Names every sandbox resolves to the given address, as `docker run --add-host`
    /// (commands in a mount namespace: their `/etc/hosts` gets these lines).
    pub add_hosts: Vec<(String, IpAddr)>,
    /// The Python the code interpreter's kernels run instead of the sandbox's `python3`
    /// (an absolute path): a venv with the libraries of E2B's `code-interpreter` template
    /// (numpy, pandas, matplotlib) gives cells those libraries. With a mount namespace it
    /// must lie outside `/home` and `/tmp`, which the namespace replaces. `None`: `python3`
    /// from the sandbox's `PATH`.
    pub kernel_python: Option<PathBuf>,
}

impl ServerConfig {
    /// 127.0.0.1 on a free port, any API key, a temporary state directory, template
    /// `base`, the system clock, automatic isolation, no latency, no running limit, the
    /// host's roots only and no added host.
    pub fn loopback() -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            api_key: ApiKeyPolicy::AnyNonEmpty,
            state_dir: None,
            templates: vec!["base".to_owned()],
            clock: Clock::system(),
            isolation: IsolationMode::Auto,
            latency: Duration::ZERO,
            max_running: None,
            upstream_ca: Vec::new(),
            add_hosts: Vec::new(),
            kernel_python: None,
        }
    }
}
