//! Header rules over the protocols an intercepted name may speak beyond one HTTP/1.1
//! exchange: a WebSocket (an HTTP/1.1 upgrade) relayed both ways, and HTTP/2 to an
//! upstream that chooses it by ALPN.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use http_body_util::BodyExt as _;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::rules::{Binary, enforces, running_as_root, sh, test_pki};
use crate::support::*;

const SECRET: &str = "Bearer sk-e2b-local-protocols-5c1d";

/// What the upstream saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    conn: usize,
    version: http::Version,
    path: String,
    /// `:authority` in HTTP/2, `Host` in HTTP/1.1.
    authority: String,
    authorization: Vec<String>,
    /// The `Upgrade` header, if any.
    upgrade: Option<String>,
}

/// How the test upstream speaks.
#[derive(Clone, Copy)]
enum Speaks {
    /// HTTP/1.1 (upgrades too), no ALPN.
    Http1,
    /// HTTP/2 alone (ALPN `h2` alone: a client offering only HTTP/1.1 is refused).
    Http2,
    /// HTTP/1.1 (upgrades too), and HTTP/2 where the client offers it by ALPN.
    Both,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type TestBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// A service that records every request. `/echo` with an upgrade is a WebSocket echo (each
/// message sent back, a close answered with a close); `/refuse` is a 403; `/bytes/N`
/// answers N bytes; anything else `ok <path> <version> <request body length>`.
async fn upstream(
    ip: IpAddr,
    port: u16,
    tls: Option<Arc<rustls::ServerConfig>>,
    speaks: Speaks,
) -> Arc<Mutex<Vec<Seen>>> {
    let tls = tls.map(|config| {
        let mut config = (*config).clone();
        config.alpn_protocols = match speaks {
            Speaks::Http1 => Vec::new(),
            Speaks::Http2 => vec![b"h2".to_vec()],
            Speaks::Both => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        Arc::new(config)
    });
    let listener = tokio::net::TcpListener::bind((ip, port))
        .await
        .expect("bind the upstream's loopback address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let conns = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let conn = conns.fetch_add(1, Ordering::SeqCst);
            let record = Arc::clone(&record);
            let tls = tls.clone();
            tokio::spawn(async move {
                let io: Box<dyn Io> = match tls {
                    Some(config) => match tokio_rustls::TlsAcceptor::from(config).accept(tcp).await
                    {
                        Ok(tls) => Box::new(tls),
                        Err(_) => return,
                    },
                    None => Box::new(tcp),
                };
                let io = hyper_util::rt::TokioIo::new(io);
                let service = hyper::service::service_fn(move |request| {
                    let record = Arc::clone(&record);
                    async move {
                        Ok::<_, std::convert::Infallible>(answer(request, conn, &record).await)
                    }
                });
                let executor = hyper_util::rt::TokioExecutor::new();
                let _ = match speaks {
                    Speaks::Http2 => hyper::server::conn::http2::Builder::new(executor)
                        .serve_connection(io, service)
                        .await
                        .map_err(|e| e.to_string()),
                    Speaks::Http1 | Speaks::Both => {
                        hyper_util::server::conn::auto::Builder::new(executor)
                            .serve_connection_with_upgrades(io, service)
                            .await
                            .map_err(|e| e.to_string())
                    }
                };
            });
        }
    });
    seen
}

async fn answer(
    mut request: hyper::Request<hyper::body::Incoming>,
    conn: usize,
    record: &Mutex<Vec<Seen>>,
) -> hyper::Response<TestBody> {
    let path = request.uri().path().to_owned();
    let headers = request.headers();
    let authority = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            headers
                .get(http::header::HOST)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        })
        .unwrap_or_default();
    let authorization = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    record.lock().unwrap().push(Seen {
        conn,
        version: request.version(),
        path: path.clone(),
        authority,
        authorization,
        upgrade: headers
            .get(http::header::UPGRADE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    });
    let text = |status: http::StatusCode, text: String| {
        let mut response =
            hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(text)).boxed());
        *response.status_mut() = status;
        response
    };
    if path == "/refuse" {
        return text(http::StatusCode::FORBIDDEN, "refused\n".to_owned());
    }
    if path == "/echo" {
        let Some(key) = request.headers().get("sec-websocket-key").cloned() else {
            return text(http::StatusCode::BAD_REQUEST, "not an upgrade\n".to_owned());
        };
        let digest = ring::digest::digest(
            &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
            &[key.as_bytes(), b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"].concat(),
        );
        let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let _ = echo(hyper_util::rt::TokioIo::new(upgraded)).await;
            }
        });
        let mut response = text(http::StatusCode::SWITCHING_PROTOCOLS, String::new());
        let headers = response.headers_mut();
        headers.insert(http::header::UPGRADE, "websocket".parse().unwrap());
        headers.insert(http::header::CONNECTION, "Upgrade".parse().unwrap());
        headers.insert("sec-websocket-accept", accept.parse().unwrap());
        return response;
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let total: usize = n.parse().unwrap_or(0);
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let frames = futures::stream::unfold(total, move |left| {
            let chunk = chunk.clone();
            async move {
                (left > 0).then(|| {
                    let n = left.min(chunk.len());
                    let frame = hyper::body::Frame::data(chunk.slice(..n));
                    (Ok::<_, std::convert::Infallible>(frame), left - n)
                })
            }
        });
        return hyper::Response::new(http_body_util::StreamBody::new(frames).boxed());
    }
    let version = request.version();
    let mut body = request.into_body();
    let mut length = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        length += frame.data_ref().map_or(0, bytes::Bytes::len);
    }
    text(
        http::StatusCode::OK,
        format!("ok {path} {version:?} {length}\n"),
    )
}

/// A WebSocket echo (RFC 6455 framing): every frame's payload unmasked and sent back with
/// its opcode; a close is answered with a close, then the connection is shut.
async fn echo(mut io: impl AsyncRead + AsyncWrite + Unpin) -> std::io::Result<()> {
    loop {
        let mut head = [0u8; 2];
        io.read_exact(&mut head).await?;
        let opcode = head[0] & 0x0f;
        let length = match head[1] & 0x7f {
            126 => u64::from(io.read_u16().await?),
            127 => io.read_u64().await?,
            n => u64::from(n),
        };
        let mut mask = [0u8; 4];
        if head[1] & 0x80 != 0 {
            io.read_exact(&mut mask).await?;
        }
        let mut payload = vec![0u8; usize::try_from(length).unwrap()];
        io.read_exact(&mut payload).await?;
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= mask[i % 4];
        }
        let mut frame = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => frame.push(u8::try_from(n).unwrap()),
            n if n < 65536 => {
                frame.push(126);
                frame.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
            }
            n => {
                frame.push(127);
                frame.extend_from_slice(&u64::try_from(n).unwrap().to_be_bytes());
            }
        }
        frame.extend_from_slice(&payload);
        io.write_all(&frame).await?;
        if opcode == 8 {
            return io.shutdown().await;
        }
    }
}

/// A WebSocket client by hand (Python's standard library has none): the handshake (with a
/// client-sent `Authorization` the rule must replace), the accept checked, two messages
/// (one past 64 KiB) echoed, then a close and the end of the connection.
const WS_CLIENT: &str = r#"
import base64, hashlib, os, socket, ssl, sys

scheme, host, path = sys.argv[1:4]
sock = socket.create_connection((host, 443 if scheme == "wss" else 80), timeout=60)
if scheme == "wss":
    sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
              "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer client-sent\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = sock.recv(65536)
    if not chunk:
        sys.exit("no answer")
    buf += chunk
head, buf = buf.split(b"\r\n\r\n", 1)
lines = head.decode().split("\r\n")
print(lines[0])
if not lines[0].startswith("HTTP/1.1 101 "):
    sys.exit(0)
fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
accept = base64.b64encode(hashlib.sha1((key + guid).encode()).digest()).decode()
print("accept", fields.get("sec-websocket-accept") == accept)

def take(n):
    global buf
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit("closed early")
        buf += chunk
    out, buf = buf[:n], buf[n:]
    return out

def send(opcode, payload):
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        length = bytes([0x80 | n])
    elif n < 65536:
        length = bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        length = bytes([0x80 | 127]) + n.to_bytes(8, "big")
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x80 | opcode]) + length + mask + masked)

def receive():
    first, second = take(2)
    n = second & 0x7F
    if n == 126:
        n = int.from_bytes(take(2), "big")
    elif n == 127:
        n = int.from_bytes(take(8), "big")
    return first & 0x0F, take(n)

for message in (b"hello through the proxy", os.urandom(200000)):
    send(2, message)
    opcode, echoed = receive()
    print("echo", opcode, len(echoed), echoed == message)
send(8, b"")
print("close", receive()[0])
print("end", sock.recv(1) == b"")
"#;

const ECHOED: &str = "HTTP/1.1 101 Switching Protocols\naccept True\necho 2 23 True\necho 2 200000 True\nclose 8\nend True\n";

fn take(seen: &Mutex<Vec<Seen>>) -> Vec<Seen> {
    std::mem::take(&mut *seen.lock().unwrap())
}

/// A sandbox whose rules set `Authorization` for each of `names`.
async fn sandbox_with_rules_for(api: &Api, names: &[&str]) -> Sandbox {
    let rules: serde_json::Map<_, _> = names
        .iter()
        .map(|name| {
            let rule = json!([{"transform": {"headers": {"Authorization": SECRET}}}]);
            ((*name).to_owned(), rule)
        })
        .collect();
    let body = json!({"templateID": "base", "timeout": 300, "network": {"rules": rules}});
    let reply = api.post("/v2/sandboxes", &body.to_string()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Sandbox {
        id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    }
}

#[tokio::test]
async fn websocket_upgrades_through_a_named_host_get_the_rule_headers_and_relay_both_ways() {
    // contract: X13
    if !running_as_root() {
        // Rules need the mount namespace and the filter: elsewhere they are refused (X12).
        return;
    }
    // ws.example.test's upstream speaks HTTP/1.1 alone (no ALPN); api.example.test's
    // offers HTTP/2 too, so its upgrade goes on a connection of its own.
    let h1_ip: IpAddr = "127.61.0.11".parse().unwrap();
    let both_ip: IpAddr = "127.61.0.12".parse().unwrap();
    let pki = test_pki(&["ws.example.test", "api.example.test"]);
    let h1_seen = upstream(h1_ip, 443, Some(Arc::clone(&pki.server)), Speaks::Http1).await;
    let both_seen = upstream(both_ip, 443, Some(Arc::clone(&pki.server)), Speaks::Both).await;
    let plain_seen = upstream(h1_ip, 80, None, Speaks::Http1).await;
    let server = Binary::start(
        &pki.ca_pem,
        &[("ws.example.test", h1_ip), ("api.example.test", both_ip)],
    );
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let sandbox = sandbox_with_rules_for(api, &["ws.example.test", "api.example.test"]).await;
    api.upload(&sandbox, "/home/user/ws.py", WS_CLIENT.as_bytes())
        .await;
    let ws = |args: &str| format!("/usr/bin/python3 /home/user/ws.py {args} 2>&1");

    for (args, seen) in [
        ("wss ws.example.test /echo", &h1_seen),
        ("ws ws.example.test /echo", &plain_seen),
        ("wss api.example.test /echo", &both_seen),
    ] {
        let out = sh(api, &sandbox, &ws(args)).await;
        assert_eq!(out, ECHOED, "{args}");
        let seen = take(seen);
        assert_eq!(seen.len(), 1, "{args}: {seen:?}");
        assert_eq!(seen[0].version, http::Version::HTTP_11, "{args}");
        assert_eq!(seen[0].path, "/echo", "{args}");
        assert_eq!(
            seen[0].authorization,
            [SECRET],
            "{args}: the rule's, not the client's"
        );
        assert_eq!(seen[0].upgrade.as_deref(), Some("websocket"), "{args}");
    }

    // An h2c upgrade (curl offers it on plain HTTP) is declined: after a switch, the next
    // requests would go by without the rule's headers.
    let out = sh(
        api,
        &sandbox,
        "curl -sS --http2 http://ws.example.test/h2c http://ws.example.test/h2c-again",
    )
    .await;
    assert_eq!(out, "ok /h2c HTTP/1.1 0\nok /h2c-again HTTP/1.1 0\n");
    let requests = take(&plain_seen);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in requests {
        assert_eq!(request.upgrade, None, "{}", request.path);
        assert_eq!(request.authorization, [SECRET], "{}", request.path);
    }

    // A refused upgrade is the upstream's answer, passed back as is.
    let out = sh(api, &sandbox, &ws("wss ws.example.test /refuse")).await;
    assert_eq!(out, "HTTP/1.1 403 Forbidden\n");
    assert_eq!(take(&h1_seen)[0].authorization, [SECRET]);

    // Header values reach neither the log nor the sandbox's answers.
    let log = server.log_text();
    assert!(!log.contains("sk-e2b-local-protocols"), "{log}");
}

#[tokio::test]
async fn an_upstream_that_speaks_http2_alone_gets_http2_with_the_rule_headers() {
    // contract: X13
    if !running_as_root() {
        return;
    }
    let ip: IpAddr = "127.61.0.13".parse().unwrap();
    let pki = test_pki(&["api.example.test"]);
    let seen = upstream(ip, 443, Some(Arc::clone(&pki.server)), Speaks::Http2).await;
    let server = Binary::start(&pki.ca_pem, &[("api.example.test", ip)]);
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let sandbox = sandbox_with_rules_for(api, &["api.example.test"]).await;

    // An HTTP/1.1 client: its requests go on as HTTP/2, `Host` as `:authority`.
    let out = sh(
        api,
        &sandbox,
        "curl -sS --http1.1 -H 'Authorization: Bearer client-sent' https://api.example.test/one https://api.example.test/two",
    )
    .await;
    assert_eq!(out, "ok /one HTTP/2.0 0\nok /two HTTP/2.0 0\n");
    let requests = take(&seen);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(request.version, http::Version::HTTP_2);
        assert_eq!(request.authority, "api.example.test");
        assert_eq!(request.authorization, [SECRET], "{}", request.path);
    }
    assert_eq!(
        requests[0].conn, requests[1].conn,
        "one upstream connection"
    );

    // An HTTP/2 client, several streams at once on one connection; a streamed upload and
    // a download of several flow-control windows.
    let out = sh(
        api,
        &sandbox,
        "curl -sS --parallel --parallel-immediate https://api.example.test/a https://api.example.test/b https://api.example.test/c 2>/dev/null | sort && head -c 300000 /dev/zero | curl -sS -T - https://api.example.test/upload && curl -sS https://api.example.test/bytes/5000000 | wc -c",
    )
    .await;
    assert_eq!(
        out,
        "ok /a HTTP/2.0 0\nok /b HTTP/2.0 0\nok /c HTTP/2.0 0\nok /upload HTTP/2.0 300000\n5000000\n"
    );
    let requests = take(&seen);
    assert_eq!(requests.len(), 5, "{requests:?}");
    for request in &requests {
        assert_eq!(request.version, http::Version::HTTP_2);
        assert_eq!(request.authority, "api.example.test");
        assert_eq!(request.authorization, [SECRET], "{}", request.path);
    }

    // A WebSocket to an upstream that speaks HTTP/2 alone: its HTTP/1.1 connection is
    // refused (no protocol in common), a 502 naming the name.
    api.upload(&sandbox, "/home/user/ws.py", WS_CLIENT.as_bytes())
        .await;
    let out = sh(
        api,
        &sandbox,
        "/usr/bin/python3 /home/user/ws.py wss api.example.test /echo 2>&1",
    )
    .await;
    assert_eq!(out, "HTTP/1.1 502 Bad Gateway\n");
    assert!(take(&seen).is_empty());
    let log = server.log_text();
    assert!(!log.contains("sk-e2b-local-protocols"), "{log}");
}
