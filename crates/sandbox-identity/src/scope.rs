//! The scope a sandbox belongs to, and its digest.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Version of the identity encoding and of the metadata stamped on sandboxes.
///
/// Bumping it gives every scope a new digest, so sandboxes stamped under an
/// older encoding are never adopted by a newer one.
pub const IDENTITY_VERSION: u32 = 1;

/// Domain-separation tag at the front of every encoding, so a digest of a
/// scope can never equal a SHA-256 of some other structure of ours.
const DOMAIN_TAG: &[u8] = b"hermes-e2b/scope";

/// Whether a sandbox outlives its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One sandbox per scope, paused by E2B at lease expiry and found again later.
    Persistent,
    /// A fresh sandbox per session, killed at teardown and never adopted.
    Ephemeral,
}

impl Mode {
    /// The value stamped under [`MODE_KEY`](crate::MODE_KEY).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Persistent => "persistent",
            Mode::Ephemeral => "ephemeral",
        }
    }

    fn tag(self) -> u8 {
        match self {
            Mode::Persistent => b'p',
            Mode::Ephemeral => b'e',
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The sandbox's egress policy (`allow_internet_access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InternetAccess {
    /// Outbound traffic is allowed.
    Allowed,
    /// The sandbox sits behind deny-all egress.
    Denied,
}

impl InternetAccess {
    fn tag(self) -> u8 {
        match self {
            InternetAccess::Allowed => b'a',
            InternetAccess::Denied => b'd',
        }
    }
}

/// Whether envd's access-token protection is on (`secure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Security {
    /// envd requires its access token.
    Secure,
    /// envd accepts unauthenticated requests.
    Insecure,
}

impl Security {
    fn tag(self) -> u8 {
        match self {
            Security::Secure => b's',
            Security::Insecure => b'i',
        }
    }
}

/// Everything that makes an existing sandbox a valid substitute for the one
/// this session would create.
///
/// Lease durations, the working directory and user metadata are deliberately
/// absent: none of them makes an existing sandbox unsafe to reuse. The
/// posture fields are present because a sandbox keeps the egress policy and
/// envd protection it was created with for life, so tightening either must
/// lead to a new sandbox.
///
/// Strings are hashed exactly as given; this crate does not normalise them
/// (that would need I/O for paths). Callers pass Hermes' own values: the
/// profile home key and the resolved container task id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScopeIdentity {
    /// The Hermes profile home, as Hermes names it (never leaves the host).
    pub profile_home: String,
    /// The container task id Hermes resolved (never leaves the host).
    pub task_id: String,
    /// The E2B template name or id, as configured.
    pub template: String,
    /// Persistent or ephemeral.
    pub mode: Mode,
    /// The egress policy.
    pub internet: InternetAccess,
    /// The envd protection.
    pub security: Security,
}

impl ScopeIdentity {
    /// The versioned, length-prefixed encoding the digest is taken over.
    ///
    /// Every field, the domain tag and the version included, is written as an
    /// 8-byte big-endian length followed by its bytes, in a fixed order. A
    /// sequence of such fields parses one way only, so two identities that
    /// differ in any field (a separator or unicode inside a task id included)
    /// have different encodings. The encoding uses no platform-dependent
    /// types, so it is the same on every host.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            128 + self.profile_home.len() + self.task_id.len() + self.template.len(),
        );
        put_field(&mut out, DOMAIN_TAG);
        put_field(&mut out, &IDENTITY_VERSION.to_be_bytes());
        put_field(&mut out, self.profile_home.as_bytes());
        put_field(&mut out, self.task_id.as_bytes());
        put_field(&mut out, self.template.as_bytes());
        put_field(&mut out, &[self.mode.tag()]);
        put_field(&mut out, &[self.internet.tag()]);
        put_field(&mut out, &[self.security.tag()]);
        out
    }

    /// The SHA-256 scope digest of [`encode`](Self::encode).
    pub fn digest(&self) -> ScopeDigest {
        ScopeDigest(Sha256::digest(self.encode()).into())
    }
}

fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    // usize -> u64 is lossless on every platform Rust supports.
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// A scope digest: SHA-256 over [`ScopeIdentity::encode`].
///
/// Shown and stamped as 64 lowercase hex characters. It reveals nothing about
/// the profile home or the task id it was computed from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeDigest([u8; 32]);

impl ScopeDigest {
    /// Wraps raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ScopeDigest(bytes)
    }

    /// The raw digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for ScopeDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScopeDigest({})", self.to_hex())
    }
}

impl fmt::Display for ScopeDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for ScopeDigest {
    type Err = Error;

    /// Parses the canonical form only (64 lowercase hex characters), since
    /// the value usually comes from sandbox metadata, which is untrusted.
    fn from_str(value: &str) -> Result<Self, Error> {
        let mut out = [0u8; 32];
        // `hex` also accepts uppercase, which would give one digest two spellings.
        if value.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(value, &mut out).is_err()
        {
            return Err(Error::MalformedDigest {
                length: value.len(),
            });
        }
        Ok(ScopeDigest(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ScopeIdentity {
        ScopeIdentity {
            profile_home: "/home/u/.hermes".to_owned(),
            task_id: "default".to_owned(),
            template: "base".to_owned(),
            mode: Mode::Persistent,
            internet: InternetAccess::Allowed,
            security: Security::Secure,
        }
    }

    /// Builds the expected encoding byte by byte, independently of `encode`.
    fn field(bytes: &[u8]) -> Vec<u8> {
        let mut out = (bytes.len() as u64).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out
    }

    // contract: I1
    #[test]
    fn encoding_is_the_documented_layout() {
        let mut expected = Vec::new();
        for part in [
            &b"hermes-e2b/scope"[..],
            &[0, 0, 0, 1],
            b"/home/u/.hermes",
            b"default",
            b"base",
            b"p",
            b"a",
            b"s",
        ] {
            expected.extend(field(part));
        }
        assert_eq!(identity().encode(), expected);
    }

    // contract: I1
    #[test]
    fn digest_is_pinned_across_platforms_and_releases() {
        // Computed outside Rust (Python hashlib over the layout above), so a
        // change to the encoding, the hash or the hex form fails here.
        assert_eq!(
            identity().digest().to_hex(),
            "7c452b60a93c7b2f44368245c4ec56e8f5a6b62fd5b49661e70de482d537cf06"
        );
    }

    // contract: I1
    #[test]
    fn each_field_changes_the_digest() {
        let base = identity().digest();
        let variants = [
            ScopeIdentity {
                profile_home: "/home/v/.hermes".to_owned(),
                ..identity()
            },
            ScopeIdentity {
                task_id: "session:abc".to_owned(),
                ..identity()
            },
            ScopeIdentity {
                template: "python".to_owned(),
                ..identity()
            },
            ScopeIdentity {
                mode: Mode::Ephemeral,
                ..identity()
            },
            ScopeIdentity {
                internet: InternetAccess::Denied,
                ..identity()
            },
            ScopeIdentity {
                security: Security::Insecure,
                ..identity()
            },
        ];
        for variant in variants {
            assert_ne!(variant.digest(), base, "{variant:?}");
        }
    }

    #[test]
    fn moving_a_separator_between_fields_changes_the_digest() {
        let a = ScopeIdentity {
            profile_home: "/h\0x".to_owned(),
            task_id: "y".to_owned(),
            ..identity()
        };
        let b = ScopeIdentity {
            profile_home: "/h".to_owned(),
            task_id: "x\0y".to_owned(),
            ..identity()
        };
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn hex_round_trips_and_rejects_non_canonical_forms() {
        let digest = identity().digest();
        let hex = digest.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex.parse::<ScopeDigest>().ok(), Some(digest));
        assert!(hex.to_uppercase().parse::<ScopeDigest>().is_err());
        assert!(hex[..63].parse::<ScopeDigest>().is_err());
        assert!(format!("{hex}0").parse::<ScopeDigest>().is_err());
        let err = "zz".repeat(32).parse::<ScopeDigest>().err();
        assert!(err.is_some_and(|e| e.is_malformed_digest()));
    }
}
