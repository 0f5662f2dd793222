//! e2b-client against an in-process e2b-local: every operation, E2B's lifecycle driven by the
//! server's clock, injected faults, typed outcomes and error hygiene.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, ConnectState, CreateOptions, Error, FileType, Health, Jitter,
    KillOutcome, ListQuery, ListedSandbox, MakeDirOutcome, OnTimeout, PauseMemory, PauseOutcome,
    ProcessEvent, RetryPolicy, Sandbox, SandboxId, SandboxInfo, SandboxState, Signal,
    SignalOutcome, StartOptions, StateFilter, UploadFile,
};
use agent_sandbox_examples::e2b_local::{
    Clock, DropRule, FailRule, FaultScope, Server, ServerConfig,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

/// A server whose lease clock only moves when the test says so.
async fn server() -> Server {
    let mut config = ServerConfig::loopback();
    config.clock = Clock::manual(SystemTime::now());
    Server::start(config).await.expect("e2b-local starts")
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        jitter: Jitter::None,
    }
}

fn config_for(server: &Server, key: &str) -> Config {
    let mut config = Config::new(ApiKey::new(key.to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    config.retry = fast_retry();
    config.request_deadline = Duration::from_secs(30);
    config
}

fn client(server: &Server) -> Client {
    Client::new(config_for(server, "e2b_integration_key_0123456789")).expect("valid config")
}

async fn create(client: &Client, on_timeout: OnTimeout, secs: u64) -> (SandboxInfo, Sandbox) {
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(secs));
    options.on_timeout = on_timeout;
    let info = client.create(options).await.expect("created");
    let sandbox = client.sandbox(info.envd_access()).expect("envd handle");
    (info, sandbox)
}

async fn lease_secs(client: &Client, id: &SandboxId) -> i64 {
    let detail = client.get(id).await.expect("get");
    (detail.summary.end_at - detail.summary.started_at).whole_seconds()
}

async fn sh(sandbox: &Sandbox, cmd: &str) -> String {
    let output = sandbox
        .run(StartOptions::shell(cmd.to_owned()), 1 << 20)
        .await
        .expect("command ran");
    assert_eq!(output.end.exit_code, 0, "{cmd}: {output:?}");
    String::from_utf8(output.stdout.to_vec()).expect("utf-8")
}

async fn list_all(client: &Client, query: ListQuery) -> Vec<ListedSandbox> {
    client.list(query).try_collect().await.expect("list")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_operations_and_outcomes() {
    let server = server().await;
    let client = client(&server);

    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(120));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options.allow_internet_access = Some(false);
    options.secure = Some(true);
    options
        .metadata
        .insert("scope".to_owned(), "a b/c&d=e%f".to_owned());
    options
        .env_vars
        .insert("FROM_CREATE".to_owned(), "yes".to_owned());
    let info = client.create(options).await.expect("created");
    assert!(info.envd_access_token.is_some(), "v2 sandboxes are secure");
    let id = info.sandbox_id.clone();

    let detail = client.get(&id).await.expect("get");
    assert_eq!(detail.summary.state, SandboxState::Running);
    assert_eq!(detail.summary.metadata["scope"], "a b/c&d=e%f");
    assert_eq!(detail.allow_internet_access, Some(false));
    let lifecycle = detail.lifecycle.as_ref().expect("lifecycle");
    assert_eq!(lifecycle.on_timeout, "pause");
    assert_eq!(
        (detail.summary.end_at - detail.summary.started_at).whole_seconds(),
        120
    );

    // Sandbox-wide env vars reach commands.
    let sandbox = client.sandbox(info.envd_access()).expect("envd");
    assert_eq!(sh(&sandbox, "echo $FROM_CREATE").await, "yes\n");

    // The metadata filter (double-encoded on the wire) finds exactly this sandbox.
    let (_, _other) = create(&client, OnTimeout::Kill, 120).await;
    let mut query = ListQuery::all();
    query
        .metadata
        .insert("scope".to_owned(), "a b/c&d=e%f".to_owned());
    let found = list_all(&client, query.clone()).await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].sandbox_id, id);
    assert_eq!(list_all(&client, ListQuery::all()).await.len(), 2);

    // Pause, then a second pause is the typed 409 outcome.
    assert_eq!(
        client.pause(&id).await.expect("pause"),
        PauseOutcome::Paused
    );
    assert_eq!(
        client.pause(&id).await.expect("pause again"),
        PauseOutcome::AlreadyPaused
    );
    query.state = StateFilter::Running;
    assert!(list_all(&client, query.clone()).await.is_empty());
    query.state = StateFilter::Paused;
    assert_eq!(list_all(&client, query.clone()).await.len(), 1);
    assert_eq!(
        client.get(&id).await.expect("get paused").summary.state,
        SandboxState::Paused
    );

    // set_timeout only applies to a running sandbox.
    let error = client
        .set_timeout(&id, Duration::from_secs(60))
        .await
        .expect_err("paused sandboxes have no lease");
    assert!(error.is_not_found(), "{error:?}");

    // Connect resumes (201) and then finds it running (200).
    let resumed = client
        .connect(&id, Duration::from_secs(60))
        .await
        .expect("connect");
    assert_eq!(resumed.state, ConnectState::Resumed);
    let again = client
        .connect(&id, Duration::from_secs(60))
        .await
        .expect("connect");
    assert_eq!(again.state, ConnectState::Running);

    // Kill, then the typed 404 outcomes everywhere.
    assert_eq!(client.kill(&id).await.expect("kill"), KillOutcome::Killed);
    assert_eq!(
        client.kill(&id).await.expect("kill again"),
        KillOutcome::NotFound
    );
    let gone = client.get(&id).await.expect_err("killed");
    assert!(gone.is_not_found() && gone.is_sandbox_gone() && !gone.is_conflict());
    let gone = client
        .connect(&id, Duration::from_secs(60))
        .await
        .expect_err("killed");
    assert!(gone.is_sandbox_gone());
    let gone = client
        .sandbox(resumed.sandbox.envd_access())
        .expect("handle")
        .stat("/home/user")
        .await
        .expect_err("killed");
    assert!(gone.is_sandbox_gone(), "{gone:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_follow_the_next_token() {
    let server = server().await;
    let client = client(&server);
    let mut ids = Vec::new();
    for _ in 0..5 {
        let mut options = CreateOptions::new("base".to_owned());
        options
            .metadata
            .insert("batch".to_owned(), "paging".to_owned());
        ids.push(client.create(options).await.expect("created").sandbox_id);
    }
    let mut query = ListQuery::all();
    query
        .metadata
        .insert("batch".to_owned(), "paging".to_owned());
    query.limit = Some(2);
    let mut listed: Vec<SandboxId> = list_all(&client, query)
        .await
        .into_iter()
        .map(|s| s.sandbox_id)
        .collect();
    assert_eq!(listed.len(), 5, "three pages of 2, 2 and 1");
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_extend_only_on_connect_and_settable_by_set_timeout() {
    // contract: L5
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Pause(PauseMemory::Discard), 300).await;
    let id = info.sandbox_id.clone();
    assert_eq!(lease_secs(&client, &id).await, 300);

    // Connect never shortens.
    client
        .connect(&id, Duration::from_secs(60))
        .await
        .expect("connect");
    assert_eq!(lease_secs(&client, &id).await, 300);
    // It extends from now.
    server.clock().advance(Duration::from_secs(10));
    let connected = client
        .connect(&id, Duration::from_secs(600))
        .await
        .expect("connect");
    assert_eq!(connected.state, ConnectState::Running);
    assert_eq!(lease_secs(&client, &id).await, 610);
    // set_timeout may shorten.
    client
        .set_timeout(&id, Duration::from_secs(30))
        .await
        .expect("set timeout");
    assert_eq!(lease_secs(&client, &id).await, 40);

    // State that must survive the pause, and a process that must not.
    sandbox
        .write_file("/home/user/kept.txt", Bytes::from_static(b"still here"))
        .await
        .expect("write");
    let sleeper = sandbox
        .start(StartOptions::shell("sleep 1000".to_owned()))
        .await
        .expect("start");
    let sleeper_pid = sleeper.pid();

    // Past the lease: E2B pauses it (filesystem only).
    server.clock().advance(Duration::from_secs(31));
    assert_eq!(
        client.get(&id).await.expect("get").summary.state,
        SandboxState::Paused
    );
    assert_eq!(sandbox.health().await.expect("health"), Health::NotRunning);
    let error = sandbox
        .stat("/home/user/kept.txt")
        .await
        .expect_err("paused");
    assert!(error.is_sandbox_gone(), "{error:?}");
    // The sleeper's stream ends one way or another; it never hangs.
    let tail: Vec<Result<ProcessEvent, Error>> = sleeper.collect().await;
    assert!(
        !tail
            .iter()
            .any(|e| matches!(e, Ok(ProcessEvent::End(end)) if end.exit_code == 0)),
        "{tail:?}"
    );

    // Connect resumes it with the files kept and the processes gone.
    let resumed = client
        .connect(&id, Duration::from_secs(300))
        .await
        .expect("resume");
    assert_eq!(resumed.state, ConnectState::Resumed);
    let sandbox = client.sandbox(resumed.sandbox.envd_access()).expect("envd");
    assert_eq!(sandbox.health().await.expect("health"), Health::Running);
    assert_eq!(
        &sandbox
            .read_file("/home/user/kept.txt", 1024)
            .await
            .expect("read")[..],
        b"still here"
    );
    let processes = sandbox.list_processes().await.expect("list");
    assert!(
        processes.iter().all(|p| p.pid != sleeper_pid),
        "{processes:?}"
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_sandbox_is_killed_at_lease_end() {
    // contract: L4
    let server = server().await;
    let client = client(&server);
    let (info, _sandbox) = create(&client, OnTimeout::Kill, 60).await;
    server.clock().advance(Duration::from_secs(61));
    let error = client.get(&info.sandbox_id).await.expect_err("killed");
    assert!(error.is_sandbox_gone());
    assert!(list_all(&client, ListQuery::all()).await.is_empty());
    assert_eq!(
        client.kill(&info.sandbox_id).await.expect("kill"),
        KillOutcome::NotFound
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_stream_signal_and_reattach() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;

    // Output, exit code, env, cwd, user.
    let mut options =
        StartOptions::shell("echo out-$GREETING; echo err >&2; pwd; exit 3".to_owned());
    options.envs.insert("GREETING".to_owned(), "hi".to_owned());
    sandbox.make_dir("/home/user/work").await.expect("mkdir");
    options.cwd = Some("/home/user/work".to_owned());
    options.user = Some("root".to_owned());
    let output = sandbox.run(options, 1 << 20).await.expect("ran");
    let stdout = String::from_utf8(output.stdout.to_vec()).expect("utf-8");
    assert!(stdout.starts_with("out-hi\n"), "{stdout}");
    assert!(stdout.trim_end().ends_with("/work"), "{stdout}");
    assert_eq!(&output.stderr[..], b"err\n");
    assert_eq!(output.end.exit_code, 3);
    assert!(output.end.exited);
    assert!(output.pid > 0);

    // Keepalives arrive on silence.
    let mut options = StartOptions::shell("sleep 2.5".to_owned());
    options.keepalive = Duration::from_secs(1);
    let events: Vec<ProcessEvent> = sandbox
        .start(options)
        .await
        .expect("start")
        .try_collect()
        .await
        .expect("events");
    assert!(events.contains(&ProcessEvent::Keepalive), "{events:?}");
    assert!(matches!(events.last(), Some(ProcessEvent::End(end)) if end.exit_code == 0));

    // The process deadline (Connect-Timeout-Ms) ends the stream with deadline_exceeded.
    let mut options = StartOptions::shell("sleep 30".to_owned());
    options.timeout = Some(Duration::from_millis(500));
    let mut stream = sandbox.start(options).await.expect("start");
    let error = loop {
        match stream.next().await.expect("the stream ends with an error") {
            Ok(ProcessEvent::Keepalive | ProcessEvent::Start { .. }) => continue,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(error) => break error,
        }
    };
    assert!(error.is_deadline_exceeded(), "{error:?}");
    assert!(
        !error.to_string().to_lowercase().contains("timeout"),
        "{error}"
    );

    // Drop a stream, the process keeps running; Connect re-attaches by pid.
    let waiter = "while [ ! -f $HOME/go ]; do sleep 0.05; done; echo released";
    let first = sandbox
        .start(StartOptions::shell(waiter.to_owned()))
        .await
        .expect("start");
    let pid = first.pid();
    drop(first);
    let again = sandbox.connect_process(pid).await.expect("connect");
    assert_eq!(again.pid(), pid);
    sandbox
        .write_file("/home/user/go", Bytes::new())
        .await
        .expect("release");
    let output = again.collect_output(1024).await.expect("finished");
    assert_eq!(&output.stdout[..], b"released\n");
    assert_eq!(output.end.exit_code, 0);
    let error = sandbox.connect_process(999_999).await.map(drop);
    let error = match error {
        Err(error) => error,
        Ok(()) => panic!("unknown pid must fail"),
    };
    assert!(error.is_not_found(), "{error:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_by_pid_leaves_other_processes_and_the_sandbox_alive() {
    // contract: L6
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut victim = sandbox
        .start(StartOptions::shell("sleep 1000".to_owned()))
        .await
        .expect("start");
    let victim_pid = victim.pid();
    let survivor = sandbox
        .start(StartOptions::shell("sleep 1000".to_owned()))
        .await
        .expect("start");
    let survivor_pid = survivor.pid();

    let listed: Vec<u32> = sandbox
        .list_processes()
        .await
        .expect("list")
        .into_iter()
        .map(|p| p.pid)
        .collect();
    assert!(listed.contains(&victim_pid) && listed.contains(&survivor_pid));
    let info_of_victim = sandbox
        .list_processes()
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.pid == victim_pid)
        .expect("listed");
    assert_eq!(info_of_victim.config.cmd, "/bin/bash");
    assert_eq!(info_of_victim.config.args, ["-l", "-c", "sleep 1000"]);

    assert_eq!(
        sandbox.kill_process(victim_pid).await.expect("kill"),
        SignalOutcome::Delivered
    );
    let end = loop {
        match victim.next().await.expect("an end").expect("clean stream") {
            ProcessEvent::End(end) => break end,
            _ => continue,
        }
    };
    assert_eq!(end.exit_code, -1);
    assert!(!end.exited);

    let listed: Vec<u32> = sandbox
        .list_processes()
        .await
        .expect("list")
        .into_iter()
        .map(|p| p.pid)
        .collect();
    assert!(!listed.contains(&victim_pid), "{listed:?}");
    assert!(listed.contains(&survivor_pid), "{listed:?}");
    assert_eq!(sandbox.health().await.expect("health"), Health::Running);
    assert_eq!(
        client
            .get(&info.sandbox_id)
            .await
            .expect("get")
            .summary
            .state,
        SandboxState::Running
    );
    // The survivor was alive until we killed it too; an unknown pid is NotFound.
    assert_eq!(
        sandbox.kill_process(survivor_pid).await.expect("kill"),
        SignalOutcome::Delivered
    );
    drop(survivor);
    assert_eq!(
        sandbox.kill_process(999_999).await.expect("kill"),
        SignalOutcome::NotFound
    );

    // SIGTERM is delivered the same way.
    let mut polite = sandbox
        .start(StartOptions::shell("sleep 1000".to_owned()))
        .await
        .expect("start");
    assert_eq!(
        sandbox
            .send_signal(polite.pid(), Signal::Term)
            .await
            .expect("term"),
        SignalOutcome::Delivered
    );
    let end = loop {
        match polite.next().await.expect("an end").expect("clean stream") {
            ProcessEvent::End(end) => break end,
            _ => continue,
        }
    };
    assert_ne!(end.exit_code, 0);
    server.shutdown().await.expect("shutdown");
}

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
async fn injected_503_is_retried_and_should_retry_false_is_not() {
    let server = server().await;
    let client = client(&server);
    let (info, _) = create(&client, OnTimeout::Kill, 600).await;
    let id = info.sandbox_id;
    let rest_503 = |count, should_retry| FailRule {
        count,
        status: 503,
        scope: FaultScope::Rest,
        path_prefix: None,
        retry_after_secs: None,
        should_retry,
    };

    // Two 503s, then success: retried.
    server.faults().fail_next(rest_503(2, None));
    client.get(&id).await.expect("retried through two 503s");

    // Without retries the same fault surfaces, typed as transient.
    let mut no_retry = config_for(&server, "e2b_integration_key_0123456789");
    no_retry.retry = RetryPolicy::none();
    let no_retry = Client::new(no_retry).expect("valid");
    server.faults().fail_next(rest_503(1, None));
    let error = no_retry.get(&id).await.expect_err("503");
    assert_eq!(error.status(), Some(503));
    assert!(error.is_transient());

    // Should-Retry: false: one attempt per call, so two calls use up a count of two.
    server.faults().fail_next(rest_503(2, Some(false)));
    assert_eq!(
        client.get(&id).await.expect_err("not retried").status(),
        Some(503)
    );
    assert_eq!(
        client.get(&id).await.expect_err("not retried").status(),
        Some(503)
    );
    client.get(&id).await.expect("the rule is used up");

    // Retry-After is honoured (0 s here).
    server.faults().fail_next(FailRule {
        retry_after_secs: Some(0),
        status: 429,
        ..rest_503(1, None)
    });
    client.get(&id).await.expect("retried after Retry-After");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_are_retried_but_start_never_runs_twice() {
    let server = server().await;
    let setup = client(&server);
    let (info, setup_sandbox) = create(&setup, OnTimeout::Kill, 600).await;
    let marker = "mkdir -p $HOME/starts && touch $HOME/starts/$(date +%s%N)-$$";
    let starts = || async { sh(&setup_sandbox, "ls $HOME/starts 2>/dev/null | wc -l").await };

    // A fresh client has no pooled connection, so every request opens one; e2b-local resets
    // the next two right after accepting them.
    let fresh = client(&server);
    server.faults().drop_next_connections(2);
    let detail = fresh.get(&info.sandbox_id).await.expect("retried");
    assert_eq!(detail.summary.sandbox_id, info.sandbox_id);

    // e2b-local resets the next connection right after accepting it. Which failure the client
    // sees is the kernel's timing: a reset noticed while the connection is set up is a connect
    // failure, safe to retry even for Start; a reset noticed once the client has begun writing
    // the request leaves it unable to know whether envd got it, so Start is not retried.
    // Either way the command never runs twice, and the run count matches what was reported.
    let fresh = client(&server);
    let sandbox = fresh.sandbox(info.envd_access()).expect("envd");
    server.faults().drop_next_connections(1);
    let ran: u32 = match sandbox
        .run(StartOptions::shell(marker.to_owned()), 1024)
        .await
    {
        Ok(output) => {
            assert_eq!(output.end.exit_code, 0);
            1
        }
        Err(error) => {
            assert!(error.is_transient(), "{error:?}");
            assert!(
                !error.is_connect(),
                "a connect failure is retried: {error:?}"
            );
            0
        }
    };
    assert_eq!(starts().await.trim(), ran.to_string());

    // An injected 503 (even one inviting retries) means Start reached the server: not retried.
    server.faults().fail_next(FailRule {
        count: 1,
        status: 503,
        scope: FaultScope::Envd,
        path_prefix: Some("/process.Process/Start".to_owned()),
        retry_after_secs: None,
        should_retry: Some(true),
    });
    let error = sandbox
        .start(StartOptions::shell(marker.to_owned()))
        .await
        .expect_err("503");
    assert_eq!(error.status(), Some(503));
    assert_eq!(starts().await.trim(), ran.to_string());

    // The answer broke right after the request was processed: not retried, the command ran once.
    server.faults().drop_streams(DropRule {
        count: 1,
        after_bytes: 0,
        scope: FaultScope::Envd,
        path_prefix: Some("/process.Process/Start".to_owned()),
    });
    let error = sandbox
        .start(StartOptions::shell(marker.to_owned()))
        .await
        .expect_err("cut");
    assert!(error.is_transient(), "{error:?}");
    assert!(!error.is_connect(), "{error:?}");
    // The command itself ran (envd started it before the answer broke), once.
    // Bounded by time rather than by a count of polls: on a loaded machine one poll (itself a
    // command) can take long enough that a fixed count runs out before the command is seen.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let expected = (ran + 1).to_string();
    let mut runs = starts().await;
    while runs.trim() != expected && std::time::Instant::now() < give_up {
        runs = starts().await;
    }
    assert_eq!(runs.trim(), expected);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_way_is_an_error_not_a_clean_end() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    server.faults().drop_streams(DropRule {
        count: 1,
        after_bytes: 200,
        scope: FaultScope::Envd,
        path_prefix: Some("/process.Process/Start".to_owned()),
    });
    let items: Vec<Result<ProcessEvent, Error>> = sandbox
        .start(StartOptions::shell("seq 1 100000".to_owned()))
        .await
        .expect("headers")
        .collect()
        .await;
    let last = items.last().expect("items");
    let error = last.as_ref().expect_err("the cut surfaces as an error");
    assert!(
        error.is_transient() || matches!(error, Error::Protocol { .. }),
        "{error:?}"
    );
    assert!(!items.iter().any(|e| matches!(e, Ok(ProcessEvent::End(_)))));
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_and_force_paused_sandboxes() {
    let server = server().await;
    let client = client(&server);
    let (gone, gone_sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let (paused, paused_sandbox) = create(&client, OnTimeout::Kill, 600).await;
    paused_sandbox
        .write_file("/home/user/f", Bytes::from_static(b"x"))
        .await
        .expect("write");

    server
        .faults()
        .vanish_sandbox(gone.sandbox_id.as_str())
        .expect("vanish");
    assert_eq!(
        gone_sandbox.health().await.expect("health"),
        Health::NotRunning
    );
    let error = gone_sandbox
        .run(StartOptions::shell("true".to_owned()), 10)
        .await
        .expect_err("gone");
    assert!(
        error.is_sandbox_gone() && !error.is_transient(),
        "{error:?}"
    );
    assert!(
        client
            .get(&gone.sandbox_id)
            .await
            .expect_err("gone")
            .is_sandbox_gone()
    );
    assert_eq!(
        client.kill(&gone.sandbox_id).await.expect("kill"),
        KillOutcome::NotFound
    );

    server
        .faults()
        .pause_sandbox(paused.sandbox_id.as_str())
        .expect("pause");
    assert!(
        paused_sandbox
            .stat("/home/user/f")
            .await
            .expect_err("paused")
            .is_sandbox_gone()
    );
    let resumed = client
        .connect(&paused.sandbox_id, Duration::from_secs(60))
        .await
        .expect("resume");
    assert_eq!(resumed.state, ConnectState::Resumed);
    let sandbox = client.sandbox(resumed.sandbox.envd_access()).expect("envd");
    assert_eq!(sandbox.stat("/home/user/f").await.expect("kept").size, 1);
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_bounds_a_slow_server() {
    let server = server().await;
    let mut config = config_for(&server, "e2b_integration_key_0123456789");
    config.request_deadline = Duration::from_millis(300);
    let client = Client::new(config).expect("valid");
    server.faults().set_latency(Duration::from_secs(5));
    let error = client
        .get(&SandboxId::parse("inotthere".to_owned()).expect("id"))
        .await
        .expect_err("deadline");
    server.faults().set_latency(Duration::ZERO);
    assert!(
        error.is_deadline_exceeded() && error.is_transient(),
        "{error:?}"
    );
    let shown = error.to_string();
    assert!(shown.contains("deadline exceeded"), "{shown}");
    assert!(!shown.to_lowercase().contains("timeout"), "{shown}");
    server.shutdown().await.expect("shutdown");
}

#[test]
fn no_secret_in_any_error_string() {
    // contract: X1, X4
    use proptest::prelude::*;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(server());
    let mut strict = ServerConfig::loopback();
    strict.api_key = agent_sandbox_examples::e2b_local::ApiKeyPolicy::Exact(
        "e2b_the_only_valid_key_000".to_owned(),
    );
    let strict = runtime
        .block_on(Server::start(strict))
        .expect("strict server");
    let closed_port = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        listener.local_addr().expect("addr").port()
    });

    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 12,
        ..proptest::test_runner::Config::default()
    });
    let strategy = (
        "[A-Z][0-9][A-Za-z0-9_-]{10,40}",
        "[A-Z][0-9][a-z0-9]{6,12}",
        "[A-Z][0-9][A-Za-z0-9]{6,20}",
    );
    runner
        .run(&strategy, |(key, user, pass)| {
            let errors: Vec<Error> = runtime.block_on(async {
                let client = Client::new(config_for(&server, &key)).expect("valid");
                let mut errors = Vec::new();
                let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
                errors.push(
                    sandbox
                        .stat("/home/user/missing")
                        .await
                        .expect_err("missing"),
                );
                sandbox
                    .write_file("/home/user/big", Bytes::from(vec![0u8; 4096]))
                    .await
                    .expect("write");
                errors.push(
                    sandbox
                        .read_file("/home/user/big", 16)
                        .await
                        .expect_err("cap"),
                );
                client.kill(&info.sandbox_id).await.expect("kill");
                errors.push(client.get(&info.sandbox_id).await.expect_err("gone"));
                errors.push(sandbox.list_dir("/", 1).await.expect_err("gone"));

                // Wrong key on a strict server.
                let strict_client = Client::new(config_for(&strict, &key)).expect("valid");
                errors.push(
                    strict_client
                        .list(ListQuery::all())
                        .try_collect::<Vec<_>>()
                        .await
                        .expect_err("401"),
                );
                // Credentials in the URL of an unreachable server.
                let mut config = config_for(&server, &key);
                config.api_url = Some(format!("http://{user}:{pass}@127.0.0.1:{closed_port}"));
                config.retry = RetryPolicy::none();
                let unreachable = Client::new(config).expect("valid");
                errors.push(
                    unreachable
                        .get(&info.sandbox_id)
                        .await
                        .expect_err("refused"),
                );
                errors
            });
            assert!(errors[4].is_unauthorized(), "{:?}", errors[4]);
            for error in &errors {
                let shown = format!("{error} | {error:?}");
                for secret in [&key, &user, &pass] {
                    prop_assert!(
                        !shown.contains(secret.as_str()),
                        "{} leaked: {}",
                        secret,
                        shown
                    );
                }
            }
            Ok(())
        })
        .expect("no secret leaked");
    runtime.block_on(async {
        server.shutdown().await.expect("shutdown");
        strict.shutdown().await.expect("shutdown");
    });
}

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
