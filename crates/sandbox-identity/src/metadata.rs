//! The identity the backend stamps on a sandbox, and its merge with user metadata.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::scope::{IDENTITY_VERSION, Mode, ScopeDigest, ScopeIdentity};

/// Metadata key holding the scope digest (64 lowercase hex characters).
pub const SCOPE_KEY: &str = "hermes.scope";
/// Metadata key holding [`IDENTITY_VERSION`] in decimal.
pub const IDENTITY_VERSION_KEY: &str = "hermes.identity";
/// Metadata key holding the mode (`persistent` or `ephemeral`).
pub const MODE_KEY: &str = "hermes.mode";
/// Prefix reserved for this backend's keys; user metadata may not use it.
pub const RESERVED_PREFIX: &str = "hermes.";

/// The identity part of a sandbox's metadata.
///
/// It holds only the digest, the identity version and the mode, so no task
/// id, session key or host path ever reaches E2B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentityMetadata {
    /// The scope digest.
    pub digest: ScopeDigest,
    /// The mode the sandbox was created in.
    pub mode: Mode,
}

impl IdentityMetadata {
    /// The identity metadata of a scope.
    pub fn for_scope(identity: &ScopeIdentity) -> Self {
        IdentityMetadata {
            digest: identity.digest(),
            mode: identity.mode,
        }
    }

    /// The identity keys and their values.
    ///
    /// Also the filter to list a scope's sandboxes by: every key must match.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SCOPE_KEY.to_owned(), self.digest.to_hex()),
            (
                IDENTITY_VERSION_KEY.to_owned(),
                IDENTITY_VERSION.to_string(),
            ),
            (MODE_KEY.to_owned(), self.mode.as_str().to_owned()),
        ])
    }

    /// Reads the identity back from a sandbox's metadata.
    ///
    /// Strict: the version must be exactly [`IDENTITY_VERSION`] in its
    /// canonical decimal form, the digest canonical hex, the mode one of the
    /// two names. Other keys are ignored.
    pub fn from_map(metadata: &BTreeMap<String, String>) -> Result<Self, Error> {
        let get = |key: &'static str| {
            metadata
                .get(key)
                .map(String::as_str)
                .ok_or(Error::MissingKey { key })
        };
        let unsupported = |key: &'static str| Error::UnsupportedValue { key };

        if get(IDENTITY_VERSION_KEY)? != IDENTITY_VERSION.to_string() {
            return Err(unsupported(IDENTITY_VERSION_KEY));
        }
        let digest = get(SCOPE_KEY)?
            .parse::<ScopeDigest>()
            .map_err(|_| unsupported(SCOPE_KEY))?;
        let mode = match get(MODE_KEY)? {
            "persistent" => Mode::Persistent,
            "ephemeral" => Mode::Ephemeral,
            _ => return Err(unsupported(MODE_KEY)),
        };
        Ok(IdentityMetadata { digest, mode })
    }
}

/// The metadata to create a sandbox with: user metadata merged under the
/// identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampedMetadata {
    /// The merged map to send with the create request.
    pub metadata: BTreeMap<String, String>,
    /// User keys that were dropped because they use the reserved
    /// [`RESERVED_PREFIX`] (identity keys always win), sorted, so the caller
    /// can warn about a configuration that tried to set them.
    pub dropped_user_keys: Vec<String>,
}

/// Merges user metadata with the identity; the identity always wins.
///
/// Every user key under [`RESERVED_PREFIX`] is dropped, not only the current
/// identity keys, so a user value cannot collide with a key a later identity
/// version adds.
pub fn stamp(user: &BTreeMap<String, String>, identity: &IdentityMetadata) -> StampedMetadata {
    let mut metadata = BTreeMap::new();
    let mut dropped_user_keys = Vec::new();
    for (key, value) in user {
        if key.starts_with(RESERVED_PREFIX) {
            dropped_user_keys.push(key.clone());
        } else {
            metadata.insert(key.clone(), value.clone());
        }
    }
    metadata.extend(identity.to_map());
    StampedMetadata {
        metadata,
        dropped_user_keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::{InternetAccess, Security};

    fn identity() -> ScopeIdentity {
        ScopeIdentity {
            profile_home: "/home/alice/.hermes".to_owned(),
            task_id: "session:telegram:12345".to_owned(),
            template: "base".to_owned(),
            mode: Mode::Persistent,
            internet: InternetAccess::Allowed,
            security: Security::Secure,
        }
    }

    // contract: I1
    #[test]
    fn stamped_metadata_carries_no_task_id_or_host_path() {
        let scope = identity();
        let user = BTreeMap::from([("team".to_owned(), "infra".to_owned())]);
        let stamped = stamp(&user, &IdentityMetadata::for_scope(&scope));
        for (key, value) in &stamped.metadata {
            for secret in ["alice", ".hermes", "telegram", "12345", "session"] {
                assert!(
                    !key.contains(secret) && !value.contains(secret),
                    "{key}={value} leaks {secret}"
                );
            }
        }
        assert_eq!(
            stamped.metadata.get("team").map(String::as_str),
            Some("infra")
        );
        assert_eq!(
            stamped.metadata.get(SCOPE_KEY),
            Some(&scope.digest().to_hex())
        );
        assert_eq!(
            stamped.metadata.get(MODE_KEY).map(String::as_str),
            Some("persistent")
        );
        assert_eq!(
            stamped
                .metadata
                .get(IDENTITY_VERSION_KEY)
                .map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn identity_keys_win_over_user_metadata() {
        let ident = IdentityMetadata::for_scope(&identity());
        let user = BTreeMap::from([
            (SCOPE_KEY.to_owned(), "0".repeat(64)),
            (MODE_KEY.to_owned(), "ephemeral".to_owned()),
            ("hermes.future".to_owned(), "x".to_owned()),
            ("owner".to_owned(), "bob".to_owned()),
        ]);
        let stamped = stamp(&user, &ident);
        assert_eq!(IdentityMetadata::from_map(&stamped.metadata), Ok(ident));
        assert!(!stamped.metadata.contains_key("hermes.future"));
        assert_eq!(
            stamped.metadata.get("owner").map(String::as_str),
            Some("bob")
        );
        assert_eq!(
            stamped.dropped_user_keys,
            vec!["hermes.future", "hermes.mode", "hermes.scope"]
        );
    }

    #[test]
    fn reading_identity_rejects_foreign_or_partial_metadata() {
        let ident = IdentityMetadata::for_scope(&identity());
        let good = ident.to_map();
        assert_eq!(IdentityMetadata::from_map(&good), Ok(ident));

        let mut missing = good.clone();
        missing.remove(SCOPE_KEY);
        assert!(IdentityMetadata::from_map(&missing).is_err_and(|e| e.is_missing_identity()));

        for (key, bad) in [
            (IDENTITY_VERSION_KEY, "2"),
            (IDENTITY_VERSION_KEY, "01"),
            (MODE_KEY, "Persistent"),
            (SCOPE_KEY, "abc"),
        ] {
            let mut map = good.clone();
            map.insert(key.to_owned(), bad.to_owned());
            assert_eq!(
                IdentityMetadata::from_map(&map),
                Err(Error::UnsupportedValue { key }),
                "{key}={bad}"
            );
        }
    }
}
