//! Keeping the profile's egress policy in force (X9, X10).
//!
//! What a sandbox's rules are is known without asking E2B: a sandbox this host creates
//! carries the digest of its policy in its metadata ([`EGRESS_KEY`]), which adoption's list
//! already returns; E2B metadata cannot be changed, so after a live update this host records
//! `<sandbox> <digest>` in the scope note, and that record wins over the stamp for that
//! sandbox. A sandbox is therefore updated with one request when, and only when, what is
//! known of it differs from the profile's policy; in steady state nothing is sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use e2b_client::{Client, SandboxId};

use super::{Attached, Backend, Inner, Phase, bump};
use crate::egress::{DesiredNetwork, EGRESS_KEY, EgressPolicy};
use crate::error::Error;
use crate::note::{NOTE_EGRESS, NOTE_STAND_INS};

/// What is known of a sandbox's rules when it is attached.
pub(crate) enum EgressKnown {
    /// Created by this process with the policy of this digest.
    Created(String),
    /// Found by metadata: the digest it was created with, if it carries one.
    Stamped(Option<String>),
    /// An externally owned sandbox (attach mode): its rules are not known.
    External,
}

impl Backend {
    /// Replaces the egress policy from the next command on (a re-read setting, a change made
    /// with `hermes e2b network`). Costs no request: the attached sandbox is updated before
    /// the next command that finds its rules differ (X10). Returns whether it changed.
    pub fn set_egress(&self, policy: EgressPolicy) -> bool {
        replace(&self.inner.egress, policy)
    }

    /// The egress policy in force from the next command on.
    pub fn egress(&self) -> EgressPolicy {
        self.inner
            .egress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the credentials from the next command on (a re-read setting). Costs no
    /// request: their rules reach the attached sandbox before the next command, together with
    /// the egress policy, and a changed value too, since values are resolved at every
    /// command (X16). Returns whether the setting changed.
    pub fn set_credentials(&self, credentials: crate::credentials::Credentials) -> bool {
        replace(&self.inner.credentials, credentials)
    }

    /// The credentials in force from the next command on.
    pub fn credentials(&self) -> crate::credentials::Credentials {
        self.inner
            .credentials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The stand-ins the attached sandbox's commands see, by variable name (X16); empty when
    /// nothing is attached or no credential is configured.
    pub fn stand_ins(&self) -> BTreeMap<String, String> {
        match &*self.inner.lock_state("stand-ins") {
            Phase::Attached(attached) => attached.stand_ins.clone(),
            _ => BTreeMap::new(),
        }
    }
}

/// Puts `value` in `slot`; whether it differed from what was there.
fn replace<T: PartialEq>(slot: &Mutex<T>, value: T) -> bool {
    let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
    let changed = *current != value;
    *current = value;
    changed
}

impl Inner {
    /// The rules the profile's policy means for this scope's sandboxes now.
    pub(crate) fn desired_egress(&self) -> EgressPolicy {
        self.egress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .effective(self.config.internet)
    }

    /// The policy and the credentials' rules E2B must hold now (X9, X16) for `operation` on
    /// `sandbox` (None before a create); an error names a credential without a value, the
    /// operation and the sandbox.
    pub(crate) fn desired_network(
        &self,
        operation: &'static str,
        sandbox: Option<&SandboxId>,
    ) -> Result<DesiredNetwork, Error> {
        let credentials = self
            .credentials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let rules = if credentials.is_empty() {
            e2b_client::TransformRules::new()
        } else {
            let store = match self.secret_store.get() {
                Some(store) => Arc::clone(store),
                None => {
                    let store = self.config.secret_store(&self.scope.profile_home)?;
                    Arc::clone(self.secret_store.get_or_init(|| store))
                }
            };
            crate::credentials::credential_rules(
                &store,
                self.config.credential_store,
                &credentials,
                &self.services.runtime,
                || self.shared_client(),
                operation,
                sandbox.map(SandboxId::as_str),
            )?
        };
        let proxy = DesiredNetwork::proxy(self.config.egress_proxy.as_ref(), &credentials)
            .map_err(|error| error.needed_by(operation, sandbox.map(SandboxId::as_str)))?;
        Ok(DesiredNetwork {
            policy: self.desired_egress(),
            rules,
            proxy,
        })
    }

    /// Puts the policy and the credentials' rules into a create request and their digest
    /// into the metadata; returns the digest.
    pub(super) fn stamp_egress(
        &self,
        options: &mut e2b_client::CreateOptions,
    ) -> Result<String, Error> {
        let desired = self.desired_network("create", None)?;
        let digest = desired.digest();
        // No rules, no `network`: on E2B the two are the same, while e2b-local filters the
        // commands of every sandbox created with a `network` (refusing UDP), which a
        // profile without a policy should not pay for. Rules set later reach it by update.
        if !desired.is_empty() {
            options.network = Some(desired.network_config());
        }
        options
            .metadata
            .insert(EGRESS_KEY.to_owned(), digest.clone());
        Ok(digest)
    }

    /// Makes the policy hold on a sandbox being attached, before anything is sent to its
    /// envd (X9): nothing when what is known matches, else one update. Returns the digest in
    /// force.
    pub(super) fn egress_at_attach(
        &self,
        client: &Client,
        id: &SandboxId,
        known: EgressKnown,
    ) -> Result<String, Error> {
        let desired = self.desired_network("attach", Some(id))?;
        let digest = desired.digest();
        let known = match known {
            EgressKnown::Created(digest) => Some(digest),
            EgressKnown::Stamped(stamp) => self.noted_egress(id).or(stamp),
            // A sandbox the profile does not own keeps its own rules unless the profile has
            // some: then they are put in force, as on any other.
            EgressKnown::External
                if self
                    .egress
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .is_empty()
                    && desired.rules.is_empty() =>
            {
                Some(digest.clone())
            }
            EgressKnown::External => None,
        };
        if known.as_deref() != Some(digest.as_str()) {
            self.update_egress(client, id, &desired)?;
        }
        Ok(digest)
    }

    /// Before each command: a policy changed since the sandbox was attached (a narrowed
    /// one included) is put in force first (X10). Costs nothing while it is unchanged, and
    /// no request when this host's note shows another process (`hermes e2b network`) has
    /// already applied it.
    pub(super) fn keep_egress(&self, attached: &mut Attached) -> Result<(), Error> {
        let desired = self.desired_network("command", Some(&attached.id))?;
        self.keep_stand_ins(attached);
        let digest = desired.digest();
        if attached.egress == digest {
            return Ok(());
        }
        if self.noted_egress(&attached.id).as_deref() != Some(digest.as_str()) {
            // A sandbox idle past its lease may have paused, and E2B updates running ones:
            // the baseline lease first (no request while the known expiry covers it).
            self.top_up_lease(attached, std::time::Duration::ZERO)?;
            self.update_egress(&attached.client, &attached.id, &desired)?;
        }
        attached.egress = digest;
        Ok(())
    }

    /// One update request, then the note (the record that outlives the stale stamp).
    fn update_egress(
        &self,
        client: &Client,
        id: &SandboxId,
        desired: &DesiredNetwork,
    ) -> Result<(), Error> {
        bump(&self.stats.network_updates);
        tracing::info!(sandbox_id = %id, "E2B egress policy applied to sandbox {id}: {}", desired.summary());
        self.block_on(client.replace_network(id, &desired.update()))
            .map_err(|source| Error::e2b("apply egress policy", Some(id.as_str()), source))?;
        let line = format!("{} {}", id.as_str(), desired.digest());
        self.note(|note| note.set(NOTE_EGRESS, &line));
        Ok(())
    }

    /// Gives the attached sandbox a stand-in for every configured credential (X16): those
    /// this host noted for it, else fresh random ones, noted. Costs nothing once each name
    /// has one.
    fn keep_stand_ins(&self, attached: &mut Attached) {
        // Each variable, and the aliases that see its stand-in too (Hermes' mappings).
        let names: Vec<(String, Vec<String>)> = self
            .credentials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .list()
            .iter()
            .map(|credential| (credential.name().to_owned(), credential.aliases().to_vec()))
            .collect();
        if names.iter().all(|(name, aliases)| {
            let own = attached.stand_ins.get(name);
            own.is_some()
                && aliases
                    .iter()
                    .all(|alias| attached.stand_ins.get(alias) == own)
        }) {
            return;
        }
        if attached.stand_ins.is_empty() {
            attached.stand_ins = self.noted_stand_ins(&attached.id);
        }
        let mut added = false;
        for (name, aliases) in names {
            let own = attached
                .stand_ins
                .entry(name)
                .or_insert_with(|| {
                    added = true;
                    crate::stand_in::new_stand_in(&*self.services.random)
                })
                .clone();
            for alias in aliases {
                if attached.stand_ins.get(&alias) != Some(&own) {
                    attached.stand_ins.insert(alias, own.clone());
                    added = true;
                }
            }
        }
        if added {
            let line = crate::stand_in::stand_ins_line(attached.id.as_str(), &attached.stand_ins);
            self.note(|note| note.set(NOTE_STAND_INS, &line));
        }
    }

    /// The stand-ins this host noted for `id`.
    fn noted_stand_ins(&self, id: &SandboxId) -> std::collections::BTreeMap<String, String> {
        let note = self
            .files
            .as_ref()
            .and_then(|files| files.note().ok().flatten());
        note.and_then(|note| {
            note.get(NOTE_STAND_INS)
                .map(|line| crate::stand_in::parse_stand_ins(line, id.as_str()))
        })
        .unwrap_or_default()
    }

    /// The digest this host last applied to `id`, from the scope note.
    fn noted_egress(&self, id: &SandboxId) -> Option<String> {
        let note = self.files.as_ref()?.note().ok().flatten()?;
        noted_for(note.get(NOTE_EGRESS)?, id.as_str())
    }
}

/// The digest in a note line `<sandbox> <digest>` when it is about `sandbox_id`.
pub(crate) fn noted_for(line: &str, sandbox_id: &str) -> Option<String> {
    let (id, digest) = line.split_once(' ')?;
    (id == sandbox_id).then(|| digest.trim().to_owned())
}
