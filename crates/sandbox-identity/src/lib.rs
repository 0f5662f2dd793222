//! Pure scope identity for E2B sandboxes: the scope digest, identity metadata, adoption choice and lease arithmetic.
//!
//! This crate is a placeholder: issue #3 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
