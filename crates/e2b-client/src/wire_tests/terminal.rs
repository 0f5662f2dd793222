//! envd's process service for terminals: what start_pty, send_pty_input and resize_pty send.

use axum::body::Body;
use futures::StreamExt;

use super::support::*;
use crate::*;

#[tokio::test]
async fn pty_calls_send_what_envd_expects() {
    let server = TestServer::start(|request, _| match request.path_and_query.as_str() {
        "/process.Process/Start" => {
            let body = [
                frame(0, r#"{"event":{"start":{"pid":77}}}"#),
                frame(0, r#"{"event":{"data":{"pty":"JCA="}}}"#),
                frame(
                    0,
                    r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}"#,
                ),
                frame(2, "{}"),
            ]
            .concat();
            connect_stream(Body::from(body))
        }
        "/process.Process/SendInput" | "/process.Process/Update"
            if !request.body.starts_with(br#"{"process":{"pid":78}"#) =>
        {
            json(200, &serde_json::json!({}))
        }
        _ => json(
            404,
            &serde_json::json!({"code": "not_found", "message": "process with pid 78 not found"}),
        ),
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    let mut options = PtyOptions::shell(PtySize { cols: 80, rows: 24 });
    options.envs.insert("A".to_owned(), "b".to_owned());
    options.user = Some("root".to_owned());
    let mut stream = sandbox.start_pty(options).await.expect("started");
    assert_eq!(stream.pid(), 77);
    sandbox.send_pty_input(77, b"ls\n").await.expect("typed");
    sandbox
        .resize_pty(
            77,
            PtySize {
                cols: 132,
                rows: 40,
            },
        )
        .await
        .expect("resized");
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.expect("event"));
    }
    assert_eq!(
        events[1],
        ProcessEvent::Pty(bytes::Bytes::from_static(b"$ "))
    );
    assert!(matches!(&events[2], ProcessEvent::End(end) if end.exit_code == -1));

    let requests = server.requests();
    let start = &requests[0];
    assert_eq!(
        start.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(start.header("authorization"), Some("Basic cm9vdDo="));
    assert!(start.header("connect-timeout-ms").is_none(), "no deadline");
    assert_eq!(
        std::str::from_utf8(&start.body[5..]).expect("utf-8"),
        r#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"A":"b","LANG":"C.UTF-8","LC_ALL":"C.UTF-8","TERM":"xterm-256color"}},"pty":{"size":{"cols":80,"rows":24}}}"#
    );
    assert_eq!(requests[1].path_and_query, "/process.Process/SendInput");
    assert_eq!(requests[1].header("content-type"), Some("application/json"));
    assert_eq!(
        std::str::from_utf8(&requests[1].body).expect("utf-8"),
        r#"{"process":{"pid":77},"input":{"pty":"bHMK"}}"#
    );
    assert_eq!(requests[2].path_and_query, "/process.Process/Update");
    assert_eq!(
        std::str::from_utf8(&requests[2].body).expect("utf-8"),
        r#"{"process":{"pid":77},"pty":{"size":{"cols":132,"rows":40}}}"#
    );

    // An unknown pid names the operation and the sandbox; typing is never retried.
    let error = sandbox
        .send_pty_input(78, b"x")
        .await
        .expect_err("no such pid");
    assert!(error.is_not_found(), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("send process input") && text.contains(SANDBOX),
        "{text}"
    );
    assert_eq!(server.requests().len(), 4);
}
