//! The trees recovery works on. A module of its own below both the run (`recover`) and the
//! push base (`base`), so each names them without depending on the other.

/// The trees recovered, relative to the Hermes home on both sides.
pub const RECOVERABLE_ROOTS: [&str; 2] = ["skills", "memories"];
