//! Descriptive metadata stamped beside the identity: which profile made a sandbox (as a
//! digest) and its posture. Never used to adopt: the scope digest alone decides that, so
//! sandboxes stamped before these keys existed are still found (inventory falls back to the
//! host's own scope files for them).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::metadata::{IdentityMetadata, StampedMetadata, stamp};
use crate::scope::{IDENTITY_VERSION, InternetAccess, ScopeDigest, ScopeIdentity, Security};

/// Metadata key holding the [`ProfileDigest`] of the profile that created the sandbox.
pub const PROFILE_KEY: &str = "hermes.profile";
/// Metadata key holding the [`Posture`] the sandbox was created with.
pub const POSTURE_KEY: &str = "hermes.posture";

/// Domain-separation tag, so a profile digest never equals a scope digest.
const PROFILE_DOMAIN_TAG: &[u8] = b"hermes-e2b/profile";

/// SHA-256 over a versioned, length-prefixed encoding of the profile home alone: the same
/// for every scope of one profile, and it reveals nothing about the path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileDigest(ScopeDigest);

impl ProfileDigest {
    /// The digest of a profile home, as Hermes names it (the string the scope digest uses).
    pub fn of(profile_home: &str) -> ProfileDigest {
        let mut out = Vec::with_capacity(64 + profile_home.len());
        for field in [
            PROFILE_DOMAIN_TAG,
            &IDENTITY_VERSION.to_be_bytes()[..],
            profile_home.as_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u64).to_be_bytes());
            out.extend_from_slice(field);
        }
        ProfileDigest(ScopeDigest::from_bytes(Sha256::digest(&out).into()))
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }

    /// The raw digest bytes.
    pub fn as_bytes(&self) -> [u8; 32] {
        *self.0.as_bytes()
    }
}

impl fmt::Debug for ProfileDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProfileDigest({})", self.to_hex())
    }
}

impl fmt::Display for ProfileDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for ProfileDigest {
    type Err = Error;

    /// The canonical form only, as [`ScopeDigest`]'s.
    fn from_str(value: &str) -> Result<Self, Error> {
        value.parse::<ScopeDigest>().map(ProfileDigest)
    }
}

/// The egress policy and envd protection a sandbox was created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Posture {
    /// The egress policy.
    pub internet: InternetAccess,
    /// The envd protection.
    pub security: Security,
}

impl Posture {
    /// The stamped form: `internet-allowed secure`, `internet-denied insecure`, ...
    pub fn as_str(self) -> &'static str {
        match (self.internet, self.security) {
            (InternetAccess::Allowed, Security::Secure) => "internet-allowed secure",
            (InternetAccess::Allowed, Security::Insecure) => "internet-allowed insecure",
            (InternetAccess::Denied, Security::Secure) => "internet-denied secure",
            (InternetAccess::Denied, Security::Insecure) => "internet-denied insecure",
        }
    }

    fn parse(value: &str) -> Option<Posture> {
        let (internet, security) = value.split_once(' ')?;
        Some(Posture {
            internet: match internet {
                "internet-allowed" => InternetAccess::Allowed,
                "internet-denied" => InternetAccess::Denied,
                _ => return None,
            },
            security: match security {
                "secure" => Security::Secure,
                "insecure" => Security::Insecure,
                _ => return None,
            },
        })
    }
}

impl fmt::Display for Posture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The descriptive keys read back from a sandbox's metadata; each is `None` when absent
/// (a sandbox made before the key existed) or not in its canonical form (untrusted input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Labels {
    /// The creating profile.
    pub profile: Option<ProfileDigest>,
    /// The posture at creation.
    pub posture: Option<Posture>,
}

impl Labels {
    /// The labels of a scope.
    pub fn for_scope(identity: &ScopeIdentity) -> Labels {
        Labels {
            profile: Some(ProfileDigest::of(&identity.profile_home)),
            posture: Some(Posture {
                internet: identity.internet,
                security: identity.security,
            }),
        }
    }

    /// Reads the labels back; lenient, since their absence is normal for older sandboxes.
    pub fn from_map(metadata: &BTreeMap<String, String>) -> Labels {
        Labels {
            profile: metadata.get(PROFILE_KEY).and_then(|v| v.parse().ok()),
            posture: metadata.get(POSTURE_KEY).and_then(|v| Posture::parse(v)),
        }
    }

    /// The keys and values present.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        if let Some(profile) = self.profile {
            map.insert(PROFILE_KEY.to_owned(), profile.to_hex());
        }
        if let Some(posture) = self.posture {
            map.insert(POSTURE_KEY.to_owned(), posture.as_str().to_owned());
        }
        map
    }
}

/// [`stamp`] plus the scope's [`Labels`]: what a new sandbox is created with. The labels sit
/// under the reserved prefix too, so user metadata can never forge them.
pub fn stamp_scope(user: &BTreeMap<String, String>, identity: &ScopeIdentity) -> StampedMetadata {
    let mut stamped = stamp(user, &IdentityMetadata::for_scope(identity));
    stamped
        .metadata
        .extend(Labels::for_scope(identity).to_map());
    stamped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::Mode;
    use crate::{SCOPE_KEY, adoption};

    fn identity(home: &str, task: &str) -> ScopeIdentity {
        ScopeIdentity {
            profile_home: home.to_owned(),
            task_id: task.to_owned(),
            template: "base".to_owned(),
            mode: Mode::Persistent,
            internet: InternetAccess::Denied,
            security: Security::Secure,
        }
    }

    // contract: I7
    #[test]
    fn the_profile_digest_is_per_profile_and_hides_the_path() {
        let a = identity("/home/alice/.hermes", "default");
        let b = identity("/home/alice/.hermes", "session:x");
        let other = identity("/home/bob/.hermes", "default");
        let stamped_a = stamp_scope(&BTreeMap::new(), &a).metadata;
        let stamped_b = stamp_scope(&BTreeMap::new(), &b).metadata;
        assert_eq!(stamped_a[PROFILE_KEY], stamped_b[PROFILE_KEY]);
        assert_ne!(stamped_a[SCOPE_KEY], stamped_b[SCOPE_KEY]);
        assert_ne!(
            stamped_a[PROFILE_KEY],
            stamp_scope(&BTreeMap::new(), &other).metadata[PROFILE_KEY]
        );
        // Domain-separated from the scope digest, and no path in any value.
        assert_ne!(stamped_a[PROFILE_KEY], a.digest().to_hex());
        assert!(stamped_a.values().all(|v| !v.contains("alice")));
        assert_eq!(stamped_a[POSTURE_KEY], "internet-denied secure");
    }

    #[test]
    fn the_profile_digest_is_pinned() {
        // SHA-256 over the layout in `ProfileDigest::of` (three length-prefixed fields),
        // computed with Python's hashlib.
        assert_eq!(
            ProfileDigest::of("/home/u/.hermes").to_hex(),
            "da4b3b874fa2ef5b29fb73c4453a1d4dc09416e4269ed0c221908c7b803cb808"
        );
    }

    #[test]
    fn labels_read_back_leniently_and_users_cannot_forge_them() {
        let scope = identity("/h", "t");
        let forged = BTreeMap::from([(PROFILE_KEY.to_owned(), "0".repeat(64))]);
        let stamped = stamp_scope(&forged, &scope);
        assert_eq!(
            Labels::from_map(&stamped.metadata),
            Labels::for_scope(&scope)
        );
        assert_eq!(stamped.dropped_user_keys, vec![PROFILE_KEY]);

        let legacy = IdentityMetadata::for_scope(&scope).to_map();
        let none = Labels {
            profile: None,
            posture: None,
        };
        assert_eq!(Labels::from_map(&legacy), none);
        let mut bad = legacy.clone();
        bad.insert(PROFILE_KEY.to_owned(), "ABC".to_owned());
        bad.insert(
            POSTURE_KEY.to_owned(),
            "internet-allowed  secure".to_owned(),
        );
        assert_eq!(Labels::from_map(&bad), none);
    }

    // contract: I7
    #[test]
    fn labels_do_not_change_adoption() {
        let scope = identity("/h", "t");
        let mut listed = adoption::Candidate {
            sandbox_id: "a".to_owned(),
            template_id: "base".to_owned(),
            template_alias: None,
            metadata: IdentityMetadata::for_scope(&scope).to_map(),
            started_at: std::time::SystemTime::UNIX_EPOCH,
            state: adoption::SandboxState::Running,
        };
        assert_eq!(
            adoption::check(&scope, &listed),
            Ok(()),
            "a legacy sandbox is adopted"
        );
        listed.metadata = stamp_scope(&BTreeMap::new(), &scope).metadata;
        assert_eq!(adoption::check(&scope, &listed), Ok(()));
    }
}
