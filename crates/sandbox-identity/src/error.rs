//! The crate's one error type.

/// What went wrong while reading identity data.
///
/// Everything this crate parses comes from sandbox metadata, which is
/// untrusted, so errors describe the shape of a bad value and never echo it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A scope digest was not 64 lowercase hex characters.
    #[error("parse scope digest failed: expected 64 lowercase hex characters, got {length} bytes")]
    MalformedDigest {
        /// Length in bytes of the rejected value.
        length: usize,
    },
    /// Sandbox metadata lacks one of the identity keys.
    #[error("read identity metadata failed: key {key} is missing")]
    MissingKey {
        /// The identity key that is absent.
        key: &'static str,
    },
    /// Sandbox metadata carries an identity key with a value this version
    /// does not understand (another identity version, an unknown mode, a
    /// malformed digest).
    #[error("read identity metadata failed: key {key} has an unsupported value")]
    UnsupportedValue {
        /// The identity key whose value was rejected.
        key: &'static str,
    },
}

impl Error {
    /// Whether a scope digest string was malformed.
    pub fn is_malformed_digest(&self) -> bool {
        matches!(self, Error::MalformedDigest { .. })
    }

    /// Whether sandbox metadata carried no identity (or only part of one):
    /// the sandbox was not stamped by this backend.
    pub fn is_missing_identity(&self) -> bool {
        matches!(self, Error::MissingKey { .. })
    }

    /// Whether sandbox metadata carried an identity this version cannot read.
    pub fn is_unsupported_identity(&self) -> bool {
        matches!(self, Error::UnsupportedValue { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert_bounds<T: Send + Sync + 'static>() {}
        assert_bounds::<Error>();
        let err = Error::MissingKey {
            key: "hermes.scope",
        };
        assert!(err.is_missing_identity());
        assert!(!err.is_unsupported_identity());
        assert!(err.to_string().contains("hermes.scope"));
    }
}
