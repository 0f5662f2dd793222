//! Moving Hermes state in and out of a sandbox: upload plans and capped, member-checked tar streams.
//!
//! This crate is a placeholder: issue #4 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
