//! What a person meets first: a refused key, a key without access, the concurrency limit, a
//! missing template, an unreachable endpoint, a passed deadline. Each is classified by a
//! predicate (the wording is the caller's) and names its operation once.

use std::time::Duration;

use super::support::*;
use crate::*;

/// A server answering every request with `status` and E2B's error body.
async fn answering(status: u16, message: &'static str) -> TestServer {
    TestServer::start(move |_, _| {
        json(
            status,
            &serde_json::json!({"code": status, "message": message}),
        )
    })
    .await
}

/// One of the error's classifying predicates.
type Predicate = fn(&Error) -> bool;

fn create_options() -> CreateOptions {
    CreateOptions::new("no-such-template".to_owned())
}

#[tokio::test]
async fn refusals_are_classified_and_name_the_operation_once() {
    // contract: O5
    let cases: [(u16, &str, Predicate); 4] = [
        (401, "Invalid API key", Error::is_unauthorized),
        (
            403,
            "Team does not have access to the template",
            Error::is_forbidden,
        ),
        (
            404,
            "template 'no-such-template' not found",
            Error::is_template_missing,
        ),
        (
            429,
            "You have reached the maximum number of concurrent E2B sandboxes",
            Error::is_rate_limited,
        ),
    ];
    for (status, message, predicate) in cases {
        let server = answering(status, message).await;
        let client = client_for(&server.url, RetryPolicy::none(), Duration::from_secs(5));
        let error = client.create(create_options()).await.expect_err("refused");
        assert!(predicate(&error), "{status}: {error:?}");
        let others = [
            Error::is_unauthorized(&error),
            Error::is_forbidden(&error),
            Error::is_template_missing(&error),
            Error::is_rate_limited(&error),
        ];
        assert_eq!(
            others.iter().filter(|hit| **hit).count(),
            1,
            "{status}: one class only"
        );
        let text = error.to_string();
        assert_eq!(text.matches("create sandbox").count(), 1, "{text}");
        assert!(text.contains(message), "{text}");
        assert!(!text.contains(KEY), "{text}");
        // The reason is the text without the operation, for a caller that names it.
        let reason = error.reason();
        assert_eq!(reason, format!("HTTP {status}: {message}"));
    }
}

#[tokio::test]
async fn a_404_elsewhere_is_not_a_missing_template() {
    let server = answering(404, "not found").await;
    let client = client_for(&server.url, RetryPolicy::none(), Duration::from_secs(5));
    let error = client.get(&sandbox_id()).await.expect_err("404");
    assert!(!error.is_template_missing(), "{error:?}");
    assert!(error.is_sandbox_gone(), "{error:?}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_named_and_is_not_tls() {
    // contract: O5, O6
    // A port nothing listens on: bound, then released.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}");
    let client = client_for(&url, RetryPolicy::none(), Duration::from_secs(5));
    let error = client.count_running().await.expect_err("nothing listens");
    assert!(error.is_connect(), "{error:?}");
    assert!(!error.is_tls(), "{error:?}");
    assert_eq!(error.endpoint(), Some(url.as_str()));
    let text = error.to_string();
    assert_eq!(text.matches(&url).count(), 1, "{text}");
    assert_eq!(text.matches("list sandboxes").count(), 1, "{text}");
    assert!(!text.contains(KEY), "{text}");
}

#[tokio::test]
async fn the_endpoint_never_carries_credentials_or_a_path() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let url = format!("http://user:s3cret@127.0.0.1:{port}/base");
    let client = client_for(&url, RetryPolicy::none(), Duration::from_secs(5));
    let error = client.count_running().await.expect_err("nothing listens");
    assert_eq!(
        error.endpoint(),
        Some(format!("http://127.0.0.1:{port}").as_str())
    );
    assert!(!error.to_string().contains("s3cret"), "{error}");
}

#[tokio::test]
async fn count_running_asks_one_running_item_and_reads_the_total() {
    // contract: O6
    let server = TestServer::start(|_, _| {
        with_header(json(200, &serde_json::json!([])), "x-total-running", "7")
    })
    .await;
    let running = client(&server.url).count_running().await.expect("counted");
    assert_eq!(running, Some(7));
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(
        requests[0].path_and_query,
        "/v2/sandboxes?state=running&limit=1"
    );
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));

    let silent = TestServer::start(|_, _| json(200, &serde_json::json!([]))).await;
    assert_eq!(client(&silent.url).count_running().await.expect("ok"), None);
}
