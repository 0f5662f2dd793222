//! Replays the saved cargo-fuzz corpus (`fuzz/corpus/read_archive`) through the fuzz target's
//! own checks, so every input the fuzzer found interesting stays a regression test.

#![allow(clippy::print_stdout)] // Prints counts and timings as figures, never asserts on time.

use crate::support;

#[test]
fn saved_fuzz_corpus_replays_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/read_archive");
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
