//! Sessions and terminals: commands share the server's session as under envd; a PTY
//! process leads a session of its own on a real pseudo-terminal.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use e2b_local::{IsolationMode, Server, ServerConfig};
use serde_json::json;

use crate::support::{Api, FrameStream, new_sandbox};

/// Prints `shared` when the shell neither leads its process group nor its session, then
/// `leads` when `setsid` (the tool) made it lead both under the same pid, as agent-sandbox's
/// launcher expects.
const SESSION_PROBE: &str = "read -r _ _ _ _ group session _ < /proc/$$/stat; \
     [ \"$group\" != $$ ] && [ \"$session\" != $$ ] && echo shared; \
     exec setsid bash -c 'read -r _ _ _ _ group session _ < /proc/$$/stat; \
     [ \"$group\" = $$ ] && [ \"$session\" = $$ ] && echo leads $$'";

#[tokio::test]
async fn commands_start_in_the_servers_session_as_under_envd() {
    // contract: L6 (e2b-local, like envd, gives a command no group of its own, so the
    // launcher's `setsid` runs)
    for mode in [IsolationMode::Auto, IsolationMode::PathMapping] {
        let mut config = ServerConfig::loopback();
        config.isolation = mode;
        let server = Server::start(config).await.unwrap();
        let api = Api::new(&server);
        let sandbox = new_sandbox(&api).await;
        let run = api.run(&sandbox, SESSION_PROBE).await;
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            format!("shared\nleads {}\n", run.pid),
            "{mode:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(run.end, json!({"exited": true, "status": "exit status 0"}));
        server.shutdown().await.unwrap();
    }
}

/// Reads a PTY stream until its accumulated output contains `needle`; returns that output.
async fn pty_until(stream: &mut FrameStream, needle: &str) -> String {
    let mut seen = Vec::new();
    while let Some(frame) = stream.next().await {
        let event = &frame.json["event"];
        assert!(
            event.get("end").is_none(),
            "ended before {needle:?}: {event}, after {:?}",
            String::from_utf8_lossy(&seen)
        );
        assert!(
            event["data"].get("stdout").is_none() && event["data"].get("stderr").is_none(),
            "{event}"
        );
        if let Some(data) = event["data"]["pty"].as_str() {
            seen.extend(STANDARD.decode(data).unwrap());
            if String::from_utf8_lossy(&seen).contains(needle) {
                return String::from_utf8_lossy(&seen).into_owned();
            }
        }
    }
    panic!(
        "stream closed before {needle:?}: {:?}",
        String::from_utf8_lossy(&seen)
    );
}

/// The end event of a stream, skipping what comes before it.
async fn end_of(stream: &mut FrameStream) -> serde_json::Value {
    while let Some(frame) = stream.next().await {
        if let Some(end) = frame.json["event"].get("end") {
            return end.clone();
        }
    }
    panic!("no end event");
}

fn pty_input(text: &str) -> String {
    STANDARD.encode(text)
}

#[tokio::test]
async fn a_pty_is_a_real_terminal_that_takes_input_and_resizes() {
    for mode in [IsolationMode::Auto, IsolationMode::PathMapping] {
        let mut config = ServerConfig::loopback();
        config.isolation = mode;
        let server = Server::start(config).await.unwrap();
        let api = Api::new(&server);
        let sandbox = new_sandbox(&api).await;
        // The size, the terminal and its session as the command sees them, then again after
        // each line of input (the resize happens in between).
        let script = "stty size; test -t 0 && test -t 1 && echo on-a-tty; \
             read -r _ _ _ _ group session _ < /proc/$$/stat; [ \"$session\" = $$ ] && echo leads; \
             read -r line; echo \"got:$line\"; stty size; tput cols; read -r _; exit 7";
        let body = json!({
            "process": {"cmd": "/bin/bash", "args": ["-c", script], "envs": {"TERM": "xterm-256color"}},
            "pty": {"size": {"cols": 80, "rows": 24}},
        });
        let mut stream = api.start_request(&sandbox, &body, &[]).await;
        let pid = stream.next().await.unwrap().json["event"]["start"]["pid"]
            .as_u64()
            .unwrap();
        let first = pty_until(&mut stream, "leads").await;
        assert!(
            first.contains("24 80\r\non-a-tty\r\n"),
            "{mode:?}: {first:?}"
        );

        let resized = api
            .rpc(
                &sandbox,
                "process.Process/Update",
                json!({"process": {"pid": pid}, "pty": {"size": {"cols": 132, "rows": 40}}}),
            )
            .await;
        assert_eq!((resized.status, resized.json), (200, json!({})), "{mode:?}");
        let typed = api
            .rpc(
                &sandbox,
                "process.Process/SendInput",
                json!({"process": {"pid": pid}, "input": {"pty": pty_input("hello\n")}}),
            )
            .await;
        assert_eq!(typed.status, 200, "{}", typed.text);
        // `stty size` then `tput cols` (which asks the terminal, not $COLUMNS).
        pty_until(&mut stream, "got:hello\r\n40 132\r\n132\r\n").await;

        // Input meant for stdin, or closing stdin, is refused on a terminal as by envd.
        let stdin = api
            .rpc(
                &sandbox,
                "process.Process/SendInput",
                json!({"process": {"pid": pid}, "input": {"stdin": pty_input("x")}}),
            )
            .await;
        assert_eq!(stdin.json["code"], "internal", "{}", stdin.text);
        let close = api
            .rpc(
                &sandbox,
                "process.Process/CloseStdin",
                json!({"process": {"pid": pid}}),
            )
            .await;
        assert_eq!(close.json["code"], "unknown", "{}", close.text);

        let typed = api
            .rpc(
                &sandbox,
                "process.Process/SendInput",
                json!({"process": {"pid": pid}, "input": {"pty": pty_input("bye\n")}}),
            )
            .await;
        assert_eq!(typed.status, 200);
        assert_eq!(
            end_of(&mut stream).await,
            json!({"exitCode": 7, "exited": true, "status": "exit status 7", "error": "exit status 7"})
        );
        server.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn an_interactive_pty_shell_is_killed_by_pid_and_pipes_refuse_pty_calls() {
    let server = crate::support::manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    // What the SDK's `pty.create` sends.
    let body = json!({
        "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm-256color", "MARK": "m1"}},
        "pty": {"size": {"cols": 100, "rows": 30}},
    });
    let mut stream = api.start_request(&sandbox, &body, &[]).await;
    let pid = stream.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let typed = api
        .rpc(
            &sandbox,
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": pty_input("echo \"[$MARK:$(tput cols)]\"\n")}}),
        )
        .await;
    assert_eq!(typed.status, 200, "{}", typed.text);
    pty_until(&mut stream, "[m1:100]").await;
    let listed = api.rpc(&sandbox, "process.Process/List", json!({})).await;
    assert_eq!(listed.listed_pids(), vec![pid]);

    let killed = api
        .rpc(
            &sandbox,
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(killed.status, 200);
    assert_eq!(
        end_of(&mut stream).await,
        json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})
    );

    // A process without a terminal refuses terminal input and resizing.
    let mut plain = api.start(&sandbox, "sleep 30", &[]).await;
    let plain_pid = plain.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let typed = api
        .rpc(
            &sandbox,
            "process.Process/SendInput",
            json!({"process": {"pid": plain_pid}, "input": {"pty": pty_input("x")}}),
        )
        .await;
    assert_eq!(typed.json["code"], "internal", "{}", typed.text);
    let resized = api
        .rpc(
            &sandbox,
            "process.Process/Update",
            json!({"process": {"pid": plain_pid}, "pty": {"size": {"cols": 1, "rows": 1}}}),
        )
        .await;
    assert_eq!(
        resized.json,
        json!({"code": "internal", "message": "error resizing tty: tty not assigned to process"})
    );
    server.shutdown().await.unwrap();
}
