//! Snapshots and forks: routes, bodies, paging, typed outcomes, retries and errors.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};

use super::support::*;
use crate::*;

fn snapshot_json(id: &str, names: &[&str]) -> serde_json::Value {
    serde_json::json!({"snapshotID": id, "names": names})
}

#[tokio::test]
async fn create_snapshot_sends_the_name_only_when_given() {
    let server = TestServer::start(|request, _| {
        if request.body.as_ref() == b"{}" {
            json(201, &snapshot_json("tpl0001:default", &[]))
        } else {
            json(
                201,
                &snapshot_json(
                    "team/before-upgrade:default",
                    &["team/before-upgrade:default"],
                ),
            )
        }
    })
    .await;
    let client = client(&server.url);
    let unnamed = client
        .create_snapshot(&sandbox_id(), None)
        .await
        .expect("unnamed");
    assert_eq!(unnamed.snapshot_id, "tpl0001:default");
    assert!(unnamed.names.is_empty());
    let named = client
        .create_snapshot(&sandbox_id(), Some("before-upgrade"))
        .await
        .expect("named");
    assert_eq!(named.snapshot_id, "team/before-upgrade:default");
    assert_eq!(named.names, ["team/before-upgrade:default"]);

    let requests = server.requests();
    let seen: Vec<(&str, &str, &[u8])> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.path_and_query.as_str(), &r.body[..]))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "POST",
                "/sandboxes/iunit0000000000000001/snapshots",
                &b"{}"[..]
            ),
            (
                "POST",
                "/sandboxes/iunit0000000000000001/snapshots",
                &br#"{"name":"before-upgrade"}"#[..]
            ),
        ]
    );
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    assert_eq!(requests[0].header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_snapshot_is_never_sent_twice_after_a_5xx() {
    let server =
        TestServer::start(|_, _| json(503, &serde_json::json!({"code":503,"message":"busy"})))
            .await;
    let error = client(&server.url)
        .create_snapshot(&sandbox_id(), Some("x"))
        .await
        .expect_err("503");
    assert_eq!(error.operation(), Some(Operation::CreateSnapshot));
    assert_eq!(error.sandbox_id(), Some(&sandbox_id()));
    assert_eq!(error.status(), Some(503));
    assert!(error.is_transient());
    assert!(error.to_string().contains("create snapshot"), "{error}");
    assert_eq!(server.requests().len(), 1, "not idempotent: one attempt");
}

#[tokio::test]
async fn a_snapshot_whose_answer_was_lost_is_not_resent() {
    // The first connection is reset before any answer: for a non-idempotent request that is
    // a lost answer, not a refused connection, so it is not retried either.
    let (url, connections) = dropping_server(
        1,
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 38\r\n\r\n{\"snapshotID\":\"a:default\",\"names\":[]}",
    )
    .await;
    let error = client(&url)
        .create_snapshot(&sandbox_id(), None)
        .await
        .expect_err("the answer was lost");
    assert!(matches!(error, Error::Transport { .. }), "{error:?}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn snapshot_of_a_missing_sandbox_is_sandbox_gone_and_names_it() {
    let server = TestServer::start(|_, _| {
        json(
            404,
            &serde_json::json!({"code":404,"message":"Sandbox not found"}),
        )
    })
    .await;
    let error = client(&server.url)
        .create_snapshot(&sandbox_id(), None)
        .await
        .expect_err("404");
    assert!(error.is_not_found() && error.is_sandbox_gone());
    assert!(
        error.to_string().contains(SANDBOX) && !error.to_string().contains(KEY),
        "{error}"
    );
}

#[tokio::test]
async fn invalid_name_answers_are_typed_api_errors_with_e2bs_text() {
    let server = TestServer::start(|_, _| {
        json(
            400,
            &serde_json::json!({"code":400,"message":"invalid name: alias must contain only lowercase letters, numbers, dashes and underscores"}),
        )
    })
    .await;
    let error = client(&server.url)
        .create_snapshot(&sandbox_id(), Some("Bad Name!"))
        .await
        .expect_err("400");
    assert_eq!(error.status(), Some(400));
    assert!(!error.is_transient() && !error.is_sandbox_gone());
    assert!(error.reason().contains("lowercase letters"), "{error}");
}

#[tokio::test]
async fn list_snapshots_sends_the_filters_and_follows_next_token_lazily() {
    let server = TestServer::start(|request, _| {
        let q = request.path_and_query.as_str();
        if q.contains("nextToken=n%2F2") {
            json(200, &serde_json::json!([snapshot_json("c:default", &[])]))
        } else if q.contains("nextToken=n1") {
            with_header(
                json(200, &serde_json::json!([snapshot_json("b:default", &[])])),
                "x-next-token",
                "n/2",
            )
        } else {
            with_header(
                json(
                    200,
                    &serde_json::json!([{"snapshotID":"a:default","names":null}]),
                ),
                "x-next-token",
                "n1",
            )
        }
    })
    .await;
    let client = client(&server.url);
    let mut query = SnapshotQuery::all();
    query.sandbox_id = Some(sandbox_id());
    query.name = Some("team/my snap:v1".to_owned());
    query.limit = Some(1);

    let first: Vec<SnapshotInfo> = client
        .list_snapshots(query.clone())
        .take(1)
        .try_collect()
        .await
        .expect("first");
    assert_eq!(first.len(), 1);
    assert!(first[0].names.is_empty(), "null names read as none");
    assert_eq!(server.requests().len(), 1, "one page for one item");

    let all: Vec<SnapshotInfo> = client
        .list_snapshots(query)
        .try_collect()
        .await
        .expect("all pages");
    let ids: Vec<&str> = all.iter().map(|s| s.snapshot_id.as_str()).collect();
    assert_eq!(ids, ["a:default", "b:default", "c:default"]);
    let paths: Vec<String> = server
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    let base = "/snapshots?sandboxID=iunit0000000000000001&name=team%2Fmy%20snap%3Av1&limit=1";
    assert_eq!(
        paths[1..],
        [
            base.to_owned(),
            format!("{base}&nextToken=n1"),
            format!("{base}&nextToken=n%2F2"),
        ]
    );
}

#[tokio::test]
async fn list_snapshots_all_sends_the_sdks_page_size_and_names_the_operation() {
    let server = TestServer::start(|request, index| {
        if index == 0 {
            assert_eq!(request.path_and_query, "/snapshots?limit=100");
            json(
                401,
                &serde_json::json!({"code":401,"message":"Invalid API key"}),
            )
        } else {
            with_header(json(200, &serde_json::json!([])), "x-next-token", "same")
        }
    })
    .await;
    let client = client(&server.url);
    let error = client
        .list_snapshots(SnapshotQuery::all())
        .try_collect::<Vec<_>>()
        .await
        .expect_err("401");
    assert!(error.is_unauthorized());
    assert_eq!(error.operation(), Some(Operation::ListSnapshots));
    assert_eq!(error.sandbox_id(), None);
    // A server repeating its token cannot loop the stream.
    let repeated = client
        .list_snapshots(SnapshotQuery::all())
        .try_collect::<Vec<_>>()
        .await;
    assert!(
        matches!(repeated, Err(Error::Protocol { .. })),
        "{repeated:?}"
    );
}

#[tokio::test]
async fn delete_snapshot_encodes_the_id_as_one_segment_and_types_404() {
    let server = TestServer::start(|request, _| {
        if request.path_and_query.ends_with("gone%3Adefault") {
            json(
                404,
                &serde_json::json!({"code":404,"message":"template not found"}),
            )
        } else {
            Response::builder()
                .status(204)
                .body(Body::empty())
                .expect("response")
        }
    })
    .await;
    let client = client(&server.url);
    assert_eq!(
        client
            .delete_snapshot("team/my-snap:v1")
            .await
            .expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client
            .delete_snapshot("gone:default")
            .await
            .expect("not found"),
        DeleteOutcome::NotFound
    );
    let error = client.delete_snapshot("").await.expect_err("empty");
    assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
    let requests = server.requests();
    let routes: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.path_and_query.as_str()))
        .collect();
    // Python's quote(id, safe=""), as the official SDK sends it.
    assert_eq!(
        routes,
        [
            ("DELETE", "/templates/team%2Fmy-snap%3Av1"),
            ("DELETE", "/templates/gone%3Adefault"),
        ]
    );
}

#[tokio::test]
async fn delete_snapshot_errors_name_the_operation_and_are_retried_when_transient() {
    let server = TestServer::start(|_, index| {
        if index == 0 {
            json(503, &serde_json::json!({"code":503,"message":"busy"}))
        } else {
            json(500, &serde_json::json!({"code":500,"message":"boom"}))
        }
    })
    .await;
    let error = client(&server.url)
        .delete_snapshot("a:default")
        .await
        .expect_err("500");
    assert_eq!(error.operation(), Some(Operation::DeleteSnapshot));
    assert_eq!(error.status(), Some(500));
    assert_eq!(
        server.requests().len(),
        2,
        "idempotent: the 503 was retried"
    );
}

#[tokio::test]
async fn fork_gives_one_result_per_fork_each_independent() {
    let server = TestServer::start(|_, _| {
        let mut second = sandbox_json();
        second["sandboxID"] = serde_json::json!("ifork2");
        json(
            201,
            &serde_json::json!([
                {"sandbox": sandbox_json()},
                {"error": {"code": 429, "message": "too many sandboxes"}},
                {"sandbox": second},
                {"error": {"code": 404, "message": "snapshot not found"}},
            ]),
        )
    })
    .await;
    let results = client(&server.url)
        .fork(
            &sandbox_id(),
            ForkOptions {
                count: 4,
                timeout: Duration::from_millis(60_001),
            },
        )
        .await
        .expect("fork");
    assert_eq!(results.len(), 4);
    assert_eq!(
        results[0].as_ref().expect("first").sandbox_id.as_str(),
        SANDBOX
    );
    let limited = results[1].as_ref().expect_err("second failed");
    assert!(limited.is_rate_limited(), "{limited:?}");
    assert_eq!(limited.operation(), Some(Operation::StartFork));
    assert_eq!(limited.sandbox_id(), Some(&sandbox_id()));
    assert!(limited.reason().contains("too many sandboxes"), "{limited}");
    assert_eq!(
        results[2].as_ref().expect("third").sandbox_id.as_str(),
        "ifork2"
    );
    // A per-fork 404 is about what that fork needed, not the source sandbox.
    let missing = results[3].as_ref().expect_err("fourth failed");
    assert!(missing.is_not_found() && !missing.is_sandbox_gone());

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].path_and_query,
        "/sandboxes/iunit0000000000000001/fork"
    );
    assert_eq!(&requests[0].body[..], br#"{"timeout":61,"count":4}"#);
}

#[tokio::test]
async fn a_short_fork_answer_still_gives_one_entry_per_fork() {
    let server =
        TestServer::start(|_, _| json(201, &serde_json::json!([{"sandbox": sandbox_json()}, {}])))
            .await;
    let results = client(&server.url)
        .fork(
            &sandbox_id(),
            ForkOptions {
                count: 3,
                timeout: Duration::from_secs(60),
            },
        )
        .await
        .expect("fork");
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok());
    for result in &results[1..] {
        assert!(
            matches!(
                result,
                Err(Error::Protocol {
                    operation: Operation::StartFork,
                    ..
                })
            ),
            "{result:?}"
        );
    }
}

#[tokio::test]
async fn fork_of_a_missing_sandbox_fails_as_a_whole_and_is_not_retried() {
    let server = TestServer::start(|_, _| {
        json(
            404,
            &serde_json::json!({"code":404,"message":"Sandbox not found"}),
        )
    })
    .await;
    let client = client(&server.url);
    let error = client
        .fork(
            &sandbox_id(),
            ForkOptions {
                count: 2,
                timeout: Duration::from_secs(60),
            },
        )
        .await
        .expect_err("404");
    assert!(error.is_sandbox_gone(), "{error:?}");
    assert_eq!(error.operation(), Some(Operation::Fork));
    assert_eq!(error.sandbox_id(), Some(&sandbox_id()));
    assert!(error.to_string().contains("fork sandbox"), "{error}");
    assert_eq!(server.requests().len(), 1);

    for count in [0, 101] {
        let error = client
            .fork(
                &sandbox_id(),
                ForkOptions {
                    count,
                    timeout: Duration::from_secs(60),
                },
            )
            .await
            .expect_err("bad count");
        assert!(matches!(error, Error::InvalidInput { .. }), "{error:?}");
    }
    assert_eq!(server.requests().len(), 1, "a bad count is never sent");
}

#[tokio::test]
async fn a_5xx_on_fork_is_not_retried() {
    let server = TestServer::start(|_, _| {
        json(
            502,
            &serde_json::json!({"code":502,"message":"bad gateway"}),
        )
    })
    .await;
    let error = client(&server.url)
        .fork(
            &sandbox_id(),
            ForkOptions {
                count: 1,
                timeout: Duration::from_secs(60),
            },
        )
        .await
        .expect_err("502");
    assert!(error.is_transient());
    assert_eq!(server.requests().len(), 1, "not idempotent: one attempt");
}

#[tokio::test]
async fn create_from_a_snapshot_sends_its_id_as_the_template() {
    let server = TestServer::start(|_, _| json(201, &sandbox_json())).await;
    client(&server.url)
        .create(CreateOptions::new("team/my-snap:v1".to_owned()))
        .await
        .expect("created");
    let body: serde_json::Value = serde_json::from_slice(&server.requests()[0].body).expect("json");
    assert_eq!(body["templateID"], "team/my-snap:v1");
}
