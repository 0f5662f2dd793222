//! The upstream side of one intercepted connection: a connection made beside the
//! sandbox's handshake and kept while both sides keep theirs alive, HTTP/2 where the
//! upstream chooses it by ALPN and HTTP/1.1 otherwise; and the relay of a protocol upgrade
//! (WebSocket), which needs HTTP/1.1 upstream.
//!
//! Over HTTP/1.1 the requests of a sandbox's connection take turns on the upstream one;
//! over HTTP/2 each is a stream of its own, so an HTTP/2 client's streams run together.
//! An upgrade goes on the upstream connection when it is HTTP/1.1, and on a connection of
//! its own offering HTTP/1.1 alone when it is HTTP/2 (a WebSocket over HTTP/2, RFC 8441,
//! is neither offered to the sandbox nor asked of the upstream).

use std::sync::{Arc, PoisonError};

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::LivePolicy;
use super::relay::{Body, HANDSHAKE_TIMEOUT, Io, bad_gateway};
use super::transform::EgressProxy;
use crate::identity::Placeholders;

/// The TLS client sides for upstreams, both verifying against the same roots.
#[derive(Clone)]
pub(super) struct UpstreamTls {
    /// Offers `h2` and `http/1.1`: the upstream picks.
    pub(super) any: Arc<rustls::ClientConfig>,
    /// Offers `http/1.1` alone, for an upgrade.
    pub(super) http1: Arc<rustls::ClientConfig>,
}

/// What a new upstream connection offers by ALPN.
#[derive(Clone, Copy)]
enum Offer {
    Http2OrHttp1,
    Http1Only,
}

/// An upstream connection, in the protocol the upstream chose.
enum Sender {
    Http1(http1::SendRequest<Incoming>),
    Http2(http2::SendRequest<Incoming>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::Http1(sender) => sender.is_closed(),
            Sender::Http2(sender) => sender.is_closed(),
        }
    }
}

/// The upstream of one intercepted connection: connected while the sandbox's side is,
/// again at a request after it closed, and kept while both sides keep theirs alive.
pub(super) struct Upstream {
    dest: std::net::SocketAddr,
    name: String,
    tls: Option<UpstreamTls>,
    placeholders: Arc<Placeholders>,
    sender: tokio::sync::Mutex<Option<Sender>>,
    /// Why the connection made beside the sandbox's handshake failed, until a request
    /// answers it (a 502 naming it, at once: not a second wait for the same failure).
    failed: std::sync::Mutex<Option<String>>,
    /// The relay of an upgraded connection, which outlives the HTTP exchange that made it.
    tunnel: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Upstream {
    pub(super) fn new(
        dest: std::net::SocketAddr,
        name: String,
        tls: Option<UpstreamTls>,
        placeholders: Arc<Placeholders>,
    ) -> Upstream {
        Upstream {
            dest,
            name,
            tls,
            placeholders,
            sender: tokio::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
            tunnel: std::sync::Mutex::new(None),
        }
    }

    /// Runs `serving` (the sandbox's side) with the upstream connection made beside it,
    /// so a new connection waits for the slower handshake, not for both in turn; then
    /// waits for an upgraded connection's relay, which is the rest of the connection.
    pub(super) async fn beside(&self, via: Option<EgressProxy>, serving: impl Future<Output = ()>) {
        // The slot stays locked until the connection is made, so the first request waits
        // for it (or its failure) and opens no other.
        let mut slot = self.sender.lock().await;
        let early = async {
            match self.connect(via.as_ref(), Offer::Http2OrHttp1).await {
                Ok(sender) => *slot = Some(sender),
                Err(error) => {
                    tracing::info!(name = %self.name, dest = %self.dest, %error, "egress interception: upstream unreachable");
                    *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
                }
            }
            drop(slot);
        };
        tokio::join!(early, serving);
        let tunnel = self
            .tunnel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tunnel) = tunnel {
            let _ = tunnel.await;
        }
    }

    /// One request: the rule's headers set (by the policy of this moment, so an update
    /// reaches the next request of a kept-alive connection), then sent upstream; an
    /// upstream failure is a 502 to the sandbox.
    pub(super) async fn forward(
        &self,
        mut request: hyper::Request<Incoming>,
        policy: &LivePolicy,
    ) -> hyper::Response<Body> {
        if let Err(why) = self.set_headers(&mut request, policy) {
            return bad_gateway(&why);
        }
        decline_h2c(&mut request);
        let via = policy.current().egress_proxy().cloned();
        let mut slot = self.sender.lock().await;
        let reusable = slot.as_ref().is_some_and(|sender| !sender.is_closed());
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(error) = failed.filter(|_| !reusable) {
            return bad_gateway(&format!("e2b-local could not reach {}: {error}", self.name));
        }
        if !reusable {
            match self.connect(via.as_ref(), Offer::Http2OrHttp1).await {
                Ok(sender) => *slot = Some(sender),
                Err(error) => {
                    tracing::info!(name = %self.name, dest = %self.dest, %error, "egress interception: upstream unreachable");
                    return bad_gateway(&format!(
                        "e2b-local could not reach {}: {error}",
                        self.name
                    ));
                }
            }
        }
        match slot.as_mut() {
            None => bad_gateway("no upstream connection"),
            Some(Sender::Http2(sender)) => {
                // Streams share the connection: the slot is not held while one runs.
                let sender = sender.clone();
                drop(slot);
                if asks_upgrade(&request) {
                    return self.upgrade_apart(request, via.as_ref()).await;
                }
                self.send_http2(sender, request).await
            }
            // HTTP/1.1: one request at a time, so the slot is held until the answer's head.
            Some(Sender::Http1(sender)) => match self.send_http1(sender, request).await {
                Ok(response) => response,
                Err(failed) => {
                    *slot = None;
                    failed
                }
            },
        }
    }

    /// Sets the rule's headers on `request`, each value's placeholders resolved now, so a
    /// secret's update reaches the next request; an unknown secret sends nothing, the
    /// placeholder least of all. The error is the text of the 502 to answer.
    fn set_headers(
        &self,
        request: &mut hyper::Request<Incoming>,
        policy: &LivePolicy,
    ) -> Result<(), String> {
        let current = policy.current();
        let Some(headers) = current.headers_for(&self.name) else {
            return Ok(());
        };
        for (name, value) in headers {
            let value = self
                .placeholders
                .resolve(policy.workload(), value.expose())
                .map_err(|why| {
                tracing::info!(name = %self.name, header = %name, %why, "egress interception: a header rule's placeholder cannot be resolved");
                format!(
                    "e2b-local could not apply the {name} header rule for {}: {why}",
                    self.name
                )
            })?;
            let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) else {
                // Checked when the rules were taken; never sent half-applied.
                return Err("the rule's header could not be applied".to_owned());
            };
            request.headers_mut().insert(name, value);
        }
        Ok(())
    }

    /// Sends on an HTTP/1.1 connection; an upgrade the upstream accepts (101) is relayed
    /// both ways once each side has handed its connection over. The error is the 502 of a
    /// connection no longer usable.
    async fn send_http1(
        &self,
        sender: &mut http1::SendRequest<Incoming>,
        mut request: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<Body>, hyper::Response<Body>> {
        let downstream = asks_upgrade(&request).then(|| hyper::upgrade::on(&mut request));
        to_http1(&mut request);
        if sender.ready().await.is_err() {
            return Err(bad_gateway("the upstream connection closed"));
        }
        let mut response = sender.send_request(request).await.map_err(|error| {
            bad_gateway(&format!("the request to {} failed: {error}", self.name))
        })?;
        // A refused upgrade (any other status) is an ordinary answer, passed back as is.
        if let Some(downstream) = downstream
            && response.status() == http::StatusCode::SWITCHING_PROTOCOLS
        {
            self.relay(downstream, hyper::upgrade::on(&mut response));
        }
        Ok(response.map(|body| body.boxed()))
    }

    /// An upgrade while the upstream connection is HTTP/2: on a connection of its own,
    /// which offers HTTP/1.1 alone.
    async fn upgrade_apart(
        &self,
        request: hyper::Request<Incoming>,
        via: Option<&EgressProxy>,
    ) -> hyper::Response<Body> {
        match self.connect(via, Offer::Http1Only).await {
            Ok(Sender::Http1(mut sender)) => self
                .send_http1(&mut sender, request)
                .await
                .unwrap_or_else(|failed| failed),
            // Unreachable: rustls refuses a protocol it did not offer.
            Ok(Sender::Http2(_)) => bad_gateway(&format!(
                "{} answered an HTTP/1.1 upgrade in HTTP/2",
                self.name
            )),
            Err(error) => {
                tracing::info!(name = %self.name, dest = %self.dest, %error, "egress interception: upstream unreachable");
                bad_gateway(&format!("e2b-local could not reach {}: {error}", self.name))
            }
        }
    }

    async fn send_http2(
        &self,
        mut sender: http2::SendRequest<Incoming>,
        mut request: hyper::Request<Incoming>,
    ) -> hyper::Response<Body> {
        self.to_http2(&mut request);
        // A closed connection stays in the slot, where the next request sees it closed and
        // connects again; a failed stream leaves the others be.
        if sender.ready().await.is_err() {
            return bad_gateway("the upstream connection closed");
        }
        match sender.send_request(request).await {
            Ok(response) => response.map(|body| body.boxed()),
            Err(error) => bad_gateway(&format!("the request to {} failed: {error}", self.name)),
        }
    }

    /// Relays the bytes of an upgraded connection both ways until either side closes it.
    fn relay(&self, downstream: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
        let name = self.name.clone();
        let relay = tokio::spawn(async move {
            let (downstream, upstream) = match tokio::try_join!(downstream, upstream) {
                Ok(both) => both,
                Err(error) => {
                    tracing::info!(%name, %error, "egress interception: an accepted upgrade failed");
                    return;
                }
            };
            let (mut downstream, mut upstream) = (TokioIo::new(downstream), TokioIo::new(upstream));
            match tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await {
                Ok((sent, received)) => {
                    tracing::debug!(%name, sent, received, "egress interception: upgraded connection closed");
                }
                Err(error) => {
                    tracing::debug!(%name, %error, "egress interception: upgraded connection ended");
                }
            }
        });
        *self.tunnel.lock().unwrap_or_else(PoisonError::into_inner) = Some(relay);
    }

    /// Shapes a request for HTTP/2 upstream: the authority (the `Host` an HTTP/1.1 client
    /// sent, else the name) goes into the target, and `Host` goes, since HTTP/2 carries
    /// it as `:authority`.
    fn to_http2(&self, request: &mut hyper::Request<Incoming>) {
        let host = request.headers_mut().remove(http::header::HOST);
        if request.uri().authority().is_none() {
            let target = request
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
            let absolute = |authority: &[u8]| {
                http::Uri::builder()
                    .scheme(http::uri::Scheme::HTTPS)
                    .authority(authority)
                    .path_and_query(target.clone())
                    .build()
                    .ok()
            };
            let uri = host
                .as_ref()
                .and_then(|host| absolute(host.as_bytes()))
                .or_else(|| absolute(self.name.as_bytes()));
            if let Some(uri) = uri {
                *request.uri_mut() = uri;
            }
        }
        *request.version_mut() = http::Version::HTTP_2;
    }

    async fn connect(&self, via: Option<&EgressProxy>, offer: Offer) -> Result<Sender, String> {
        let connecting = async {
            let tcp = super::socks::connect(self.dest, via)
                .await
                .map_err(|e| e.to_string())?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &self.tls else {
                return http1_handshake(Box::new(tcp)).await;
            };
            let name = rustls_pki_types::ServerName::try_from(self.name.clone())
                .map_err(|e| e.to_string())?;
            let config = match offer {
                Offer::Http2OrHttp1 => &tls.any,
                Offer::Http1Only => &tls.http1,
            };
            let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                let (sender, connection) =
                    http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                        .await
                        .map_err(|e| e.to_string())?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                return Ok(Sender::Http2(sender));
            }
            http1_handshake(Box::new(stream)).await
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| "timed out".to_owned())?
    }
}

async fn http1_handshake(io: Box<dyn Io>) -> Result<Sender, String> {
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    // With upgrades, so that a 101 hands the connection over instead of closing it.
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    Ok(Sender::Http1(sender))
}

/// The comma-separated tokens of every `name` header.
fn tokens(headers: &http::HeaderMap, name: http::header::HeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty())
        .collect()
}

/// Declines an `h2c` upgrade (HTTP/2 over plain HTTP) by dropping the offer, as a server
/// may: the exchange stays HTTP/1.1, where every request gets the rule's headers; after a
/// relayed switch the next requests would go by untouched.
fn decline_h2c(request: &mut hyper::Request<Incoming>) {
    let headers = request.headers_mut();
    let upgrades = tokens(headers, http::header::UPGRADE);
    if !upgrades
        .iter()
        .any(|token| token.eq_ignore_ascii_case("h2c"))
    {
        return;
    }
    let settings = http::HeaderName::from_static("http2-settings");
    let kept: Vec<String> = tokens(headers, http::header::CONNECTION)
        .into_iter()
        .filter(|token| {
            !token.eq_ignore_ascii_case("upgrade") && !token.eq_ignore_ascii_case(settings.as_str())
        })
        .collect();
    headers.remove(http::header::UPGRADE);
    headers.remove(&settings);
    headers.remove(http::header::CONNECTION);
    if let Ok(connection) = http::HeaderValue::from_str(&kept.join(", "))
        && !kept.is_empty()
    {
        headers.insert(http::header::CONNECTION, connection);
    }
}

/// Whether an HTTP/1.1 request asks to switch protocols (`Connection: upgrade` and an
/// `Upgrade` header); HTTP/2 has no such request.
fn asks_upgrade(request: &hyper::Request<Incoming>) -> bool {
    let headers = request.headers();
    request.version() == http::Version::HTTP_11
        && headers.contains_key(http::header::UPGRADE)
        && tokens(headers, http::header::CONNECTION)
            .iter()
            .any(|token| token.eq_ignore_ascii_case("upgrade"))
}

/// Shapes a request for HTTP/1.1 upstream: an HTTP/2 client's authority becomes `Host`,
/// its target origin-form.
fn to_http1(request: &mut hyper::Request<Incoming>) {
    if request.version() != http::Version::HTTP_2 {
        return;
    }
    if let Some(authority) = request.uri().authority().cloned()
        && !request.headers().contains_key(http::header::HOST)
        && let Ok(host) = http::HeaderValue::from_str(authority.as_str())
    {
        request.headers_mut().insert(http::header::HOST, host);
    }
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str)
        .to_owned();
    if let Ok(uri) = target.parse() {
        *request.uri_mut() = uri;
    }
    *request.version_mut() = http::Version::HTTP_11;
}
