//! envd's directory watches: what watch_dir and the polling watcher calls send and read.

use axum::body::Body;
use futures::StreamExt;

use super::support::*;
use crate::*;

#[tokio::test]
async fn watch_calls_send_what_envd_expects_and_read_its_events() {
    let server = TestServer::start(|request, _| match request.path_and_query.as_str() {
        "/filesystem.Filesystem/WatchDir" => {
            let body = [
                frame(0, r#"{"start":{}}"#),
                frame(0, r#"{"keepalive":{}}"#),
                frame(0, r#"{"filesystem":{"name":"a/b","type":"EVENT_TYPE_CREATE"}}"#),
                frame(0, r#"{"filesystem":{"name":"a/b","type":"EVENT_TYPE_CHMOD"}}"#),
                frame(
                    2,
                    r#"{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"}}"#,
                ),
            ]
            .concat();
            connect_stream(Body::from(body))
        }
        "/filesystem.Filesystem/CreateWatcher" => json(200, &serde_json::json!({"watcherId": "w1"})),
        "/filesystem.Filesystem/GetWatcherEvents" => json(
            200,
            &serde_json::json!({"events": [{"name": "x", "type": "EVENT_TYPE_WRITE"}, {"name": "y", "type": "EVENT_TYPE_NEW_KIND"}]}),
        ),
        _ => json(
            404,
            &serde_json::json!({"code": "not_found", "message": "watcher with id w1 not found"}),
        ),
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    let mut options = WatchOptions::new(WatchDepth::Recursive);
    options.timeout = Some(std::time::Duration::from_secs(5));
    let stream = sandbox
        .watch_dir("/home/user/w", options)
        .await
        .expect("watching");
    let items: Vec<Result<FsEvent, Error>> = stream.collect().await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(
        items[0].as_ref().expect("event"),
        &FsEvent {
            name: "a/b".to_owned(),
            kind: FsEventKind::Create,
            entry: None,
        }
    );
    assert_eq!(items[1].as_ref().expect("event").kind, FsEventKind::Chmod);
    let error = items[2].as_ref().expect_err("the end frame's error");
    assert!(error.is_deadline_exceeded(), "{error:?}");
    assert!(error.to_string().contains("watch directory"), "{error}");

    let id = sandbox
        .create_watcher("dir", WatchDepth::Direct)
        .await
        .expect("created");
    assert_eq!(id.as_str(), "w1");
    let events = sandbox.watcher_events(&id).await.expect("events");
    assert_eq!(
        events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [FsEventKind::Write, FsEventKind::Other]
    );
    let error = sandbox.remove_watcher(&id).await.expect_err("not found");
    assert!(error.is_not_found(), "{error:?}");

    let requests = server.requests();
    assert_eq!(requests[0].header("connect-timeout-ms"), Some("5000"));
    assert_eq!(
        std::str::from_utf8(&requests[0].body[5..]).expect("utf-8"),
        r#"{"path":"/home/user/w","recursive":true}"#
    );
    assert_eq!(
        std::str::from_utf8(&requests[1].body).expect("utf-8"),
        r#"{"path":"dir","recursive":false}"#
    );
    assert_eq!(
        std::str::from_utf8(&requests[2].body).expect("utf-8"),
        r#"{"watcherId":"w1"}"#
    );
}
