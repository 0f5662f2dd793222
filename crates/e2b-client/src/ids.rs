//! Sandbox identifiers, validated before they reach a URL path or a header.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest sandbox id we accept; E2B's are 21 characters (plus an optional client suffix).
const MAX_LEN: usize = 128;

/// An E2B sandbox id such as `ikk8xw53nne4bytcdg87t`.
///
/// Only ASCII letters, digits and `-` are accepted (E2B ids are `[a-z0-9]` with an optional
/// `-<clientID>` suffix), so an id from a server can never smuggle a path segment or a header
/// line into a request.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    /// Checks and wraps an id; `None` if it is empty, too long or has other characters.
    pub fn parse(value: String) -> Option<SandboxId> {
        let valid = !value.is_empty()
            && value.len() <= MAX_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        valid.then_some(SandboxId(value))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SandboxId({})", self.0)
    }
}

impl Serialize for SandboxId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SandboxId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SandboxId, D::Error> {
        let raw = String::deserialize(deserializer)?;
        SandboxId::parse(raw).ok_or_else(|| {
            serde::de::Error::custom("sandbox id must be 1-128 ASCII letters, digits or '-'")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_e2b_ids_and_refuses_path_tricks() {
        assert!(SandboxId::parse("ikk8xw53nne4bytcdg87t".to_owned()).is_some());
        assert!(SandboxId::parse("ikk8xw53nne4bytcdg87t-6532622b".to_owned()).is_some());
        for bad in [
            "",
            "../x",
            "a/b",
            "a b",
            "a\r\nX: y",
            "a?b",
            "é",
            &"a".repeat(129),
        ] {
            assert!(SandboxId::parse(bad.to_owned()).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn deserialising_validates() {
        let ok: SandboxId = serde_json::from_str("\"abc123\"").expect("valid id");
        assert_eq!(ok.as_str(), "abc123");
        assert!(serde_json::from_str::<SandboxId>("\"../admin\"").is_err());
    }
}
