//! Directory watches: `WatchDir` streams and the polling watchers report real filesystem
//! events under envd's names.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Api, FrameStream, Sandbox, envelope, manual_server, new_sandbox};

async fn watch_stream(api: &Api, sandbox: &Sandbox, body: Value) -> FrameStream {
    let response = api
        .envd(
            sandbox,
            reqwest::Method::POST,
            "/filesystem.Filesystem/WatchDir",
        )
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(envelope(&body))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    FrameStream::new(response)
}

/// The next `n` filesystem events of a stream, as (name, type).
async fn events(stream: &mut FrameStream, n: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        let frame = stream.next().await.expect("stream open");
        assert_eq!(frame.flags, 0, "stream ended: {}", frame.json);
        if let Some(event) = frame.json.get("filesystem") {
            out.push((
                event["name"].as_str().unwrap().to_owned(),
                event["type"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(n, t)| ((*n).to_owned(), format!("EVENT_TYPE_{t}")))
        .collect()
}

#[tokio::test]
async fn watch_dir_streams_create_write_chmod_rename_remove_recursively() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    assert_eq!(
        api.run(&sandbox, "mkdir -p ~/w/old").await.end["exited"],
        true
    );
    let mut stream = watch_stream(
        &api,
        &sandbox,
        json!({"path": "/home/user/w", "recursive": true, "includeEntry": true}),
    )
    .await;
    let start = stream.next().await.unwrap();
    assert_eq!(start.json, json!({"start": {}}));

    api.run(
        &sandbox,
        "cd ~/w && echo a > f && chmod 600 f && mv f g && rm g",
    )
    .await;
    assert_eq!(
        events(&mut stream, 6).await,
        pairs(&[
            ("f", "CREATE"),
            ("f", "WRITE"),
            ("f", "CHMOD"),
            ("f", "RENAME"),
            ("g", "CREATE"),
            ("g", "REMOVE"),
        ])
    );
    // Directories present at the start and created later are watched too.
    api.run(&sandbox, "cd ~/w && : > old/x && mkdir new").await;
    assert_eq!(
        events(&mut stream, 2).await,
        pairs(&[("old/x", "CREATE"), ("new", "CREATE")])
    );
    api.run(&sandbox, "cd ~/w && echo deep > new/y").await;
    let frame = loop {
        let frame = stream.next().await.unwrap();
        if frame.json.get("filesystem").is_some() {
            break frame;
        }
    };
    // The entry of what still exists is included when asked.
    assert_eq!(frame.json["filesystem"]["name"], "new/y");
    assert_eq!(frame.json["filesystem"]["type"], "EVENT_TYPE_CREATE");
    assert_eq!(
        frame.json["filesystem"]["entry"]["path"],
        "/home/user/w/new/y"
    );
    assert_eq!(events(&mut stream, 1).await, pairs(&[("new/y", "WRITE")]));

    // Errors come before the start event, in the end-stream frame.
    api.run(&sandbox, "touch ~/file").await;
    for (path, code) in [
        ("/home/user/missing", "not_found"),
        ("/home/user/file", "invalid_argument"),
        ("/etc", "permission_denied"),
    ] {
        let mut refused = watch_stream(&api, &sandbox, json!({"path": path})).await;
        let end = refused.next().await.unwrap();
        assert_eq!(
            (end.flags, end.json["error"]["code"].as_str()),
            (2, Some(code)),
            "{path}"
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn polling_watchers_collect_events_until_removed() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    api.run(&sandbox, "mkdir -p ~/p/sub").await;
    let created = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": "p", "recursive": false}),
        )
        .await;
    assert_eq!(created.status, 200, "{}", created.text);
    let id = created.json["watcherId"].as_str().unwrap().to_owned();

    api.run(&sandbox, "cd ~/p && echo x > top && : > sub/deep && rm top")
        .await;
    // The events arrive asynchronously: fetch until the three of `top` are in (a bounded wait
    // for state, not a timing assumption).
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 && tokio::time::Instant::now() < deadline {
        let got = api
            .rpc(
                &sandbox,
                "filesystem.Filesystem/GetWatcherEvents",
                json!({"watcherId": id}),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text);
        for event in got.json["events"].as_array().unwrap() {
            seen.push((
                event["name"].as_str().unwrap().to_owned(),
                event["type"].as_str().unwrap().to_owned(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Not recursive: `sub/deep` is not reported.
    assert_eq!(
        seen,
        pairs(&[("top", "CREATE"), ("top", "WRITE"), ("top", "REMOVE")])
    );

    let other = new_sandbox(&api).await;
    let foreign = api
        .rpc(
            &other,
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": id}),
        )
        .await;
    assert_eq!(
        foreign.json["code"], "not_found",
        "another sandbox's watcher"
    );
    let removed = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/RemoveWatcher",
            json!({"watcherId": id}),
        )
        .await;
    assert_eq!((removed.status, removed.json), (200, json!({})));
    let gone = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": id}),
        )
        .await;
    assert_eq!(
        gone.json,
        json!({"code": "not_found", "message": format!("watcher with id {id} not found")})
    );

    // contract: L18 — a pause that keeps memory keeps envd's watchers with it, as on E2B;
    // one that keeps the files only ends them (envd boots afresh).
    let again = api
        .rpc(
            &sandbox,
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": "p"}),
        )
        .await;
    let again = again.json["watcherId"].as_str().unwrap().to_owned();
    for (body, kept) in [("{}", true), (r#"{"memory":false}"#, false)] {
        assert_eq!(
            api.post(&format!("/sandboxes/{}/pause", sandbox.id), body)
                .await
                .status,
            204
        );
        assert_eq!(
            api.post(
                &format!("/sandboxes/{}/connect", sandbox.id),
                r#"{"timeout": 300}"#
            )
            .await
            .status,
            201
        );
        let after = api
            .rpc(
                &sandbox,
                "filesystem.Filesystem/GetWatcherEvents",
                json!({"watcherId": again}),
            )
            .await;
        if kept {
            assert_eq!(after.status, 200, "{body}: {}", after.text);
        } else {
            assert_eq!(after.json["code"], "not_found", "{body}: {}", after.text);
        }
    }
    server.shutdown().await.unwrap();
}
