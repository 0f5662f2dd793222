//! Client configuration: where E2B is, how long a request may take, how to retry.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::ids::SandboxId;
use crate::redact::redact;
use crate::secret::ApiKey;

/// E2B's public domain, the default when neither the caller nor `E2B_DOMAIN` names one.
pub const DEFAULT_DOMAIN: &str = "e2b.app";

/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;

/// The port the code interpreter (E2B's `code-interpreter` template's Jupyter service)
/// listens on inside a sandbox.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// Domains served by E2B's shared sandbox host `sandbox.<domain>`, which routes by headers.
const SHARED_HOST_DOMAINS: [&str; 7] = [
    "e2b.app",
    "e2b.dev",
    "e2b.pro",
    "e2b-staging.dev",
    "e2b-tango.dev",
    "e2b-juliett.dev",
    "foxtrot-2.e2b.dev",
];

/// How to reach E2B. Build it with [`Config::new`] or [`Config::from_env`], then adjust the
/// public fields; there is deliberately no `Default`.
#[derive(Clone)]
pub struct Config {
    /// The API key, sent as `X-API-Key` on control-plane requests only.
    pub api_key: ApiKey,
    /// The E2B domain (`e2b.app`); gives `https://api.<domain>` and the sandbox hosts.
    pub domain: String,
    /// Overrides the control-plane base URL (like `E2B_API_URL`).
    pub api_url: Option<String>,
    /// Overrides the envd base URL for every sandbox (like `E2B_SANDBOX_URL`).
    pub sandbox_url: Option<String>,
    /// Overrides the base URL of the volume content API (like `E2B_VOLUME_API_URL`); `None`:
    /// `https://api.<domain>`, the volume's cluster domain when E2B names one.
    pub volume_api_url: Option<String>,
    /// The longest any single request may take, retries included. Streams (command output,
    /// downloads) are bounded by it while waiting for the response and then per silent gap.
    pub request_deadline: Duration,
    /// When and how often to retry.
    pub retry: RetryPolicy,
    /// Caps on what the client will buffer from a server.
    pub limits: Limits,
    /// An HTTP(S) proxy every request goes through (`http://[user:pass@]host:port`), as the
    /// official SDK's `proxy`; `None` uses the environment's (`HTTPS_PROXY`, `HTTP_PROXY`,
    /// `ALL_PROXY`, `NO_PROXY`) as reqwest reads them.
    pub proxy: Option<String>,
    /// Extra headers on every control-plane request (the SDK's `api_headers`): a gateway's
    /// own authentication, tracing. They cannot replace `X-API-Key`.
    pub api_headers: std::collections::BTreeMap<String, String>,
}

impl Config {
    /// E2B's public cloud (`e2b.app`), a 60 s request deadline (the official SDK's), the
    /// standard retry policy and standard limits. The environment is not read.
    pub fn new(api_key: ApiKey) -> Config {
        Config {
            api_key,
            domain: DEFAULT_DOMAIN.to_owned(),
            api_url: None,
            sandbox_url: None,
            volume_api_url: None,
            request_deadline: Duration::from_secs(60),
            retry: RetryPolicy::standard(),
            limits: Limits::standard(),
            proxy: None,
            api_headers: std::collections::BTreeMap::new(),
        }
    }

    /// Like [`Config::new`], then applies `E2B_DOMAIN`, `E2B_API_URL` and `E2B_SANDBOX_URL` from
    /// the process environment as the official SDK does (empty values count as unset). The key
    /// is the caller's: it is never read from the environment here.
    pub fn from_env(api_key: ApiKey) -> Config {
        Config::from_lookup(api_key, &|name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] with an injected variable lookup (for tests and for hosts that keep
    /// settings elsewhere).
    pub fn from_lookup(api_key: ApiKey, lookup: &dyn Fn(&str) -> Option<String>) -> Config {
        let var = |name: &str| lookup(name).filter(|value| !value.is_empty());
        let mut config = Config::new(api_key);
        if let Some(domain) = var("E2B_DOMAIN") {
            config.domain = domain;
        }
        config.api_url = var("E2B_API_URL");
        config.sandbox_url = var("E2B_SANDBOX_URL");
        config.volume_api_url = var("E2B_VOLUME_API_URL");
        config
    }

    /// The control-plane base URL: `api_url`, else `https://api.<domain>`.
    pub fn api_base_url(&self) -> String {
        match &self.api_url {
            Some(url) => url.clone(),
            None => format!("https://api.{}", self.domain),
        }
    }

    /// The volume content API's base URL, decided like the official SDK: `volume_api_url`
    /// verbatim if set, else `https://api.<domain>` with the volume's cluster domain (E2B's
    /// answer names one for a BYOC cluster) or ours.
    pub fn volume_base_url(&self, volume_domain: Option<&str>) -> String {
        match &self.volume_api_url {
            Some(url) => url.clone(),
            None => format!(
                "https://api.{}",
                volume_domain
                    .filter(|d| !d.is_empty())
                    .unwrap_or(&self.domain)
            ),
        }
    }

    /// The envd base URL for a sandbox, decided like the official SDK:
    /// `sandbox_url` verbatim if set; else the sandbox's domain (or ours) picks the shared host
    /// `https://sandbox.<domain>` for E2B's own domains and `https://49983-<id>.<domain>`
    /// otherwise.
    pub fn envd_base_url(&self, sandbox_id: &SandboxId, sandbox_domain: Option<&str>) -> String {
        self.port_base_url(sandbox_id, sandbox_domain, ENVD_PORT)
    }

    /// The base URL for requests to `port` of a sandbox carrying the `E2b-Sandbox-Id` and
    /// `E2b-Sandbox-Port` headers, decided as [`Config::envd_base_url`] is (the official SDK's
    /// `get_sandbox_url`): the code interpreter's requests go here with port 49999.
    pub fn port_base_url(
        &self,
        sandbox_id: &SandboxId,
        sandbox_domain: Option<&str>,
        port: u16,
    ) -> String {
        if let Some(url) = &self.sandbox_url {
            return url.clone();
        }
        let domain = self.domain_of(sandbox_domain);
        if SHARED_HOST_DOMAINS.contains(&domain) {
            format!("https://sandbox.{domain}")
        } else {
            format!("https://{port}-{sandbox_id}.{domain}")
        }
    }

    /// The host a sandbox's `port` is reached at from outside, as the official SDK's
    /// `get_host(port)`: `<port>-<id>.<domain>`. Open `https://` on it (a browser, a
    /// WebSocket) to see what the sandbox serves there; a sandbox created with public traffic
    /// off wants its traffic access token in the `e2b-traffic-access-token` header.
    pub fn sandbox_host(
        &self,
        sandbox_id: &SandboxId,
        sandbox_domain: Option<&str>,
        port: u16,
    ) -> String {
        format!("{port}-{sandbox_id}.{}", self.domain_of(sandbox_domain))
    }

    fn domain_of<'a>(&'a self, sandbox_domain: Option<&'a str>) -> &'a str {
        sandbox_domain
            .filter(|domain| !domain.is_empty())
            .unwrap_or(&self.domain)
    }
}

impl Config {
    /// The sandbox's own envd address, as the SDK's `envd_direct_url`: `sandbox_url`
    /// verbatim if set, else `https://49983-<id>.<domain>` (even on E2B's own domains, whose
    /// shared host needs headers a plain URL cannot carry). Signed file URLs use it.
    pub fn envd_direct_url(&self, sandbox_id: &SandboxId, sandbox_domain: Option<&str>) -> String {
        if let Some(url) = &self.sandbox_url {
            return url.clone();
        }
        format!(
            "https://{}",
            self.sandbox_host(sandbox_id, sandbox_domain, ENVD_PORT)
        )
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may carry credentials (user:pass@), so they go through the redaction pass.
        f.debug_struct("Config")
            .field("api_key", &self.api_key)
            .field("domain", &self.domain)
            .field("api_url", &self.api_url.as_deref().map(redact))
            .field("sandbox_url", &self.sandbox_url.as_deref().map(redact))
            .field("request_deadline", &self.request_deadline)
            .field("retry", &self.retry)
            .field("limits", &self.limits)
            .field("proxy", &self.proxy.as_deref().map(redact))
            .field("api_headers", &self.api_headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// When to retry a failed request, and how long to wait.
///
/// Retried: connection failures, and responses 429/502/503/504 unless the server says
/// `Should-Retry: false` (`Should-Retry: true` makes any status retryable). Requests that are
/// not idempotent (creating a sandbox, starting a process, moving a file) are retried only when
/// the connection could not be established, so they never run twice. Waits follow `Retry-After`
/// when present, else exponential backoff; both are clamped to `max_backoff` and to the
/// request deadline.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Retries after the first attempt (the official SDK uses 3).
    pub max_retries: u32,
    /// The first backoff; it doubles per retry.
    pub initial_backoff: Duration,
    /// No wait, including a server's `Retry-After`, is longer than this.
    pub max_backoff: Duration,
    /// Spreads retries of many clients apart.
    pub jitter: Jitter,
}

impl RetryPolicy {
    /// 3 retries, 100 ms doubling to at most 10 s, random jitter (the official SDK's numbers).
    pub fn standard() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            jitter: Jitter::Random,
        }
    }

    /// Never retry.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_retries: 0,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            jitter: Jitter::None,
        }
    }
}

/// The source of backoff jitter. A wait is `backoff/2 + fraction * backoff/2`.
#[derive(Clone, Debug)]
pub enum Jitter {
    /// No jitter: always the full backoff (deterministic).
    None,
    /// A fresh random fraction per wait.
    Random,
    /// Fractions from the caller (tests, simulations).
    Source(Arc<dyn JitterSource>),
}

impl Jitter {
    /// A fraction in `[0, 1]`.
    pub(crate) fn fraction(&self) -> f64 {
        let raw = match self {
            Jitter::None => 1.0,
            Jitter::Random => rand::random::<f64>(),
            Jitter::Source(source) => source.next_fraction(),
        };
        if raw.is_nan() {
            0.0
        } else {
            raw.clamp(0.0, 1.0)
        }
    }
}

/// Supplies jitter fractions; values outside `[0, 1]` are clamped.
pub trait JitterSource: Send + Sync + fmt::Debug {
    /// The next fraction.
    fn next_fraction(&self) -> f64;
}

/// Caps on what the client buffers from a server, so a hostile or broken server cannot make it
/// allocate without bound.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest Connect stream frame accepted; a larger length prefix is a protocol error before
    /// any of it is buffered.
    pub max_frame_bytes: usize,
    /// Largest JSON response body (control plane and unary envd calls).
    pub max_json_bytes: usize,
}

impl Limits {
    /// 4 MiB frames (envd sends at most 32 KiB of output per frame), 32 MiB JSON bodies.
    pub fn standard() -> Limits {
        Limits {
            max_frame_bytes: 4 << 20,
            max_json_bytes: 32 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn key() -> ApiKey {
        ApiKey::new("e2b_test_key_0123456789".to_owned())
    }

    fn id() -> SandboxId {
        SandboxId::parse("ikk8xw53nne4bytcdg87t".to_owned()).expect("valid id")
    }

    #[test]
    fn the_volume_api_is_the_variable_or_the_volumes_own_domain() {
        let config = Config::new(key());
        assert_eq!(config.volume_base_url(None), "https://api.e2b.app");
        assert_eq!(
            config.volume_base_url(Some("byoc.example")),
            "https://api.byoc.example"
        );
        let vars = HashMap::from([("E2B_VOLUME_API_URL", "http://127.0.0.1:9")]);
        let config = Config::from_lookup(key(), &|name| vars.get(name).map(|v| (*v).to_owned()));
        assert_eq!(
            config.volume_base_url(Some("byoc.example")),
            "http://127.0.0.1:9"
        );
    }

    #[test]
    fn defaults_point_at_e2b_cloud() {
        let config = Config::new(key());
        assert_eq!(config.api_base_url(), "https://api.e2b.app");
        assert_eq!(config.envd_base_url(&id(), None), "https://sandbox.e2b.app");
    }

    #[test]
    fn environment_overrides_like_the_sdk() {
        let vars: HashMap<&str, &str> = [
            ("E2B_DOMAIN", "example.org"),
            ("E2B_API_URL", ""),
            ("E2B_SANDBOX_URL", ""),
        ]
        .into();
        let lookup = |name: &str| vars.get(name).map(|v| (*v).to_owned());
        let config = Config::from_lookup(key(), &lookup);
        assert_eq!(config.domain, "example.org");
        // Empty values count as unset.
        assert_eq!(config.api_base_url(), "https://api.example.org");
        assert_eq!(
            config.envd_base_url(&id(), None),
            "https://49983-ikk8xw53nne4bytcdg87t.example.org"
        );

        let vars: HashMap<&str, &str> = [
            ("E2B_API_URL", "http://127.0.0.1:3000"),
            ("E2B_SANDBOX_URL", "http://127.0.0.1:3001"),
        ]
        .into();
        let lookup = |name: &str| vars.get(name).map(|v| (*v).to_owned());
        let config = Config::from_lookup(key(), &lookup);
        assert_eq!(config.domain, "e2b.app");
        assert_eq!(config.api_base_url(), "http://127.0.0.1:3000");
        assert_eq!(
            config.envd_base_url(&id(), Some("other.dev")),
            "http://127.0.0.1:3001"
        );
    }

    #[test]
    fn a_ports_url_and_host_are_decided_like_the_sdks_get_sandbox_url_and_get_host() {
        let config = Config::new(key());
        // E2B's own domains route every port by headers on one host.
        assert_eq!(
            config.port_base_url(&id(), None, CODE_INTERPRETER_PORT),
            "https://sandbox.e2b.app"
        );
        assert_eq!(
            config.port_base_url(&id(), Some("other.dev"), CODE_INTERPRETER_PORT),
            "https://49999-ikk8xw53nne4bytcdg87t.other.dev"
        );
        assert_eq!(
            config.sandbox_host(&id(), None, 3000),
            "3000-ikk8xw53nne4bytcdg87t.e2b.app"
        );
        assert_eq!(
            config.sandbox_host(&id(), Some(""), 8080),
            "8080-ikk8xw53nne4bytcdg87t.e2b.app"
        );
        let mut local = Config::new(key());
        local.sandbox_url = Some("http://127.0.0.1:3001".to_owned());
        assert_eq!(
            local.port_base_url(&id(), None, CODE_INTERPRETER_PORT),
            "http://127.0.0.1:3001"
        );
    }

    #[test]
    fn direct_urls_name_the_sandbox_even_on_shared_host_domains() {
        let config = Config::new(key());
        assert_eq!(
            config.envd_direct_url(&id(), None),
            "https://49983-ikk8xw53nne4bytcdg87t.e2b.app"
        );
        assert_eq!(
            config.envd_direct_url(&id(), Some("other.dev")),
            "https://49983-ikk8xw53nne4bytcdg87t.other.dev"
        );
        let mut local = Config::new(key());
        local.sandbox_url = Some("http://127.0.0.1:3001".to_owned());
        assert_eq!(
            local.envd_direct_url(&id(), Some("other.dev")),
            "http://127.0.0.1:3001"
        );
    }

    #[test]
    fn envd_url_decision_follows_the_sandbox_domain() {
        let config = Config::new(key());
        for shared in SHARED_HOST_DOMAINS {
            assert_eq!(
                config.envd_base_url(&id(), Some(shared)),
                format!("https://sandbox.{shared}")
            );
        }
        assert_eq!(
            config.envd_base_url(&id(), Some("self-hosted.example")),
            "https://49983-ikk8xw53nne4bytcdg87t.self-hosted.example"
        );
        // An empty domain from the server falls back to ours.
        assert_eq!(
            config.envd_base_url(&id(), Some("")),
            "https://sandbox.e2b.app"
        );
    }

    #[test]
    fn debug_hides_key_and_url_credentials() {
        // contract: X1
        let mut config = Config::new(key());
        config.api_url = Some("https://admin:hunter22@api.example.org".to_owned());
        let shown = format!("{config:?}");
        assert!(!shown.contains("0123456789"), "{shown}");
        assert!(!shown.contains("hunter22"), "{shown}");
    }

    #[test]
    fn jitter_fractions_are_clamped() {
        #[derive(Debug)]
        struct Fixed(f64);
        impl JitterSource for Fixed {
            fn next_fraction(&self) -> f64 {
                self.0
            }
        }
        assert_eq!(Jitter::Source(Arc::new(Fixed(7.0))).fraction(), 1.0);
        assert_eq!(Jitter::Source(Arc::new(Fixed(-1.0))).fraction(), 0.0);
        assert_eq!(Jitter::Source(Arc::new(Fixed(f64::NAN))).fraction(), 0.0);
        assert_eq!(Jitter::None.fraction(), 1.0);
        let random = Jitter::Random.fraction();
        assert!((0.0..=1.0).contains(&random));
    }
}
