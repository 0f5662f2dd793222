//! Fuzz target: the same checks `tests/fuzz_corpus.rs` replays on the saved corpus.
#![no_main]

#[path = "../../tests/support/mod.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    support::harness::check_archive(data);
});
