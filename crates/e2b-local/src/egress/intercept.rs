//! Header rules (`network.rules`) applied: a connection the proxy received for a name
//! with rules is terminated here (TLS with a leaf of the state directory's CA, or plain
//! HTTP on port 80), and every request on it is sent on to the destination the sandbox
//! dialled with the rule's headers set, replacing any the client sent. The upstream is
//! verified as that name against the host's roots and `--upstream-ca`.
//!
//! Requests and responses are relayed by hyper, bodies streamed frame by frame with
//! backpressure, so memory stays bounded whatever their size: HTTP/2 or HTTP/1.1
//! (keep-alive, chunked) with the sandbox, as its client chose by ALPN, and with the
//! upstream, as it chose ([`super::upstream`]). An HTTP/1.1 upgrade (WebSocket) is relayed:
//! the request with the rule's headers, the upstream's 101, then bytes both ways. Header
//! values are never logged: only names and errors.

use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

use super::LivePolicy;
use super::ca::Ca;
use super::relay::{HANDSHAKE_TIMEOUT, Io};
use super::upstream::{Upstream, UpstreamTls};
use crate::identity::Placeholders;

/// What interception needs: the CA that signs the leaves, the upstream TLS side, and the
/// team's secrets and the sandbox's workload tokens that header values name by placeholder.
pub(crate) struct Interceptor {
    ca: Ca,
    upstream: UpstreamTls,
    placeholders: Arc<Placeholders>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

/// The TLS client side for upstreams: the host's roots plus the PEM files given; it offers
/// HTTP/2 and HTTP/1.1 by ALPN.
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
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Interceptor {
    pub(crate) fn new(
        ca: Ca,
        upstream: Arc<rustls::ClientConfig>,
        placeholders: Arc<Placeholders>,
    ) -> Interceptor {
        let mut http1 = (*upstream).clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Interceptor {
            ca,
            upstream: UpstreamTls {
                any: upstream,
                http1: Arc::new(http1),
            },
            placeholders,
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
        let upstream = Arc::new(Upstream::new(
            dest,
            name.clone(),
            tls.then(|| self.upstream.clone()),
            Arc::clone(&self.placeholders),
        ));
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
        let via = policy.current().egress_proxy().cloned();
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
            // HTTP/1.1, or HTTP/2 where the client chose it by ALPN (told by its preface);
            // an HTTP/1.1 connection may be upgraded.
            let served =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(downstream), service)
                    .await;
            if let Err(error) = served {
                tracing::debug!(%name, %error, "egress interception: connection ended");
            }
        };
        upstream.beside(via, serving).await;
    }
}
