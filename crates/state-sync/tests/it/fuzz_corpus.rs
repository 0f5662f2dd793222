//! Replays capped-tar's saved cargo-fuzz corpus (`crates/capped-tar/fuzz/corpus/read_archive`)
//! through state-sync's own checks (unsafe-member policy, teardown round trip), so every input
//! the fuzzer found interesting stays a regression test of this crate's adapter too.

#![allow(clippy::print_stdout)] // Prints counts and timings as figures, never asserts on time.

use crate::support;

#[test]
fn saved_fuzz_corpus_replays_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../capped-tar/fuzz/corpus/read_archive");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus is committed") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("readable");
        support::harness::check_archive(&data);
        replayed += 1;
    }
    assert!(replayed > 0, "empty corpus at {}", dir.display());
    println!("replayed {replayed} corpus inputs");
}
