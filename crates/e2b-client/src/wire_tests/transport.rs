//! What every request shares: retries, deadlines, redirects, scrubbed errors, caps on JSON.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use tokio::net::TcpListener;

use super::support::*;
use crate::*;

#[tokio::test]
async fn transient_503_is_retried_until_it_succeeds() {
    let server = TestServer::start(|_, index| {
        if index < 2 {
            json(503, &serde_json::json!({"code":503,"message":"busy"}))
        } else {
            json(200, &detail_json())
        }
    })
    .await;
    let detail = client(&server.url)
        .get(&sandbox_id())
        .await
        .expect("third try");
    assert_eq!(detail.summary.sandbox_id, sandbox_id());
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn should_retry_false_stops_retries_and_true_forces_them() {
    let server = TestServer::start(|_, _| {
        with_header(
            json(503, &serde_json::json!({"code":503,"message":"busy"})),
            "should-retry",
            "false",
        )
    })
    .await;
    let error = client(&server.url)
        .get(&sandbox_id())
        .await
        .expect_err("503");
    assert_eq!(error.status(), Some(503));
    assert_eq!(server.requests().len(), 1);

    let server = TestServer::start(|_, index| {
        if index == 0 {
            with_header(
                json(500, &serde_json::json!({"code":500,"message":"hiccup"})),
                "should-retry",
                "true",
            )
        } else {
            json(200, &detail_json())
        }
    })
    .await;
    client(&server.url)
        .get(&sandbox_id())
        .await
        .expect("second try");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn retries_are_bounded() {
    let server = TestServer::start(|_, _| {
        json(
            502,
            &serde_json::json!({"code":502,"message":"bad gateway"}),
        )
    })
    .await;
    let error = client(&server.url)
        .get(&sandbox_id())
        .await
        .expect_err("502");
    assert!(error.is_transient());
    assert_eq!(server.requests().len(), 4, "1 try + max_retries 3");
}

#[tokio::test]
async fn retry_after_longer_than_the_deadline_gives_up_at_once() {
    let server = TestServer::start(|_, _| {
        with_header(
            json(429, &serde_json::json!({"code":429,"message":"slow down"})),
            "retry-after",
            "5",
        )
    })
    .await;
    let retry = RetryPolicy {
        max_backoff: Duration::from_secs(30),
        ..fast_retry()
    };
    let client = client_for(&server.url, retry, Duration::from_secs(1));
    let error = client.get(&sandbox_id()).await.expect_err("429");
    assert_eq!(error.status(), Some(429));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_dropped_connection_is_retried_for_idempotent_requests() {
    let (url, connections) =
        dropping_server(2, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
    let outcome = client(&url)
        .kill(&sandbox_id())
        .await
        .expect("third connection");
    assert_eq!(outcome, KillOutcome::Killed);
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn start_is_never_retried_once_sent() {
    // A dropped connection after the request went out.
    let (url, connections) =
        dropping_server(1, "HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\n").await;
    let error = sandbox(&client(&url))
        .start(StartOptions::shell("echo once".to_owned()))
        .await
        .expect_err("dropped");
    assert!(
        matches!(
            error,
            Error::Transport {
                stage: TransportStage::Request,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_transient());
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    // A 503 even with Should-Retry: true.
    let server = TestServer::start(|_, _| {
        with_header(
            json(
                503,
                &serde_json::json!({"code":"unavailable","message":"busy"}),
            ),
            "should-retry",
            "true",
        )
    })
    .await;
    let error = sandbox(&client(&server.url))
        .start(StartOptions::shell("echo once".to_owned()))
        .await
        .expect_err("503");
    assert_eq!(error.code(), Some("unavailable"));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_connect_error_without_the_word_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "http://user:hunter2pass@{}",
        listener.local_addr().expect("addr")
    );
    drop(listener);
    let error = client(&url).get(&sandbox_id()).await.expect_err("refused");
    assert!(error.is_connect() && error.is_transient(), "{error:?}");
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("hunter2pass"), "{shown}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(!shown.to_lowercase().contains("timeout"), "{shown}");
}

#[tokio::test]
async fn the_deadline_bounds_a_hanging_server() {
    let server = TestServer::start(|_, _| {
        // Headers never come: the body stream is pending forever.
        Response::new(Body::from_stream(futures::stream::pending::<
            Result<Bytes, Infallible>,
        >()))
    })
    .await;
    let client = client_for(&server.url, fast_retry(), Duration::from_millis(300));
    let error = client.get(&sandbox_id()).await.expect_err("deadline");
    assert!(error.is_deadline_exceeded(), "{error:?}");
    let shown = error.to_string();
    assert!(shown.contains("deadline exceeded"), "{shown}");
    assert!(!shown.to_lowercase().contains("timeout"), "{shown}");
}

#[tokio::test]
async fn a_per_call_deadline_bounds_one_handle_and_leaves_the_others_alone() {
    let server = TestServer::start(|request, _| {
        if request.header("x-hang").is_some() || request.path_and_query == "/process.Process/List" {
            Response::new(Body::from_stream(futures::stream::pending::<
                Result<Bytes, Infallible>,
            >()))
        } else {
            json(200, &detail_json())
        }
    })
    .await;
    // The client's own deadline is long; the handle's is short.
    let client = client_for(&server.url, fast_retry(), Duration::from_secs(30));
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(server.url.clone());
    config.sandbox_url = Some(server.url.clone());
    config
        .api_headers
        .insert("x-hang".to_owned(), "1".to_owned());
    let hanging = Client::new(config).expect("valid config");
    let quick = hanging.with_request_deadline(Duration::from_millis(200));
    let error = quick.get(&sandbox_id()).await.expect_err("deadline");
    assert!(error.is_deadline_exceeded(), "{error:?}");
    assert!(error.to_string().contains("0.200s"), "{error}");
    // The client it came from, and others, keep theirs.
    client.get(&sandbox_id()).await.expect("answered");
    let envd = sandbox(&client).with_request_deadline(Duration::from_millis(200));
    let error = envd.list_processes().await.expect_err("deadline");
    assert!(error.to_string().contains("0.200s"), "{error}");
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let target = TestServer::start(|_, _| json(200, &detail_json())).await;
    let location = format!("{}/stolen", target.url);
    let server = TestServer::start(move |_, _| {
        with_header(
            Response::builder()
                .status(302)
                .body(Body::empty())
                .expect("response"),
            "location",
            &location,
        )
    })
    .await;
    let error = client(&server.url)
        .get(&sandbox_id())
        .await
        .expect_err("302");
    assert_eq!(error.status(), Some(302));
    assert!(
        target.requests().is_empty(),
        "the key never went to the other host"
    );
}

#[tokio::test]
async fn errors_echoing_credentials_are_scrubbed() {
    // contract: X1, X4
    let server = TestServer::start(|request, _| {
        let echo = format!(
            "bad key {} token {} auth {}",
            request.header("x-api-key").unwrap_or("-"),
            request.header("x-access-token").unwrap_or("-"),
            request.header("authorization").unwrap_or("-")
        );
        json(
            401,
            &serde_json::json!({"code":"unauthenticated","message":echo}),
        )
    })
    .await;
    let client = client(&server.url);
    let control = client.get(&sandbox_id()).await.expect_err("401");
    let envd = sandbox(&client)
        .with_user("root".to_owned())
        .stat("/x")
        .await
        .expect_err("401");
    for error in [control, envd] {
        assert!(error.is_unauthorized());
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(KEY), "{shown}");
        assert!(!shown.contains(TOKEN), "{shown}");
        assert!(!shown.contains("cm9vdDo="), "{shown}");
    }
}

#[tokio::test]
async fn hostile_json_is_refused_without_buffering_it_all() {
    let server = TestServer::start(|_, _| {
        let body = futures::stream::iter(0..10_000)
            .map(|_| Ok::<Bytes, Infallible>(Bytes::from(vec![b' '; 64 * 1024])));
        Response::new(Body::from_stream(body))
    })
    .await;
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(server.url.clone());
    config.limits.max_json_bytes = 1 << 20;
    let client = Client::new(config).expect("valid");
    let error = client.get(&sandbox_id()).await.expect_err("too big");
    assert!(error.is_limit_exceeded(), "{error:?}");
}

#[tokio::test]
async fn a_client_sharing_pools_reuses_the_connection_and_sends_its_own_key() {
    // Many scopes of one process cost one pool: the second client's request goes out on the
    // first one's idle connection, with the second client's own key.
    let server = TestServer::start(|_, _| json(200, &detail_json())).await;
    let first = client(&server.url);
    first.get(&sandbox_id()).await.expect("first");
    let mut config = Config::new(ApiKey::new("e2b_second_key_0123456789".to_owned()));
    config.api_url = Some(server.url.clone());
    config.sandbox_url = Some(server.url.clone());
    config.retry = fast_retry();
    config.request_deadline = Duration::from_secs(10);
    let second = first.sharing_pools(config).expect("shares");
    second.get(&sandbox_id()).await.expect("second");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].peer, requests[1].peer,
        "one connection for both clients"
    );
    let key = |index: usize| {
        requests[index].headers["x-api-key"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(key(0), KEY);
    assert_eq!(key(1), "e2b_second_key_0123456789");

    // A different connect timeout gets pools of its own.
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(server.url.clone());
    config.request_deadline = Duration::from_secs(2);
    let apart = first.sharing_pools(config).expect("new pools");
    apart.get(&sandbox_id()).await.expect("third");
    assert_ne!(server.requests()[2].peer, requests[0].peer);
}

#[tokio::test]
async fn a_configured_proxy_carries_every_request_and_api_headers_reach_only_the_control_plane() {
    // The test server plays the proxy: requests reach it in absolute form, naming hosts
    // that do not resolve, so nothing but the proxy could have carried them.
    let server = TestServer::start(|request, _| match request.header("e2b-sandbox-id") {
        Some(_) => Response::new(Body::empty()),
        None => json(201, &sandbox_json()),
    })
    .await;
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some("http://e2b-api.invalid:3000".to_owned());
    config.sandbox_url = Some("http://e2b-envd.invalid:3001".to_owned());
    config.proxy = Some(server.url.clone());
    config
        .api_headers
        .insert("X-Gateway-Auth".to_owned(), "gateway-secret".to_owned());
    let client = Client::new(config).expect("valid config");
    let info = client
        .create(CreateOptions::new("base".to_owned()))
        .await
        .expect("created through the proxy");
    let sandbox = client.sandbox(info.envd_access()).expect("handle");
    assert_eq!(
        sandbox.health().await.expect("asked through the proxy"),
        Health::Running
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(
        requests[0].authority.as_deref(),
        Some("e2b-api.invalid:3000")
    );
    assert_eq!(requests[0].header("x-gateway-auth"), Some("gateway-secret"));
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    assert_eq!(
        requests[1].authority.as_deref(),
        Some("e2b-envd.invalid:3001")
    );
    assert!(requests[1].header("x-gateway-auth").is_none());
    assert!(requests[1].header("x-api-key").is_none());
    let shown = format!(
        "{:?}",
        Config {
            proxy: Some("http://user:pw-secret@proxy.example:8080".to_owned()),
            ..Config::new(ApiKey::new(KEY.to_owned()))
        }
    );
    assert!(!shown.contains("pw-secret"), "{shown}");
}

#[test]
fn api_headers_cannot_replace_the_key_and_a_bad_proxy_is_refused_without_its_text() {
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config
        .api_headers
        .insert("X-API-Key".to_owned(), "other".to_owned());
    let error = Client::new(config).expect_err("refused");
    assert!(error.to_string().contains("api_headers"), "{error}");

    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.proxy = Some("::not a url with pw-secret".to_owned());
    let error = Client::new(config).expect_err("refused");
    assert!(error.to_string().contains("proxy"), "{error}");
    assert!(!error.to_string().contains("pw-secret"), "{error}");
}
