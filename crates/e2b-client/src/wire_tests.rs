//! Tests of the client against small in-process HTTP servers: headers, routes, retries,
//! deadlines, streaming and caps as they happen on a real socket.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::http::{HeaderMap, StatusCode};
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::*;

const KEY: &str = "e2b_unit_test_key_4f1c2a9b";
const TOKEN: &str = "envd-unit-token-77aa";
const SANDBOX: &str = "iunit0000000000000001";

/// A request as the test server saw it.
#[derive(Clone, Debug)]
struct Recorded {
    method: String,
    path_and_query: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

type Handler = Arc<dyn Fn(&Recorded, usize) -> Response + Send + Sync>;

/// An axum server that records every request and answers through `handler(request, index)`.
struct TestServer {
    url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl TestServer {
    async fn start(
        handler: impl Fn(&Recorded, usize) -> Response + Send + Sync + 'static,
    ) -> TestServer {
        let handler: Handler = Arc::new(handler);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let router = Router::new().fallback(move |request: Request| {
            let handler = handler.clone();
            let seen = seen.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX)
                    .await
                    .unwrap_or_default();
                let recorded = Recorded {
                    method: parts.method.to_string(),
                    path_and_query: parts
                        .uri
                        .path_and_query()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    headers: parts.headers,
                    body,
                };
                let index = {
                    let mut all = seen.lock().expect("not poisoned");
                    all.push(recorded.clone());
                    all.len() - 1
                };
                handler(&recorded, index)
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        TestServer { url, requests }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("not poisoned").clone()
    }
}

/// A raw TCP server: the first `drops` connections are closed after the request arrives
/// without any answer; later ones get `response` verbatim. Returns the URL and a connection
/// counter.
async fn dropping_server(drops: usize, response: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let index = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                // Read the request head (and whatever body came with it).
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                if index < drops {
                    // Reset instead of a clean close, like a crashed proxy.
                    let _ = socket.set_zero_linger();
                    drop(socket);
                    return;
                }
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, connections)
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        jitter: Jitter::None,
    }
}

fn client_for(url: &str, retry: RetryPolicy, deadline: Duration) -> Client {
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(url.to_owned());
    config.sandbox_url = Some(url.to_owned());
    config.retry = retry;
    config.request_deadline = deadline;
    Client::new(config).expect("valid config")
}

fn client(url: &str) -> Client {
    client_for(url, fast_retry(), Duration::from_secs(10))
}

fn sandbox_id() -> SandboxId {
    SandboxId::parse(SANDBOX.to_owned()).expect("valid id")
}

fn sandbox(client: &Client) -> Sandbox {
    client
        .sandbox(EnvdAccess {
            sandbox_id: sandbox_id(),
            access_token: Some(AccessToken::new(TOKEN.to_owned())),
            domain: None,
        })
        .expect("valid sandbox")
}

fn json(status: u16, value: &serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).expect("valid status");
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("valid"));
    response
}

fn with_header(mut response: Response, name: &'static str, value: &str) -> Response {
    response
        .headers_mut()
        .insert(name, value.parse().expect("valid header"));
    response
}

fn sandbox_json() -> serde_json::Value {
    serde_json::json!({"templateID":"base","alias":"base","sandboxID":SANDBOX,"clientID":"6532622b",
        "envdVersion":"0.6.13","envdAccessToken":TOKEN,"trafficAccessToken":null,"domain":null})
}

fn detail_json() -> serde_json::Value {
    serde_json::json!({"templateID":"base","sandboxID":SANDBOX,"clientID":"6532622b",
        "startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","cpuCount":2,
        "memoryMB":512,"diskSizeMB":1024,"metadata":{},"state":"running","envdVersion":"0.6.13"})
}

fn frame(flags: u8, payload: &str) -> Bytes {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    out.extend_from_slice(payload.as_bytes());
    Bytes::from(out)
}

fn connect_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        "content-type",
        "application/connect+json".parse().expect("valid"),
    );
    response
}

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
    // e2b-wire 1.3, the 2.63 capture (plus our sorted keys).
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

#[tokio::test]
async fn start_sends_what_envd_expects() {
    let server = TestServer::start(|_, _| {
        let body = [
            frame(0, r#"{"event":{"start":{"pid":1000}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            ),
            frame(2, "{}"),
        ]
        .concat();
        connect_stream(Body::from(body))
    })
    .await;
    let client = client(&server.url);
    let mut options = StartOptions::shell("echo hello".to_owned());
    options.envs.insert("A".to_owned(), "b".to_owned());
    options.cwd = Some("/home/user".to_owned());
    options.user = Some("root".to_owned());
    options.timeout = Some(Duration::from_secs(30));
    let output = sandbox(&client).run(options, 1024).await.expect("ran");
    assert_eq!(output.pid, 1000);
    assert_eq!(output.end.exit_code, 0);

    let request = &server.requests()[0];
    assert_eq!(request.path_and_query, "/process.Process/Start");
    assert_eq!(
        request.header("content-type"),
        Some("application/connect+json")
    );
    assert_eq!(request.header("connect-protocol-version"), Some("1"));
    assert_eq!(request.header("keepalive-ping-interval"), Some("50"));
    assert_eq!(request.header("connect-timeout-ms"), Some("30000"));
    assert_eq!(request.header("authorization"), Some("Basic cm9vdDo="));
    assert_eq!(request.header("e2b-sandbox-id"), Some(SANDBOX));
    assert_eq!(request.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(request.header("x-access-token"), Some(TOKEN));
    assert!(
        request.header("x-api-key").is_none(),
        "the API key stays on the control plane"
    );
    let body = &request.body;
    assert_eq!(body[0], 0);
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(len, body.len() - 5);
    assert_eq!(
        std::str::from_utf8(&body[5..]).expect("utf-8"),
        r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello"],"envs":{"A":"b"},"cwd":"/home/user"},"stdin":false}"#
    );
}

#[tokio::test]
async fn start_sends_an_argv_as_it_is() {
    let server = TestServer::start(|_, _| {
        let body = [
            frame(0, r#"{"event":{"start":{"pid":1001}}}"#),
            frame(
                0,
                r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            ),
            frame(2, "{}"),
        ]
        .concat();
        connect_stream(Body::from(body))
    })
    .await;
    let client = client(&server.url);
    // Shell syntax in an argument is data: it is neither quoted nor split here.
    let options = StartOptions::exec(
        "/bin/bash".to_owned(),
        vec!["-c".to_owned(), "echo 'it''s' \"$HOME\"; exit 3".to_owned()],
    );
    let output = sandbox(&client).run(options, 1024).await.expect("ran");
    assert_eq!(output.pid, 1001);

    let request = &server.requests()[0];
    assert_eq!(request.path_and_query, "/process.Process/Start");
    assert_eq!(request.header("connect-timeout-ms"), None);
    assert_eq!(request.header("authorization"), None);
    let message: serde_json::Value = serde_json::from_slice(&request.body[5..]).expect("json");
    assert_eq!(
        message,
        serde_json::json!({
            "process": {
                "cmd": "/bin/bash",
                "args": ["-c", "echo 'it''s' \"$HOME\"; exit 3"],
                "envs": {},
            },
            "stdin": false,
        })
    );
}

#[tokio::test]
async fn events_are_delivered_while_the_command_still_runs() {
    // contract: O1
    let (feed, frames) = mpsc::channel::<Bytes>(4);
    let frames = Arc::new(Mutex::new(Some(frames)));
    let server = TestServer::start(move |_, _| {
        let frames = frames
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one request");
        let body = futures::stream::unfold(frames, |mut frames| async move {
            let next = frames.recv().await?;
            Some((Ok::<Bytes, Infallible>(next), frames))
        });
        connect_stream(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let guard = Duration::from_secs(10);
    feed.send(frame(0, r#"{"event":{"start":{"pid":42}}}"#))
        .await
        .expect("send");
    let mut events = tokio::time::timeout(
        guard,
        sandbox(&client).start(StartOptions::shell("slow".to_owned())),
    )
    .await
    .expect("not buffered")
    .expect("started");
    assert_eq!(events.pid(), 42);
    assert_eq!(
        events.next().await.expect("an event").expect("ok"),
        ProcessEvent::Start { pid: 42 }
    );
    // The server has not finished: the next event only exists once we send it.
    feed.send(frame(0, r#"{"event":{"data":{"stdout":"b25l"}}}"#))
        .await
        .expect("send");
    let event = tokio::time::timeout(guard, events.next())
        .await
        .expect("not buffered");
    assert_eq!(
        event.expect("an event").expect("ok"),
        ProcessEvent::Stdout(Bytes::from_static(b"one"))
    );
    feed.send(frame(
        0,
        r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#,
    ))
    .await
    .expect("send");
    feed.send(frame(2, "{}")).await.expect("send");
    drop(feed);
    let rest: Vec<ProcessEvent> = events.try_collect().await.expect("clean end");
    assert!(matches!(rest.as_slice(), [ProcessEvent::End(end)] if end.exit_code == -1));
}

#[tokio::test]
async fn a_stream_cut_mid_frame_is_an_error() {
    let (cut, cut_signal) = tokio::sync::oneshot::channel::<()>();
    let cut_signal = Arc::new(Mutex::new(Some(cut_signal)));
    let server = TestServer::start(move |_, _| {
        let cut_signal = cut_signal
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one request");
        let mut wire = frame(0, r#"{"event":{"start":{"pid":1}}}"#).to_vec();
        wire.extend_from_slice(&frame(0, r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#)[..9]);
        // The connection breaks mid-frame once the test has seen the start event.
        let body = futures::stream::iter([Ok(Bytes::from(wire))]).chain(futures::stream::once(
            async move {
                let _ = cut_signal.await;
                Err(std::io::Error::other("cut"))
            },
        ));
        connect_stream(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let mut events = sandbox(&client)
        .start(StartOptions::shell("x".to_owned()))
        .await
        .expect("started");
    assert_eq!(events.pid(), 1);
    assert!(matches!(
        events.next().await,
        Some(Ok(ProcessEvent::Start { pid: 1 }))
    ));
    cut.send(()).expect("server waiting");
    let error = events.next().await.expect("an item").expect_err("cut");
    assert!(
        matches!(
            error,
            Error::Transport {
                stage: TransportStage::Body,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn envd_outcomes_are_typed() {
    let server = TestServer::start(|request, _| {
        let q = request.path_and_query.as_str();
        if q == "/process.Process/SendSignal" {
            json(404, &serde_json::json!({"code":"not_found","message":"process with pid 7 not found"}))
        } else if q == "/filesystem.Filesystem/MakeDir" {
            json(409, &serde_json::json!({"code":"already_exists","message":"exists"}))
        } else if q == "/filesystem.Filesystem/Stat" {
            json(404, &serde_json::json!({"code":"not_found","message":"no such file"}))
        } else {
            json(502, &serde_json::json!({"sandboxId":SANDBOX,"message":"The sandbox was not found","code":502}))
        }
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client);
    assert_eq!(
        sandbox.kill_process(7).await.expect("signal"),
        SignalOutcome::NotFound
    );
    assert!(matches!(
        sandbox.make_dir("/d").await.expect("mkdir"),
        MakeDirOutcome::AlreadyExists
    ));
    let stat = sandbox.stat("/nope").await.expect_err("missing");
    assert!(stat.is_not_found() && !stat.is_sandbox_gone());
    assert_eq!(sandbox.health().await.expect("health"), Health::NotRunning);
    let gone = sandbox.list_processes().await.expect_err("gone");
    assert!(gone.is_sandbox_gone() && !gone.is_transient());
    // 502 "was not found" is not retried: one request each for health and list.
    let tail: Vec<String> = server
        .requests()
        .into_iter()
        .skip(3)
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(tail, ["/health", "/process.Process/List"]);
    assert_eq!(
        &server.requests()[0].body[..],
        br#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#
    );
}

#[tokio::test]
async fn download_is_refused_while_streaming_past_the_cap() {
    // contract: S12
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let server = TestServer::start(move |_, _| {
        let counter = counter.clone();
        // No Content-Length: only counting while reading can stop it.
        let body = futures::stream::iter(0..1000).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<Bytes, Infallible>(Bytes::from(vec![b'x'; 64 * 1024]))
        });
        Response::new(Body::from_stream(body))
    })
    .await;
    let client = client(&server.url);
    let mut download = sandbox(&client)
        .read_file_stream("/home/user/big.bin", 256 * 1024)
        .await
        .expect("headers");
    assert_eq!(download.content_length(), None);
    let mut delivered = 0usize;
    let error = loop {
        match download.next().await.expect("an item") {
            Ok(chunk) => delivered += chunk.len(),
            Err(error) => break error,
        }
    };
    assert!(error.is_limit_exceeded(), "{error:?}");
    assert!(delivered <= 256 * 1024);
    drop(download);
    // The server produced far less than the 64 MiB it would have sent.
    assert!(
        sent.load(Ordering::SeqCst) < 1000,
        "{}",
        sent.load(Ordering::SeqCst)
    );
    let request = &server.requests()[0];
    assert_eq!(
        request.path_and_query,
        "/files?path=%2Fhome%2Fuser%2Fbig.bin"
    );
    assert_eq!(request.header("accept-encoding"), Some("identity"));
}

#[tokio::test]
async fn download_with_a_declared_length_over_the_cap_fails_before_reading() {
    let server = TestServer::start(|_, _| Response::new(Body::from(vec![0u8; 4096]))).await;
    let client = client(&server.url);
    let error = sandbox(&client)
        .read_file_stream("/f", 1024)
        .await
        .expect_err("over the cap");
    assert!(error.is_limit_exceeded());
    assert_eq!(
        sandbox(&client)
            .read_file("/f", 4096)
            .await
            .expect("at the cap")
            .len(),
        4096
    );
}

#[tokio::test]
async fn uploads_use_one_multipart_request_or_octet_streams() {
    // contract: S4
    let server = TestServer::start(|request, _| {
        let count = std::str::from_utf8(&request.body)
            .unwrap_or("")
            .matches("name=\"file\"")
            .count()
            .max(1);
        let items: Vec<serde_json::Value> = (0..count)
            .map(|i| serde_json::json!({"path":format!("/home/user/f{i}"),"name":format!("f{i}"),"type":"file"}))
            .collect();
        json(200, &serde_json::Value::Array(items))
    })
    .await;
    let client = client(&server.url);
    let sandbox = sandbox(&client).with_user("root".to_owned());
    let chunks = futures::stream::iter([
        Ok(Bytes::from_static(b"str")),
        Ok(Bytes::from_static(b"eam")),
    ]);
    let written = sandbox
        .write_files(vec![
            UploadFile::bytes("/home/user/a/b.txt".to_owned(), Bytes::from_static(b"one")),
            UploadFile::stream("rel/c.txt".to_owned(), chunks),
        ])
        .await
        .expect("uploaded");
    assert_eq!(written.len(), 2);
    sandbox
        .write_file("/home/user/a b.txt", Bytes::from_static(b"x"))
        .await
        .expect("octet-stream");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let multipart = &requests[0];
    assert_eq!(multipart.path_and_query, "/files?username=root");
    let content_type = multipart.header("content-type").expect("content type");
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .expect("multipart");
    let body = std::str::from_utf8(&multipart.body).expect("utf-8");
    assert!(body.contains(
        "filename=\"/home/user/a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\none\r\n"
    ));
    assert!(body.contains(
        "filename=\"rel/c.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nstream\r\n"
    ));
    assert!(body.ends_with(&format!("--{boundary}--\r\n")));
    let octet = &requests[1];
    assert_eq!(
        octet.path_and_query,
        "/files?path=%2Fhome%2Fuser%2Fa%20b.txt&username=root"
    );
    assert_eq!(
        octet.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(&octet.body[..], b"x");

    let refused = sandbox
        .write_files(vec![UploadFile::bytes("a\"b".to_owned(), Bytes::new())])
        .await
        .expect_err("bad name");
    assert!(matches!(refused, Error::InvalidInput { .. }));
    assert_eq!(server.requests().len(), 2, "nothing was sent");
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

#[tokio::test]
async fn an_error_before_the_start_event_fails_the_start_call() {
    let server = TestServer::start(|_, _| {
        connect_stream(Body::from(frame(
            2,
            r#"{"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}}"#,
        )))
    })
    .await;
    let client = client(&server.url);
    let mut options = StartOptions::shell("true".to_owned());
    options.cwd = Some("/nope".to_owned());
    let error = sandbox(&client).start(options).await.expect_err("refused");
    assert_eq!(error.code(), Some("invalid_argument"));
    assert_eq!(error.operation(), Some(Operation::StartProcess));
    assert!(
        error.to_string().contains("cwd '/nope' does not exist"),
        "{error}"
    );
}
