//! `GET /sandboxes/{id}/logs` and `GET /v2/sandboxes/{id}/logs`: the events e2b-local saw
//! for a sandbox, filtered by cursor, direction, limit, level and search.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

fn messages(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect()
}

fn millis(server: &e2b_local::Server) -> u128 {
    server
        .clock()
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test]
async fn lifecycle_and_commands_are_logged_and_filtered() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = &sandbox.id;
    server.clock().advance(Duration::from_secs(1));
    let run = api.run(&sandbox, "echo hi; exit 3").await;
    let pid = run.pid;
    server.clock().advance(Duration::from_secs(1));
    let after_command = millis(&server);
    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    let resumed = api
        .post(&format!("/sandboxes/{id}/connect"), r#"{"timeout": 60}"#)
        .await;
    assert_eq!(resumed.status, 201, "{}", resumed.text);

    let all = api.get(&format!("/v2/sandboxes/{id}/logs")).await;
    assert_eq!(
        messages(&all),
        vec![
            "sandbox created".to_owned(),
            format!("process {pid} started"),
            format!("process {pid} exited (exit status 3)"),
            "sandbox paused".to_owned(),
            "sandbox resumed".to_owned(),
        ]
    );
    let entries = all.json["logs"].as_array().unwrap();
    assert_eq!(entries[1]["fields"]["pid"], pid.to_string());
    assert_eq!(
        entries[1]["fields"]["cmd"],
        "/bin/bash -l -c echo hi; exit 3"
    );
    assert_eq!(entries[2]["fields"]["exitCode"], "3");
    assert_eq!(entries[2]["level"], "info");
    assert!(entries[0]["timestamp"].as_str().unwrap().ends_with('Z'));

    // The cursor (ms) starts forward paging; backward pages go newest first.
    let forward = api
        .get(&format!(
            "/v2/sandboxes/{id}/logs?cursor={after_command}&limit=1"
        ))
        .await;
    assert_eq!(messages(&forward), vec!["sandbox paused"]);
    let backward = api
        .get(&format!(
            "/v2/sandboxes/{id}/logs?direction=backward&limit=2"
        ))
        .await;
    assert_eq!(
        messages(&backward),
        vec!["sandbox resumed", "sandbox paused"]
    );
    let search = api
        .get(&format!("/v2/sandboxes/{id}/logs?search=process"))
        .await;
    assert_eq!(messages(&search).len(), 2);
    // Case-sensitive, as E2B's search is.
    let no_match = api
        .get(&format!("/v2/sandboxes/{id}/logs?search=Process"))
        .await;
    assert!(messages(&no_match).is_empty());
    let warn = api
        .get(&format!("/v2/sandboxes/{id}/logs?level=warn"))
        .await;
    assert!(messages(&warn).is_empty(), "{}", warn.text);
    let bad = api
        .get(&format!("/v2/sandboxes/{id}/logs?direction=sideways"))
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text);

    // v1: both shapes, from `start` on.
    let v1 = api
        .get(&format!("/sandboxes/{id}/logs?start={after_command}"))
        .await;
    assert_eq!(v1.status, 200, "{}", v1.text);
    let lines: Vec<&str> = v1.json["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap())
        .collect();
    assert_eq!(lines, vec!["sandbox paused", "sandbox resumed"]);
    assert_eq!(v1.json["logEntries"][0]["message"], "sandbox paused");

    // A killed sandbox keeps its log while the server runs; an unknown one is 404.
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).await.status, 204);
    let killed = api
        .get(&format!(
            "/v2/sandboxes/{id}/logs?direction=backward&limit=1"
        ))
        .await;
    assert_eq!(messages(&killed), vec!["sandbox killed"]);
    for path in [
        "/v2/sandboxes/nosuchsandbox/logs",
        "/sandboxes/nosuchsandbox/logs",
    ] {
        let missing = api.get(path).await;
        assert_eq!(missing.status, 404, "{path}: {}", missing.text);
        assert_eq!(missing.json["code"], 404, "{path}");
    }
    let _: Value = v1.json;
    server.shutdown().await.unwrap();
}
