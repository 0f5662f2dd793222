//! Egress rules of a sandbox: the filter its commands get, and live updates.

use http::StatusCode;

use super::{Record, SbState, Store};
use crate::egress::{LivePolicy, NetworkRecord, Policy};
use crate::process_table::ProcessTable;
use crate::reply::ApiError;
use crate::sandbox_ns::NsCapability;

/// The process table of a sandbox starting to run: its namespaces, and its egress policy
/// when commands must be filtered (see [`crate::egress`]).
pub(super) fn process_table(
    record: &Record,
    ns: NsCapability,
    layer: Option<std::sync::Arc<crate::root_layer::RootLayer>>,
    egress_ok: bool,
    log: crate::sandbox_log::SandboxLog,
) -> ProcessTable {
    let plan = ns.plan(record.network.is_none() && record.allow_internet_access == Some(false));
    let policy = Policy::compile(
        record.network.as_ref(),
        record.allow_internet_access,
        &crate::egress::host_name_servers(),
    );
    // Fails closed: a sandbox with rules keeps a policy even where this host cannot
    // enforce one now (after a restart or resume; its commands are then refused, see
    // `envd::process`), and rules that no longer compile (a record edited by hand, or from
    // another version) deny everything. Rules that deny nothing need a filter only where
    // one can be had (for later updates); `allow_internet_access = false` alone is as
    // before, a loopback-only namespace or else the filter where there is one.
    let restricts = policy.as_ref().map_or(true, Policy::restricts);
    let needs_filter = !plan.offline
        && match record.network {
            Some(_) => restricts || egress_ok,
            None => restricts && egress_ok,
        };
    let egress = needs_filter.then(|| {
        let policy = policy.unwrap_or_else(|_| deny_everything());
        LivePolicy::new(policy, log.clone(), record.workload())
    });
    ProcessTable::new(&record.id, plan, layer, egress, log)
}

impl Store {
    /// Why egress rules cannot be enforced on this host (`None`: they can).
    pub(crate) fn egress_unavailable(&self) -> Option<&str> {
        self.egress_unavailable.as_deref()
    }

    /// Replaces the egress rules of a running sandbox (`PUT /sandboxes/{id}/network`):
    /// commands connect by `policy` from now on. 409 for a paused sandbox, for one in a
    /// loopback-only network namespace that the rules would open, and for one without a
    /// filter whose unfiltered commands still run.
    pub(crate) fn update_network(
        &self,
        id: &str,
        network: NetworkRecord,
        allow_internet_access: Option<bool>,
        policy: Policy,
    ) -> Result<(), ApiError> {
        self.sweep();
        let mut inner = self.lock();
        let entry = inner
            .entries
            .get_mut(id)
            .ok_or_else(|| ApiError::sandbox_not_found(id))?;
        let conflict = |why: String| ApiError::new(StatusCode::CONFLICT, why);
        if entry.record.state != SbState::Running {
            return Err(conflict(format!(
                "sandbox '{id}' is paused: its network can be updated only while it runs"
            )));
        }
        if entry.procs.offline() && !policy.denies_everything() {
            return Err(conflict(format!(
                "sandbox '{id}' was created with allow_internet_access=false and runs in a network namespace with only loopback, which e2b-local cannot open up live; create it with network.denyOut [\"0.0.0.0/0\"] instead"
            )));
        }
        match entry.procs.egress() {
            Some(live) => live.set(policy),
            None if entry.procs.offline() => {}
            None => {
                if let Some(why) = &self.egress_unavailable
                    && policy.restricts()
                {
                    return Err(ApiError::bad_request(format!(
                        "egress rules cannot be enforced by e2b-local here: {why}"
                    )));
                }
                entry
                    .procs
                    .start_filtering(LivePolicy::new(
                        policy,
                        self.logs.of(id),
                        entry.record.workload(),
                    ))
                    .map_err(|pids| conflict(format!(
                        "sandbox '{id}' was created without network rules and its commands {pids:?} run unfiltered: e2b-local cannot hold them to new rules; create the sandbox with a network config, or update it before starting commands"
                    )))?;
            }
        }
        entry.record.network = Some(network);
        entry.record.allow_internet_access = allow_internet_access;
        self.logs.of(id).push(
            crate::sandbox_log::Level::Info,
            "network rules updated",
            &[],
        );
        let record = entry.record.clone();
        self.persist(&record);
        Ok(())
    }
}

/// The policy that lets nothing out but the sandbox's own loopback.
fn deny_everything() -> Policy {
    Policy::compile(None, Some(false), &[])
        .unwrap_or_else(|_| unreachable!("rules without a network config always compile"))
}
