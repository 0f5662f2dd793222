//! The profile's egress policy on its sandboxes, from outside a session (`hermes e2b
//! network`): what each sandbox has, and putting a changed policy in force on the running
//! ones with one request each, recorded in the scope note so that no session repeats it.

use std::time::SystemTime;

use e2b_client::SandboxId;
use writer_lease::ScopeNote;

use super::{EntryState, Inventory, Listing, SandboxEntry};
use crate::egress::{DesiredNetwork, EgressPolicy};
use crate::error::{Error, ErrorChain};
use crate::note::NOTE_EGRESS;

/// What [`Inventory::apply_egress`] did to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EgressOutcome {
    /// Its rules already were the policy's: nothing sent.
    InForce,
    /// Updated now (one request).
    Updated,
    /// Paused: it gets the policy when a session resumes it, before any command (X9).
    AtResume,
    /// The update failed; the text says why. A session updates it before its next command.
    Failed(String),
}

/// A sandbox's credential headers as E2B reports them, without a value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CredentialHeaders {
    /// Host to header names.
    pub headers: std::collections::BTreeMap<String, Vec<String>>,
    /// The hosts whose headers hold a value rather than E2B Secrets placeholders.
    pub values_in_rules: Vec<String>,
}

/// One sandbox of [`Inventory::apply_egress`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EgressApplied {
    /// The sandbox as listed.
    pub entry: SandboxEntry,
    /// What was done.
    pub outcome: EgressOutcome,
}

impl Inventory {
    /// The policy the settings give, as E2B must hold it (with `allow_internet_access =
    /// false`'s deny of every destination).
    pub fn egress_policy(&self) -> EgressPolicy {
        self.config.egress.effective(self.config.internet)
    }

    /// The egress rules E2B reports for a sandbox (one request): `(allow_out, deny_out)`;
    /// `None` when E2B reports none.
    pub fn sandbox_rules(&self, sandbox_id: &str) -> Result<Option<EgressPolicy>, Error> {
        let id = SandboxId::parse(sandbox_id.to_owned()).ok_or_else(|| Error::InvalidConfig {
            reason: format!("{sandbox_id:?} is not a valid sandbox id"),
        })?;
        let client = self.config.client()?;
        let detail = self
            .services
            .runtime
            .block_on(client.get(&id))
            .map_err(|source| Error::e2b("read egress rules", Some(sandbox_id), source))?;
        // What E2B holds is shown as it is; entries this host would refuse stay visible.
        Ok(detail.network.map(|network| {
            EgressPolicy::reported(network.egress.allow_out, network.egress.deny_out)
        }))
    }

    /// The configured credentials (their values resolve on demand, never kept).
    pub fn credentials(&self) -> crate::credentials::Credentials {
        self.config.credentials.clone()
    }

    /// Where the credentials' values are kept for this profile, and its secrets as E2B lists
    /// them (one request unless the setting says `rules`); never a value (X22).
    pub fn credential_store(&self) -> Result<crate::secret_store::StoreReport, Error> {
        let store = self.config.secret_store(&self.profile_home)?;
        let client = self.config.client()?;
        self.services
            .runtime
            .block_on(store.report(&client, self.config.credential_store))
            .map_err(|error| error.needed_by("credentials listing", None))
    }

    /// Which of `sandbox_id`'s rule hosts carry which header names, as E2B reports them
    /// (one request), and the hosts whose headers hold something other than an E2B Secrets
    /// placeholder (a value: a sandbox not yet moved to Secrets, X22); never a value (X16).
    pub fn sandbox_credential_headers(&self, sandbox_id: &str) -> Result<CredentialHeaders, Error> {
        let id = SandboxId::parse(sandbox_id.to_owned()).ok_or_else(|| Error::InvalidConfig {
            reason: format!("{sandbox_id:?} is not a valid sandbox id"),
        })?;
        let client = self.config.client()?;
        let detail = self
            .services
            .runtime
            .block_on(client.get(&id))
            .map_err(|source| Error::e2b("read network rules", Some(sandbox_id), source))?;
        let mut out = CredentialHeaders::default();
        for (host, rules) in detail.network.map(|n| n.rules).unwrap_or_default() {
            let mut names = Vec::new();
            let mut holds_value = false;
            for (name, value) in rules.into_iter().flat_map(|rule| rule.headers) {
                holds_value |= !value.expose().contains("${e2b.secrets.");
                names.push(name);
            }
            if holds_value {
                out.values_in_rules.push(host.clone());
            }
            out.headers.insert(host, names);
        }
        Ok(out)
    }

    /// Puts the settings' egress policy, with the credentials' header rules (X16), in force
    /// on this profile's running sandboxes whose known rules differ (one request each);
    /// paused ones get it when resumed. Each update is recorded in its scope note, so a
    /// running session finds it done and sends nothing. A credential without a value is an
    /// error before anything is sent.
    pub fn apply_egress(&self, now: SystemTime) -> Result<Vec<EgressApplied>, Error> {
        let store = self.config.secret_store(&self.profile_home)?;
        let rules = crate::credentials::credential_rules(
            &store,
            self.config.credential_store,
            &self.config.credentials,
            &self.services.runtime,
            || self.config.client(),
            "network update",
            None,
        )?;
        let proxy =
            DesiredNetwork::proxy(self.config.egress_proxy.as_ref(), &self.config.credentials)
                .map_err(|error| error.needed_by("network update", None))?;
        let desired = DesiredNetwork {
            policy: self.egress_policy(),
            rules,
            proxy,
        };
        let digest = desired.digest();
        let entries = self.list(Listing::ThisProfile, now)?;
        let client = self.config.client()?;
        let mut applied = Vec::with_capacity(entries.len());
        for entry in entries {
            let outcome = if entry.egress_known().as_deref() == Some(digest.as_str()) {
                EgressOutcome::InForce
            } else if entry.state != EntryState::Running {
                EgressOutcome::AtResume
            } else {
                match SandboxId::parse(entry.sandbox_id.clone()) {
                    None => EgressOutcome::Failed("not a valid sandbox id".to_owned()),
                    Some(id) => {
                        let sent = self
                            .services
                            .runtime
                            .block_on(client.replace_network(&id, &desired.update()));
                        match sent {
                            Ok(()) => {
                                self.note_egress(&entry, &digest);
                                EgressOutcome::Updated
                            }
                            Err(source) => EgressOutcome::Failed(
                                ErrorChain(&Error::e2b(
                                    "apply egress policy",
                                    Some(id.as_str()),
                                    source,
                                ))
                                .to_string(),
                            ),
                        }
                    }
                }
            };
            applied.push(EgressApplied { entry, outcome });
        }
        Ok(applied)
    }

    /// Records the applied policy in the sandbox's scope note (best effort, like every note
    /// line: a session then sends the same update once more).
    fn note_egress(&self, entry: &SandboxEntry, digest: &str) {
        let Some(scope) = scope_digest(&entry.scope) else {
            return;
        };
        let files = self.scope_files(&scope);
        let line = format!("{} {digest}", entry.sandbox_id);
        let change = |note: &mut ScopeNote| note.set(NOTE_EGRESS, &line);
        if let Err(error) = files.update_note(change) {
            tracing::debug!("E2B scope note not updated: {}", ErrorChain(&error));
        }
    }
}

/// A scope digest from its 64 hex digits.
fn scope_digest(hex: &str) -> Option<sandbox_identity::ScopeDigest> {
    let mut bytes = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(sandbox_identity::ScopeDigest::from_bytes(bytes))
}
