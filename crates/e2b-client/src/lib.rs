//! A native async client for E2B: the control-plane REST API and the in-sandbox envd Connect-JSON protocol.
//!
//! This crate is a placeholder: issue #2 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
