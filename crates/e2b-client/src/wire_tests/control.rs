//! The control plane: routes, bodies, typed outcomes, paging.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};

use super::support::*;
use crate::*;

#[tokio::test]
async fn create_sends_the_v2_body_and_the_key_only_to_the_control_plane() {
    let server = TestServer::start(|_, _| json(201, &sandbox_json())).await;
    let client = client(&server.url);
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(120));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options.allow_internet_access = Some(false);
    options
        .metadata
        .insert("scope".to_owned(), "a b/c".to_owned());
    options.env_vars.insert("FOO".to_owned(), "1".to_owned());
    let info = client.create(options).await.expect("created");
    assert_eq!(info.sandbox_id, sandbox_id());
    assert_eq!(
        info.envd_access_token.as_ref().map(AccessToken::expose),
        Some(TOKEN)
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path_and_query, "/v2/sandboxes");
    assert_eq!(request.header("x-api-key"), Some(KEY));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert!(request.header("e2b-sandbox-id").is_none());
    // What the official Python SDK 2.63 sends (plus our sorted keys).
    assert_eq!(
        std::str::from_utf8(&request.body).expect("utf-8"),
        r#"{"templateID":"base","timeout":120,"autoPause":true,"autoPauseMemory":false,"allow_internet_access":false,"metadata":{"scope":"a b/c"},"envVars":{"FOO":"1"}}"#
    );
}

#[tokio::test]
async fn control_plane_routes_and_outcomes() {
    let server = TestServer::start(|request, _| {
        match (request.method.as_str(), request.path_and_query.as_str()) {
            ("GET", p) if p.starts_with("/sandboxes/") => json(200, &detail_json()),
            ("POST", p) if p.ends_with("/connect") => json(201, &sandbox_json()),
            ("POST", p) if p.ends_with("/timeout") => Response::builder()
                .status(204)
                .body(Body::empty())
                .expect("response"),
            ("POST", p) if p.ends_with("/pause") => json(
                409,
                &serde_json::json!({"code":409,"message":"Error pausing sandbox - sandbox is already paused"}),
            ),
            ("DELETE", _) => json(
                404,
                &serde_json::json!({"code":404,"message":"Sandbox doesn't exist or you don't have access to it"}),
            ),
            _ => json(500, &serde_json::json!({"code":500,"message":"unexpected"})),
        }
    })
    .await;
    let client = client(&server.url);
    let id = sandbox_id();
    let detail = client.get(&id).await.expect("get");
    assert_eq!(detail.summary.state, SandboxState::Running);
    let connected = client
        .connect(&id, Duration::from_millis(600_500))
        .await
        .expect("connect");
    assert_eq!(connected.state, ConnectState::Resumed);
    client
        .set_timeout(&id, Duration::from_secs(30))
        .await
        .expect("set timeout");
    assert_eq!(
        client.pause(&id).await.expect("pause"),
        PauseOutcome::AlreadyPaused
    );
    assert_eq!(client.kill(&id).await.expect("kill"), KillOutcome::NotFound);

    let requests = server.requests();
    let routes: Vec<(&str, &str)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.path_and_query.as_str()))
        .collect();
    assert_eq!(
        routes,
        [
            ("GET", "/sandboxes/iunit0000000000000001"),
            ("POST", "/v2/sandboxes/iunit0000000000000001/connect"),
            ("POST", "/sandboxes/iunit0000000000000001/timeout"),
            ("POST", "/sandboxes/iunit0000000000000001/pause"),
            ("DELETE", "/sandboxes/iunit0000000000000001"),
        ]
    );
    // Fractions of a second round up: a lease is never silently shortened.
    assert_eq!(&requests[1].body[..], br#"{"timeout":601}"#);
    assert_eq!(&requests[2].body[..], br#"{"timeout":30}"#);
    assert_eq!(&requests[3].body[..], b"{}");
}

#[tokio::test]
async fn a_404_from_get_is_a_typed_sandbox_gone_error() {
    let server = TestServer::start(|_, _| {
        json(
            404,
            &serde_json::json!({"code":404,"message":"Sandbox \"x\" doesn't exist"}),
        )
    })
    .await;
    let error = client(&server.url)
        .get(&sandbox_id())
        .await
        .expect_err("404");
    assert!(error.is_not_found() && error.is_sandbox_gone() && !error.is_transient());
    assert_eq!(error.operation(), Some(Operation::Get));
    assert_eq!(error.sandbox_id(), Some(&sandbox_id()));
    assert_eq!(server.requests().len(), 1, "a 404 is not retried");
}

#[tokio::test]
async fn list_follows_next_token_lazily() {
    let server = TestServer::start(|request, _| {
        let page = |id: &str| {
            let mut item = detail_json();
            item["sandboxID"] = serde_json::json!(id);
            serde_json::json!([item])
        };
        let q = request.path_and_query.as_str();
        if q.contains("nextToken=t%2F2") {
            json(200, &page("ipage3"))
        } else if q.contains("nextToken=t1") {
            with_header(json(200, &page("ipage2")), "x-next-token", "t/2")
        } else {
            with_header(json(200, &page("ipage1")), "x-next-token", "t1")
        }
    })
    .await;
    let client = client(&server.url);
    let mut query = ListQuery::all();
    query
        .metadata
        .insert("scope".to_owned(), "a b/c".to_owned());
    query.limit = Some(1);

    // Only the first page is fetched for the first item.
    let first: Vec<ListedSandbox> = client
        .list(query.clone())
        .take(1)
        .try_collect()
        .await
        .expect("first");
    assert_eq!(first.len(), 1);
    assert_eq!(server.requests().len(), 1);

    let all: Vec<ListedSandbox> = client.list(query).try_collect().await.expect("all pages");
    let ids: Vec<&str> = all.iter().map(|s| s.sandbox_id.as_str()).collect();
    assert_eq!(ids, ["ipage1", "ipage2", "ipage3"]);
    let paths: Vec<String> = server
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(
        paths[1..],
        [
            "/v2/sandboxes?metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=1",
            "/v2/sandboxes?metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=1&nextToken=t1",
            "/v2/sandboxes?metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=1&nextToken=t%2F2",
        ]
    );
}

#[tokio::test]
async fn a_server_repeating_its_page_token_cannot_loop_us() {
    let server = TestServer::start(|_, _| {
        with_header(json(200, &serde_json::json!([])), "x-next-token", "same")
    })
    .await;
    let result: Result<Vec<ListedSandbox>, Error> = client(&server.url)
        .list(ListQuery::all())
        .try_collect()
        .await;
    assert!(matches!(result, Err(Error::Protocol { .. })), "{result:?}");
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn bad_configuration_is_refused() {
    let mut config = Config::new(ApiKey::new(String::new()));
    assert!(matches!(
        Client::new(config.clone()),
        Err(Error::InvalidConfig { .. })
    ));
    config.api_key = ApiKey::new(KEY.to_owned());
    config.api_url = Some("ftp://secret:pw12345678@host".to_owned());
    let error = Client::new(config).expect_err("bad scheme");
    assert!(!error.to_string().contains("pw12345678"), "{error}");
}
