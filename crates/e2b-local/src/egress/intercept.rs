//! Header rules (`network.rules`) applied: a connection the proxy received for a name
//! with rules is terminated here (TLS with a leaf of the state directory's CA, or plain
//! HTTP on port 80), and every request on it is sent on to the destination the sandbox
//! dialled with the rule's headers set, replacing any the client sent. The upstream is
//! verified as that name against the host's roots and `--upstream-ca`.
//!
//! Requests and responses are relayed by hyper, bodies streamed frame by frame with
//! backpressure, so memory stays bounded whatever their size: HTTP/2 or HTTP/1.1
//! (keep-alive, chunked) with the sandbox, as its client chose by ALPN, HTTP/1.1 upstream.
//! Protocol upgrades (WebSocket) are not relayed. Header values are never logged: only
//! names and errors.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpStream;

use super::LivePolicy;
use super::ca::Ca;
use crate::secrets::Secrets;

/// How long a sandbox's TLS handshake with the proxy, or the proxy's with an upstream,
/// may take.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What interception needs: the CA that signs the leaves, the upstream TLS side, and the
/// team's secrets that header values name by placeholder.
pub(crate) struct Interceptor {
    ca: Ca,
    upstream: Arc<rustls::ClientConfig>,
    secrets: Arc<Secrets>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

/// The TLS client side for upstreams: the host's roots plus the PEM files given.
pub(crate) fn upstream_tls(extra: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    // A host without a usable store still verifies against the files given.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    for path in extra {
        let certs: Vec<_> = rustls_pki_types::pem::PemObject::pem_file_iter(path)
            .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("cannot read the upstream CA file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "the upstream CA file {} holds no PEM certificate",
                path.display()
            ));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("the upstream CA file {}: {e}", path.display()))?;
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A byte stream either way (the sandbox's side, an upstream).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Body = BoxBody<Bytes, hyper::Error>;

impl Interceptor {
    pub(crate) fn new(
        ca: Ca,
        upstream: Arc<rustls::ClientConfig>,
        secrets: Arc<Secrets>,
    ) -> Interceptor {
        Interceptor {
            ca,
            upstream,
            secrets,
        }
    }

    /// Serves one connection for `name` to `dest` (443: TLS; else plain HTTP) whose
    /// first bytes, already read, are `prefix`, until either side closes it.
    pub(crate) async fn serve(
        &self,
        stream: TcpStream,
        prefix: Vec<u8>,
        name: String,
        dest: std::net::SocketAddr,
        policy: Arc<LivePolicy>,
    ) {
        let tls = dest.port() != super::rules::HTTP_PORT;
        // Requests and answers are small writes each way: without this, Nagle's algorithm
        // and the peer's delayed ACK hold them back tens of milliseconds.
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let replayed = tokio::io::join(std::io::Cursor::new(prefix).chain(read), write);
        let upstream = Arc::new(Upstream {
            dest,
            name: name.clone(),
            tls: tls.then(|| Arc::clone(&self.upstream)),
            secrets: Arc::clone(&self.secrets),
            sender: tokio::sync::Mutex::new(None),
            failed: std::sync::Mutex::new(None),
        });
        let downstream = async {
            if !tls {
                return Some(Box::new(replayed) as Box<dyn Io>);
            }
            let config = match self.ca.server_config(&name) {
                Ok(config) => config,
                Err(error) => {
                    tracing::warn!(%error, "egress interception: no certificate");
                    return None;
                }
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(replayed)).await {
                Ok(Ok(tls)) => Some(Box::new(tls) as Box<dyn Io>),
                Ok(Err(error)) => {
                    tracing::info!(%name, %error, "egress interception: the sandbox's TLS handshake failed");
                    None
                }
                Err(_) => None,
            }
        };
        // The upstream's handshakes run beside the sandbox's, so a new connection waits for
        // the slower of the two, not for both in turn. The slot stays locked until then, so
        // the first request waits for this connection (or its failure) and opens no other.
        let via = policy.current().egress_proxy().cloned();
        let mut slot = upstream.sender.lock().await;
        let early = async {
            match upstream.connect(via.as_ref()).await {
                Ok(sender) => *slot = Some(sender),
                Err(error) => upstream.early_failure(error),
            }
            drop(slot);
        };
        let serving = async {
            let Some(downstream) = downstream.await else {
                return;
            };
            let upstream = Arc::clone(&upstream);
            let service = hyper::service::service_fn(move |request| {
                let upstream = Arc::clone(&upstream);
                let policy = Arc::clone(&policy);
                async move {
                    Ok::<_, std::convert::Infallible>(upstream.forward(request, &policy).await)
                }
            });
            // HTTP/1.1, or HTTP/2 where the client chose it by ALPN (told by its preface).
            let served =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(downstream), service)
                    .await;
            if let Err(error) = served {
                tracing::debug!(%name, %error, "egress interception: connection ended");
            }
        };
        tokio::join!(early, serving);
    }
}

/// The upstream of one intercepted connection: connected while the sandbox's side is,
/// again at a request after it closed, and kept while both sides keep theirs alive.
struct Upstream {
    dest: std::net::SocketAddr,
    name: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    secrets: Arc<Secrets>,
    sender: tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Incoming>>>,
    /// Why the connection made beside the sandbox's handshake failed, until a request
    /// answers it (a 502 naming it, at once: not a second wait for the same failure).
    failed: std::sync::Mutex<Option<String>>,
}

impl Upstream {
    /// One request: the rule's headers set (by the policy of this moment, so an update
    /// reaches the next request of a kept-alive connection), then sent upstream; an
    /// upstream failure is a 502 to the sandbox.
    async fn forward(
        &self,
        mut request: hyper::Request<Incoming>,
        policy: &LivePolicy,
    ) -> hyper::Response<Body> {
        if request.version() == http::Version::HTTP_2 {
            // Upstream speaks HTTP/1.1: the authority becomes `Host`, the target origin-form.
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
        if let Some(headers) = policy.current().headers_for(&self.name) {
            for (name, value) in headers {
                // Placeholders are resolved at every request, so a secret's update reaches
                // the next one; an unknown secret sends nothing, the placeholder least of all.
                let value = match self.secrets.resolve(value.expose()) {
                    Ok(value) => value,
                    Err(why) => {
                        tracing::info!(name = %self.name, header = %name, %why, "egress interception: a header rule's secret is missing");
                        return bad_gateway(&format!(
                            "e2b-local could not apply the {name} header rule for {}: {why}",
                            self.name
                        ));
                    }
                };
                let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_str(&value),
                ) else {
                    // Checked when the rules were taken; never sent half-applied.
                    return bad_gateway("the rule's header could not be applied");
                };
                request.headers_mut().insert(name, value);
            }
        }
        let via = policy.current().egress_proxy().cloned();
        let mut slot = self.sender.lock().await;
        let reusable = slot.as_ref().is_some_and(|sender| !sender.is_closed());
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(error) = failed.filter(|_| !reusable) {
            return bad_gateway(&format!("e2b-local could not reach {}: {error}", self.name));
        }
        if !reusable {
            match self.connect(via.as_ref()).await {
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
        let Some(sender) = slot.as_mut() else {
            return bad_gateway("no upstream connection");
        };
        if sender.ready().await.is_err() {
            *slot = None;
            return bad_gateway("the upstream connection closed");
        }
        match sender.send_request(request).await {
            Ok(response) => response.map(|body| body.boxed()),
            Err(error) => {
                *slot = None;
                bad_gateway(&format!("the request to {} failed: {error}", self.name))
            }
        }
    }

    fn early_failure(&self, error: String) {
        tracing::info!(name = %self.name, dest = %self.dest, %error, "egress interception: upstream unreachable");
        *self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
    }

    async fn connect(
        &self,
        via: Option<&super::transform::EgressProxy>,
    ) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, String> {
        let connecting = async {
            let tcp = super::socks::connect(self.dest, via)
                .await
                .map_err(|e| e.to_string())?;
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Io> = match &self.tls {
                Some(config) => {
                    let name = rustls_pki_types::ServerName::try_from(self.name.clone())
                        .map_err(|e| e.to_string())?;
                    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
                    Box::new(
                        connector
                            .connect(name, tcp)
                            .await
                            .map_err(|e| e.to_string())?,
                    )
                }
                None => Box::new(tcp),
            };
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(sender)
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| "timed out".to_owned())?
    }
}

fn bad_gateway(why: &str) -> hyper::Response<Body> {
    let mut response = hyper::Response::new(
        Full::new(Bytes::from(format!("{why}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = http::StatusCode::BAD_GATEWAY;
    response
}
