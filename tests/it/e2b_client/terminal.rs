//! Terminals: a PTY started, typed on, resized, re-attached by pid, listed and killed.

use agent_sandbox_examples::e2b_client::{ProcessStream, PtyOptions, PtySize};

use super::*;

/// Reads terminal output until it contains `needle`; returns everything read.
async fn read_until(stream: &mut ProcessStream, needle: &str) -> String {
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        match event.expect("event") {
            ProcessEvent::Pty(chunk) => {
                seen.extend_from_slice(&chunk);
                if String::from_utf8_lossy(&seen).contains(needle) {
                    return String::from_utf8_lossy(&seen).into_owned();
                }
            }
            ProcessEvent::End(end) => panic!("ended ({end:?}) before {needle:?}"),
            _ => {}
        }
    }
    panic!(
        "stream closed before {needle:?}: {:?}",
        String::from_utf8_lossy(&seen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_is_typed_on_resized_reattached_and_killed() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;

    let mut options = PtyOptions::shell(PtySize { cols: 90, rows: 20 });
    options.envs.insert("MARK".to_owned(), "m1".to_owned());
    let mut stream = sandbox.start_pty(options).await.expect("pty started");
    let pid = stream.pid();
    // The typed line is echoed with `$MARK`; only the output carries its value.
    sandbox
        .send_pty_input(pid, b"echo \"[$MARK:$(tput cols)x$(tput lines)]\"\n")
        .await
        .expect("typed");
    read_until(&mut stream, "[m1:90x20]").await;

    sandbox
        .resize_pty(
            pid,
            PtySize {
                cols: 120,
                rows: 33,
            },
        )
        .await
        .expect("resized");
    // Dropped: the terminal lives on, and Connect re-attaches to its output by pid.
    drop(stream);
    let mut attached = sandbox.connect_process(pid).await.expect("re-attached");
    assert_eq!(attached.pid(), pid);
    sandbox
        .send_pty_input(pid, b"echo \"<$(stty size)>\"\n")
        .await
        .expect("typed");
    read_until(&mut attached, "<33 120>").await;
    let listed = sandbox.list_processes().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pid, pid);
    assert_eq!(listed[0].config.args, ["-i", "-l"]);

    assert_eq!(
        sandbox.kill_process(pid).await.expect("killed"),
        SignalOutcome::Delivered
    );
    let output = attached.collect_output(1 << 20).await.expect("end");
    assert_eq!(output.end.status, "signal: killed");

    // A process without a terminal: typing on it and resizing it are refused, naming the call.
    let plain = sandbox
        .start(StartOptions::shell("sleep 30".to_owned()))
        .await
        .expect("started");
    let error = sandbox
        .resize_pty(plain.pid(), PtySize { cols: 1, rows: 1 })
        .await
        .expect_err("no terminal");
    assert!(error.to_string().contains("resize terminal"), "{error}");
    let error = sandbox
        .send_pty_input(plain.pid(), b"x")
        .await
        .expect_err("no terminal");
    assert!(error.to_string().contains("send process input"), "{error}");
    let error = sandbox
        .send_pty_input(4_000_000, b"x")
        .await
        .expect_err("no such pid");
    assert!(error.is_not_found(), "{error:?}");
    server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_through_one_streamed_call_reaches_the_terminal_in_order() {
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut stream = sandbox
        .start_pty(PtyOptions::shell(PtySize { cols: 80, rows: 24 }))
        .await
        .expect("pty started");
    let pid = stream.pid();
    let mut typing = sandbox.stream_pty_input(pid).await.expect("opened");
    // Keystrokes one by one, as a person types them, then Enter.
    for key in "echo [typed-$((6*7))]".chars() {
        typing
            .send(Bytes::from(key.to_string()))
            .await
            .expect("typed");
    }
    typing.send(Bytes::from_static(b"\n")).await.expect("typed");
    read_until(&mut stream, "[typed-42]").await;
    typing.finish().await.expect("accepted");

    // Typing to a process that is not on a terminal is refused, naming why.
    let plain = sandbox
        .start(StartOptions::exec(
            "sleep".to_owned(),
            vec!["30".to_owned()],
        ))
        .await
        .expect("started");
    let mut wrong = sandbox.stream_pty_input(plain.pid()).await.expect("opened");
    let refused = match wrong.send(Bytes::from_static(b"x")).await {
        Err(error) => error,
        Ok(()) => wrong.finish().await.expect_err("refused"),
    };
    assert!(
        refused.to_string().contains("tty not assigned"),
        "{refused}"
    );
    sandbox.kill_process(plain.pid()).await.expect("killed");
}
