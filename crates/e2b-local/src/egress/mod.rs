//! Egress rules (E2B's `allowOut` / `denyOut`), enforced on the sandbox's own processes.
//!
//! The rules of a sandbox live in a [`LivePolicy`], replaced whole by the update route;
//! every new connection is judged against the policy of that moment.

use std::sync::{Arc, PoisonError, RwLock};

// The verdicts are used by the enforcement, which lands in the next commit.
#[allow(dead_code)]
pub(crate) mod rules;

pub(crate) use self::rules::{NetworkRecord, Policy};

/// A sandbox's current policy, shared by whatever enforces it.
#[derive(Debug)]
pub(crate) struct LivePolicy(RwLock<Arc<Policy>>);

impl LivePolicy {
    pub(crate) fn new(policy: Policy) -> Arc<LivePolicy> {
        Arc::new(LivePolicy(RwLock::new(Arc::new(policy))))
    }

    /// The policy now.
    #[allow(dead_code)]
    pub(crate) fn current(&self) -> Arc<Policy> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the policy; connections made from now on follow it.
    pub(crate) fn set(&self, policy: Policy) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
    }
}

/// The name servers of the host's resolv.conf (the sandbox's too: it is not replaced).
pub(crate) fn host_name_servers() -> Vec<std::net::IpAddr> {
    rules::name_servers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
}

/// Why egress rules cannot be enforced with this isolation (`None`: they can).
pub(crate) fn unavailable(isolation: &crate::isolation::Isolation) -> Option<String> {
    match isolation {
        crate::isolation::Isolation::Namespace { .. } => None,
        crate::isolation::Isolation::PathMapping => Some(
            "commands run with path mapping (e2b-local is not root), where egress rules are not enforced"
                .to_owned(),
        ),
    }
}
