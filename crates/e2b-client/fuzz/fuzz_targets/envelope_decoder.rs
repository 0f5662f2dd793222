//! Fuzz target: the Connect envelope decoder, with the checks `cargo test -p e2b-client`
//! replays on the saved corpus (`framing::check_envelope_stream`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    e2b_client::fuzzing::envelope_stream(data);
});
