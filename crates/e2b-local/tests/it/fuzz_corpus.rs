//! Replays the saved cargo-fuzz corpus of the multipart upload (`fuzz/corpus/multipart_upload`)
//! with the fuzz target's checks, so every input the fuzzer found interesting stays a
//! regression test: the first byte chooses whether `?path=` is given, the rest is the body.

use crate::support::{Api, manual_server, new_sandbox};

#[tokio::test]
async fn saved_multipart_fuzz_corpus_replays_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/multipart_upload");
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus is committed") {
        let path = entry.expect("corpus entry").path();
        let input = std::fs::read(&path).expect("readable");
        let Some((&mode, body)) = input.split_first() else {
            continue;
        };
        let route = if mode & 1 == 1 {
            "/files?path=/home/user/given/name.txt"
        } else {
            "/files"
        };
        let reply = api
            .envd(&sandbox, reqwest::Method::POST, route)
            .header("content-type", "multipart/form-data; boundary=fuzzboundary")
            .body(body.to_vec())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}: no answer: {e}", path.display()));
        let status = reply.status().as_u16();
        let text = reply.text().await.expect("body");
        assert!(
            status == 200 || (400..500).contains(&status),
            "{}: status {status}: {text}",
            path.display()
        );
        if status == 200 {
            let entries: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            for entry in entries.as_array().expect("entries") {
                let written = entry["path"].as_str().expect("path");
                assert!(
                    written.starts_with("/home/user/") || written.starts_with("/tmp/"),
                    "{}: wrote {written}",
                    path.display()
                );
            }
        }
        replayed += 1;
    }
    assert!(replayed > 0, "empty corpus at {}", dir.display());
    server.shutdown().await.expect("shutdown");
}
