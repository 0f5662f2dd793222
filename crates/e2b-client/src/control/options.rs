//! What callers pass to the control plane: what to create and which sandboxes to list.

use std::collections::BTreeMap;
use std::time::Duration;

use super::NetworkConfig;

/// What to create. Start from [`CreateOptions::new`]; there is no `Default`.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Template name or id (`base`). A snapshot's id or name is a template too: a sandbox
    /// created from it starts with the snapshot's files.
    pub template: String,
    /// The first lease; `None` leaves it to E2B (300 s on the v2 route).
    pub timeout: Option<Duration>,
    /// What happens when the lease runs out.
    pub on_timeout: OnTimeout,
    /// Metadata to find the sandbox by later.
    pub metadata: BTreeMap<String, String>,
    /// Environment variables for every process in the sandbox.
    pub env_vars: BTreeMap<String, String>,
    /// `Some(false)` puts the sandbox behind deny-all egress; `None` leaves E2B's default.
    pub allow_internet_access: Option<bool>,
    /// Egress rules and public-URL settings (`network`); `None` sends none (everything
    /// reachable unless `allow_internet_access` is `Some(false)`).
    pub network: Option<NetworkConfig>,
    /// Sent as `secure` when set. On the v2 route E2B always issues an envd access token, so
    /// `Some(true)` is what you get anyway; E2B ignores the field there.
    pub secure: Option<bool>,
    /// `Some(true)`: traffic to the paused sandbox (a command, a file call, a request to one
    /// of its ports) resumes it, as `connect` would (`autoResume`). Only with
    /// [`OnTimeout::Pause`]`(`[`PauseMemory::Keep`]`)`: a filesystem-only pause cannot be woken.
    /// `None` leaves E2B's default (off).
    pub auto_resume: Option<bool>,
    /// Sent as `Idempotency-Key`: a create repeated with the same key (and the same
    /// options) gets the sandbox the first one made, so the create can be retried after a
    /// lost answer. `None`: no key, and no retry once the request may have arrived.
    pub idempotency_key: Option<String>,
    /// Volumes to mount, each by name at an absolute path
    /// ([`Volume::mount_at`](crate::Volume::mount_at)); empty sends none.
    pub volume_mounts: Vec<crate::VolumeMountInfo>,
    /// Workload identity (`iam.tokens`): named tokens E2B's egress proxy mints for the
    /// sandbox's outgoing requests where a header rule's value names one
    /// ([`identity_token_placeholder`]); the sandbox never holds them. Empty sends none.
    pub iam_tokens: BTreeMap<String, IamToken>,
    /// E2B's MCP gateway (`mcp`): the servers it runs, as the object the official SDK takes
    /// (server name to its configuration). The sandbox must come from the `mcp-gateway`
    /// template; its endpoint is then [`Sandbox::mcp_url`](crate::Sandbox::mcp_url) with
    /// [`Sandbox::mcp_token`](crate::Sandbox::mcp_token). `None` sends none.
    pub mcp: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One workload token a sandbox's header rules may name (E2B's `SandboxIamToken`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct IamToken {
    /// Who the token is for (`sts.amazonaws.com`), sent as the token's `aud`.
    pub audience: String,
    /// The token type; E2B issues `JWT-SVID` only.
    #[serde(rename = "tokenType")]
    pub token_type: String,
}

impl IamToken {
    /// A JWT-SVID for `audience`, the one type E2B issues.
    pub fn jwt_svid(audience: String) -> IamToken {
        IamToken {
            audience,
            token_type: "JWT-SVID".to_owned(),
        }
    }
}

/// The placeholder a header rule's value carries for workload token `name`: E2B's egress
/// proxy puts a token minted for the sandbox in its place at each request. A name with `{`,
/// `}` or a control character could not be read back, so it is refused.
pub fn identity_token_placeholder(name: &str) -> Result<String, String> {
    if name.is_empty() || name.chars().any(|c| c == '{' || c == '}' || c.is_control()) {
        return Err(format!(
            "iam token name {name:?}: a token name is not empty and has no '{{', '}}' or control \
             characters"
        ));
    }
    Ok(format!("${{e2b.identity.tokens.{name}}}"))
}

impl CreateOptions {
    /// A sandbox from `template` with E2B's defaults for everything else.
    pub fn new(template: String) -> CreateOptions {
        CreateOptions {
            template,
            timeout: None,
            on_timeout: OnTimeout::ServerDefault,
            metadata: BTreeMap::new(),
            env_vars: BTreeMap::new(),
            allow_internet_access: None,
            network: None,
            secure: None,
            auto_resume: None,
            idempotency_key: None,
            volume_mounts: Vec::new(),
            iam_tokens: BTreeMap::new(),
            mcp: None,
        }
    }
}

/// What E2B does with a sandbox whose lease ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// Whatever E2B does when not told (it kills).
    ServerDefault,
    /// Kill it (`autoPause: false`).
    Kill,
    /// Pause it (`autoPause: true`), with or without memory.
    Pause(PauseMemory),
}

/// Whether a pause keeps memory (processes survive) or only the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseMemory {
    /// Memory snapshot: running processes resume (`autoPauseMemory: true`).
    Keep,
    /// Filesystem only: resume cold-boots, processes are gone (`autoPauseMemory: false`).
    Discard,
}

/// How a paused sandbox comes back on [`Client::connect_with`](crate::Client::connect_with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnResume {
    /// With the memory its pause kept, when it kept any (E2B's default).
    Restore,
    /// Cold-booted from its files: no process survives, the boot id is new.
    Reboot,
}

/// Which states [`Client::list`](crate::Client::list) returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    /// Running sandboxes only.
    Running,
    /// Paused sandboxes only.
    Paused,
    /// Both.
    Any,
}

/// A list filter. Start from [`ListQuery::all`].
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Every pair must match exactly.
    pub metadata: BTreeMap<String, String>,
    /// Which states.
    pub state: StateFilter,
    /// Page size (E2B: 1 to 100, default 100).
    pub limit: Option<u32>,
    /// Order by start time; `None` leaves E2B's.
    pub order: Option<ListOrder>,
    /// Only sandboxes started at or after this time.
    pub started_after: Option<time::OffsetDateTime>,
    /// Only sandboxes of this template (id or name).
    pub template: Option<String>,
    /// Start from the page this token names (an `X-Next-Token` an earlier listing got)
    /// instead of the first.
    pub next_token: Option<String>,
}

/// The order [`Client::list`](crate::Client::list) returns sandboxes in, by start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListOrder {
    /// Oldest first (`order=asc`).
    OldestFirst,
    /// Newest first (`order=desc`).
    NewestFirst,
}

impl ListQuery {
    /// Every sandbox, running or paused, in E2B's page size.
    pub fn all() -> ListQuery {
        ListQuery {
            metadata: BTreeMap::new(),
            state: StateFilter::Any,
            limit: None,
            order: None,
            started_after: None,
            template: None,
            next_token: None,
        }
    }
}
