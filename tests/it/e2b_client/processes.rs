//! Processes: streams, signals, reattach, kill by pid.

use super::*;

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
