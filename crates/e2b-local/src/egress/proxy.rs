//! The in-process proxy behind domain rules: a connection to port 80 or 443 that only a
//! domain entry of `allowOut` may allow is connected here instead (by
//! the notifier, `notify`); the proxy reads the name it asks for (HTTP `Host`, TLS SNI from the
//! ClientHello, which it does not terminate), checks it against the sandbox's policy of
//! that moment, and then connects to the original destination and relays both ways, or
//! closes the connection.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::LivePolicy;
use super::intercept::Interceptor;
use super::rules::HTTP_PORT;
use super::sock::{bind, connect, local_addr};

/// The most bytes read while looking for the name (a request head, a ClientHello).
const MAX_PREFIX: usize = 16 * 1024;

/// Connections relayed at once, for all sandboxes.
const MAX_RELAYS: usize = 1024;

/// The pause after a failed accept.
const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The longest host name (RFC 1035); a longer one is never allowed, nor logged whole.
const MAX_NAME: usize = 253;
/// How long a connection may take to say which name it wants.
const NAME_TIMEOUT: Duration = Duration::from_secs(10);
/// A redirected connection the proxy never saw is forgotten after this.
const PENDING_TTL: Duration = Duration::from_secs(60);

struct Pending {
    dest: SocketAddr,
    /// Whether the name must be allowed by a domain entry (else the address was).
    by_name: bool,
    policy: Arc<LivePolicy>,
    since: Instant,
}

/// The proxy: its loopback address and the connections redirected to it, by their source.
pub(crate) struct Proxy {
    addr: SocketAddr,
    pending: Mutex<HashMap<SocketAddr, Pending>>,
    /// e2b-local's own listening address, set once it listens.
    api: std::sync::OnceLock<SocketAddr>,
    interceptor: Interceptor,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Proxy {
    /// Binds the proxy on 127.0.0.1 and serves it on the current runtime until `stop`.
    pub(crate) async fn start(
        interceptor: Interceptor,
    ) -> std::io::Result<(Arc<Proxy>, tokio::task::JoinHandle<()>)> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let proxy = Arc::new(Proxy {
            addr: listener.local_addr()?,
            pending: Mutex::new(HashMap::new()),
            api: std::sync::OnceLock::new(),
            interceptor,
        });
        let serving = Arc::clone(&proxy);
        let relays = Arc::new(tokio::sync::Semaphore::new(MAX_RELAYS));
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    // Out of descriptors (EMFILE) the connection stays queued and accept
                    // fails again at once: pause rather than spin.
                    Err(_) => {
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                        continue;
                    }
                };
                // A sandbox opening connections without end costs a bounded number of
                // descriptors: past the bound a connection is closed unread (refused).
                let Ok(permit) = Arc::clone(&relays).try_acquire_owned() else {
                    drop(serving.forget(peer));
                    continue;
                };
                let proxy = Arc::clone(&serving);
                tokio::spawn(async move {
                    proxy.relay(stream, peer).await;
                    drop(permit);
                });
            }
        });
        Ok((proxy, task))
    }

    /// Records where e2b-local's API listens: a sandbox with rules reaches it only as the
    /// rules allow a host elsewhere (on E2B the API is on the internet), so a sandbox
    /// cannot lift its own rules through it.
    pub(crate) fn set_api_addr(&self, addr: SocketAddr) {
        let _ = self.api.set(addr);
    }

    /// Whether `dest` is e2b-local's own API, by any local address it answers on.
    pub(super) fn is_api(&self, dest: SocketAddr) -> bool {
        self.api.get().is_some_and(|api| {
            let ip = super::rules::unmapped(dest.ip());
            dest.port() == api.port() && (ip == api.ip() || ip.is_loopback() || ip.is_unspecified())
        })
    }

    /// Connects a sandbox socket to the proxy instead of `dest`, remembering `dest` by the
    /// socket's source address; the answer is that connect's.
    pub(super) fn redirect(
        &self,
        socket: &OwnedFd,
        domain: i32,
        dest: SocketAddr,
        by_name: bool,
        policy: &Arc<LivePolicy>,
    ) -> Result<(), i32> {
        let mapped = |addr: SocketAddr| match (domain, addr.ip()) {
            (libc::AF_INET6, IpAddr::V4(v4)) => {
                SocketAddr::new(v4.to_ipv6_mapped().into(), addr.port())
            }
            _ => addr,
        };
        let source = match local_addr(socket).filter(|addr| addr.port() != 0) {
            Some(source) => source,
            None => {
                bind(
                    socket,
                    mapped(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)),
                )?;
                local_addr(socket).ok_or(libc::EADDRNOTAVAIL)?
            }
        };
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.retain(|_, p| p.since.elapsed() < PENDING_TTL);
            pending.insert(
                source,
                Pending {
                    dest,
                    by_name,
                    policy: Arc::clone(policy),
                    since: Instant::now(),
                },
            );
        }
        let result = connect(socket, mapped(self.addr));
        if matches!(result, Err(errno) if errno != libc::EINPROGRESS) {
            self.forget(source);
        }
        result
    }

    fn forget(&self, source: SocketAddr) -> Option<Pending> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&source)
    }

    async fn relay(&self, mut stream: TcpStream, peer: SocketAddr) {
        // Anything that connects without having been redirected (a sandbox dialling the
        // proxy's port itself) learns nothing and reaches nothing.
        let Some(pending) = self.forget(peer) else {
            return;
        };
        let mut prefix = Vec::with_capacity(2048);
        // The name matters on the web ports only, and only to a domain entry or a header
        // rule: anything else (a connection only tunnelled) is relayed unread, so a
        // protocol whose server speaks first is not held up.
        let web = pending.dest.port() == HTTP_PORT || pending.dest.port() == super::rules::TLS_PORT;
        let wanted = web && (pending.by_name || pending.policy.current().has_header_rules());
        let name = if !wanted {
            None
        } else {
            tokio::time::timeout(NAME_TIMEOUT, async {
                let mut chunk = [0u8; 4096];
                loop {
                    let found = if pending.dest.port() == HTTP_PORT {
                        http_host(&prefix)
                    } else {
                        tls_sni(&prefix)
                    };
                    match found {
                        Found::Name(name) => return Some(name),
                        Found::Never => return None,
                        Found::NeedMore if prefix.len() >= MAX_PREFIX => return None,
                        Found::NeedMore => {}
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => prefix.extend_from_slice(&chunk[..n]),
                    }
                }
            })
            .await
            .ok()
            .flatten()
            .filter(|name| name.len() <= MAX_NAME)
        };
        let policy = pending.policy.current();
        let allowed =
            !pending.by_name || name.as_deref().is_some_and(|name| policy.allows_name(name));
        if !allowed {
            tracing::info!(dest = %pending.dest, name = ?name, "egress refused: no domain rule allows this name");
            pending.policy.refused(pending.dest, name.as_deref());
            return;
        }
        if let Some(name) = name.filter(|name| policy.headers_for(name).is_some()) {
            drop(policy);
            self.interceptor
                .serve(stream, prefix, name, pending.dest, pending.policy)
                .await;
            return;
        }
        let via = policy.egress_proxy().cloned();
        drop(policy);
        let mut upstream = match super::socks::connect(pending.dest, via.as_ref()).await {
            Ok(upstream) => upstream,
            Err(error) => {
                tracing::info!(dest = %pending.dest, %error, "egress: the destination is unreachable");
                return;
            }
        };
        if upstream.write_all(&prefix).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
    }
}

/// What the bytes so far say about the name.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Name(String),
    NeedMore,
    /// Not the protocol, or no name in it.
    Never,
}

/// The `Host` of an HTTP/1 request head, without its port.
fn http_host(bytes: &[u8]) -> Found {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Found::NeedMore;
    };
    let Ok(head) = std::str::from_utf8(&bytes[..end]) else {
        return Found::Never;
    };
    for line in head.split("\r\n").skip(1) {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("host") {
            let value = value.trim();
            let host = match value.strip_prefix('[') {
                Some(rest) => rest.split(']').next().unwrap_or_default(),
                None => value.rsplit_once(':').map_or(value, |(host, port)| {
                    if port.bytes().all(|b| b.is_ascii_digit()) {
                        host
                    } else {
                        value
                    }
                }),
            };
            return Found::Name(host.to_owned());
        }
    }
    Found::Never
}

/// The server name of a TLS ClientHello (in one record, as clients send it).
fn tls_sni(bytes: &[u8]) -> Found {
    if bytes.len() < 5 {
        return Found::NeedMore;
    }
    if bytes[0] != 0x16 {
        return Found::Never;
    }
    let record_len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if bytes.len() < 5 + record_len {
        return Found::NeedMore;
    }
    parse_client_hello(&bytes[5..5 + record_len]).map_or(Found::Never, Found::Name)
}

fn parse_client_hello(hello: &[u8]) -> Option<String> {
    let mut at = Reader {
        bytes: hello,
        pos: 0,
    };
    if at.u8()? != 1 {
        return None;
    }
    at.skip(3)?; // handshake length
    at.skip(2 + 32)?; // version, random
    let session = usize::from(at.u8()?);
    at.skip(session)?;
    let suites = usize::from(at.u16()?);
    at.skip(suites)?;
    let compression = usize::from(at.u8()?);
    at.skip(compression)?;
    let extensions_end = at.pos + usize::from(at.u16()?);
    while at.pos + 4 <= extensions_end {
        let kind = at.u16()?;
        let len = usize::from(at.u16()?);
        if kind != 0 {
            at.skip(len)?;
            continue;
        }
        at.skip(2)?; // server name list length
        let name_type = at.u8()?;
        let name_len = usize::from(at.u16()?);
        let name = at.take(name_len)?;
        return (name_type == 0)
            .then(|| String::from_utf8(name.to_vec()).ok())
            .flatten();
    }
    None
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let slice = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(slice)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_headers_are_read_without_port_and_only_from_a_whole_head() {
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.test"),
            Found::NeedMore
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: A.test:8080\r\n\r\n"),
            Found::Name("A.test".to_owned())
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Found::Name("::1".to_owned())
        );
        assert_eq!(http_host(b"GET / HTTP/1.0\r\n\r\n"), Found::Never);
    }

    #[test]
    fn sni_is_read_from_a_client_hello() {
        // A minimal ClientHello: no session, one suite, null compression, SNI only.
        let name = b"api.example.test";
        let mut sni = vec![0, 0];
        let list_len = (3 + name.len()) as u16;
        let ext_len = 2 + list_len;
        sni.extend_from_slice(&ext_len.to_be_bytes());
        sni.extend_from_slice(&list_len.to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        body.extend_from_slice(&sni);
        let mut hello = vec![1, 0, 0, body.len() as u8];
        hello.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&(hello.len() as u16).to_be_bytes());
        record.extend_from_slice(&hello);
        assert_eq!(tls_sni(&record[..10]), Found::NeedMore);
        assert_eq!(tls_sni(&record), Found::Name("api.example.test".to_owned()));
        assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n"), Found::Never);
    }
}
