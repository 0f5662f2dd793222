//! The scope key, and the file names derived from it.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The scope a set of coordination files belongs to: a 32-byte digest.
///
/// Normally the scope digest `sandbox-identity` computes; this crate only
/// needs 32 opaque bytes. File names are derived from its hex form alone, so
/// they cannot contain separators, traversal or anything from the task id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeKey([u8; 32]);

impl ScopeKey {
    /// Wraps digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ScopeKey(bytes)
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The name of one of this scope's files.
    pub fn file_name(&self, file: ScopeFile) -> String {
        format!("{}.{}", self.to_hex(), file.suffix())
    }
}

impl fmt::Debug for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScopeKey({})", self.to_hex())
    }
}

impl fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for ScopeKey {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self, Error> {
        let mut out = [0u8; 32];
        // `hex` also accepts uppercase, which would give one key two file names.
        if value.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(value, &mut out).is_err()
        {
            return Err(Error::MalformedScopeKey {
                length: value.len(),
            });
        }
        Ok(ScopeKey(out))
    }
}

/// The files one scope has in the coordination directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeFile {
    /// `<key>.writer.lock`: locked by the writer for its whole session.
    WriterLock,
    /// `<key>.create.lock`: locked while a sandbox is being created.
    CreationLock,
    /// `<key>.dirty`: present while the sandbox state must not be run against.
    Dirty,
    /// `<key>.prepared`: which generation last completed a push, to which sandbox.
    Prepared,
    /// `<key>.generation`: the latest writer generation that began.
    Generation,
    /// `<key>.note`: what this host remembers about the scope for people (diagnostics).
    Note,
    /// `<key>.gate.lock`: locked shared by a reader while it decides admission, and
    /// exclusively by a new writer from taking the role until its transition began.
    Gate,
    /// `<key>.activity`: when this host last started and ended a command in the scope's
    /// sandbox (diagnostics: `hermes e2b list`'s last use and idle time).
    Activity,
}

impl ScopeFile {
    /// Every scope file, for listings.
    pub const ALL: [ScopeFile; 8] = [
        ScopeFile::WriterLock,
        ScopeFile::CreationLock,
        ScopeFile::Dirty,
        ScopeFile::Prepared,
        ScopeFile::Generation,
        ScopeFile::Note,
        ScopeFile::Gate,
        ScopeFile::Activity,
    ];

    fn suffix(self) -> &'static str {
        match self {
            ScopeFile::WriterLock => "writer.lock",
            ScopeFile::CreationLock => "create.lock",
            ScopeFile::Dirty => "dirty",
            ScopeFile::Prepared => "prepared",
            ScopeFile::Generation => "generation",
            ScopeFile::Note => "note",
            ScopeFile::Gate => "gate.lock",
            ScopeFile::Activity => "activity",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_digest_only() {
        let key = ScopeKey::from_bytes([0xab; 32]);
        let hex = "ab".repeat(32);
        assert_eq!(key.to_hex(), hex);
        assert_eq!(hex.parse::<ScopeKey>().ok(), Some(key));
        let names: Vec<String> = ScopeFile::ALL.iter().map(|f| key.file_name(*f)).collect();
        assert_eq!(
            names,
            [
                format!("{hex}.writer.lock"),
                format!("{hex}.create.lock"),
                format!("{hex}.dirty"),
                format!("{hex}.prepared"),
                format!("{hex}.generation"),
                format!("{hex}.note"),
                format!("{hex}.gate.lock"),
                format!("{hex}.activity"),
            ]
        );
        for name in names {
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
        }
    }

    #[test]
    fn only_canonical_hex_parses() {
        assert!("../etc".parse::<ScopeKey>().is_err());
        assert!("AB".repeat(32).parse::<ScopeKey>().is_err());
        let err = "g".repeat(64).parse::<ScopeKey>().err();
        assert!(err.is_some_and(|e| e.is_caller_error()));
    }
}
