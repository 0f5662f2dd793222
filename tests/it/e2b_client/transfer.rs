//! `/files` beyond plain bytes through e2b-client: gzip both ways, metadata, symlink
//! entries, signed URLs; stdin over `StreamInput`; the access token kept out of every text.

use agent_sandbox_examples::e2b_client::{ContentCoding, ProcessStdin, WriteOptions};

use super::*;

fn compressible(lines: usize) -> Vec<u8> {
    (0..lines)
        .flat_map(|i| format!("line {i} of a compressible file\n").into_bytes())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_both_ways_and_metadata_with_bounded_reads() {
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let home = server.sandbox_home(info.sandbox_id.as_str());
    let content = Bytes::from(compressible(50_000));

    // In memory, gzip, with metadata: the file holds the plain bytes; envd read the
    // metadata back.
    let mut options = WriteOptions::new(ContentCoding::Gzip);
    options
        .metadata
        .insert("Owner".to_owned(), "alice".to_owned());
    let written = sandbox
        .write_file_with("gz/a.txt", content.clone(), &options)
        .await
        .expect("gzip upload");
    assert_eq!(
        written.metadata,
        BTreeMap::from([("owner".to_owned(), "alice".to_owned())])
    );
    assert_eq!(std::fs::read(home.join("gz/a.txt")).unwrap(), content);
    let entry = sandbox.stat("/home/user/gz/a.txt").await.expect("stat");
    assert_eq!(entry.metadata["owner"], "alice");

    // Streamed, gzip: compressed as read.
    let chunks: Vec<std::io::Result<Bytes>> = content
        .chunks(7_000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    sandbox
        .write_file_stream_with(
            "gz/b.txt",
            futures::stream::iter(chunks),
            &WriteOptions::new(ContentCoding::Gzip),
        )
        .await
        .expect("streamed gzip upload");
    assert_eq!(std::fs::read(home.join("gz/b.txt")).unwrap(), content);

    // Multipart, gzip, metadata on every file.
    let mut batch = WriteOptions::new(ContentCoding::Gzip);
    batch.metadata.insert("batch".to_owned(), "7".to_owned());
    let files = vec![
        UploadFile::bytes("gz/m1.txt".to_owned(), Bytes::from_static(b"one")),
        UploadFile::bytes("gz/m2.txt".to_owned(), Bytes::from_static(b"two")),
    ];
    let written = sandbox
        .write_files_with(files, &batch)
        .await
        .expect("multipart gzip");
    assert!(written.iter().all(|w| w.metadata["batch"] == "7"));
    assert_eq!(std::fs::read(home.join("gz/m2.txt")).unwrap(), b"two");

    // Download gzip: no length on the wire, the bytes decoded, the cap on decoded bytes.
    let download = sandbox
        .read_file_stream_with("gz/a.txt", 10 << 20, ContentCoding::Gzip)
        .await
        .expect("gzip download");
    assert_eq!(download.content_length(), None, "sent gzip-coded");
    assert_eq!(download.bytes().await.expect("decoded"), content);
    let capped = sandbox
        .read_file_stream_with("gz/a.txt", 100_000, ContentCoding::Gzip)
        .await
        .expect("opened")
        .bytes()
        .await
        .expect_err("decoded bytes pass the cap");
    assert!(capped.is_limit_exceeded(), "{capped}");
    // The plain call is unchanged: identity with its length.
    let plain = sandbox
        .read_file_stream("gz/a.txt", 10 << 20)
        .await
        .expect("plain");
    assert_eq!(plain.content_length(), Some(content.len() as u64));

    // Metadata the SDK would refuse never leaves the client.
    let mut bad = WriteOptions::new(ContentCoding::Identity);
    bad.metadata.insert("bad key".to_owned(), "v".to_owned());
    let refused = sandbox
        .write_file_with("gz/bad.txt", Bytes::from_static(b"x"), &bad)
        .await
        .expect_err("refused");
    assert!(
        refused.to_string().contains("invalid metadata key"),
        "{refused}"
    );
    assert!(!home.join("gz/bad.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_entries_carry_their_resolved_target() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sh(
        &sandbox,
        "mkdir -p ~/l/dir && echo r > ~/l/dir/real.txt && cd ~/l && ln -s dir/real.txt link && ln -s nowhere dangling",
    )
    .await;
    let link = sandbox.stat("/home/user/l/link").await.expect("stat");
    assert_eq!(
        link.symlink_target.as_deref(),
        Some("/home/user/l/dir/real.txt")
    );
    assert_eq!(link.kind, FileType::File);
    assert!(link.permissions.starts_with('L'), "{}", link.permissions);
    let dangling = sandbox.stat("/home/user/l/dangling").await.expect("stat");
    assert_eq!(
        dangling.symlink_target.as_deref(),
        Some("/home/user/l/dangling")
    );
    assert_eq!(
        dangling.kind,
        FileType::Other("FILE_TYPE_UNSPECIFIED".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_urls_work_without_headers_until_they_expire() {
    // contract: X6 (a secure sandbox's files are reached with its token or a signed URL)
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let token = info
        .envd_access_token
        .as_ref()
        .expect("a secure sandbox has a token")
        .expose()
        .to_owned();
    let plain = reqwest::Client::new();

    let upload = sandbox
        .upload_url("/home/user/u.txt", None)
        .expect("upload url");
    let put = plain
        .post(upload.expose())
        .header("content-type", "application/octet-stream")
        .body("by url")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let url = sandbox
        .download_url("/home/user/u.txt", Some(Duration::from_secs(60)))
        .expect("download url");
    assert!(url.expose().contains("signature_expiration="));
    let got = plain.get(url.expose()).send().await.unwrap();
    assert_eq!(got.text().await.unwrap(), "by url");
    // Neither the token nor the signature shows in Debug.
    let shown = format!("{url:?} {sandbox:?}");
    assert!(!shown.contains(&token), "{shown}");
    let signature = url.expose().split("signature=").nth(1).unwrap();
    let signature = signature.split('&').next().unwrap();
    assert!(!shown.contains(signature), "{shown}");

    // Past its expiry (the server's clock), envd's words.
    server.clock().advance(Duration::from_secs(120));
    let late = plain.get(url.expose()).send().await.unwrap();
    assert_eq!(late.status().as_u16(), 401);
    assert!(
        late.text()
            .await
            .unwrap()
            .contains("signature is already expired")
    );
    // A read URL does not write.
    let read_only = sandbox.download_url("/home/user/u.txt", None).expect("url");
    let refused = plain
        .post(read_only.expose())
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_token_goes_out_on_every_envd_call_and_nowhere_else() {
    // contract: X6
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let token = info
        .envd_access_token
        .as_ref()
        .expect("token")
        .expose()
        .to_owned();
    // Every kind of envd call succeeds, so each carried the token (envd refuses without).
    assert_eq!(sh(&sandbox, "echo hi").await, "hi\n");
    sandbox
        .write_file("t.txt", Bytes::from_static(b"t"))
        .await
        .expect("upload");
    assert_eq!(sandbox.read_file("t.txt", 10).await.expect("download"), "t");
    sandbox.stat("t.txt").await.expect("stat");
    // A handle without the token is refused, and its error does not carry any token.
    let mut access = info.envd_access();
    access.access_token = None;
    let anonymous = client.sandbox(access).expect("handle");
    let error = anonymous.stat("t.txt").await.expect_err("refused");
    assert!(error.is_unauthorized(), "{error}");
    // Errors of the real handle never carry the token either.
    let missing = sandbox
        .read_file("nope.txt", 10)
        .await
        .expect_err("missing");
    for text in [
        format!("{error}"),
        format!("{error:?}"),
        format!("{missing}"),
        format!("{missing:?}"),
        format!("{sandbox:?}"),
        format!("{info:?}"),
    ] {
        assert!(!text.contains(&token), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_input_feeds_stdin_in_order_while_open() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut options = StartOptions::exec("/bin/cat".to_owned(), Vec::new());
    options.stdin = ProcessStdin::Open;
    let mut output = sandbox.start(options).await.expect("cat started");
    let pid = match output.next().await.expect("start").expect("start") {
        ProcessEvent::Start { pid } => pid,
        other => panic!("expected start, got {other:?}"),
    };
    let mut input = sandbox.stream_input(pid).await.expect("input stream");
    input
        .send(Bytes::from_static(b"hello\n"))
        .await
        .expect("sent");
    // It arrives while the input stream is still open.
    let first = tokio::time::timeout(Duration::from_secs(30), next_stdout(&mut output))
        .await
        .expect("input reaches the process before the stream ends");
    assert_eq!(first, "hello\n");
    input.keepalive().await.expect("keepalive");
    // A long write is split into several messages and arrives whole, in order.
    let long: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    input.send(Bytes::from(long.clone())).await.expect("sent");
    input.finish().await.expect("envd accepted the stream");
    sandbox.close_stdin(pid).await.expect("closed");
    let mut rest = Vec::new();
    while let Some(event) = output.next().await {
        match event.expect("event") {
            ProcessEvent::Stdout(chunk) => rest.extend_from_slice(&chunk),
            ProcessEvent::End(end) => {
                assert_eq!(end.exit_code, 0);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(rest, long);

    // An unknown pid: the call's error comes back from send or finish.
    let mut unknown = sandbox.stream_input(999_999).await.expect("opened");
    let sent = unknown.send(Bytes::from_static(b"x")).await;
    let error = match sent {
        Err(error) => error,
        Ok(()) => unknown.finish().await.expect_err("not found"),
    };
    assert!(error.is_not_found(), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_stdin_writes_one_message_per_call_in_order() {
    // contract: O9
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut options = StartOptions::exec("/bin/cat".to_owned(), Vec::new());
    options.stdin = ProcessStdin::Open;
    let mut output = sandbox.start(options).await.expect("cat started");
    let pid = output.pid();
    // Each call is one request; what it carries reaches the process while stdin stays open.
    sandbox.send_stdin(pid, b"first\n").await.expect("sent");
    let first = tokio::time::timeout(Duration::from_secs(30), next_stdout(&mut output))
        .await
        .expect("input reaches the process at once");
    assert_eq!(first, "first\n");
    // Bytes that are not UTF-8 arrive as they were.
    let binary: Vec<u8> = (0..=255u8).collect();
    sandbox.send_stdin(pid, &binary).await.expect("sent");
    sandbox.close_stdin(pid).await.expect("closed");
    let mut rest = Vec::new();
    while let Some(event) = output.next().await {
        match event.expect("event") {
            ProcessEvent::Stdout(chunk) => rest.extend_from_slice(&chunk),
            ProcessEvent::End(end) => {
                assert_eq!(end.exit_code, 0);
                break;
            }
            _ => {}
        }
    }
    assert_eq!(rest, binary);
    // Once stdin is closed envd refuses more input; an unknown pid is not found. Both name
    // the operation.
    let closed = sandbox
        .send_stdin(pid, b"late")
        .await
        .expect_err("stdin is closed");
    assert!(
        closed.to_string().contains("send process input"),
        "{closed}"
    );
    let unknown = sandbox
        .send_stdin(999_999, b"x")
        .await
        .expect_err("no such pid");
    assert!(unknown.is_not_found(), "{unknown}");
}

async fn next_stdout(stream: &mut agent_sandbox_examples::e2b_client::ProcessStream) -> String {
    loop {
        match stream.next().await.expect("running").expect("event") {
            ProcessEvent::Stdout(chunk) => return String::from_utf8(chunk.to_vec()).unwrap(),
            ProcessEvent::End(end) => panic!("ended early: {end:?}"),
            _ => {}
        }
    }
}
