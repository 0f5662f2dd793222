//! The integration tests of capped-tar, one test binary.

mod adversarial;
mod fuzz_corpus;
mod properties;
mod support;
