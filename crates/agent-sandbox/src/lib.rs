//! The framework-neutral E2B sandbox backend for agents: lazy attach, leases, admission, sync, recovery and cleanup.
//!
//! This crate is a placeholder: issue #5 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
