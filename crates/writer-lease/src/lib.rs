//! Host coordination for one sandbox scope: the writer lease, dirty marker, prepared stamp and creation lock.
//!
//! This crate is a placeholder: issue #3 fills it. See `README.md` beside
//! this crate and `docs/architecture.md` at the workspace root.
