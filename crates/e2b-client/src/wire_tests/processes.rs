//! envd's process service: what Start sends and how its stream is read.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::support::*;
use crate::*;

#[tokio::test]
async fn start_sends_what_envd_expects() {
    let server = TestServer::start(|_, _| {
        let body = [
            frame(0, r#"{"event":{"start":{"pid":1000}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            ),
            frame(2, "{}"),
        ]
        .concat();
        connect_stream(Body::from(body))
    })
    .await;
    let client = client(&server.url);
    let mut options = StartOptions::shell("echo hello".to_owned());
    options.envs.insert("A".to_owned(), "b".to_owned());
    options.cwd = Some("/home/user".to_owned());
    options.user = Some("root".to_owned());
    options.timeout = Some(Duration::from_secs(30));
    let output = sandbox(&client).run(options, 1024).await.expect("ran");
    assert_eq!(output.pid, 1000);
    assert_eq!(output.end.exit_code, 0);

    let request = &server.requests()[0];
    assert_eq!(request.path_and_query, "/process.Process/Start");
    assert_eq!(
        request.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(request.header("connect-protocol-version"), Some("1"));
    assert_eq!(request.header("keepalive-ping-interval"), Some("50"));
    assert_eq!(request.header("connect-timeout-ms"), Some("30000"));
    assert_eq!(request.header("authorization"), Some("Basic cm9vdDo="));
    assert_eq!(request.header("e2b-sandbox-id"), Some(SANDBOX));
    assert_eq!(request.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(request.header("x-access-token"), Some(TOKEN));
    assert!(
        request.header("x-api-key").is_none(),
        "the API key stays on the control plane"
    );
    let body = &request.body;
    assert_eq!(body[0], 0);
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(len, body.len() - 5);
    assert_eq!(
        std::str::from_utf8(&body[5..]).expect("utf-8"),
        r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello"],"envs":{"A":"b"},"cwd":"/home/user"},"stdin":false}"#
    );
}

#[tokio::test]
async fn start_sends_an_argv_as_it_is() {
    let server = TestServer::start(|_, _| {
        let body = [
            frame(0, r#"{"event":{"start":{"pid":1001}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            ),
            frame(2, "{}"),
        ]
        .concat();
        connect_stream(Body::from(body))
    })
    .await;
    let client = client(&server.url);
    // Shell syntax in an argument is data: it is neither quoted nor split here.
    let options = StartOptions::exec(
        "/bin/bash".to_owned(),
        vec!["-c".to_owned(), "echo 'it''s' \"$HOME\"; exit 3".to_owned()],
    );
    let output = sandbox(&client).run(options, 1024).await.expect("ran");
    assert_eq!(output.pid, 1001);

    let request = &server.requests()[0];
    assert_eq!(request.path_and_query, "/process.Process/Start");
    assert_eq!(request.header("connect-timeout-ms"), None);
    assert_eq!(request.header("authorization"), None);
    let message: serde_json::Value = serde_json::from_slice(&request.body[5..]).expect("json");
    assert_eq!(
        message,
        serde_json::json!({
            "process": {
                "cmd": "/bin/bash",
                "args": ["-c", "echo 'it''s' \"$HOME\"; exit 3"],
                "envs": {},
            },
            "stdin": false,
        })
    );
}

#[tokio::test]
async fn events_are_delivered_while_the_command_still_runs() {
    // contract: O1
    let (server, feed) = fed_stream_server().await;
    let client = client(&server.url);
    let guard = Duration::from_secs(10);
    feed.send(frame(0, r#"{"event":{"start":{"pid":42}}}"#))
        .await
        .expect("send");
    let mut events = tokio::time::timeout(
        guard,
        sandbox(&client).start(StartOptions::shell("slow".to_owned())),
    )
    .await
    .expect("not buffered")
    .expect("started");
    assert_eq!(events.pid(), 42);
    assert_eq!(
        events.next().await.expect("an event").expect("ok"),
        ProcessEvent::Start { pid: 42 }
    );
    // The server has not finished: the next event only exists once we send it.
    feed.send(frame(0, r#"{"event":{"data":{"stdout":"b25l"}}}"#))
        .await
        .expect("send");
    let event = tokio::time::timeout(guard, events.next())
        .await
        .expect("not buffered");
    assert_eq!(
        event.expect("an event").expect("ok"),
        ProcessEvent::Stdout(Bytes::from_static(b"one"))
    );
    feed.send(frame(
        0,
        r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#,
    ))
    .await
    .expect("send");
    feed.send(frame(2, "{}")).await.expect("send");
    drop(feed);
    let rest: Vec<ProcessEvent> = events.try_collect().await.expect("clean end");
    assert!(matches!(rest.as_slice(), [ProcessEvent::End(end)] if end.exit_code == -1));
}

/// The end event, the end-of-stream message and the end of the body arrive as separate
/// chunks (as envd writes them). A stream dropped at the end event closes its connection; one
/// read to the end of the response leaves it for the next request.
#[tokio::test]
async fn a_command_read_past_its_end_event_leaves_the_connection_for_the_next() {
    let server = TestServer::start(|_, _| {
        let frames = [
            frame(0, r#"{"event":{"start":{"pid":7}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#,
            ),
            frame(2, "{}"),
        ];
        let body = futures::stream::iter(frames.map(Ok::<Bytes, Infallible>));
        connect_stream(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    let guard = Duration::from_secs(10);
    for _ in 0..2 {
        let output = sandbox
            .run(StartOptions::shell("true".to_owned()), 1024)
            .await
            .expect("ran");
        assert_eq!(output.end.exit_code, 0);
    }
    for _ in 0..2 {
        let mut events = sandbox
            .start(StartOptions::shell("true".to_owned()))
            .await
            .expect("started");
        loop {
            match events.next().await.expect("an event").expect("ok") {
                ProcessEvent::End(end) => break assert_eq!(end.exit_code, 0),
                _ => continue,
            }
        }
        assert!(events.drain(guard).await, "the response ends cleanly");
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    let peers: std::collections::BTreeSet<_> = requests.iter().map(|r| r.peer).collect();
    assert_eq!(peers.len(), 1, "one connection for all four: {peers:?}");
    assert!(peers.iter().all(Option::is_some));
}

/// A server that never ends the response after the end event costs the drain its limit, not
/// more.
#[tokio::test]
async fn a_response_that_never_ends_after_the_end_event_is_given_up_after_the_limit() {
    let server = TestServer::start(|_, _| {
        let frames = [
            frame(0, r#"{"event":{"start":{"pid":7}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#,
            ),
        ];
        let body = futures::stream::iter(frames.map(Ok::<Bytes, Infallible>))
            .chain(futures::stream::pending());
        connect_stream(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let mut events = sandbox(&client)
        .start(StartOptions::shell("true".to_owned()))
        .await
        .expect("started");
    while !matches!(
        events.next().await.expect("an event").expect("ok"),
        ProcessEvent::End(_)
    ) {}
    let drained = tokio::time::timeout(
        Duration::from_secs(10),
        events.drain(Duration::from_millis(50)),
    )
    .await
    .expect("the drain gives up at its limit");
    assert!(!drained, "no clean end");
}

#[tokio::test]
async fn a_stream_cut_mid_frame_is_an_error() {
    let (cut, cut_signal) = tokio::sync::oneshot::channel::<()>();
    let cut_signal = Arc::new(Mutex::new(Some(cut_signal)));
    let server = TestServer::start(move |_, _| {
        let cut_signal = cut_signal
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one request");
        let mut wire = frame(0, r#"{"event":{"start":{"pid":1}}}"#).to_vec();
        wire.extend_from_slice(&frame(0, r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#)[..9]);
        // The connection breaks mid-frame once the test has seen the start event.
        let body = futures::stream::iter([Ok(Bytes::from(wire))]).chain(futures::stream::once(
            async move {
                let _ = cut_signal.await;
                Err(std::io::Error::other("cut"))
            },
        ));
        connect_stream(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let mut events = sandbox(&client)
        .start(StartOptions::shell("x".to_owned()))
        .await
        .expect("started");
    assert_eq!(events.pid(), 1);
    assert!(matches!(
        events.next().await,
        Some(Ok(ProcessEvent::Start { pid: 1 }))
    ));
    cut.send(()).expect("server waiting");
    let error = events.next().await.expect("an item").expect_err("cut");
    assert!(
        matches!(
            error,
            Error::Transport {
                stage: TransportStage::Body,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn a_frame_length_near_4_gib_is_refused_under_the_default_cap_without_waiting() {
    // contract: O1
    let server = TestServer::start(|_, _| {
        let mut wire = frame(0, r#"{"event":{"start":{"pid":3}}}"#).to_vec();
        // A header claiming almost 4 GiB and a few payload bytes; then the server stays
        // silent with the connection open, so only the header can end the stream in time.
        wire.push(0);
        wire.extend_from_slice(&0xFFFF_FFF0_u32.to_be_bytes());
        wire.extend_from_slice(b"xyz");
        let body = futures::stream::iter([Ok::<Bytes, Infallible>(Bytes::from(wire))])
            .chain(futures::stream::pending());
        connect_stream(Body::from_stream(body))
    })
    .await;
    // `client` keeps `Config::new`'s standard limits, as a real client has them.
    let client = client(&server.url);
    let mut events = sandbox(&client)
        .start(StartOptions::shell("x".to_owned()))
        .await
        .expect("started");
    assert!(matches!(
        events.next().await,
        Some(Ok(ProcessEvent::Start { pid: 3 }))
    ));
    // Far below the stream's allowed silence (100 s here): waiting for the payload would
    // fail this bound instead of passing late.
    let error = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("refused at the header, without waiting for the payload")
        .expect("an item")
        .expect_err("a protocol error");
    assert!(matches!(error, Error::Protocol { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("frame of 4294967280 bytes exceeds the 4194304-byte frame cap"),
        "{error}"
    );
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn envd_outcomes_are_typed() {
    let server = TestServer::start(|request, _| {
        let q = request.path_and_query.as_str();
        if q == "/process.Process/SendSignal" {
            json(404, &serde_json::json!({"code":"not_found","message":"process with pid 7 not found"}))
        } else if q == "/filesystem.Filesystem/MakeDir" {
            json(409, &serde_json::json!({"code":"already_exists","message":"exists"}))
        } else if q == "/filesystem.Filesystem/Stat" {
            json(404, &serde_json::json!({"code":"not_found","message":"no such file"}))
        } else {
            json(502, &serde_json::json!({"sandboxId":SANDBOX,"message":"The sandbox was not found","code":502}))
        }
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    assert_eq!(
        sandbox.kill_process(7).await.expect("signal"),
        SignalOutcome::NotFound
    );
    assert!(matches!(
        sandbox.make_dir("/d").await.expect("mkdir"),
        MakeDirOutcome::AlreadyExists
    ));
    let stat = sandbox.stat("/nope").await.expect_err("missing");
    assert!(stat.is_not_found() && !stat.is_sandbox_gone());
    assert_eq!(sandbox.health().await.expect("health"), Health::NotRunning);
    let gone = sandbox.list_processes().await.expect_err("gone");
    assert!(gone.is_sandbox_gone() && !gone.is_transient());
    // 502 "was not found" is not retried: one request each for health and list.
    let tail: Vec<String> = server
        .requests()
        .into_iter()
        .skip(3)
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(tail, ["/health", "/process.Process/List"]);
    assert_eq!(
        &server.requests()[0].body[..],
        br#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#
    );
}

#[tokio::test]
async fn an_error_before_the_start_event_fails_the_start_call() {
    let server = TestServer::start(|_, _| {
        connect_stream(Body::from(frame(
            2,
            r#"{"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}}"#,
        )))
    })
    .await;
    let client = client(&server.url);
    let mut options = StartOptions::shell("true".to_owned());
    options.cwd = Some("/nope".to_owned());
    let error = sandbox(&client).start(options).await.expect_err("refused");
    assert_eq!(error.code(), Some("invalid_argument"));
    assert_eq!(error.operation(), Some(Operation::StartProcess));
    assert!(
        error.to_string().contains("cwd '/nope' does not exist"),
        "{error}"
    );
}
