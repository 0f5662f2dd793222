//! The `network` of a sandbox: checked at create, replaced by
//! `PUT /sandboxes/{id}/network`, reported by `GET /sandboxes/{id}`.

use std::collections::BTreeMap;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::egress::{NetworkRecord, Policy};
use crate::parse::parse_body;
use crate::reply::ApiError;
use crate::store::{Record, parse_sandbox_id};

/// `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (update) in one: the
/// update has no `allowPublicTraffic` nor `maskRequestHost`, and says
/// `allow_internet_access` in snake case.
#[derive(Debug, Deserialize)]
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

impl NetworkBody {
    /// Refuses what e2b-local cannot do (never silently ignored), then the record.
    fn into_record(self) -> Result<NetworkRecord, ApiError> {
        if self
            .egress_proxy
            .as_ref()
            .is_some_and(|proxy| !proxy.is_null())
        {
            return Err(ApiError::bad_request(
                "network.egressProxy is not supported by e2b-local: it has no SOCKS5 tunnel, and traffic meant for the proxy must not go out directly",
            ));
        }
        if self.rules.as_ref().is_some_and(|rules| !rules.is_empty()) {
            return Err(ApiError::bad_request(
                "network.rules (per-domain request transforms) are not supported by e2b-local: it does not terminate the sandbox's TLS, so it cannot rewrite requests",
            ));
        }
        Ok(NetworkRecord {
            allow_out: self.allow_out.unwrap_or_default(),
            deny_out: self.deny_out.unwrap_or_default(),
            allow_public_traffic: self.allow_public_traffic,
            mask_request_host: self.mask_request_host,
            dns_servers: self.dns_servers,
        })
    }
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
    if let Some(why) = app.store.egress_unavailable()
        && policy.restricts()
    {
        return Err(ApiError::bad_request(format!(
            "egress rules cannot be enforced by e2b-local here: {why}"
        )));
    }
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
    Some(value)
}
