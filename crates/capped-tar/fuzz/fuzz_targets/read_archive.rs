//! Fuzz target: the same checks `tests/it/fuzz_corpus.rs` replays on the saved corpus.
#![no_main]

#[path = "../../tests/it/support/mod.rs"]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    support::harness::check_archive(data);
});
