//! Knobs for reliability tests: the public [`Faults`] handle, and their application to
//! connections ([`FaultyListener`]) and requests ([`apply`]): latency, injected 5xx,
//! dropped connections and streams, sandboxes that vanish or pause.

use std::fmt;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::extract::connect_info::Connected;
use axum::response::Response;
use axum::serve::IncomingStream;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, StatusCode};
use tokio::net::{TcpListener, TcpStream};

use crate::app::App;
use crate::conn::ConnSocket;
use crate::error::Error;
use crate::fault_state::{DropRule, FailRule, HoldRule, Release};
use crate::plane::Plane;

/// A cloneable handle onto the server's knobs; every change applies to the next
/// requests and connections. Also reachable over HTTP under `/_e2b_local/` (see the README).
#[derive(Clone)]
pub struct Faults {
    pub(crate) app: Arc<App>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("state", &self.app.faults)
            .finish()
    }
}

impl Faults {
    /// Delays every request (REST and envd, not the admin routes) by `latency` before
    /// it is handled. `Duration::ZERO` turns the delay off.
    pub fn set_latency(&self, latency: Duration) {
        self.app.faults.set_latency(latency);
    }

    /// Queues a rule failing the next matching requests with an E2B-style error body
    /// `{"code":status,"message":...}` (the rule's message, else `injected fault`): 5xx and
    /// 429 for reliability tests; 401, 403, 404 and 429 with E2B's messages for what a user
    /// sees on a refused key, a missing template or the concurrency limit. Rules are
    /// consulted in order.
    pub fn fail_next(&self, rule: FailRule) {
        if rule.count > 0 {
            self.app.faults.push_fail(rule);
        }
    }

    /// Accepts and immediately closes the next `count` TCP connections, without any response.
    pub fn drop_next_connections(&self, count: u32) {
        self.app.faults.add_connection_drops(count);
    }

    /// Queues a rule cutting the next matching response bodies after some bytes.
    pub fn drop_streams(&self, rule: DropRule) {
        if rule.count > 0 {
            self.app.faults.push_drop(rule);
        }
    }

    /// Makes the next `count` forks (entries of `POST /sandboxes/{id}/fork`, across requests)
    /// fail to start with `status`, each reported in its own entry while the others start:
    /// E2B's independent per-fork results. `count` 0 turns it off.
    pub fn fail_fork_starts(&self, count: u32, status: u16) {
        self.app.faults.set_fork_start_failures(count, status);
    }

    /// Makes the source of each of the next `count` fork requests vanish (as
    /// [`Faults::vanish_sandbox`]) right after its files were captured and before the forks
    /// start: the forks still start from the capture.
    pub fn vanish_next_fork_sources(&self, count: u32) {
        self.app.faults.add_fork_source_vanishes(count);
    }

    /// Holds the request after the next `rule.skip` matching ones: it stays unanswered and
    /// unhandled until [`release_hold`](Self::release_hold) (or [`clear`](Self::clear), which
    /// fails it). One rule at a time; arming replaces an unused one.
    pub fn hold_request(&self, rule: HoldRule) {
        self.app.faults.set_hold(rule);
    }

    /// `METHOD path` of the request being held, if one is.
    pub fn held_request(&self) -> Option<String> {
        self.app.faults.hold_status().1
    }

    /// Disarms the hold rule and lets the held request go on as `release` says.
    pub fn release_hold(&self, release: Release) {
        self.app.faults.release_hold(release);
    }

    /// Removes every queued rule and the latency, and fails a held request; already running
    /// sandboxes are untouched.
    pub fn clear(&self) {
        self.app.faults.clear();
    }

    /// Makes a sandbox disappear as if it had been killed: processes die, files go,
    /// REST answers 404 and envd 502.
    pub fn vanish_sandbox(&self, sandbox_id: &str) -> Result<(), Error> {
        self.app
            .store
            .vanish(sandbox_id)
            .map_err(|reason| Error::Sandbox {
                operation: "vanish sandbox",
                sandbox_id: sandbox_id.to_owned(),
                reason,
            })
    }

    /// Pauses a running sandbox behind its client's back, as another client's pause (or
    /// the lease end of a sandbox that keeps its memory) would: its processes are frozen
    /// and go on when it is resumed.
    pub fn pause_sandbox(&self, sandbox_id: &str) -> Result<(), Error> {
        self.app
            .store
            .force_pause(sandbox_id)
            .map_err(|reason| Error::Sandbox {
                operation: "pause sandbox",
                sandbox_id: sandbox_id.to_owned(),
                reason,
            })
    }
}

/// Applies latency, injected failures and stream cuts to one request.
pub(crate) async fn apply(
    app: &App,
    plane: Plane,
    request: Request,
    next: impl FnOnce(Request) -> std::pin::Pin<Box<dyn Future<Output = Response> + Send>>,
) -> Response {
    let latency = app.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let path = request.uri().path().to_owned();
    if app
        .faults
        .take_hold(plane, request.method().as_str(), &path)
        && app.faults.wait_release().await == Release::Fail
    {
        return injected_failure(&FailRule::new(1, 503));
    }
    if let Some(rule) = app.faults.take_fail(plane, &path) {
        return injected_failure(&rule);
    }
    let drop_rule = app.faults.take_drop(plane, &path);
    let response = next(request).await;
    match drop_rule {
        Some(rule) => cut_body(response, rule.after_bytes),
        None => response,
    }
}

fn injected_failure(rule: &FailRule) -> Response {
    let status = StatusCode::from_u16(rule.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let message = rule.message.as_deref().unwrap_or("injected fault");
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = rule.retry_after_secs {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(retry) = rule.should_retry {
        let value = if retry { "true" } else { "false" };
        headers.insert("should-retry", HeaderValue::from_static(value));
    }
    response
}

/// Wraps a response body so that it errors (and hyper aborts the connection) once
/// `after` bytes went out.
fn cut_body(response: Response, after: u64) -> Response {
    let (mut parts, body) = response.into_parts();
    // A sized body would let the client detect the cut by length only; chunked makes
    // the abort look like a dropped stream.
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let stream = futures::stream::unfold(
        (body.into_data_stream(), after, false),
        |(mut inner, left, cut)| async move {
            if cut {
                // Give hyper a moment to flush what was already sent, so the client
                // sees (close to) exactly `after` bytes before the connection dies.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Some((
                    Err(std::io::Error::other("injected stream drop")),
                    (inner, 0, true),
                ));
            }
            let chunk = match inner.next().await? {
                Ok(chunk) => chunk,
                Err(e) => return Some((Err(std::io::Error::other(e)), (inner, left, true))),
            };
            let len = chunk.len() as u64;
            if len < left {
                Some((
                    Ok::<Bytes, std::io::Error>(chunk),
                    (inner, left - len, false),
                ))
            } else {
                let keep = usize::try_from(left).unwrap_or(usize::MAX);
                Some((Ok(chunk.slice(..keep)), (inner, 0, true)))
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Each request's connection socket, for a stream that must end in a reset.
impl Connected<IncomingStream<'_, FaultyListener>> for ConnSocket {
    fn connect_info(stream: IncomingStream<'_, FaultyListener>) -> ConnSocket {
        ConnSocket::new(stream.io().as_raw_fd())
    }
}

/// The TCP listener used by the server: drops connections on demand.
pub(crate) struct FaultyListener {
    pub(crate) inner: TcpListener,
    pub(crate) faults: Arc<App>,
}

impl axum::serve::Listener for FaultyListener {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    if self.faults.faults.take_connection_drop() {
                        tracing::debug!(%addr, "fault: dropping connection");
                        // Linger 0 turns the close into a reset, so the client sees a
                        // refused/dropped connection rather than a clean EOF.
                        let _ = stream.set_zero_linger();
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    return (stream, addr);
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    // Out of file descriptors and similar: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
