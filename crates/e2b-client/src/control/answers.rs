//! What the control plane answers: sandboxes as create, connect, list and get describe them,
//! and the typed outcomes of connect, pause and kill.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::NetworkConfig;
use super::network::NetworkWire;
use crate::ids::SandboxId;
use crate::json;
use crate::sandbox::EnvdAccess;
use crate::secret::AccessToken;

/// A sandbox as create and connect return it.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "InfoWire")]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The id.
    pub sandbox_id: SandboxId,
    /// The template id.
    pub template_id: String,
    /// The template alias, when it has one.
    pub alias: Option<String>,
    /// E2B's client id (legacy).
    pub client_id: String,
    /// envd's version.
    pub envd_version: String,
    /// The token envd requires in `X-Access-Token`, if any.
    pub envd_access_token: Option<AccessToken>,
    /// The token for user-port traffic, if any.
    pub traffic_access_token: Option<AccessToken>,
    /// The sandbox's domain when it differs from the client's.
    pub domain: Option<String>,
}

// The answers are read through private wire shapes that share their field sets, so each
// wire name and its aliases are spelled once, however many answers carry the field.

/// What create, connect, list and get all say about a sandbox.
#[derive(Deserialize)]
struct CommonWire {
    #[serde(rename = "sandboxID", alias = "sandboxId", alias = "sandbox_id")]
    sandbox_id: SandboxId,
    #[serde(
        rename = "templateID",
        alias = "templateId",
        alias = "template_id",
        default
    )]
    template_id: String,
    #[serde(default)]
    alias: Option<String>,
    #[serde(rename = "clientID", alias = "clientId", alias = "client_id", default)]
    client_id: String,
    #[serde(rename = "envdVersion", alias = "envd_version", default)]
    envd_version: String,
}

/// How to reach envd, as create, connect and get say it.
#[derive(Deserialize)]
struct AccessWire {
    #[serde(
        rename = "envdAccessToken",
        alias = "envd_access_token",
        default,
        deserialize_with = "json::opt_token"
    )]
    envd_access_token: Option<AccessToken>,
    #[serde(default)]
    domain: Option<String>,
}

#[derive(Deserialize)]
struct InfoWire {
    #[serde(flatten)]
    common: CommonWire,
    #[serde(flatten)]
    access: AccessWire,
    #[serde(
        rename = "trafficAccessToken",
        alias = "traffic_access_token",
        default,
        deserialize_with = "json::opt_token"
    )]
    traffic_access_token: Option<AccessToken>,
}

impl From<InfoWire> for SandboxInfo {
    fn from(wire: InfoWire) -> SandboxInfo {
        let InfoWire {
            common,
            access,
            traffic_access_token,
        } = wire;
        SandboxInfo {
            sandbox_id: common.sandbox_id,
            template_id: common.template_id,
            alias: common.alias,
            client_id: common.client_id,
            envd_version: common.envd_version,
            envd_access_token: access.envd_access_token,
            traffic_access_token,
            domain: access.domain,
        }
    }
}

impl SandboxInfo {
    /// What [`Client::sandbox`](crate::Client::sandbox) needs to reach this sandbox's envd.
    pub fn envd_access(&self) -> EnvdAccess {
        EnvdAccess {
            sandbox_id: self.sandbox_id.clone(),
            access_token: self.envd_access_token.clone(),
            domain: self.domain.clone(),
            traffic_access_token: self.traffic_access_token.clone(),
        }
    }
}

/// A sandbox's state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SandboxState {
    /// Running.
    Running,
    /// Paused (a snapshot exists).
    Paused,
    /// A state this client does not know, as sent.
    Other(String),
}

impl<'de> Deserialize<'de> for SandboxState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SandboxState, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(match raw.as_str() {
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            _ => SandboxState::Other(raw),
        })
    }
}

/// A sandbox as list returns it.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "ListedWire")]
#[non_exhaustive]
pub struct ListedSandbox {
    /// The id.
    pub sandbox_id: SandboxId,
    /// The template id.
    pub template_id: String,
    /// The template alias, when it has one.
    pub alias: Option<String>,
    /// E2B's client id (legacy).
    pub client_id: String,
    /// When it started.
    pub started_at: time::OffsetDateTime,
    /// When the lease ends (running) or when it paused (paused).
    pub end_at: time::OffsetDateTime,
    /// vCPUs.
    pub cpu_count: u32,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Disk in MiB.
    pub disk_size_mb: u64,
    /// Running or paused.
    pub state: SandboxState,
    /// envd's version.
    pub envd_version: String,
    /// The metadata given at creation.
    pub metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ListedWire {
    #[serde(flatten)]
    common: CommonWire,
    #[serde(
        rename = "startedAt",
        alias = "started_at",
        deserialize_with = "json::rfc3339"
    )]
    started_at: time::OffsetDateTime,
    #[serde(rename = "endAt", alias = "end_at", deserialize_with = "json::rfc3339")]
    end_at: time::OffsetDateTime,
    #[serde(
        rename = "cpuCount",
        alias = "cpu_count",
        default,
        deserialize_with = "json::int"
    )]
    cpu_count: u32,
    #[serde(
        rename = "memoryMB",
        alias = "memory_mb",
        default,
        deserialize_with = "json::int"
    )]
    memory_mb: u64,
    #[serde(
        rename = "diskSizeMB",
        alias = "disk_size_mb",
        default,
        deserialize_with = "json::int"
    )]
    disk_size_mb: u64,
    state: SandboxState,
    #[serde(default, deserialize_with = "json::null_default")]
    metadata: BTreeMap<String, String>,
}

impl From<ListedWire> for ListedSandbox {
    fn from(wire: ListedWire) -> ListedSandbox {
        let ListedWire {
            common,
            started_at,
            end_at,
            cpu_count,
            memory_mb,
            disk_size_mb,
            state,
            metadata,
        } = wire;
        ListedSandbox {
            sandbox_id: common.sandbox_id,
            template_id: common.template_id,
            alias: common.alias,
            client_id: common.client_id,
            started_at,
            end_at,
            cpu_count,
            memory_mb,
            disk_size_mb,
            state,
            envd_version: common.envd_version,
            metadata,
        }
    }
}

/// One sandbox in detail, as get returns it.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "DetailWire")]
#[non_exhaustive]
pub struct SandboxDetail {
    /// Everything list also reports.
    pub summary: ListedSandbox,
    /// The token envd requires, if any.
    pub envd_access_token: Option<AccessToken>,
    /// Whether outbound internet is allowed, when E2B says.
    pub allow_internet_access: Option<bool>,
    /// The sandbox's domain when it differs from the client's.
    pub domain: Option<String>,
    /// What happens at lease end, when E2B says.
    pub lifecycle: Option<Lifecycle>,
    /// The network configuration (egress rules as last set), when E2B says.
    pub network: Option<NetworkConfig>,
    /// The volumes mounted at create.
    pub volume_mounts: Vec<crate::VolumeMountInfo>,
}

#[derive(Deserialize)]
struct DetailWire {
    #[serde(flatten)]
    summary: ListedSandbox,
    #[serde(flatten)]
    access: AccessWire,
    #[serde(
        rename = "allowInternetAccess",
        alias = "allow_internet_access",
        default
    )]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    lifecycle: Option<Lifecycle>,
    #[serde(default)]
    network: Option<NetworkWire>,
    #[serde(
        rename = "volumeMounts",
        alias = "volume_mounts",
        default,
        deserialize_with = "json::null_default"
    )]
    volume_mounts: Vec<crate::VolumeMountInfo>,
}

impl From<DetailWire> for SandboxDetail {
    fn from(wire: DetailWire) -> SandboxDetail {
        SandboxDetail {
            summary: wire.summary,
            envd_access_token: wire.access.envd_access_token,
            allow_internet_access: wire.allow_internet_access,
            domain: wire.access.domain,
            lifecycle: wire.lifecycle,
            network: wire.network.map(NetworkConfig::from),
            volume_mounts: wire.volume_mounts,
        }
    }
}

impl SandboxDetail {
    /// What [`Client::sandbox`](crate::Client::sandbox) needs to reach this sandbox's envd.
    pub fn envd_access(&self) -> EnvdAccess {
        EnvdAccess {
            sandbox_id: self.summary.sandbox_id.clone(),
            access_token: self.envd_access_token.clone(),
            domain: self.domain.clone(),
            // Get's answer does not carry it (create's and connect's do).
            traffic_access_token: None,
        }
    }
}

/// A sandbox's lease-end behaviour as E2B reports it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct Lifecycle {
    /// `"pause"` or `"kill"`.
    #[serde(rename = "onTimeout", alias = "on_timeout", default)]
    pub on_timeout: String,
    /// Whether traffic resumes it automatically.
    #[serde(rename = "autoResume", alias = "auto_resume", default)]
    pub auto_resume: bool,
}

/// The result of [`Client::connect`](crate::Client::connect).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Connected {
    /// The sandbox, with its current envd token and domain.
    pub sandbox: SandboxInfo,
    /// Whether it was already running (200) or has been resumed (201).
    pub state: ConnectState,
}

/// Whether connect found the sandbox running or resumed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectState {
    /// It was running (HTTP 200); the lease was extended if that made it longer.
    Running,
    /// It was paused and has been resumed (HTTP 201).
    Resumed,
}

/// The result of [`Client::pause`](crate::Client::pause).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseOutcome {
    /// Paused now (HTTP 204).
    Paused,
    /// HTTP 409: already paused (or in another state transition).
    AlreadyPaused,
}

/// The result of [`Client::kill`](crate::Client::kill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillOutcome {
    /// Killed now (HTTP 204).
    Killed,
    /// HTTP 404: no such sandbox (already gone).
    NotFound,
}
