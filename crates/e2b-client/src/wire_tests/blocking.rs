//! The blocking start: the same request as the async one, its stream read on the calling
//! thread, its connection kept for the next command, its waits, interrupts and failures.

use std::time::{Duration, Instant};

use axum::body::Body;

use super::support::*;
use crate::blocking::Next;
use crate::*;

fn finished_body(pid: u32, stdout: &str) -> Body {
    Body::from(
        [
            frame(0, &format!(r#"{{"event":{{"start":{{"pid":{pid}}}}}}}"#)),
            frame(
                0,
                &format!(
                    r#"{{"event":{{"data":{{"stdout":"{}"}}}}}}"#,
                    json::encode_bytes(stdout.as_bytes())
                ),
            ),
            frame(0, r#"{"event":{"keepalive":{}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}"#,
            ),
            frame(2, "{}"),
        ]
        .concat(),
    )
}

/// Every event up to `End`, on this thread.
fn events(stream: &mut blocking::BlockingProcessStream) -> Vec<ProcessEvent> {
    let mut seen = Vec::new();
    loop {
        match stream.next_event(None).expect("event") {
            Next::Event(event) => {
                let end = matches!(event, ProcessEvent::End(_));
                seen.push(event);
                if end {
                    return seen;
                }
            }
            Next::Waited => panic!("no time limit was given"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_start_sends_what_the_async_one_sends_and_reuses_its_connection() {
    let server =
        TestServer::start(|_, index| connect_stream(finished_body(1000 + index as u32, "hello")))
            .await;
    let sandbox = sandbox(&client(&server.url));
    assert!(sandbox.can_start_blocking());
    let mut options = StartOptions::shell("echo hello".to_owned());
    options.envs.insert("A".to_owned(), "b".to_owned());
    options.cwd = Some("/home/user".to_owned());
    options.user = Some("root".to_owned());
    options.timeout = Some(Duration::from_secs(30));
    let (first, second) = tokio::task::spawn_blocking({
        let sandbox = sandbox.clone();
        move || {
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut stream = sandbox.start_blocking(options.clone()).expect("started");
                // An interrupter kept past the end neither keeps the connection from the
                // next command nor reaches it there.
                let interrupter = stream.interrupter();
                let pid = stream.pid();
                let seen = events(&mut stream);
                assert!(stream.finish(END_DRAIN_LIMIT), "a clean end");
                interrupter.interrupt();
                runs.push((pid, seen));
            }
            (runs.remove(0), runs.remove(0))
        }
    })
    .await
    .expect("ran");
    assert_eq!((first.0, second.0), (1000, 1001));
    assert!(
        matches!(&first.1[..], [ProcessEvent::Stdout(out), ProcessEvent::End(end)] if out.as_ref() == b"hello" && end.exit_code == 3),
        "{:?}",
        first.1
    );
    let requests = server.requests();
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path_and_query, "/process.Process/Start");
    for (name, value) in [
        ("content-type", "application/connect+json"),
        ("connect-protocol-version", "1"),
        ("keepalive-ping-interval", "50"),
        ("connect-timeout-ms", "30000"),
        ("authorization", "Basic cm9vdDo="),
        ("e2b-sandbox-id", SANDBOX),
        ("e2b-sandbox-port", "49983"),
        ("x-access-token", TOKEN),
    ] {
        assert_eq!(request.header(name), Some(value), "{name}");
    }
    assert!(
        request.header("x-api-key").is_none(),
        "the API key stays on the control plane"
    );
    assert_eq!(
        std::str::from_utf8(&request.body[5..]).expect("utf-8"),
        r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello"],"envs":{"A":"b"},"cwd":"/home/user"},"stdin":false}"#
    );
    assert_eq!(
        requests[0].peer, requests[1].peer,
        "the second command goes out on the first one's connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_read_returns_at_the_time_given_and_an_interrupt_ends_it() {
    let (server, feed) = fed_stream_server().await;
    let sandbox = sandbox(&client(&server.url));
    feed.send(frame(0, r#"{"event":{"start":{"pid":7}}}"#))
        .await
        .expect("send");
    let error = tokio::task::spawn_blocking(move || {
        let mut stream = sandbox
            .start_blocking(StartOptions::shell("sleep".to_owned()))
            .expect("started");
        assert_eq!(stream.pid(), 7);
        let asked = Instant::now();
        let waited = stream
            .next_event(Some(asked + Duration::from_millis(50)))
            .expect("a wait");
        assert!(matches!(waited, Next::Waited), "{waited:?}");
        assert!(asked.elapsed() >= Duration::from_millis(50));
        let interrupter = stream.interrupter();
        let interrupting = std::thread::spawn(move || interrupter.interrupt());
        let error = stream.next_event(None).expect_err("interrupted");
        interrupting.join().expect("joined");
        // The stream has ended: asking again is refused, never a hang.
        assert!(stream.next_event(None).is_err());
        assert!(!stream.finish(END_DRAIN_LIMIT));
        error
    })
    .await
    .expect("ran");
    drop(feed);
    assert_eq!(error.sandbox_id(), Some(&sandbox_id()), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_is_the_error_the_async_start_gives() {
    let server = TestServer::start(|request, _| match request.path_and_query.as_str() {
        "/health" => json(
            502,
            &serde_json::json!({"message": "The sandbox was not found"}),
        ),
        _ if request.header("authorization").is_some() => json(
            404,
            &serde_json::json!({"code": "not_found", "message": "no such user"}),
        ),
        // No end event: the body just ends, on a sandbox the health probe finds gone.
        _ => connect_stream(Body::from(frame(0, r#"{"event":{"start":{"pid":9}}}"#))),
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    let (refused, async_refused, broken) = {
        let sandbox = sandbox.clone();
        let mut as_user = StartOptions::shell("true".to_owned());
        as_user.user = Some("nobody".to_owned());
        let async_refused = sandbox.start(as_user.clone()).await.expect_err("refused");
        tokio::task::spawn_blocking(move || {
            let refused = sandbox.start_blocking(as_user).expect_err("refused");
            let mut stream = sandbox
                .start_blocking(StartOptions::shell("true".to_owned()))
                .expect("started");
            let broken = stream.next_event(None).expect_err("broken off");
            (refused, async_refused, broken)
        })
        .await
        .expect("ran")
    };
    assert!(refused.is_not_found(), "{refused}");
    assert_eq!(refused.to_string(), async_refused.to_string());
    assert!(broken.is_sandbox_gone(), "{broken}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_plain_http_without_a_proxy_starts_blocking() {
    let server = TestServer::start(|_, _| json(200, &serde_json::json!({}))).await;
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(server.url.clone());
    config.sandbox_url = Some("https://sandbox.example".to_owned());
    let tls = sandbox(&Client::new(config).expect("valid"));
    assert!(!tls.can_start_blocking());
    let error = tls
        .start_blocking(StartOptions::shell("true".to_owned()))
        .expect_err("refused");
    assert!(error.is_invalid_request(), "{error}");
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(server.url.clone());
    config.sandbox_url = Some(server.url.clone());
    config.proxy = Some("http://127.0.0.1:9".to_owned());
    assert!(!sandbox(&Client::new(config).expect("valid")).can_start_blocking());
    assert!(server.requests().is_empty(), "nothing was sent");
}
