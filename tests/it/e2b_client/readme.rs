//! The crate README's example, run for real.

use super::*;

/// The crate README's example, run for real against e2b-local.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_example_runs_against_e2b_local() {
    let server = Server::start_loopback().await.expect("server");
    let mut config = Config::new(ApiKey::new("any-non-empty-key".to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    let client = Client::new(config).expect("client");

    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(300));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options
        .metadata
        .insert("purpose".to_owned(), "demo".to_owned());
    let info = client.create(options).await.expect("create");
    let sandbox = client.sandbox(info.envd_access()).expect("sandbox");

    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut exit_code = None;
    let mut events = sandbox
        .start(StartOptions::shell("echo hello; echo oops >&2".to_owned()))
        .await
        .expect("start");
    while let Some(event) = events.next().await {
        match event.expect("event") {
            ProcessEvent::Stdout(chunk) => stdout.extend_from_slice(&chunk),
            ProcessEvent::Stderr(chunk) => stderr.extend_from_slice(&chunk),
            ProcessEvent::End(end) => exit_code = Some(end.exit_code),
            _ => {}
        }
    }
    assert_eq!(
        (&stdout[..], &stderr[..], exit_code),
        (&b"hello\n"[..], &b"oops\n"[..], Some(0))
    );

    sandbox
        .write_files(vec![
            UploadFile::bytes("/home/user/a/one.txt".to_owned(), "1".into()),
            UploadFile::bytes("/home/user/b/two.txt".to_owned(), "2".into()),
        ])
        .await
        .expect("write");
    let text = sandbox
        .read_file("/home/user/a/one.txt", 1 << 20)
        .await
        .expect("read");
    assert_eq!(&text[..], b"1");
    let metadata: BTreeMap<String, String> = client
        .get(&info.sandbox_id)
        .await
        .expect("get")
        .summary
        .metadata;
    assert_eq!(metadata["purpose"], "demo");
    assert_eq!(
        client.kill(&info.sandbox_id).await.expect("kill"),
        KillOutcome::Killed
    );
    server.shutdown().await.expect("shutdown");
}
