//! The lease before a command (L5): extend-only connects, skipped while the known expiry
//! covers the command.

use std::sync::PoisonError;
use std::time::Duration;

use e2b_client::ConnectState;
use sandbox_identity::{LeaseKind, LeasePlan};

use super::{Attached, Inner, LEASE_HEADROOM, bump};
use crate::config::ApiKeySource;
use crate::error::Error;

impl Inner {
    /// Makes sure the known expiry covers `max(baseline, deadline + grace)` (L5); when it does
    /// not, extends through an extend-only connect, asking for [`LEASE_HEADROOM`] more on a
    /// persistent sandbox. Never set-timeout.
    pub(super) fn top_up_lease(
        &self,
        attached: &mut Attached,
        deadline: Duration,
    ) -> Result<(), Error> {
        let needed = self.policy.command_lease(deadline);
        let clock = &*self.services.clock;
        if attached.lease.covers(clock.now(), needed) {
            return Ok(());
        }
        let LeasePlan::Extend(request) = attached.lease.plan(clock, self.with_headroom(needed))
        else {
            return Ok(());
        };
        if matches!(self.config.api_key, ApiKeySource::Resolver(_)) {
            // Command reconnects use the key the profile has now, so a rotation takes effect;
            // the teardown transport keeps the attach-time client (the profile's secret scope
            // may be gone by then).
            attached.client = self.client()?;
        }
        // The connect resumes a sandbox that paused (on its lease, or for the account's
        // limit), so it is a start like a create (L14).
        let connected = self.within_limit("connect", Some(&attached.id), || {
            bump(&self.stats.connects);
            bump(&self.stats.lease_extensions);
            self.block_on(attached.client.connect(&attached.id, request.timeout()))
                .map_err(|source| Error::e2b("connect", Some(attached.id.as_str()), source))
        })?;
        attached.lease.confirm(&request);
        // A resumed sandbox may come back with new envd connection details.
        let sandbox = attached
            .client
            .sandbox(connected.sandbox.envd_access())
            .map_err(|source| Error::e2b("connect", Some(attached.id.as_str()), source))?;
        if let Some(transport) = &*self
            .handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            transport.replace_sandbox(sandbox.clone());
        }
        attached.sandbox = sandbox;
        if connected.state == ConnectState::Resumed {
            attached.info.resumed = true;
        }
        Ok(())
    }

    /// The lease to ask for when `needed` is not covered. Persistent and ephemeral sandboxes
    /// ask for [`LEASE_HEADROOM`] more, so the next commands are covered without a request
    /// (the ephemeral floor is a floor: its on-timeout kill may fire up to the headroom later
    /// for an abandoned session). The prompt probe asks for exactly what it needs: it lives
    /// for one command, and its short lease is its own cap (L11).
    pub(super) fn with_headroom(&self, needed: Duration) -> Duration {
        match self.policy.kind {
            LeaseKind::Persistent | LeaseKind::Ephemeral { .. } => {
                needed.saturating_add(LEASE_HEADROOM)
            }
            LeaseKind::Probe => needed,
        }
    }
}
