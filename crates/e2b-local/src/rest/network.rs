//! The `network` of a sandbox: checked at create, replaced by
//! `PUT /sandboxes/{id}/network`, reported by `GET /sandboxes/{id}`.

use std::collections::BTreeMap;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::egress::transform::{parse_egress_proxy, parse_rules};
use crate::egress::{NetworkRecord, Policy};
use crate::parse::parse_body;
use crate::reply::ApiError;
use crate::store::{Record, parse_sandbox_id};

/// `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (update) in one: the
/// update has no `allowPublicTraffic` nor `maskRequestHost`, and says
/// `allow_internet_access` in snake case.
///
/// `rules` and `egressProxy` stay JSON until checked, so that no parse error can quote a
/// header value or the password; `Debug` leaves them out.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NetworkBody {
    #[serde(default)]
    pub(super) allow_public_traffic: Option<bool>,
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default)]
    mask_request_host: Option<String>,
    #[serde(default)]
    egress_proxy: Option<Value>,
    #[serde(default)]
    rules: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    dns_servers: Option<Vec<String>>,
    /// Inbound (how E2B's proxy reaches the sandbox's ports): nothing to do on one machine.
    #[serde(default)]
    #[allow(dead_code)]
    https_ports: Option<Vec<u16>>,
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

impl std::fmt::Debug for NetworkBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkBody")
            .field("allow_out", &self.allow_out)
            .field("deny_out", &self.deny_out)
            .field(
                "rules",
                &self
                    .rules
                    .as_ref()
                    .map(|rules| rules.keys().collect::<Vec<_>>()),
            )
            .field(
                "egress_proxy",
                &self.egress_proxy.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

impl NetworkBody {
    /// Checks `rules` and `egressProxy` (with E2B's limits; the texts never quote a
    /// header value or password), then the record.
    fn into_record(self) -> Result<NetworkRecord, ApiError> {
        let egress_proxy = match &self.egress_proxy {
            Some(raw) => parse_egress_proxy(raw).map_err(ApiError::bad_request)?,
            None => None,
        };
        let rules = match &self.rules {
            Some(raw) => parse_rules(raw).map_err(ApiError::bad_request)?,
            None => BTreeMap::new(),
        };
        Ok(NetworkRecord {
            allow_out: self.allow_out.unwrap_or_default(),
            deny_out: self.deny_out.unwrap_or_default(),
            allow_public_traffic: self.allow_public_traffic,
            mask_request_host: self.mask_request_host,
            dns_servers: self.dns_servers,
            rules,
            egress_proxy,
        })
    }
}

/// Refuses rules where this host cannot hold commands to them (path mapping, an old
/// kernel): the same reason the filter's rules get.
fn enforceable(app: &App, record: &NetworkRecord, policy: &Policy) -> Result<(), ApiError> {
    if let Some(why) = app.store.egress_unavailable() {
        if !record.rules.is_empty() {
            return Err(ApiError::bad_request(format!(
                "network.rules cannot be enforced by e2b-local here: {why}"
            )));
        }
        if record.egress_proxy.is_some() {
            return Err(ApiError::bad_request(format!(
                "network.egressProxy cannot be enforced by e2b-local here: {why}"
            )));
        }
        if policy.restricts() {
            return Err(ApiError::bad_request(format!(
                "egress rules cannot be enforced by e2b-local here: {why}"
            )));
        }
    }
    Ok(())
}

/// Checks a create's `network` (and `allow_internet_access`): the record to store, or a
/// 400 naming the entry or the feature e2b-local cannot enforce.
pub(super) fn for_create(
    app: &App,
    body: Option<NetworkBody>,
    allow_internet_access: Option<bool>,
) -> Result<Option<NetworkRecord>, ApiError> {
    let Some(body) = body else {
        return Ok(None);
    };
    let record = body.into_record()?;
    let policy = compile(Some(&record), allow_internet_access)?;
    enforceable(app, &record, &policy)?;
    Ok(Some(record))
}

fn compile(
    record: Option<&NetworkRecord>,
    allow_internet_access: Option<bool>,
) -> Result<Policy, ApiError> {
    Policy::compile(
        record,
        allow_internet_access,
        &crate::egress::host_name_servers(),
    )
    .map_err(ApiError::bad_request)
}

/// `PUT /sandboxes/{id}/network`: replaces the egress rules (fields left out are cleared;
/// the public-URL settings stay, the update does not carry them); 204.
pub(super) fn update(app: &App, id: &str, body: &Bytes) -> Result<Response, ApiError> {
    let id = parse_sandbox_id(id)?;
    let body: NetworkBody = parse_body(body)?;
    let allow_internet_access = body.allow_internet_access;
    let mut record = body.into_record()?;
    let current = app.store.get(&id)?;
    if let Some(previous) = &current.network {
        record.allow_public_traffic = previous.allow_public_traffic;
        record.mask_request_host = previous.mask_request_host.clone();
    }
    let policy = compile(Some(&record), allow_internet_access)?;
    enforceable(app, &record, &policy)?;
    app.store
        .update_network(&id, record, allow_internet_access, policy)?;
    tracing::info!(sandbox_id = %id, "sandbox network updated");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The `network` of `SandboxDetail`, when the sandbox has one.
pub(super) fn detail(record: &Record) -> Option<Value> {
    let network = record.network.as_ref()?;
    let mut value = json!({
        "allowOut": network.allow_out,
        "denyOut": network.deny_out,
    });
    if let Some(public) = network.allow_public_traffic {
        value["allowPublicTraffic"] = json!(public);
    }
    if let Some(mask) = &network.mask_request_host {
        value["maskRequestHost"] = json!(mask);
    }
    if let Some(servers) = &network.dns_servers {
        value["dnsServers"] = json!(servers);
    }
    // As E2B does: the rules verbatim, values included (the caller set them).
    if !network.rules.is_empty() {
        value["rules"] = serde_json::to_value(&network.rules).unwrap_or_default();
    }
    // Without the password.
    if let Some(proxy) = &network.egress_proxy {
        let mut shown = json!({"address": proxy.address});
        if let Some(username) = &proxy.username {
            shown["username"] = json!(username);
        }
        value["egressProxy"] = shown;
    }
    Some(value)
}
