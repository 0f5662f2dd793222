//! The state shared by every handler.

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::ApiKeyPolicy;
use crate::fault_state::FaultState;
use crate::isolation::Isolation;
use crate::requests::RequestCounter;
use crate::secrets::Secrets;
use crate::snapshots::Snapshots;
use crate::store::Store;

/// Everything a request handler needs.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) store: Store,
    /// Template builds in progress and the archives their COPY steps uploaded.
    pub(crate) builds: crate::builds::Builds,
    pub(crate) snapshots: Snapshots,
    /// The team's secrets (`/secrets`), shared with the egress proxy.
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) clock: Clock,
    pub(crate) faults: FaultState,
    pub(crate) api_key: ApiKeyPolicy,
    pub(crate) templates: Vec<String>,
    pub(crate) isolation: Arc<Isolation>,
    pub(crate) requests: RequestCounter,
    /// Enforcement of egress rules (`None`: not on this host, see the store's reason).
    pub(crate) egress: Option<crate::egress::Egress>,
    /// Each `Idempotency-Key` a create carried: its body's digest and the sandbox it made.
    pub(crate) create_keys: std::sync::Mutex<std::collections::HashMap<String, (u64, String)>>,
    /// The code-interpreter contexts of every sandbox (port 49999).
    pub(crate) interpreters: crate::kernels::Interpreters,
    /// The team's volumes (`/volumes`, `/volumecontent`).
    pub(crate) volumes: crate::volumes::Volumes,
    /// The program the code interpreter's kernels run (`python3`, or `kernel_python`).
    pub(crate) kernel_python: String,
    /// The issuer of sandboxes' workload tokens (`iam`), and its key set.
    pub(crate) identity: Arc<crate::identity::Issuer>,
}

impl App {
    /// Checks an `X-API-Key` value against the configured policy.
    pub(crate) fn key_accepted(&self, key: Option<&str>) -> bool {
        match (key, &self.api_key) {
            (None, _) => false,
            (Some(k), ApiKeyPolicy::AnyNonEmpty) => !k.trim().is_empty(),
            (Some(k), ApiKeyPolicy::Exact(expected)) => crate::token::constant_time_eq(k, expected),
        }
    }

    /// The built-in template `reference` names (its bare name), if it names one: written
    /// bare or as `namespace/name:tag`, but never in e2b-local's own namespace, where
    /// `local/name` is a snapshot or built template of that name (a bare built-in name
    /// wins over theirs).
    pub(crate) fn builtin_template<'r>(&self, reference: &'r str) -> Option<&'r str> {
        let name = reference.rsplit('/').next().unwrap_or(reference);
        let name = name.split(':').next().unwrap_or(name);
        let builtin = !crate::snapshots::Reference::parse(reference).in_team_namespace()
            && (self.templates.iter().any(|t| t == name)
                || name == crate::paths::OTHER_HOME_TEMPLATE);
        builtin.then_some(name)
    }

    /// True when commands run in a private mount namespace.
    pub(crate) fn isolation_is_namespace(&self) -> bool {
        matches!(*self.isolation, Isolation::Namespace { .. })
    }
}
