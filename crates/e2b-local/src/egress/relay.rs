//! What the two sides of an intercepted connection share: the sandbox's side
//! (`intercept.rs`) and the upstream's (`upstream.rs`) both move these bodies over these
//! streams, within this handshake time, and answer a dead end the same way.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a sandbox's TLS handshake with the proxy, or the proxy's with an upstream,
/// may take.
pub(super) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A byte stream either way (the sandbox's side, an upstream).
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// A response for the sandbox saying why its request went nowhere.
pub(super) fn bad_gateway(why: &str) -> hyper::Response<Body> {
    let mut response = hyper::Response::new(
        Full::new(Bytes::from(format!("{why}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = http::StatusCode::BAD_GATEWAY;
    response
}
