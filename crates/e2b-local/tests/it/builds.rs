//! Template builds over the REST API where the SDK conformance tests cannot reach: a build
//! a restart cuts off.

use std::time::{Duration, Instant};

use e2b_local::{Server, ServerConfig};

use crate::support::Api;

fn sandbox_dirs(state_dir: &std::path::Path) -> usize {
    std::fs::read_dir(state_dir.join("sandboxes"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_removes_the_sandbox_of_a_build_it_cut_off() {
    // contract: L22 (a build's sandbox is the server's: never listed, never left behind)
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let requested = api.post("/v3/templates", r#"{"name":"cut-off"}"#).await;
    assert_eq!(requested.status, 202, "{}", requested.text);
    let template_id = requested.json["templateID"].as_str().unwrap().to_owned();
    let build_id = requested.json["buildID"].as_str().unwrap().to_owned();
    let started = api
        .post(
            &format!("/v2/templates/{template_id}/builds/{build_id}"),
            r#"{"fromTemplate":"base","force":false,"steps":[{"type":"RUN","args":["sleep 600"],"force":false}]}"#,
        )
        .await;
    assert_eq!(started.status, 202, "{}", started.text);
    let status_path =
        format!("/templates/{template_id}/builds/{build_id}/status?logsOffset=0&limit=100");
    // The step's log line comes once its sandbox runs it (state that settles: polled).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = api.get(&status_path).await;
        assert_eq!(status.json["status"], "building", "{}", status.text);
        if status.text.contains("[builder 1/1] RUN sleep 600") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the step never started: {}",
            status.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sandbox_dirs(dir.path()), 1, "the build's sandbox");
    let listed = api.get("/v2/sandboxes").await;
    assert_eq!(
        listed.json,
        serde_json::json!([]),
        "never in the team's list"
    );
    server.shutdown().await.unwrap();

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    assert_eq!(sandbox_dirs(dir.path()), 0, "removed at the restart");
    // The cut-off build is gone with the server that ran it, and filed nothing.
    assert_eq!(api.get(&status_path).await.status, 404);
    assert_eq!(api.get("/templates/aliases/cut-off").await.status, 404);
    server.shutdown().await.unwrap();
}
