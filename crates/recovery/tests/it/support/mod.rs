//! Test helpers: the shared tar fixtures, plus this suite's own harness.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod harness;
pub mod world;

pub use tar_fixtures::*;
