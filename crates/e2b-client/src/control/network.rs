//! A sandbox's network: egress rules at create, replaced live with
//! [`Client::update_network`], and read back from [`Client::get`](crate::Client::get).

use std::collections::BTreeSet;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::Client;
use crate::error::{Error, Operation};
use crate::ids::SandboxId;
use crate::json;
use crate::retry::Idempotency;

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
}

impl NetworkConfig {
    /// These egress rules, with E2B's defaults for the public URLs.
    pub fn new(egress: EgressRules) -> NetworkConfig {
        NetworkConfig {
            egress,
            allow_public_traffic: None,
            mask_request_host: None,
        }
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
}

impl From<&NetworkConfig> for NetworkWire {
    fn from(config: &NetworkConfig) -> NetworkWire {
        NetworkWire {
            allow_out: config.egress.allow_out.clone(),
            deny_out: config.egress.deny_out.clone(),
            allow_public_traffic: config.allow_public_traffic,
            mask_request_host: config.mask_request_host.clone(),
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
        }
    }
}

/// `SandboxNetworkUpdateConfig`: both lists always sent, so an empty one clears that list as
/// E2B's replace semantics say.
#[derive(Serialize)]
struct UpdateWire<'a> {
    #[serde(rename = "allowOut")]
    allow_out: &'a [String],
    #[serde(rename = "denyOut")]
    deny_out: &'a [String],
}

impl Client {
    /// Replaces a running sandbox's egress rules (`PUT /sandboxes/{id}/network`, 204): new
    /// connections follow `rules` from then on. It replaces the whole egress configuration, so
    /// any transform rules or egress proxy set another way are cleared, as E2B documents.
    /// A 404 is [`Error::is_sandbox_gone`]; a 409 (e.g. a paused sandbox) is
    /// [`Error::is_conflict`]. Retried like any idempotent request: sending the same rules
    /// twice leaves the same rules.
    pub async fn update_network(
        &self,
        sandbox_id: &SandboxId,
        rules: &EgressRules,
    ) -> Result<(), Error> {
        let ctx = self.ctx(Operation::UpdateNetwork, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}/network");
        let body = UpdateWire {
            allow_out: &rules.allow_out,
            deny_out: &rules.deny_out,
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
