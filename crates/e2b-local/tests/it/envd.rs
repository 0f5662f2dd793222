//! envd over the shared port: Connect framing, processes and isolation (the filesystem,
//! `/files` and access tokens are `envd_files`).

use crate::support;
use crate::support::{Api, Sandbox, envelope, manual_server, new_sandbox};
use serde_json::json;

#[tokio::test]
async fn start_stream_framing_and_end_values() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;

    let run = api.run(&sandbox, "echo hello; echo warn >&2").await;
    assert_eq!(run.stdout, b"hello\n");
    assert_eq!(run.stderr, b"warn\n");
    assert_eq!(run.end, json!({"exited": true, "status": "exit status 0"}));
    assert_eq!(run.end_stream, json!({}));
    assert!(run.pid > 0);

    let failed = api.run(&sandbox, "exit 3").await;
    assert_eq!(
        failed.end,
        json!({"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"})
    );

    // A chunked request body (how the Python SDK sends it) works as well.
    let body = envelope(&json!({"process": {"cmd": "/bin/echo", "args": ["chunked"]}}));
    let parts: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(3).map(|c| Ok(c.to_vec())).collect();
    let response = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(parts)))
        .send()
        .await
        .unwrap();
    let run = support::FrameStream::new(response).collect().await;
    assert_eq!(run.stdout, b"chunked\n");

    // Errors before the process starts travel in the end-stream frame of a 200 stream.
    let body = envelope(&json!({"process": {"cmd": "/bin/true", "cwd": "/home/user/missing"}}));
    let response = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut frames = support::FrameStream::new(response);
    let end = frames.next().await.unwrap();
    assert_eq!(end.flags, 2);
    assert_eq!(end.json["error"]["code"], "invalid_argument");
    assert_eq!(
        end.json["error"]["message"],
        "cwd '/home/user/missing' does not exist"
    );

    // Unary errors: HTTP status per the Connect mapping and a string code.
    let bad = api
        .rpc(
            &sandbox,
            "process.Process/SendSignal",
            json!({"process": {"pid": 4_000_000}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(bad.status, 404);
    assert_eq!(
        bad.json,
        json!({"code": "not_found", "message": "process with pid 4000000 not found"})
    );
    let malformed = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/List")
        .header("content-type", "application/json")
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status().as_u16(), 400);
    let proto = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/List")
        .header("content-type", "application/proto")
        .body(vec![0u8])
        .send()
        .await
        .unwrap();
    assert_eq!(proto.status().as_u16(), 415);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn start_passes_cmd_and_args_verbatim() {
    // A program and its arguments are argv as data, as real envd runs them
    // (exec.Command(cmd, args...)): no login shell, no re-parsing by a shell.
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;

    let shell = api
        .run_argv(
            &sandbox,
            "/bin/bash",
            &[
                "-c",
                "shopt -q login_shell && echo login || echo not-login; echo \"$0\"",
            ],
        )
        .await;
    assert_eq!(shell.stdout, b"not-login\n/bin/bash\n");
    assert_eq!(
        shell.end,
        json!({"exited": true, "status": "exit status 0"})
    );

    // Arguments after the `-c` script reach it as $0, $1, ... untouched.
    let positional = api
        .run_argv(
            &sandbox,
            "/bin/bash",
            &[
                "-c",
                "printf '[%s]' \"$0\" \"$1\" \"$2\"",
                "zero",
                "a  b",
                "*",
            ],
        )
        .await;
    assert_eq!(positional.stdout, b"[zero][a  b][*]");

    let echo = api.run_argv(&sandbox, "/bin/echo", &["a  b", "c"]).await;
    assert_eq!(echo.stdout, b"a  b c\n");
    let quoted = api
        .run_argv(
            &sandbox,
            "/bin/echo",
            &["$HOME", "*", "'q' \"d\"", "x;y|z", "$(id)"],
        )
        .await;
    assert_eq!(quoted.stdout, b"$HOME * 'q' \"d\" x;y|z $(id)\n");
    assert!(quoted.stderr.is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn commands_start_with_every_signal_at_its_default() {
    // contract: O9
    // As envd (a service) starts them, even when the server itself runs with SIGINT and
    // SIGQUIT ignored, as a shell's `&` leaves a background job: Ctrl-C must reach a command.
    // SAFETY: ignoring two signals process-wide; no test here relies on receiving them.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let run = api
        .run(&sandbox, "grep -E '^Sig(Ign|Blk):' /proc/self/status")
        .await;
    let text = String::from_utf8(run.stdout).unwrap();
    for line in text.lines() {
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & 0b110, 0, "SIGINT and SIGQUIT: {text}");
    }
    assert_eq!(text.lines().count(), 2, "{text}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn large_output_is_chunked_at_32_kib() {
    // contract: O1 (output streams chunk by chunk)
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let run = api
        .run(&sandbox, "head -c 20000000 /dev/urandom | base64 -w 0")
        .await;
    assert_eq!(run.stdout.len(), 26_666_668);
    assert!(run.chunks.len() > 600, "{} chunks", run.chunks.len());
    assert!(run.chunks.iter().all(|&c| c > 0 && c <= 32 * 1024));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn keepalive_on_silence_then_end() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut stream = api
        .start(
            &sandbox,
            "while [ ! -f /tmp/go ]; do sleep 0.05; done; echo released",
            &[("keepalive-ping-interval", "1")],
        )
        .await;
    let start = stream.next().await.unwrap();
    assert!(start.json["event"]["start"]["pid"].is_u64());
    let silent = stream.next().await.unwrap();
    assert_eq!(silent.json, json!({"event": {"keepalive": {}}}));
    assert_eq!(api.upload(&sandbox, "/tmp/go", b"").await.status, 200);
    let mut rest = Vec::new();
    while let Some(frame) = stream.next().await {
        rest.push(frame);
    }
    let last = rest.pop().unwrap();
    assert_eq!((last.flags, last.json), (2, json!({})));
    let end = rest.pop().unwrap();
    assert_eq!(end.json["event"]["end"]["status"], "exit status 0");
    assert!(
        rest.iter()
            .any(|f| f.json["event"]["data"]["stdout"] == "cmVsZWFzZWQK")
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn connect_timeout_is_the_process_deadline() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut stream = api
        .start(&sandbox, "sleep 300", &[("connect-timeout-ms", "300")])
        .await;
    let start = stream.next().await.unwrap();
    let pid = start.json["event"]["start"]["pid"].as_u64().unwrap();
    let mut last = None;
    while let Some(frame) = stream.next().await {
        last = Some(frame);
    }
    let last = last.unwrap();
    assert_eq!(last.flags, 2);
    assert_eq!(last.json["error"]["code"], "deadline_exceeded");
    // The process was killed, and later Connect calls see its end.
    let mut again = connect_stream(&api, &sandbox, pid).await;
    let run = again.collect().await;
    assert_eq!(run.end["status"], "signal: killed");
    assert_eq!(run.end["exitCode"], -1);
    server.shutdown().await.unwrap();
}

async fn connect_stream(api: &Api, sandbox: &Sandbox, pid: u64) -> support::FrameStream {
    let response = api
        .envd(sandbox, reqwest::Method::POST, "/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .body(envelope(&json!({"process": {"pid": pid}})))
        .send()
        .await
        .unwrap();
    support::FrameStream::new(response)
}

#[tokio::test]
async fn sigkill_by_pid_affects_only_that_pid() {
    // contract: L6 (a kill by pid leaves the sandbox and other processes alive)
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut victim = api.start(&sandbox, "sleep 300", &[]).await;
    let victim_pid = victim.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let mut survivor = api.start(&sandbox, "sleep 300", &[]).await;
    let survivor_pid = survivor.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();

    let listed = api.rpc(&sandbox, "process.Process/List", json!({})).await;
    let pids = listed.listed_pids();
    assert_eq!(pids.len(), 2);
    assert!(pids.contains(&victim_pid) && pids.contains(&survivor_pid));
    assert_eq!(listed.json["processes"][0]["config"]["cmd"], "/bin/bash");

    let killed = api
        .rpc(
            &sandbox,
            "process.Process/SendSignal",
            json!({"process": {"pid": victim_pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!((killed.status, killed.json.clone()), (200, json!({})));
    let mut end = None;
    while let Some(frame) = victim.next().await {
        if let Some(e) = frame.json["event"].get("end") {
            end = Some(e.clone());
        }
    }
    assert_eq!(
        end.unwrap(),
        json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})
    );

    let listed = api.rpc(&sandbox, "process.Process/List", json!({})).await;
    let pids = listed.listed_pids();
    assert_eq!(pids, vec![survivor_pid]);
    let again = api
        .rpc(
            &sandbox,
            "process.Process/SendSignal",
            json!({"process": {"pid": victim_pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(again.json["code"], "not_found");
    let bad_signal = api
        .rpc(
            &sandbox,
            "process.Process/SendSignal",
            json!({"process": {"pid": survivor_pid}, "signal": "SIGNAL_SIGHUP"}),
        )
        .await;
    assert_eq!(bad_signal.json["code"], "unimplemented");

    // Pausing the sandbox without its memory kills everything in it, background children
    // included (a pause that keeps it freezes them: tests/it/pausing.rs).
    let marker = api
        .run(
            &sandbox,
            "(sleep 300 &) ; (setsid sleep 301 &); echo started",
        )
        .await;
    assert_eq!(marker.stdout, b"started\n");
    assert_eq!(
        api.post(
            &format!("/sandboxes/{}/pause", sandbox.id),
            r#"{"memory":false}"#
        )
        .await
        .status,
        204
    );
    // contract: O3 — as on E2B, envd's streams die with the sandbox: the survivor's stream
    // breaks off (the connection is reset) without an end event or end-stream frame.
    let broken = loop {
        match survivor.try_next().await {
            Ok(Some(frame)) => {
                assert!(frame.flags & 2 == 0, "end-stream frame on pause");
                assert!(
                    frame.json["event"].get("end").is_none(),
                    "end event on pause"
                );
            }
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    let broken = broken.expect("the stream breaks off instead of ending cleanly");
    assert!(
        format!("{broken:?}").to_lowercase().contains("reset"),
        "{broken:?}"
    );
    let leftovers = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 30[01]$"])
        .output()
        .unwrap();
    let pids = String::from_utf8_lossy(&leftovers.stdout).to_string();
    for pid in pids.split_whitespace() {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let needle = format!("E2B_SANDBOX_ID={}", sandbox.id);
        assert!(
            !environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()),
            "process {pid} of the paused sandbox survived"
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn stdin_and_connect_reattach() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let body = envelope(&json!({"process": {"cmd": "/bin/cat"}, "stdin": true}));
    let response = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(body)
        .send()
        .await
        .unwrap();
    let mut stream = support::FrameStream::new(response);
    let pid = stream.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    drop(stream); // disconnect: the process keeps running
    let sent = api
        .rpc(
            &sandbox,
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": "aGkK"}}),
        )
        .await;
    assert_eq!(sent.status, 200, "{}", sent.text);
    let mut attached = connect_stream(&api, &sandbox, pid).await;
    assert_eq!(
        attached.next().await.unwrap().json["event"]["start"]["pid"],
        pid
    );
    let closed = api
        .rpc(
            &sandbox,
            "process.Process/CloseStdin",
            json!({"process": {"pid": pid}}),
        )
        .await;
    assert_eq!(closed.status, 200);
    let mut ended = false;
    while let Some(frame) = attached.next().await {
        if let Some(end) = frame.json["event"].get("end") {
            assert_eq!(end["status"], "exit status 0");
            ended = true;
        }
    }
    assert!(ended);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn isolation_home_user_private_tmp_and_user_switch() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let a = new_sandbox(&api).await;
    let b = new_sandbox(&api).await;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let who = api.run(&a, "whoami; echo $HOME; pwd").await;
    if root {
        assert_eq!(
            String::from_utf8_lossy(&who.stdout),
            "user\n/home/user\n/home/user\n"
        );
        let refused = api.run(&a, "cd /root").await;
        assert_eq!(refused.end["exitCode"], 1);
        let as_root = api
            .envd(&a, reqwest::Method::POST, "/process.Process/Start")
            .header("content-type", "application/connect+json")
            .header("authorization", "Basic cm9vdDo=")
            .body(envelope(&json!({"process": {"cmd": "/usr/bin/whoami"}})))
            .send()
            .await
            .unwrap();
        assert_eq!(
            support::FrameStream::new(as_root).collect().await.stdout,
            b"root\n"
        );
    } else {
        // Path-mapping fallback: HOME is the sandbox root on the host.
        let home = server.sandbox_home(&a.id);
        assert!(String::from_utf8_lossy(&who.stdout).contains(home.to_str().unwrap()));
    }
    // Private /tmp: a's file is invisible to b and to the host's /tmp.
    let wrote = api
        .run(
            &a,
            "echo secret > /tmp/e2b-local-private-test && cat /tmp/e2b-local-private-test",
        )
        .await;
    assert_eq!(wrote.stdout, b"secret\n");
    let other = api
        .run(
            &b,
            "cat /tmp/e2b-local-private-test 2>/dev/null || echo absent",
        )
        .await;
    assert_eq!(other.stdout, b"absent\n");
    assert!(!std::path::Path::new("/tmp/e2b-local-private-test").exists());
    // /home/user maps to the sandbox root on the host, owned by the sandbox user.
    let _ = api.run(&a, "echo from-command > ~/made.txt").await;
    let host_file = server.sandbox_home(&a.id).join("made.txt");
    assert_eq!(
        std::fs::read_to_string(&host_file).unwrap(),
        "from-command\n"
    );
    assert_eq!(api.upload(&a, "up.txt", b"x").await.status, 200);
    if root {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(server.sandbox_home(&a.id).join("up.txt")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    }
    server.shutdown().await.unwrap();
}
