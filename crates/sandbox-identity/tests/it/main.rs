//! The integration tests of sandbox-identity, one test binary.

mod properties;
