//! An E2B-compatible server for one machine: control plane and envd on one loopback port, for development and tests.
//!
//! This crate is a placeholder: issue #2 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
