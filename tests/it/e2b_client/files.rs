//! Filesystem RPCs, file transfer and capped downloads.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_rpcs_and_file_transfer() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;

    // MakeDir and its conflict outcome.
    match sandbox.make_dir("/home/user/a/b/c").await.expect("mkdir") {
        MakeDirOutcome::Created(entry) => {
            assert_eq!(entry.kind, FileType::Directory);
            assert_eq!(entry.path, "/home/user/a/b/c");
        }
        MakeDirOutcome::AlreadyExists => panic!("fresh directory"),
    }
    assert!(matches!(
        sandbox.make_dir("/home/user/a/b/c").await.expect("mkdir"),
        MakeDirOutcome::AlreadyExists
    ));

    // Many nested files in one multipart request; parents are created.
    // contract: S4
    let files: Vec<UploadFile> = (0..12)
        .map(|i| {
            UploadFile::bytes(
                format!("/home/user/tree/d{}/sub/file {i}.txt", i % 3),
                Bytes::from(format!("content {i}")),
            )
        })
        .chain([UploadFile::stream(
            "relative/streamed.txt".to_owned(),
            futures::stream::iter([
                Ok(Bytes::from_static(b"str")),
                Ok(Bytes::from_static(b"eamed")),
            ]),
        )])
        .collect();
    let written = sandbox.write_files(files).await.expect("uploaded");
    assert_eq!(written.len(), 13);
    assert_eq!(written[12].path, "/home/user/relative/streamed.txt");
    assert_eq!(
        sh(
            &sandbox,
            "cat \"$HOME/tree/d1/sub/file 4.txt\"; cat $HOME/relative/streamed.txt"
        )
        .await,
        "content 4streamed"
    );

    // Stat, ListDir at two depths.
    let entry = sandbox
        .stat("/home/user/tree/d0/sub/file 0.txt")
        .await
        .expect("stat");
    assert_eq!((entry.kind.clone(), entry.size), (FileType::File, 9));
    assert_eq!(entry.name, "file 0.txt");
    let top = sandbox.list_dir("/home/user/tree", 1).await.expect("list");
    let mut names: Vec<&str> = top.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["d0", "d1", "d2"]);
    let deep = sandbox.list_dir("/home/user/tree", 3).await.expect("list");
    assert_eq!(
        deep.iter().filter(|e| e.kind == FileType::File).count(),
        12,
        "{deep:?}"
    );
    let missing = sandbox.stat("/home/user/nope").await.expect_err("missing");
    assert!(missing.is_not_found() && !missing.is_sandbox_gone());

    // Move, then Remove.
    let moved = sandbox
        .move_path("/home/user/tree/d2", "/home/user/moved")
        .await
        .expect("move");
    assert_eq!(moved.path, "/home/user/moved");
    assert!(
        sandbox
            .stat("/home/user/tree/d2")
            .await
            .expect_err("moved")
            .is_not_found()
    );
    sandbox.remove("/home/user/moved").await.expect("remove");
    assert!(
        sandbox
            .stat("/home/user/moved")
            .await
            .expect_err("removed")
            .is_not_found()
    );
    sandbox
        .remove("/home/user/moved")
        .await
        .expect("removing nothing is fine");

    // Octet-stream uploads: in memory and streamed (5 MiB in 64 KiB chunks).
    let one = sandbox
        .write_file("/home/user/single.bin", Bytes::from_static(b"\x00\x01\x02"))
        .await
        .expect("octet");
    assert_eq!(one.path, "/home/user/single.bin");
    let chunks = futures::stream::iter((0..80).map(|i| Ok(Bytes::from(vec![i as u8; 64 * 1024]))));
    sandbox
        .write_file_stream("/home/user/streamed.bin", chunks)
        .await
        .expect("streamed");
    assert_eq!(
        sandbox
            .stat("/home/user/streamed.bin")
            .await
            .expect("stat")
            .size,
        80 * 64 * 1024
    );
    let back = sandbox
        .read_file("/home/user/streamed.bin", 8 << 20)
        .await
        .expect("read");
    assert_eq!(back.len(), 80 * 64 * 1024);
    assert_eq!(back[64 * 1024 * 79], 79);
    let missing = sandbox
        .read_file("/home/user/none.bin", 1024)
        .await
        .expect_err("missing");
    assert!(missing.is_not_found(), "{missing:?}");

    // Filesystem calls as another user (`Authorization: Basic` / `username=`).
    let root = sandbox.with_user("root".to_owned());
    assert_eq!(
        root.stat("/home/user/single.bin")
            .await
            .expect("as root")
            .size,
        3
    );
    assert_eq!(
        &root
            .read_file("/home/user/single.bin", 16)
            .await
            .expect("as root")[..],
        b"\x00\x01\x02"
    );
    let stranger = sandbox.with_user("nobody".to_owned());
    let refused = stranger.stat("/home/user").await.expect_err("unknown user");
    assert!(refused.is_unauthorized(), "{refused:?}");
    let refused = stranger
        .read_file("/home/user/single.bin", 16)
        .await
        .expect_err("unknown user");
    assert!(refused.is_unauthorized(), "{refused:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_refused_at_their_cap() {
    // The `/files` read cap (the file tool's `max_bytes`). Not S12: the teardown pull is a tar
    // stream from a command, capped by capped-tar.
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sh(&sandbox, "head -c 16777216 /dev/zero > $HOME/big.bin").await;
    let cap: u64 = 1 << 20;

    // The declared length is over the cap: refused before any byte is read.
    let error = sandbox
        .read_file_stream("/home/user/big.bin", cap)
        .await
        .expect_err("over the cap");
    assert!(error.is_limit_exceeded(), "{error:?}");
    assert!(error.to_string().contains("big.bin"), "{error}");

    // Without a declared length (the fault knob strips it), counting stops it mid-stream.
    server.faults().drop_streams(DropRule {
        count: 1,
        after_bytes: u64::MAX,
        scope: FaultScope::Envd,
        path_prefix: Some("/files".to_owned()),
    });
    let mut download = sandbox
        .read_file_stream("/home/user/big.bin", cap)
        .await
        .expect("no declared length");
    assert_eq!(download.content_length(), None);
    let mut delivered: u64 = 0;
    let error = loop {
        match download.next().await.expect("an item before the end") {
            Ok(chunk) => delivered += chunk.len() as u64,
            Err(error) => break error,
        }
    };
    assert!(error.is_limit_exceeded(), "{error:?}");
    assert!(delivered <= cap, "{delivered}");
    assert!(download.next().await.is_none());
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exists_answers_for_files_and_secrets_and_only_not_found_is_false() {
    use agent_sandbox_examples::e2b_client::{NewSecret, SecretValue};

    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sandbox
        .write_file("/home/user/here.txt", Bytes::from_static(b"x"))
        .await
        .expect("written");
    assert!(sandbox.exists("/home/user/here.txt").await.expect("asked"));
    assert!(sandbox.exists("/home/user").await.expect("asked"));
    assert!(
        !sandbox
            .exists("/home/user/missing.txt")
            .await
            .expect("asked")
    );

    assert!(!client.secret_exists("api-token").await.expect("asked"));
    client
        .create_secret(NewSecret {
            name: "api-token".to_owned(),
            value: SecretValue::new("s3cr3t".to_owned()),
            metadata: None,
        })
        .await
        .expect("created");
    assert!(client.secret_exists("api-token").await.expect("asked"));

    // Anything else than "not found" is an error, not a `false`.
    client.kill(&info.sandbox_id).await.expect("killed");
    let error = sandbox
        .exists("/home/user/here.txt")
        .await
        .expect_err("gone");
    assert!(error.is_sandbox_gone(), "{error}");
}
