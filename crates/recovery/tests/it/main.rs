//! The integration tests of recovery, one test binary.

mod adversarial;
mod edges;
mod fuzz_corpus;
mod host_attacks;
mod properties;
mod push_base;
mod support;
