//! A sandbox's network: egress rules at create, replaced live with
//! [`Client::update_network`], and read back from [`Client::get`](crate::Client::get).

use std::collections::{BTreeMap, BTreeSet};

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::Client;
use crate::error::{Error, Operation};
use crate::ids::SandboxId;
use crate::json;
use crate::retry::Idempotency;
use crate::secret::SecretValue;

/// Every IPv4 destination (`0.0.0.0/0`), E2B's `ALL_TRAFFIC`: `deny_out: [ALL_TRAFFIC]` blocks
/// everything that `allow_out` does not allow.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// Which destinations a sandbox may reach. Each entry is a CIDR block (`10.0.0.0/8`), a bare
/// IP address, or (in `allow_out` only) a domain name (`example.com`, `*.example.com`), which
/// E2B matches by the HTTP `Host` header on port 80 and the TLS SNI on port 443. A destination
/// is blocked when a `deny_out` entry covers it and no `allow_out` entry does: allow beats
/// deny, and with no `deny_out` everything is reachable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRules {
    /// Destinations allowed even when `deny_out` covers them.
    pub allow_out: Vec<String>,
    /// Destinations blocked unless allowed (no domain names: E2B refuses them here).
    pub deny_out: Vec<String>,
}

impl EgressRules {
    /// No rule: every destination is reachable (E2B's default).
    pub fn unrestricted() -> EgressRules {
        EgressRules {
            allow_out: Vec::new(),
            deny_out: Vec::new(),
        }
    }

    /// Only `allow_out` is reachable: everything else is denied ([`ALL_TRAFFIC`]).
    pub fn only(allow_out: Vec<String>) -> EgressRules {
        EgressRules {
            allow_out,
            deny_out: vec![ALL_TRAFFIC.to_owned()],
        }
    }

    /// Whether both allow and deny the same destinations, whatever the order or repetitions
    /// of their entries (domain names compared without case): what decides whether a
    /// sandbox's rules need an update.
    pub fn same_as(&self, other: &EgressRules) -> bool {
        fn set(entries: &[String]) -> BTreeSet<String> {
            entries
                .iter()
                .map(|e| e.trim().to_ascii_lowercase())
                .collect()
        }
        set(&self.allow_out) == set(&other.allow_out) && set(&self.deny_out) == set(&other.deny_out)
    }
}

/// One rule for a domain (E2B's `SandboxNetworkRule`): the headers E2B's egress proxy sets,
/// replacing any of the same name, on the sandbox's HTTP and HTTPS requests to that domain
/// (`{"transform": {"headers": {...}}}` on the wire). The values are secrets: `Debug` never
/// shows them, and errors about a request carrying them have them removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderTransform {
    /// Header name to value.
    pub headers: BTreeMap<String, SecretValue>,
}

/// Per-domain transform rules (E2B's `rules`): an exact DNS name or `*.`-wildcard to its
/// rules (E2B takes one per domain).
pub type TransformRules = BTreeMap<String, Vec<HeaderTransform>>;

/// A SOCKS5 proxy the sandbox's allowed TCP egress is tunnelled through (E2B's
/// `egressProxy`). The password is a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressProxy {
    /// `host:port`.
    pub address: String,
    /// RFC 1929 user name, if any.
    pub username: Option<String>,
    /// RFC 1929 password, if any.
    pub password: Option<SecretValue>,
}

/// Everything `PUT /sandboxes/{id}/network` replaces: E2B clears every field an update
/// omits, so an update carries the whole policy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkUpdate {
    /// Outbound traffic rules.
    pub egress: EgressRules,
    /// Per-domain header transforms; empty clears them.
    pub rules: TransformRules,
    /// The SOCKS5 egress proxy; `None` clears it.
    pub egress_proxy: Option<EgressProxy>,
    /// The DNS servers the sandbox resolves with (`dnsServers`); empty resets E2B's default.
    pub dns_servers: Vec<String>,
    /// `Some(false)` cuts the sandbox off the internet (deny-all egress but what
    /// `egress.allow_out` allows), `Some(true)` opens it (`allow_internet_access`); `None`
    /// sends nothing, which E2B's replace reads as its default (open).
    pub allow_internet_access: Option<bool>,
}

impl NetworkUpdate {
    /// These egress rules, no transforms, no proxy, E2B's DNS servers.
    pub fn new(egress: EgressRules) -> NetworkUpdate {
        NetworkUpdate {
            egress,
            rules: TransformRules::new(),
            egress_proxy: None,
            dns_servers: Vec::new(),
            allow_internet_access: None,
        }
    }
}

/// Every secret value in `rules` and `proxy`, for scrubbing error text.
fn secrets_of(rules: &TransformRules, proxy: Option<&EgressProxy>) -> Vec<SecretValue> {
    rules
        .values()
        .flatten()
        .flat_map(|rule| rule.headers.values().cloned())
        .chain(proxy.and_then(|proxy| proxy.password.clone()))
        .collect()
}

/// A sandbox's network configuration (E2B's `SandboxNetworkConfig`): its egress rules plus
/// the settings of its public URLs. Start from [`NetworkConfig::new`]; there is no `Default`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkConfig {
    /// Outbound traffic rules.
    pub egress: EgressRules,
    /// `Some(false)`: the sandbox's public URLs need its traffic access token; `None` leaves
    /// E2B's default (public).
    pub allow_public_traffic: Option<bool>,
    /// The host the sandbox's public URLs are served under (`${PORT}` is replaced), when set.
    pub mask_request_host: Option<String>,
    /// Per-domain header transforms (values are secrets).
    pub rules: TransformRules,
    /// The SOCKS5 egress proxy, if any.
    pub egress_proxy: Option<EgressProxy>,
    /// The DNS servers the sandbox resolves with (`dnsServers`, reachable whatever the egress
    /// rules say); empty: E2B's default.
    pub dns_servers: Vec<String>,
    /// Ports of the sandbox E2B's proxy reaches over HTTPS instead of HTTP (`httpsPorts`:
    /// servers in the sandbox that terminate TLS themselves); empty: none.
    pub https_ports: Vec<u16>,
}

impl NetworkConfig {
    /// These egress rules, with E2B's defaults for the public URLs and DNS.
    pub fn new(egress: EgressRules) -> NetworkConfig {
        NetworkConfig {
            egress,
            allow_public_traffic: None,
            mask_request_host: None,
            rules: TransformRules::new(),
            egress_proxy: None,
            dns_servers: Vec::new(),
            https_ports: Vec::new(),
        }
    }

    /// The secret values this configuration carries, for scrubbing error text.
    pub(super) fn secrets(&self) -> Vec<SecretValue> {
        secrets_of(&self.rules, self.egress_proxy.as_ref())
    }
}

/// `SandboxNetworkRule` on the wire.
#[derive(Serialize, Deserialize)]
struct RuleWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transform: Option<TransformWire>,
}

/// `SandboxNetworkTransform` on the wire.
#[derive(Serialize, Deserialize)]
struct TransformWire {
    #[serde(default, deserialize_with = "json::null_default")]
    headers: BTreeMap<String, String>,
}

/// `SandboxEgressProxyConfig` on the wire.
#[derive(Serialize, Deserialize)]
struct ProxyWire {
    address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    password: Option<String>,
}

fn rules_to_wire(rules: &TransformRules) -> BTreeMap<String, Vec<RuleWire>> {
    rules
        .iter()
        .map(|(domain, list)| {
            let list = list
                .iter()
                .map(|rule| RuleWire {
                    transform: Some(TransformWire {
                        headers: rule
                            .headers
                            .iter()
                            .map(|(name, value)| (name.clone(), value.expose().to_owned()))
                            .collect(),
                    }),
                })
                .collect();
            (domain.clone(), list)
        })
        .collect()
}

fn rules_from_wire(wire: BTreeMap<String, Vec<RuleWire>>) -> TransformRules {
    wire.into_iter()
        .map(|(domain, list)| {
            let list = list
                .into_iter()
                .map(|rule| HeaderTransform {
                    headers: rule
                        .transform
                        .map(|transform| transform.headers)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(name, value)| (name, SecretValue::new(value)))
                        .collect(),
                })
                .collect();
            (domain, list)
        })
        .collect()
}

fn proxy_to_wire(proxy: &EgressProxy) -> ProxyWire {
    ProxyWire {
        address: proxy.address.clone(),
        username: proxy.username.clone(),
        password: proxy
            .password
            .as_ref()
            .map(|password| password.expose().to_owned()),
    }
}

fn proxy_from_wire(wire: ProxyWire) -> EgressProxy {
    EgressProxy {
        address: wire.address,
        username: wire.username,
        password: wire.password.map(SecretValue::new),
    }
}

/// `SandboxNetworkConfig` as create sends it and get answers it.
#[derive(Serialize, Deserialize)]
pub(super) struct NetworkWire {
    #[serde(
        rename = "allowOut",
        alias = "allow_out",
        default,
        deserialize_with = "json::null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    allow_out: Vec<String>,
    #[serde(
        rename = "denyOut",
        alias = "deny_out",
        default,
        deserialize_with = "json::null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    deny_out: Vec<String>,
    #[serde(
        rename = "allowPublicTraffic",
        alias = "allow_public_traffic",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    allow_public_traffic: Option<bool>,
    #[serde(
        rename = "maskRequestHost",
        alias = "mask_request_host",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    mask_request_host: Option<String>,
    #[serde(
        default,
        deserialize_with = "json::null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    rules: BTreeMap<String, Vec<RuleWire>>,
    #[serde(
        rename = "egressProxy",
        alias = "egress_proxy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    egress_proxy: Option<ProxyWire>,
    #[serde(
        rename = "dnsServers",
        alias = "dns_servers",
        default,
        deserialize_with = "json::null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    dns_servers: Vec<String>,
    #[serde(
        rename = "httpsPorts",
        alias = "https_ports",
        default,
        deserialize_with = "json::null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    https_ports: Vec<u16>,
}

impl From<&NetworkConfig> for NetworkWire {
    fn from(config: &NetworkConfig) -> NetworkWire {
        NetworkWire {
            allow_out: config.egress.allow_out.clone(),
            deny_out: config.egress.deny_out.clone(),
            allow_public_traffic: config.allow_public_traffic,
            mask_request_host: config.mask_request_host.clone(),
            rules: rules_to_wire(&config.rules),
            egress_proxy: config.egress_proxy.as_ref().map(proxy_to_wire),
            dns_servers: config.dns_servers.clone(),
            https_ports: config.https_ports.clone(),
        }
    }
}

impl From<NetworkWire> for NetworkConfig {
    fn from(wire: NetworkWire) -> NetworkConfig {
        NetworkConfig {
            egress: EgressRules {
                allow_out: wire.allow_out,
                deny_out: wire.deny_out,
            },
            allow_public_traffic: wire.allow_public_traffic,
            mask_request_host: wire.mask_request_host,
            rules: rules_from_wire(wire.rules),
            egress_proxy: wire.egress_proxy.map(proxy_from_wire),
            dns_servers: wire.dns_servers,
            https_ports: wire.https_ports,
        }
    }
}

/// `SandboxNetworkUpdateConfig`: both lists always sent, so an empty one clears that list as
/// E2B's replace semantics say; `rules` and `egressProxy` only when set (omitted clears them).
#[derive(Serialize)]
struct UpdateWire<'a> {
    #[serde(rename = "allowOut")]
    allow_out: &'a [String],
    #[serde(rename = "denyOut")]
    deny_out: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    rules: BTreeMap<String, Vec<RuleWire>>,
    #[serde(rename = "egressProxy", skip_serializing_if = "Option::is_none")]
    egress_proxy: Option<ProxyWire>,
    #[serde(rename = "dnsServers", skip_serializing_if = "<[String]>::is_empty")]
    dns_servers: &'a [String],
    // E2B spells this one field in snake_case.
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_internet_access: Option<bool>,
}

impl Client {
    /// Replaces a running sandbox's egress rules (`PUT /sandboxes/{id}/network`, 204): new
    /// connections follow `rules` from then on. It replaces the whole egress configuration, so
    /// any transform rules or egress proxy are cleared, as E2B documents
    /// ([`Client::replace_network`] sends them too).
    /// A 404 is [`Error::is_sandbox_gone`]; a 409 (e.g. a paused sandbox) is
    /// [`Error::is_conflict`]. Retried like any idempotent request: sending the same rules
    /// twice leaves the same rules.
    pub async fn update_network(
        &self,
        sandbox_id: &SandboxId,
        rules: &EgressRules,
    ) -> Result<(), Error> {
        self.replace_network(sandbox_id, &NetworkUpdate::new(rules.clone()))
            .await
    }

    /// Replaces a running sandbox's whole network policy (`PUT /sandboxes/{id}/network`,
    /// 204): egress rules, per-domain header transforms and egress proxy together, since E2B
    /// clears what an update omits. Errors never carry a header value or the proxy password;
    /// otherwise as [`Client::update_network`].
    pub async fn replace_network(
        &self,
        sandbox_id: &SandboxId,
        update: &NetworkUpdate,
    ) -> Result<(), Error> {
        let ctx = self
            .ctx(Operation::UpdateNetwork, Some(sandbox_id))
            .with_secrets(secrets_of(&update.rules, update.egress_proxy.as_ref()));
        let path = format!("/sandboxes/{sandbox_id}/network");
        let body = UpdateWire {
            allow_out: &update.egress.allow_out,
            deny_out: &update.egress.deny_out,
            rules: rules_to_wire(&update.rules),
            egress_proxy: update.egress_proxy.as_ref().map(proxy_to_wire),
            dns_servers: &update.dns_servers,
            allow_internet_access: update.allow_internet_access,
        };
        self.send_json(
            &ctx,
            Method::PUT,
            &path,
            Some(&body),
            Idempotency::Idempotent,
        )
        .await?;
        Ok(())
    }
}
