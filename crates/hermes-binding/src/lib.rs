//! The Hermes Agent plugin: a PyO3 module and the Python package hermes_e2b over agent-sandbox.
//!
//! This crate is a placeholder: issue #6 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
