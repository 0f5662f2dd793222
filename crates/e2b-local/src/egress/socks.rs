//! How the server reaches a destination for a sandbox: directly, or through the sandbox's
//! `egressProxy` (SOCKS5, with RFC 1929 username and password when given).

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::transform::EgressProxy;

/// A TCP connection to `dest`, through `via` when set. The error never holds the password
/// (tokio-socks' errors name the failed step only).
pub(crate) async fn connect(
    dest: SocketAddr,
    via: Option<&EgressProxy>,
) -> std::io::Result<TcpStream> {
    let Some(proxy) = via else {
        return TcpStream::connect(dest).await;
    };
    let address = proxy.address.as_str();
    let stream = match &proxy.username {
        Some(username) => {
            let password = proxy.password.as_ref().map_or("", |p| p.expose());
            tokio_socks::tcp::Socks5Stream::connect_with_password(address, dest, username, password)
                .await
        }
        None => tokio_socks::tcp::Socks5Stream::connect(address, dest).await,
    }
    .map_err(|error| {
        std::io::Error::other(format!("through the SOCKS5 proxy {address}: {error}"))
    })?;
    Ok(stream.into_inner())
}
