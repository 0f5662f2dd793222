//! Where credentials' values live for E2B's egress (contract X22): in E2B Secrets by
//! default, one secret per profile and variable, so a sandbox's rules hold only the
//! placeholder `${e2b.secrets.<name>}` (no API answer carries a value, and a rotation is
//! one update of the secret, no sandbox touched); or, where the account or server offers no
//! Secrets API (a 404 or 403 to `GET /secrets`) or the setting says so, in the rules
//! themselves, as before.
//!
//! A process lists the profile's secrets once (the probe, which also finds secrets deleted
//! behind its back and deletes those of variables no longer configured). What this host last
//! stored is kept in a record beside the coordination files (owner-only, per endpoint; a
//! salted digest of each value, never the value), so a process that starts with the same
//! values sends nothing more, and a changed value is pushed once. The record is a cache:
//! losing it costs one update per secret.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use e2b_client::{Client, NewSecret, SecretQuery, SecretUpdate, SecretValue};
use futures::StreamExt;
use sandbox_identity::ProfileDigest;
use sha2::{Digest, Sha256};
use writer_lease::Host as _;

use crate::error::Error;

/// Every secret this plugin stores starts with this, then 12 hex digits of the profile's
/// digest, `-` and the variable's name in lower case.
pub const SECRET_NAME_PREFIX: &str = "hermes-e2b-";

/// The metadata key naming the variable a secret holds.
pub const SECRET_VARIABLE_KEY: &str = "hermes.variable";

/// The record of what this host stored, in the coordination directory.
const RECORD_FILE: &str = "credential-secrets";
const RECORD_HEADER: &str = "hermes-e2b credential secrets 2";

/// Where credentials' values are kept (`credential_store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialStore {
    /// E2B Secrets where the account offers them, else the rules (`auto`, the default).
    Auto,
    /// E2B Secrets only: without them no command runs (`secrets`).
    Secrets,
    /// The value in each sandbox's rules, where E2B's sandbox detail shows it (`rules`).
    Rules,
}

impl CredentialStore {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialStore::Auto => "auto",
            CredentialStore::Secrets => "secrets",
            CredentialStore::Rules => "rules",
        }
    }

    /// Parses the setting's value.
    pub fn parse(value: &str) -> Option<CredentialStore> {
        match value {
            "auto" => Some(CredentialStore::Auto),
            "secrets" => Some(CredentialStore::Secrets),
            "rules" => Some(CredentialStore::Rules),
            _ => None,
        }
    }
}

/// The store in force for a profile, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreInForce {
    /// E2B Secrets: the rules carry placeholders.
    Secrets,
    /// The rules carry the values; `why` says why not Secrets.
    Rules {
        /// The setting, or E2B's answer to the probe.
        why: String,
    },
}

impl StoreInForce {
    /// One line for people: `E2B Secrets` or `network rules (why)`.
    pub fn summary(&self) -> String {
        match self {
            StoreInForce::Secrets => "E2B Secrets".to_owned(),
            StoreInForce::Rules { why } => format!("network rules with the values ({why})"),
        }
    }

    /// `secrets` or `rules`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreInForce::Secrets => "secrets",
            StoreInForce::Rules { .. } => "rules",
        }
    }
}

/// The E2B secret name of variable `variable` for `profile`.
pub fn secret_name(profile: &ProfileDigest, variable: &str) -> String {
    format!(
        "{}-{}",
        secret_prefix(profile).trim_end_matches('-'),
        variable.to_ascii_lowercase()
    )
}

fn secret_prefix(profile: &ProfileDigest) -> String {
    format!("{SECRET_NAME_PREFIX}{}-", &profile.to_hex()[..12])
}

/// One of the profile's secrets as E2B lists it (never its value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSecret {
    /// The secret's name.
    pub name: String,
    /// The variable it holds, from its metadata.
    pub variable: Option<String>,
    /// When its value last changed (RFC 3339).
    pub updated_at: String,
    /// Its version: one more per update.
    pub version: u64,
}

/// A profile's store as E2B reports it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreReport {
    /// Which store is in force, and why.
    pub in_force: StoreInForce,
    /// The profile's secrets (empty unless Secrets are in force).
    pub secrets: Vec<StoredSecret>,
}

/// One profile's store on one E2B endpoint, shared by every backend of the process.
pub(crate) struct ProfileStore {
    profile: ProfileDigest,
    /// The endpoint the record is about: another endpoint's record is not this one's.
    endpoint: String,
    record: Option<PathBuf>,
    synced: tokio::sync::Mutex<Synced>,
    /// The fast path's copy: the store in force and the digests pushed, read without the
    /// async lock.
    settled: Mutex<Option<(StoreInForce, BTreeMap<String, String>)>>,
}

#[derive(Default)]
struct Synced {
    loaded: bool,
    in_force: Option<StoreInForce>,
    salt: String,
    /// The variables configured when this process last listed the profile's secrets.
    names: Option<BTreeSet<String>>,
    /// Secret name → salted digest of the value stored.
    pushed: BTreeMap<String, String>,
}

type Registry = Mutex<HashMap<(String, PathBuf), Arc<ProfileStore>>>;

/// The process's store for `profile_home` on `api_url`: one per pair, so a gateway's many
/// sessions push a rotated value once.
pub(crate) fn profile_store(
    api_url: &str,
    profile_home: &Path,
    coordination_dir: Option<&Path>,
) -> Arc<ProfileStore> {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(Registry::default);
    let key = (api_url.to_owned(), profile_home.to_path_buf());
    let mut stores = registry.lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(stores.entry(key).or_insert_with(|| {
        Arc::new(ProfileStore {
            profile: ProfileDigest::of(&profile_home.to_string_lossy()),
            endpoint: api_url.to_owned(),
            record: coordination_dir.map(|dir| dir.join(RECORD_FILE)),
            synced: tokio::sync::Mutex::new(Synced::default()),
            settled: Mutex::new(None),
        })
    }))
}

/// A credential's value and the secret that holds it.
pub(crate) struct Resolved {
    pub(crate) variable: String,
    pub(crate) secret: String,
    pub(crate) value: SecretValue,
}

impl ProfileStore {
    /// The secret name of `variable`.
    pub(crate) fn secret_name(&self, variable: &str) -> String {
        secret_name(&self.profile, variable)
    }

    /// Makes the store hold `values` (every configured credential, resolved) and returns the
    /// store in force. Steady state: no request and no lock held across an await. The first
    /// call of a process, and the first after the configured names change, lists the
    /// profile's secrets (the probe), deletes those of variables no longer configured and
    /// stores any missing one; a changed value is one update.
    pub(crate) async fn sync(
        &self,
        client: &Client,
        choice: CredentialStore,
        values: &[Resolved],
    ) -> Result<StoreInForce, SyncError> {
        if let Some(in_force) = self.settled_for(choice, values) {
            return Ok(in_force);
        }
        let mut synced = self.synced.lock().await;
        if !synced.loaded {
            synced.loaded = true;
            let record = self.record.as_deref().and_then(read_record);
            if let Some(record) = record.filter(|r| r.endpoint == self.endpoint) {
                synced.salt = record.salt;
                synced.pushed = record.pushed;
            }
        }
        if synced.salt.is_empty() {
            synced.salt = new_salt();
        }
        let names: BTreeSet<String> = values.iter().map(|v| v.variable.clone()).collect();
        let mut existing: Option<BTreeSet<String>> = None;
        if synced.in_force.is_none() || synced.names.as_ref() != Some(&names) {
            match self.list(client).await {
                Ok(listed) => {
                    let wanted: BTreeSet<&str> = values.iter().map(|v| v.secret.as_str()).collect();
                    for stale in listed.iter().filter(|s| !wanted.contains(s.name.as_str())) {
                        // A credential no longer configured: its value leaves E2B.
                        match client.delete_secret(&stale.name).await {
                            Ok(_) => tracing::info!(
                                "E2B secret {} deleted: its credential is no longer configured",
                                stale.name
                            ),
                            Err(error) => tracing::warn!(
                                "E2B secret {} (no longer configured) was not deleted: {}",
                                stale.name,
                                crate::error::ErrorChain(&error)
                            ),
                        }
                        synced.pushed.remove(&stale.name);
                    }
                    existing = Some(listed.into_iter().map(|s| s.name).collect());
                    synced.in_force = Some(StoreInForce::Secrets);
                    synced.names = Some(names);
                }
                Err(error) if error.is_not_found() || error.is_forbidden() => {
                    let why = unavailable(&error);
                    if choice == CredentialStore::Secrets {
                        return Err(SyncError::Unavailable(why));
                    }
                    let in_force = StoreInForce::Rules { why };
                    synced.in_force = Some(in_force.clone());
                    self.settle(&synced);
                    return Ok(in_force);
                }
                Err(error) => return Err(SyncError::E2b("list E2B Secrets", error)),
            }
        }
        if let Some(StoreInForce::Rules { why }) = &synced.in_force {
            if choice == CredentialStore::Secrets {
                return Err(SyncError::Unavailable(why.clone()));
            }
            return Ok(synced.in_force.clone().unwrap_or(StoreInForce::Secrets));
        }
        let mut changed = existing.is_some();
        for resolved in values {
            let digest = value_digest(&synced.salt, &resolved.secret, &resolved.value);
            let missing = existing
                .as_ref()
                .is_some_and(|e| !e.contains(&resolved.secret));
            if !missing && synced.pushed.get(&resolved.secret) == Some(&digest) {
                continue;
            }
            let known = existing.as_ref().map(|e| e.contains(&resolved.secret));
            self.push(client, resolved, known).await?;
            synced.pushed.insert(resolved.secret.clone(), digest);
            changed = true;
        }
        if changed {
            self.write_record(&synced);
        }
        self.settle(&synced);
        Ok(StoreInForce::Secrets)
    }

    /// The fast path: the store in force when every value is the one pushed.
    pub(crate) fn settled_for(
        &self,
        choice: CredentialStore,
        values: &[Resolved],
    ) -> Option<StoreInForce> {
        if choice == CredentialStore::Rules {
            return Some(StoreInForce::Rules {
                why: "credential_store: rules".to_owned(),
            });
        }
        let settled = self.settled.lock().unwrap_or_else(PoisonError::into_inner);
        let (in_force, pushed) = settled.as_ref()?;
        if let StoreInForce::Rules { .. } = in_force {
            // `secrets` takes the slow path, which refuses.
            return (choice == CredentialStore::Auto).then(|| in_force.clone());
        }
        let salt = pushed.get("")?;
        let all_pushed = pushed.len() == values.len() + 1
            && values
                .iter()
                .all(|v| pushed.get(&v.secret) == Some(&value_digest(salt, &v.secret, &v.value)));
        all_pushed.then_some(StoreInForce::Secrets)
    }

    fn settle(&self, synced: &Synced) {
        let Some(in_force) = synced.in_force.clone() else {
            return;
        };
        let mut pushed = synced.pushed.clone();
        // The salt rides under the empty name, which no secret has.
        pushed.insert(String::new(), synced.salt.clone());
        *self.settled.lock().unwrap_or_else(PoisonError::into_inner) = Some((in_force, pushed));
    }

    /// One update of the secret, or its creation when E2B has none of that name.
    async fn push(
        &self,
        client: &Client,
        resolved: &Resolved,
        known: Option<bool>,
    ) -> Result<(), SyncError> {
        let metadata = BTreeMap::from([
            (SECRET_VARIABLE_KEY.to_owned(), resolved.variable.clone()),
            ("hermes.profile".to_owned(), self.profile.to_hex()),
        ]);
        let update = || {
            client.update_secret(
                &resolved.secret,
                SecretUpdate {
                    value: resolved.value.clone(),
                    metadata: Some(metadata.clone()),
                },
            )
        };
        let create = || {
            client.create_secret(NewSecret {
                name: resolved.secret.clone(),
                value: resolved.value.clone(),
                metadata: Some(metadata.clone()),
            })
        };
        let stored = if known == Some(false) {
            match create().await {
                Err(error) if error.is_name_taken() => update().await.map(drop),
                other => other.map(drop),
            }
        } else {
            match update().await {
                Err(error) if error.is_not_found() => match create().await {
                    Err(error) if error.is_name_taken() => update().await.map(drop),
                    other => other.map(drop),
                },
                other => other.map(drop),
            }
        };
        stored.map_err(|error| SyncError::E2b("store credential in E2B Secrets", error))?;
        tracing::info!(
            "E2B secret {} holds {}'s current value",
            resolved.secret,
            resolved.variable
        );
        Ok(())
    }

    /// The profile's secrets, every page.
    async fn list(&self, client: &Client) -> Result<Vec<StoredSecret>, e2b_client::Error> {
        let prefix = secret_prefix(&self.profile);
        let mut stream = Box::pin(client.list_secrets(SecretQuery::all()));
        let mut out = Vec::new();
        while let Some(info) = stream.next().await {
            let info = info?;
            if info.name.starts_with(&prefix) {
                out.push(StoredSecret {
                    variable: info.metadata.get(SECRET_VARIABLE_KEY).cloned(),
                    name: info.name,
                    updated_at: info
                        .updated_at
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                    version: info.current_version,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// What E2B holds for the profile now (one list; nothing stored or deleted).
    pub(crate) async fn report(
        &self,
        client: &Client,
        choice: CredentialStore,
    ) -> Result<StoreReport, SyncError> {
        if choice == CredentialStore::Rules {
            return Ok(StoreReport {
                in_force: StoreInForce::Rules {
                    why: "credential_store: rules".to_owned(),
                },
                secrets: Vec::new(),
            });
        }
        match self.list(client).await {
            Ok(secrets) => Ok(StoreReport {
                in_force: StoreInForce::Secrets,
                secrets,
            }),
            Err(error) if error.is_not_found() || error.is_forbidden() => {
                let why = unavailable(&error);
                if choice == CredentialStore::Secrets {
                    return Err(SyncError::Unavailable(why));
                }
                Ok(StoreReport {
                    in_force: StoreInForce::Rules { why },
                    secrets: Vec::new(),
                })
            }
            Err(error) => Err(SyncError::E2b("list E2B Secrets", error)),
        }
    }

    fn write_record(&self, synced: &Synced) {
        let Some(path) = &self.record else {
            return;
        };
        let mut text = format!(
            "{RECORD_HEADER}\nendpoint {}\nsalt {}\n",
            self.endpoint, synced.salt
        );
        for (secret, digest) in &synced.pushed {
            text.push_str(&format!("{secret} {digest}\n"));
        }
        // The coordination files' own writer: owner-only, atomic, the directory made 0700.
        let host = writer_lease::OsHost;
        let written = path
            .parent()
            .map_or(Ok(()), |dir| host.ensure_private_dir(dir))
            .and_then(|()| host.write_atomic(path, text.as_bytes()));
        if let Err(error) = written {
            // A cache: without it the next process pushes each value once more.
            tracing::debug!(
                "the credential secrets record {} was not written: {error}",
                path.display()
            );
        }
    }
}

/// Why a secrets call failed, before the caller names its operation and sandbox.
#[derive(Debug)]
pub(crate) enum SyncError {
    /// `credential_store: secrets` on an account or server without Secrets.
    Unavailable(String),
    /// A request failed.
    E2b(&'static str, e2b_client::Error),
}

impl SyncError {
    /// The crate error for `operation` on `sandbox_id`.
    pub(crate) fn needed_by(self, operation: &'static str, sandbox_id: Option<&str>) -> Error {
        match self {
            SyncError::Unavailable(why) => Error::SecretsUnavailable {
                operation,
                sandbox_id: sandbox_id.map(str::to_owned),
                why,
            },
            SyncError::E2b(step, source) => Error::e2b(step, sandbox_id, source),
        }
    }
}

fn unavailable(error: &e2b_client::Error) -> String {
    let status = if error.is_forbidden() { 403 } else { 404 };
    format!("E2B answered {status} to GET /secrets: this account or server offers no Secrets")
}

/// A salted digest of `value` for `secret`: equal values, equal digests; the value cannot
/// be read back from it. 16 hex digits.
fn value_digest(salt: &str, secret: &str, value: &SecretValue) -> String {
    let mut hasher = Sha256::new();
    for part in [salt, secret, value.expose()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn new_salt() -> String {
    let mut bytes = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

struct Record {
    endpoint: String,
    salt: String,
    pushed: BTreeMap<String, String>,
}

/// The record, when it is whole and in this format (anything else: none, pushed again).
fn read_record(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next()? != RECORD_HEADER {
        return None;
    }
    let endpoint = lines.next()?.strip_prefix("endpoint ")?.to_owned();
    let salt = lines.next()?.strip_prefix("salt ")?.to_owned();
    let mut pushed = BTreeMap::new();
    for line in lines {
        let (secret, digest) = line.split_once(' ')?;
        pushed.insert(secret.to_owned(), digest.to_owned());
    }
    (!salt.is_empty()).then_some(Record {
        endpoint,
        salt,
        pushed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_plugin_profile_and_variable_and_e2b_takes_them() {
        // contract: X22
        let profile = ProfileDigest::of("/home/u/.hermes");
        let other = ProfileDigest::of("/home/u/.hermes/profiles/work");
        let name = secret_name(&profile, "GITHUB_TOKEN");
        assert!(name.starts_with(SECRET_NAME_PREFIX) && name.ends_with("-github_token"));
        assert_ne!(name, secret_name(&other, "GITHUB_TOKEN"));
        assert_eq!(
            e2b_client::canonical_secret_name(&name).as_deref(),
            Ok(name.as_str())
        );
    }

    #[test]
    fn the_record_round_trips_and_holds_no_value() {
        // contract: X22
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RECORD_FILE);
        let store = ProfileStore {
            profile: ProfileDigest::of("/p"),
            endpoint: "http://127.0.0.1:1".to_owned(),
            record: Some(path.clone()),
            synced: tokio::sync::Mutex::new(Synced::default()),
            settled: Mutex::new(None),
        };
        let value = SecretValue::new("ghp_secret_value".to_owned());
        let synced = Synced {
            loaded: true,
            in_force: Some(StoreInForce::Secrets),
            salt: new_salt(),
            names: Some(BTreeSet::from(["GITHUB_TOKEN".to_owned()])),
            pushed: BTreeMap::from([(
                "hermes-e2b-x-github_token".to_owned(),
                value_digest("s", "n", &value),
            )]),
        };
        store.write_record(&synced);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("ghp_secret_value"), "{text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let record = read_record(&path).unwrap();
        assert_eq!(record.salt, synced.salt);
        assert_eq!(record.endpoint, store.endpoint);
        assert_eq!(record.pushed, synced.pushed);
        // Another value, another digest; another salt, another digest.
        let other = SecretValue::new("ghp_other".to_owned());
        assert_ne!(
            value_digest("s", "n", &value),
            value_digest("s", "n", &other)
        );
        assert_ne!(
            value_digest("s", "n", &value),
            value_digest("t", "n", &value)
        );
        std::fs::write(&path, "something else\n").unwrap();
        assert!(read_record(&path).is_none());
    }
}
