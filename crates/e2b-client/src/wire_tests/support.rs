//! The test servers and the client and sandbox pointed at them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::http::{HeaderMap, StatusCode};
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::*;

pub(super) const KEY: &str = "e2b_unit_test_key_4f1c2a9b";
pub(super) const TOKEN: &str = "envd-unit-token-77aa";
pub(super) const SANDBOX: &str = "iunit0000000000000001";

/// A request as the test server saw it.
#[derive(Clone, Debug)]
pub(super) struct Recorded {
    pub(super) method: String,
    pub(super) path_and_query: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The client's address: one per connection.
    pub(super) peer: Option<std::net::SocketAddr>,
    /// The host the request was for, when it came in absolute form (through a proxy).
    pub(super) authority: Option<String>,
}

impl Recorded {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub(super) type Handler = Arc<dyn Fn(&Recorded, usize) -> Response + Send + Sync>;

/// An axum server that records every request and answers through `handler(request, index)`.
pub(super) struct TestServer {
    pub(super) url: String,
    pub(super) requests: Arc<Mutex<Vec<Recorded>>>,
}

impl TestServer {
    pub(super) async fn start(
        handler: impl Fn(&Recorded, usize) -> Response + Send + Sync + 'static,
    ) -> TestServer {
        let handler: Handler = Arc::new(handler);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let router = Router::new().fallback(move |request: Request| {
            let handler = handler.clone();
            let seen = seen.clone();
            async move {
                let peer = request
                    .extensions()
                    .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                    .map(|info| info.0);
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
                    authority: parts.uri.authority().map(ToString::to_string),
                    headers: parts.headers,
                    body,
                    peer,
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
            let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
            axum::serve(listener, service).await.expect("serve");
        });
        TestServer { url, requests }
    }

    pub(super) fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("not poisoned").clone()
    }
}

/// A raw TCP server: the first `drops` connections are closed after the request arrives
/// without any answer; later ones get `response` verbatim. Returns the URL and a connection
/// counter.
pub(super) async fn dropping_server(
    drops: usize,
    response: &'static str,
) -> (String, Arc<AtomicUsize>) {
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

pub(super) fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        jitter: Jitter::None,
    }
}

pub(super) fn client_for(url: &str, retry: RetryPolicy, deadline: Duration) -> Client {
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(url.to_owned());
    config.sandbox_url = Some(url.to_owned());
    config.retry = retry;
    config.request_deadline = deadline;
    Client::new(config).expect("valid config")
}

pub(super) fn client(url: &str) -> Client {
    client_for(url, fast_retry(), Duration::from_secs(10))
}

pub(super) fn sandbox_id() -> SandboxId {
    SandboxId::parse(SANDBOX.to_owned()).expect("valid id")
}

pub(super) fn sandbox(client: &Client) -> Sandbox {
    client
        .sandbox(EnvdAccess {
            sandbox_id: sandbox_id(),
            access_token: Some(AccessToken::new(TOKEN.to_owned())),
            domain: None,
            traffic_access_token: None,
        })
        .expect("valid sandbox")
}

pub(super) fn json(status: u16, value: &serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).expect("valid status");
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("valid"));
    response
}

pub(super) fn with_header(mut response: Response, name: &'static str, value: &str) -> Response {
    response
        .headers_mut()
        .insert(name, value.parse().expect("valid header"));
    response
}

pub(super) fn sandbox_json() -> serde_json::Value {
    serde_json::json!({"templateID":"base","alias":"base","sandboxID":SANDBOX,"clientID":"6532622b",
        "envdVersion":"0.6.13","envdAccessToken":TOKEN,"trafficAccessToken":null,"domain":null})
}

pub(super) fn detail_json() -> serde_json::Value {
    serde_json::json!({"templateID":"base","sandboxID":SANDBOX,"clientID":"6532622b",
        "startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","cpuCount":2,
        "memoryMB":512,"diskSizeMB":1024,"metadata":{},"state":"running","envdVersion":"0.6.13"})
}

pub(super) fn frame(flags: u8, payload: &str) -> Bytes {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    out.extend_from_slice(payload.as_bytes());
    Bytes::from(out)
}

pub(super) fn connect_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        "content-type",
        "application/connect+json".parse().expect("valid"),
    );
    response
}

/// A server whose one Connect stream sends the frames fed through the returned sender, as
/// they are fed, and ends when the sender is dropped.
pub(super) async fn fed_stream_server() -> (TestServer, tokio::sync::mpsc::Sender<Bytes>) {
    let (feed, frames) = tokio::sync::mpsc::channel::<Bytes>(4);
    let frames = Arc::new(Mutex::new(Some(frames)));
    let server = TestServer::start(move |_, _| {
        let frames = frames
            .lock()
            .expect("not poisoned")
            .take()
            .expect("one request");
        let body = futures::stream::unfold(frames, |mut frames| async move {
            let next = frames.recv().await?;
            Some((Ok::<Bytes, std::convert::Infallible>(next), frames))
        });
        connect_stream(Body::from_stream(body))
    })
    .await;
    (server, feed)
}
