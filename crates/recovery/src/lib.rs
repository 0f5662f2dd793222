//! Resume recovery of sandbox-authored skills and memories: restore in place, quarantine conflicts, refuse redirections.
//!
//! This crate is a placeholder: issue #4 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
