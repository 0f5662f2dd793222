//! The integration tests of state-sync, one test binary. The reader's own rules are tested in
//! capped-tar; these tests cover what state-sync adds: the unsafe-member policy, extraction
//! into a directory and the teardown archive.

mod adversarial;
mod fuzz_corpus;
mod properties;
mod support;
