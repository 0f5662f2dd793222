//! Injected faults (503s, dropped connections, cut streams, vanished and paused sandboxes, a slow server) and error hygiene.

use super::*;

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
        message: None,
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
        message: None,
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
async fn a_sandbox_killed_under_a_running_command_says_it_was_killed() {
    // contract: O3 — e2b-local breaks the stream off as E2B does; the client's one probe of
    // /health finds the sandbox gone and names it, saying it was killed or reached its end of life.
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut stream = sandbox
        .start(StartOptions::shell("sleep 60".to_owned()))
        .await
        .expect("started");
    assert!(matches!(
        stream.next().await,
        Some(Ok(ProcessEvent::Start { .. }))
    ));
    assert_eq!(
        client.kill(&info.sandbox_id).await.expect("kill"),
        KillOutcome::Killed
    );
    let error = stream
        .next()
        .await
        .expect("an item")
        .expect_err("no end event");
    assert!(
        error.is_sandbox_gone() && !error.is_transient(),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "E2B start process failed for sandbox {}: ",
            info.sandbox_id
        )),
        "{text}"
    );
    assert!(text.contains("killed or reached its end of life"), "{text}");
    assert!(stream.next().await.is_none());
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
