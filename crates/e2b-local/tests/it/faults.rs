//! Fault knobs, from code and over the admin routes.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::{Api, manual_server, new_sandbox};
use e2b_local::{DropRule, FailRule, FaultScope};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn fail_next_answers_with_status_headers_and_scope() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let mut rule = FailRule::new(2, 503);
    rule.scope = FaultScope::Rest;
    rule.retry_after_secs = Some(2);
    rule.should_retry = Some(false);
    server.faults().fail_next(rule);

    // envd requests are outside the rule's scope.
    assert_eq!(
        api.rpc(&sandbox, "process.Process/List", json!({}))
            .await
            .status,
        200
    );
    for _ in 0..2 {
        let reply = api.get("/v2/sandboxes").await;
        assert_eq!(reply.status, 503);
        assert_eq!(
            reply.json,
            json!({"code": 503, "message": "injected fault"})
        );
        assert_eq!(reply.headers["retry-after"], "2");
        assert_eq!(reply.headers["should-retry"], "false");
    }
    assert_eq!(api.get("/v2/sandboxes").await.status, 200, "rule used up");

    // Path prefix.
    let mut rule = FailRule::new(1, 502);
    rule.path_prefix = Some("/sandboxes/".into());
    server.faults().fail_next(rule);
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    assert_eq!(
        api.get(&format!("/sandboxes/{}", sandbox.id)).await.status,
        502
    );
    assert_eq!(
        api.get(&format!("/sandboxes/{}", sandbox.id)).await.status,
        200
    );

    // The same over the admin route, for envd only.
    let set = api
        .post(
            "/_e2b_local/faults/fail",
            r#"{"count":1,"status":504,"scope":"envd"}"#,
        )
        .await;
    assert_eq!(set.status, 204);
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    assert_eq!(
        api.rpc(&sandbox, "process.Process/List", json!({}))
            .await
            .status,
        504
    );
    assert_eq!(
        api.post("/_e2b_local/faults/fail", r#"{"status":42}"#)
            .await
            .status,
        400
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn refusals_a_user_meets_answer_with_e2b_s_own_message() {
    // contract: O5 — what the Hermes tests inject: a refused key, a key without access, a
    // missing template, the concurrency limit, each with E2B's wording, from code and over
    // the admin route.
    let server = manual_server().await;
    let api = Api::new(&server);
    let cases = [
        (
            401,
            "Invalid API key, please visit https://e2b.dev/docs/api-key",
        ),
        (403, "Team does not have access to the template 'x'"),
        (404, "template 'x' not found"),
        (
            429,
            "You have reached the maximum number of concurrent E2B sandboxes (20)",
        ),
    ];
    for (status, message) in cases {
        let mut rule = FailRule::new(1, status);
        rule.scope = FaultScope::Rest;
        rule.message = Some(message.to_owned());
        server.faults().fail_next(rule);
        let reply = api.get("/v2/sandboxes").await;
        assert_eq!(reply.status, status);
        assert_eq!(reply.json, json!({"code": status, "message": message}));

        let body = json!({"status": status, "scope": "rest", "message": message}).to_string();
        assert_eq!(api.post("/_e2b_local/faults/fail", &body).await.status, 204);
        let reply = api.get("/v2/sandboxes").await;
        assert_eq!(reply.status, status);
        assert_eq!(reply.json, json!({"code": status, "message": message}));
        assert_eq!(api.get("/v2/sandboxes").await.status, 200, "rule used up");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropped_connections_then_recovery() {
    let server = manual_server().await;
    server.faults().drop_next_connections(2);
    let url = format!("{}/health", server.url());
    for _ in 0..2 {
        // A fresh client per attempt: each one opens a new connection.
        let error = reqwest::Client::new().get(&url).send().await.unwrap_err();
        assert!(error.is_request() || error.is_connect(), "{error}");
    }
    assert_eq!(reqwest::get(&url).await.unwrap().status().as_u16(), 200);

    let api = Api::new(&server);
    assert_eq!(
        api.post("/_e2b_local/faults/drop-connections", r#"{"count":1}"#)
            .await
            .status,
        204
    );
    assert!(reqwest::Client::new().get(&url).send().await.is_err());
    assert_eq!(reqwest::get(&url).await.unwrap().status().as_u16(), 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn stream_dropped_after_bytes() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    assert_eq!(
        api.upload(&sandbox, "big.bin", &vec![1u8; 1024 * 1024])
            .await
            .status,
        200
    );
    server.faults().drop_streams(DropRule::new(1, 100_000));
    let response = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "big.bin")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let mut received = 0;
    let mut failed = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) => received += chunk.len(),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the body must end in an error, not a clean EOF");
    assert!(received > 0 && received <= 100_000, "{received}");
    // Next download is whole again.
    assert_eq!(api.download(&sandbox, "big.bin").await.1.len(), 1024 * 1024);

    // A process stream cut mid-way, set over the admin route.
    let set = api
        .post("/_e2b_local/faults/drop-stream", r#"{"afterBytes":10}"#)
        .await;
    assert_eq!(set.status, 204);
    let response = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+json")
        .body(support::envelope(
            &json!({"process": {"cmd": "/bin/echo", "args": ["hi"]}}),
        ))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut got = 0;
    let mut cut = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => got += c.len(),
            Err(_) => cut = true,
        }
    }
    assert!(cut);
    assert!(got <= 10, "{got}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn latency_delays_requests_but_not_admin_routes() {
    let server = manual_server().await;
    let api = Api::new(&server);
    server.faults().set_latency(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    // A lower bound only: the delay is a sleep before handling.
    assert!(started.elapsed() >= Duration::from_millis(200));
    server.faults().clear();
    assert_eq!(
        api.post("/_e2b_local/faults/latency", r#"{"ms":0}"#)
            .await
            .status,
        204
    );
    assert_eq!(api.post("/_e2b_local/faults/clear", "").await.status, 204);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn sandboxes_vanish_or_pause_on_demand() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let a = new_sandbox(&api).await;
    let b = new_sandbox(&api).await;

    server.faults().vanish_sandbox(&a.id).unwrap();
    assert_eq!(api.get(&format!("/sandboxes/{}", a.id)).await.status, 404);
    assert_eq!(
        api.rpc(&a, "process.Process/List", json!({})).await.status,
        502
    );
    let error = server.faults().vanish_sandbox(&a.id).unwrap_err();
    assert!(error.is_sandbox_not_found());
    assert!(error.to_string().contains(&a.id));

    assert_eq!(
        api.post(&format!("/_e2b_local/sandboxes/{}/pause", b.id), "")
            .await
            .status,
        204
    );
    assert_eq!(
        api.get(&format!("/sandboxes/{}", b.id)).await.json["state"],
        "paused"
    );
    assert!(
        server
            .faults()
            .pause_sandbox(&b.id)
            .unwrap_err()
            .is_sandbox_not_found()
    );
    assert_eq!(
        api.post(&format!("/_e2b_local/sandboxes/{}/vanish", b.id), "")
            .await
            .status,
        204
    );
    assert_eq!(
        api.post(&format!("/_e2b_local/sandboxes/{}/vanish", b.id), "")
            .await
            .status,
        404
    );
    server.shutdown().await.unwrap();
}

/// A held request waits unhandled until released; released with `fail` it is answered 503,
/// with `continue` it is handled. The crash campaign stops a host between two requests so.
#[tokio::test]
async fn a_held_request_waits_until_released_then_fails_or_goes_on() {
    let server = manual_server().await;
    let api = std::sync::Arc::new(Api::new(&server));
    let sandbox = new_sandbox(&api).await;
    let path = format!("/sandboxes/{}", sandbox.id);
    let set = api
        .post(
            "/_e2b_local/faults/hold",
            &format!(r#"{{"skip":1,"scope":"rest","pathPrefix":"{path}"}}"#),
        )
        .await;
    assert_eq!(set.status, 204, "{:?}", set.json);
    // Outside the prefix, then the one skipped: neither is held.
    assert_eq!(api.get("/v2/sandboxes").await.status, 200);
    assert_eq!(api.get(&path).await.status, 200);
    assert_eq!(server.faults().held_request(), None);

    for (answer, status) in [("fail", 503), ("continue", 200)] {
        let held = {
            let api = std::sync::Arc::clone(&api);
            let path = path.clone();
            tokio::spawn(async move { api.get(&path).await.status })
        };
        let begun = Instant::now();
        while server.faults().held_request().is_none() {
            assert!(begun.elapsed() < Duration::from_secs(30), "never held");
            tokio::task::yield_now().await;
        }
        let shown = api.get("/_e2b_local/faults/hold").await;
        assert_eq!(
            shown.json,
            json!({"armed": false, "held": format!("GET {path}")})
        );
        assert!(!held.is_finished(), "a held request is not answered");
        let released = api
            .post(
                "/_e2b_local/faults/release",
                &format!(r#"{{"answer":"{answer}"}}"#),
            )
            .await;
        assert_eq!(released.status, 204);
        assert_eq!(held.await.expect("the request task"), status, "{answer}");
        assert_eq!(server.faults().held_request(), None);
        // Armed again for the next round: the very next request is held.
        api.post("/_e2b_local/faults/hold", r#"{"skip":0}"#).await;
    }
    // `clear` disarms it.
    api.post("/_e2b_local/faults/clear", "").await;
    assert_eq!(api.get(&path).await.status, 200);
}
