//! A sandbox's secrets: a secure sandbox's envd access token, and the traffic access token
//! of one created with `allowPublicTraffic: false`. `Debug` never shows them (sandbox
//! records and handler contexts are `Debug`); stored as the bare string. Also the random
//! ids (UUIDs) and the comparison of presented secrets every other module uses.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// One sandbox's envd or traffic access token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct EnvdToken(String);

impl EnvdToken {
    /// 24 bytes from the thread RNG (ChaCha seeded by the OS, fit for secrets), URL-safe.
    pub(crate) fn generate() -> EnvdToken {
        let bytes: [u8; 24] = rand::rng().random();
        EnvdToken(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// The token, for the answer that hands it out and the checks that compare it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// A random version 4 UUID, lowercase hex with dashes (as Linux makes a boot id, and as
/// E2B's volume ids are).
pub(crate) fn new_uuid() -> String {
    let mut bytes: [u8; 16] = rand::rng().random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether `text` is a UUID as [`new_uuid`] writes them (any version, any case).
pub(crate) fn is_uuid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Compares a presented secret with the expected one in time that does not depend on
/// where they differ.
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl std::fmt::Debug for EnvdToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvdToken([REDACTED])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token_and_storage_keeps_the_bare_string() {
        let token = EnvdToken::generate();
        assert_eq!(token.expose().len(), 32);
        assert_ne!(token, EnvdToken::generate());
        let shown = format!("{:?}", Some(&token));
        assert!(!shown.contains(token.expose()), "{shown}");
        assert!(shown.contains("REDACTED"));
        // Records written before the newtype read back, and new ones look the same.
        let stored = serde_json::to_string(&token).unwrap();
        assert_eq!(stored, format!("\"{}\"", token.expose()));
        assert_eq!(serde_json::from_str::<EnvdToken>(&stored).unwrap(), token);
    }
}
