//! The control plane: create, connect, list and its pages, leases on the server's clock.

use super::*;

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
async fn a_sandbox_created_with_auto_resume_is_woken_by_its_next_command() {
    // contract: L19 — no connect: the command is the traffic that resumes it, memory kept.
    let server = server().await;
    let client = client(&server);
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(600));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Keep);
    options.auto_resume = Some(true);
    let info = client.create(options).await.expect("created");
    let sandbox = client.sandbox(info.envd_access()).expect("handle");
    let detail = client.get(&info.sandbox_id).await.expect("get");
    assert!(detail.lifecycle.expect("lifecycle").auto_resume);
    let started = sandbox
        .start(StartOptions::shell("sleep 600".to_owned()))
        .await
        .expect("started");
    let pid = started.pid();
    drop(started);
    assert_eq!(
        client.pause(&info.sandbox_id).await.expect("paused"),
        PauseOutcome::Paused
    );
    assert_eq!(
        client
            .get(&info.sandbox_id)
            .await
            .expect("get")
            .summary
            .state,
        SandboxState::Paused
    );
    assert_eq!(sh(&sandbox, "echo awake").await, "awake\n");
    let running = sandbox.list_processes().await.expect("listed");
    assert!(running.iter().any(|p| p.pid == pid), "{running:?}");

    // Without autoResume (and with a filesystem-only pause, refused with it) nothing wakes.
    let mut plain = CreateOptions::new("base".to_owned());
    plain.on_timeout = OnTimeout::Pause(PauseMemory::Keep);
    let (plain_info, plain_sandbox) = {
        let info = client.create(plain).await.expect("created");
        let sandbox = client.sandbox(info.envd_access()).expect("handle");
        (info, sandbox)
    };
    client.pause(&plain_info.sandbox_id).await.expect("paused");
    let error = plain_sandbox
        .run(StartOptions::shell("true".to_owned()), 1024)
        .await
        .expect_err("still paused");
    assert!(error.is_sandbox_gone(), "{error}");
    let mut refused = CreateOptions::new("base".to_owned());
    refused.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    refused.auto_resume = Some(true);
    let error = client.create(refused).await.expect_err("refused");
    assert!(error.is_invalid_request(), "{error}");
    assert!(error.to_string().contains("autoResume"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_with_an_idempotency_key_is_retried_and_makes_one_sandbox() {
    // contract: L20 — a key makes create retryable: a 503 is retried, a repeat after a lost
    // answer gets the same sandbox, the key with other options is refused.
    let server = server().await;
    let client = client(&server);
    let keyed = |key: &str| {
        let mut options = CreateOptions::new("base".to_owned());
        options.idempotency_key = Some(key.to_owned());
        options.metadata.insert("run".to_owned(), key.to_owned());
        options
    };
    let unavailable = FailRule {
        count: 1,
        status: 503,
        scope: FaultScope::Rest,
        path_prefix: Some("/v2/sandboxes".to_owned()),
        retry_after_secs: None,
        should_retry: None,
        message: None,
    };
    // Without a key a 503 is not retried: the request may have made a sandbox.
    server.faults().fail_next(unavailable.clone());
    let error = client
        .create(CreateOptions::new("base".to_owned()))
        .await
        .expect_err("not retried");
    assert!(error.is_transient(), "{error}");
    server.faults().fail_next(unavailable);
    let first = client.create(keyed("key-1")).await.expect("retried");

    // The answer is lost after the sandbox was made; the caller's repeat gets it again.
    server.faults().drop_streams(DropRule {
        count: 1,
        after_bytes: 0,
        scope: FaultScope::Rest,
        path_prefix: Some("/v2/sandboxes".to_owned()),
    });
    let lost = client
        .create(keyed("key-2"))
        .await
        .expect_err("answer lost");
    assert!(lost.is_transient(), "{lost}");
    let again = client
        .create(keyed("key-2"))
        .await
        .expect("the same sandbox");
    let repeat = client
        .create(keyed("key-1"))
        .await
        .expect("the same sandbox");
    assert_eq!(repeat.sandbox_id, first.sandbox_id);
    let mut query = ListQuery::all();
    query.metadata.insert("run".to_owned(), "key-2".to_owned());
    let listed = list_all(&client, query).await;
    assert_eq!(
        listed.iter().map(|s| &s.sandbox_id).collect::<Vec<_>>(),
        [&again.sandbox_id]
    );

    let mut changed = keyed("key-1");
    changed.env_vars.insert("OTHER".to_owned(), "1".to_owned());
    let error = client.create(changed).await.expect_err("reused key");
    assert!(error.to_string().contains("Idempotency-Key"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_by_start_time_and_template_orders_and_starts_from_a_token() {
    // The list's query options, against e2b-local's list (E2B's filters and cursor).
    use agent_sandbox_examples::e2b_client::ListOrder;

    let server = server().await;
    let client = client(&server);
    let mut ids = Vec::new();
    let mut second_started = None;
    for template in ["base", "code-interpreter-v1", "base"] {
        let mut options = CreateOptions::new(template.to_owned());
        options.timeout = Some(Duration::from_secs(3600));
        options
            .metadata
            .insert("suite".to_owned(), "filters".to_owned());
        let info = client.create(options).await.expect("created");
        if ids.len() == 1 {
            let detail = client.get(&info.sandbox_id).await.expect("get");
            second_started = Some(detail.summary.started_at);
        }
        ids.push(info.sandbox_id);
        server.clock().advance(Duration::from_secs(10));
    }
    let query = |edit: &dyn Fn(&mut ListQuery)| {
        let mut query = ListQuery::all();
        query
            .metadata
            .insert("suite".to_owned(), "filters".to_owned());
        edit(&mut query);
        query
    };
    let listed = |items: Vec<ListedSandbox>| -> Vec<SandboxId> {
        items.into_iter().map(|s| s.sandbox_id).collect()
    };
    let oldest =
        listed(list_all(&client, query(&|q| q.order = Some(ListOrder::OldestFirst))).await);
    assert_eq!(oldest, ids);
    let newest =
        listed(list_all(&client, query(&|q| q.order = Some(ListOrder::NewestFirst))).await);
    assert_eq!(newest, ids.iter().rev().cloned().collect::<Vec<_>>());
    let after = listed(
        list_all(
            &client,
            query(&|q| {
                q.order = Some(ListOrder::OldestFirst);
                q.started_after = second_started;
            }),
        )
        .await,
    );
    assert_eq!(after, ids[1..]);
    let interpreters = listed(
        list_all(
            &client,
            query(&|q| q.template = Some("code-interpreter-v1".to_owned())),
        )
        .await,
    );
    assert_eq!(interpreters, ids[1..2]);

    // A listing of one per page hands out a token; a new listing can start from it.
    let token = {
        // The token after the first page, as E2B's X-Next-Token carries it.
        let response = reqwest::Client::new()
            .get(format!(
                "{}/v2/sandboxes?metadata=suite%3Dfilters&order=asc&limit=1",
                server.url()
            ))
            .header("X-API-Key", "e2b_integration_key_0123456789")
            .send()
            .await
            .expect("listed");
        response
            .headers()
            .get("x-next-token")
            .expect("a next token")
            .to_str()
            .expect("text")
            .to_owned()
    };
    let rest = listed(
        list_all(
            &client,
            query(&|q| {
                q.order = Some(ListOrder::OldestFirst);
                q.limit = Some(1);
                q.next_token = Some(token.clone());
            }),
        )
        .await,
    );
    assert_eq!(rest, ids[1..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_servers_and_internet_access_are_sent_at_create_and_in_an_update_and_read_back() {
    use agent_sandbox_examples::e2b_client::{EgressRules, NetworkConfig, NetworkUpdate};

    let server = server().await;
    let client = client(&server);
    let mut network = NetworkConfig::new(EgressRules::unrestricted());
    network.dns_servers = vec!["1.1.1.1".to_owned()];
    network.https_ports = vec![8443];
    let mut options = CreateOptions::new("base".to_owned());
    options.network = Some(network);
    let info = client.create(options).await.expect("created");
    let shown = client.get(&info.sandbox_id).await.expect("get");
    assert_eq!(
        shown.network.expect("network").dns_servers,
        ["1.1.1.1".to_owned()]
    );
    let mut update = NetworkUpdate::new(EgressRules::unrestricted());
    update.dns_servers = vec!["9.9.9.9".to_owned()];
    update.allow_internet_access = Some(false);
    client
        .replace_network(&info.sandbox_id, &update)
        .await
        .expect("updated");
    let shown = client.get(&info.sandbox_id).await.expect("get");
    assert_eq!(shown.allow_internet_access, Some(false));
    assert_eq!(
        shown.network.expect("network").dns_servers,
        ["9.9.9.9".to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_only_pause_and_a_reboot_on_resume_start_a_new_boot_with_the_files() {
    use agent_sandbox_examples::e2b_client::OnResume;

    let server = server().await;
    let client = client(&server);
    let boot =
        |sandbox: Sandbox| async move { sh(&sandbox, "cat /proc/sys/kernel/random/boot_id").await };
    for (name, memory, on_resume) in [
        ("memory kept", PauseMemory::Keep, OnResume::Restore),
        ("files only", PauseMemory::Discard, OnResume::Restore),
        ("reboot", PauseMemory::Keep, OnResume::Reboot),
    ] {
        let mut options = CreateOptions::new("base".to_owned());
        options.on_timeout = OnTimeout::Pause(PauseMemory::Keep);
        let info = client.create(options).await.expect("created");
        let sandbox = client.sandbox(info.envd_access()).expect("handle");
        sandbox
            .write_file("/home/user/kept.txt", Bytes::from_static(b"kept"))
            .await
            .expect("written");
        let before = boot(sandbox.clone()).await;
        let sleeper = sandbox
            .start(StartOptions::exec(
                "sleep".to_owned(),
                vec!["600".to_owned()],
            ))
            .await
            .expect("started");
        let pid = sleeper.pid();
        drop(sleeper);
        assert_eq!(
            client
                .pause_with(&info.sandbox_id, memory)
                .await
                .expect("paused"),
            PauseOutcome::Paused,
            "{name}"
        );
        let connected = client
            .connect_with(&info.sandbox_id, Duration::from_secs(600), on_resume)
            .await
            .expect("resumed");
        assert_eq!(connected.state, ConnectState::Resumed, "{name}");
        let sandbox = client
            .sandbox(connected.sandbox.envd_access())
            .expect("handle");
        assert_eq!(
            &sandbox
                .read_file("/home/user/kept.txt", 64)
                .await
                .expect("read")[..],
            b"kept",
            "{name}"
        );
        let after = boot(sandbox.clone()).await;
        let alive = sandbox
            .list_processes()
            .await
            .expect("listed")
            .iter()
            .any(|p| p.pid == pid);
        let kept_memory = memory == PauseMemory::Keep && on_resume == OnResume::Restore;
        assert_eq!(
            before == after,
            kept_memory,
            "{name}: boot ids {before} {after}"
        );
        assert_eq!(alive, kept_memory, "{name}");
    }
}
