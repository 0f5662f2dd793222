//! Request accounting: the server counts what clients send, by route.

use crate::support;
use crate::support::{Api, manual_server, new_sandbox};
use e2b_local::{FailRule, FaultScope};
use serde_json::json;

#[tokio::test]
async fn every_request_is_counted_by_route_and_admin_routes_are_not() {
    let server = manual_server().await;
    let api = Api::new(&server);
    assert_eq!(server.requests().total(), 0);

    let sandbox = new_sandbox(&api).await;
    let run = api.run(&sandbox, "echo hi").await;
    assert_eq!(run.stdout, b"hi\n");
    assert_eq!(
        api.upload(&sandbox, "/home/user/a.txt", b"a").await.status,
        200
    );
    let (status, _) = api.download(&sandbox, "/home/user/a.txt").await;
    assert_eq!(status, 200);
    let listed = api.get("/v2/sandboxes").await;
    assert_eq!(listed.status, 200);
    let connect = api
        .post(
            &format!("/sandboxes/{}/connect", sandbox.id),
            r#"{"timeout":60}"#,
        )
        .await;
    assert_eq!(connect.status, 200, "{}", connect.text);
    // The clock route is an admin route: not counted.
    assert_eq!(api.get("/_e2b_local/clock").await.status, 200);

    let counts = server.requests();
    let routes: Vec<(&str, u64)> = counts.routes().collect();
    assert_eq!(
        routes,
        vec![
            ("Process/Start", 1),
            ("connect", 1),
            ("create", 1),
            ("files GET", 1),
            ("files POST", 1),
            ("list", 1),
        ]
    );
    assert_eq!((counts.total(), counts.rest(), counts.envd()), (6, 3, 3));

    // The same over HTTP, for the Python suites; reading it counts nothing.
    let mut reply = api.get("/_e2b_local/requests").await;
    assert_eq!(reply.status, 200);
    let server_micros = reply.json["serverMicros"].take();
    assert!(
        server_micros.as_u64().is_some_and(|m| m > 0),
        "{server_micros}"
    );
    let object = reply.json.as_object_mut().expect("an object");
    object.remove("serverMicros");
    // Whether the last answer's body has been dropped yet is a race; its own test polls.
    object.remove("inFlight");
    // So is whether the started process has ended; a number either way.
    let running = object.remove("runningProcesses");
    assert!(
        running
            .as_ref()
            .and_then(serde_json::Value::as_u64)
            .is_some(),
        "{running:?}"
    );
    assert_eq!(
        reply.json,
        json!({
            "total": 6,
            "rest": 3,
            "envd": 3,
            "routes": {
                "Process/Start": 1, "connect": 1, "create": 1,
                "files GET": 1, "files POST": 1, "list": 1,
            },
        })
    );
    assert_eq!(server.requests(), counts);

    // Snapshots diff; reset starts afresh.
    let before = server.requests();
    api.run(&sandbox, "true").await;
    let step = server.requests().since(&before);
    assert_eq!(
        step.routes().collect::<Vec<_>>(),
        vec![("Process/Start", 1)]
    );
    assert_eq!(api.post("/_e2b_local/requests/reset", "").await.status, 204);
    assert_eq!(server.requests().total(), 0);
    api.get(&format!("/sandboxes/{}", sandbox.id)).await;
    server.reset_requests();
    assert_eq!(server.requests().total(), 0);
}

/// The summed server time of the counted requests, as served to other processes.
async fn server_micros(api: &Api) -> u64 {
    let reply = api.get("/_e2b_local/requests").await;
    reply.json["serverMicros"].as_u64().expect("serverMicros")
}

/// The server time added since `before` once it reaches `at_least` (an answer's time is added
/// when the server drops its body, just after the client read its end), or what it reached
/// within 5 s.
async fn server_micros_since(api: &Api, before: u64, at_least: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let added = server_micros(api).await - before;
        if added >= at_least || tokio::time::Instant::now() >= deadline {
            return added;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn server_time_covers_a_streamed_answer_to_its_end_and_the_injected_latency() {
    // What scripts/bench subtracts from a client's wall time: a process's event stream counts
    // until the process ends, not only until the headers went out.
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let before = server_micros(&api).await;
    api.run(&sandbox, "sleep 0.3").await;
    let streamed = server_micros_since(&api, before, 300_000).await;
    assert!(streamed >= 300_000, "{streamed} µs for a 0.3 s process");
    // Every answer's body has ended, so none is in flight any more.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut in_flight = api.get("/_e2b_local/requests").await.json["inFlight"].clone();
    while in_flight != 0 && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        in_flight = api.get("/_e2b_local/requests").await.json["inFlight"].clone();
    }
    assert_eq!(in_flight, 0);

    server
        .faults()
        .set_latency(std::time::Duration::from_millis(200));
    let before = server_micros(&api).await;
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    let delayed = server_micros_since(&api, before, 200_000).await;
    assert!(
        delayed >= 200_000,
        "{delayed} µs with 200 ms of injected latency"
    );

    // Reset clears it with the counts.
    server.faults().set_latency(std::time::Duration::ZERO);
    assert_eq!(api.post("/_e2b_local/requests/reset", "").await.status, 204);
    assert_eq!(server_micros(&api).await, 0);
}

#[tokio::test]
async fn a_request_failed_by_a_fault_rule_still_counts() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let mut rule = FailRule::new(1, 503);
    rule.scope = FaultScope::Rest;
    server.faults().fail_next(rule);
    assert_eq!(api.get("/v2/sandboxes").await.status, 503);
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    assert_eq!(server.requests().get("list"), 2);
    // A dropped connection carries no request.
    server.faults().drop_next_connections(1);
    let fresh = reqwest::Client::new();
    let dropped = fresh
        .get(format!("{}/v2/sandboxes", server.url()))
        .header("x-api-key", support::KEY)
        .send()
        .await;
    assert!(dropped.is_err());
    assert_eq!(server.requests().get("list"), 2);
}

#[tokio::test]
async fn a_process_whose_client_went_away_counts_as_running_until_it_ends() {
    // What the campaign waits out before its sandbox-side edits: a host killed mid-commit
    // leaves its script running, as envd does.
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let running = |json: &serde_json::Value| json["runningProcesses"].as_u64();
    let stream = api.start(&sandbox, "sleep 1", &[]).await;
    drop(stream);
    let reply = api.get("/_e2b_local/requests").await;
    assert_eq!(running(&reply.json), Some(1), "{}", reply.json);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut now = running(&reply.json);
    while now != Some(0) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        now = running(&api.get("/_e2b_local/requests").await.json);
    }
    assert_eq!(now, Some(0), "the process ended");
}

#[tokio::test]
async fn a_paused_sandboxs_frozen_processes_do_not_count_as_running_until_it_resumes() {
    // contract: L18 — frozen, they run nothing: the campaign's quiet point can be reached
    // while a sandbox holding a killed client's command is paused with its memory.
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let running = |json: &serde_json::Value| json["runningProcesses"].as_u64();
    let stream = api.start(&sandbox, "sleep 600", &[]).await;
    drop(stream);
    assert_eq!(
        running(&api.get("/_e2b_local/requests").await.json),
        Some(1)
    );
    let path = format!("/sandboxes/{}", sandbox.id);
    assert_eq!(api.post(&format!("{path}/pause"), "{}").await.status, 204);
    assert_eq!(
        running(&api.get("/_e2b_local/requests").await.json),
        Some(0)
    );
    assert_eq!(
        api.post(&format!("{path}/resume"), r#"{"timeout":60}"#)
            .await
            .status,
        201
    );
    assert_eq!(
        running(&api.get("/_e2b_local/requests").await.json),
        Some(1),
        "the same process goes on"
    );
}
