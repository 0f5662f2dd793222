//! `network.rules` (per-domain header transforms) and `network.egressProxy`: checked with
//! E2B's limits, stored, reported, kept across pause, resume and a restart.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

/// The secret every test here hands over and then looks for where it must not be.
const SECRET: &str = "Bearer sk-e2b-local-never-shown-7f3a";

pub(crate) fn rules_with(value: &str) -> Value {
    json!({"api.example.test": [{"transform": {"headers": {"Authorization": value}}}]})
}

/// Whether this server can enforce rules (namespaces and the seccomp filter).
pub(crate) async fn enforces(api: &Api) -> bool {
    api.get("/_e2b_local/isolation").await.json["egressRules"] == true
}

#[tokio::test]
async fn rules_and_egress_proxy_are_stored_reported_and_survive_pause_and_restart() {
    // contract: X12
    let dir = tempfile::tempdir().unwrap();
    let mut config = e2b_local::ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = e2b_local::Clock::manual(t0());
    let server = e2b_local::Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let network = json!({
        "rules": rules_with(SECRET),
        "egressProxy": {"address": "127.0.0.1:1080", "username": "u", "password": "hunter2-pw"},
    });
    let created = api
        .post(
            "/v2/sandboxes",
            &json!({"templateID": "base", "timeout": 60, "network": network}).to_string(),
        )
        .await;
    if !enforces(&api).await {
        // Where commands cannot be held to rules, asking for them is refused, clearly.
        assert_eq!(created.status, 400, "{}", created.text);
        assert!(
            created.text.contains("network.rules cannot be enforced"),
            "{}",
            created.text
        );
        assert!(!created.text.contains(SECRET), "{}", created.text);
        server.shutdown().await.unwrap();
        return;
    }
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.json["sandboxID"].as_str().unwrap().to_owned();
    let expected = json!({"allowOut": [], "denyOut": [], "rules": rules_with(SECRET),
        "egressProxy": {"address": "127.0.0.1:1080", "username": "u"}});
    let detail = api.get(&format!("/sandboxes/{id}")).await;
    assert_eq!(detail.json["network"], expected);
    assert!(!detail.text.contains("hunter2-pw"), "{}", detail.text);
    let logs = api.get(&format!("/v2/sandboxes/{id}/logs")).await;
    assert!(!logs.text.contains("hunter2-pw") && !logs.text.contains("sk-e2b-local"));

    // The record on disk holds the secret (it must survive a restart): owner-only.
    let record = std::fs::read_dir(dir.path().join("sandboxes"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("sandbox.json"))
        .find(|path| path.exists())
        .expect("a record");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );

    assert_eq!(
        api.post(&format!("/sandboxes/{id}/pause"), "{}")
            .await
            .status,
        204
    );
    let resumed = api.post(&format!("/sandboxes/{id}/resume"), "{}").await;
    assert!(resumed.status < 300, "{}", resumed.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        expected
    );
    server.shutdown().await.unwrap();

    let server = e2b_local::Server::start(config).await.unwrap();
    let api = Api::new(&server);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        expected
    );

    // The update replaces: new value; then rules left out are cleared.
    let path = format!("/sandboxes/{id}/network");
    let body = json!({"rules": rules_with("Bearer second")}).to_string();
    let reply = api.rest(Method::PUT, &path, Some(&body)).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        json!({"allowOut": [], "denyOut": [], "rules": rules_with("Bearer second")})
    );
    let reply = api.rest(Method::PUT, &path, Some("{}")).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["network"],
        json!({"allowOut": [], "denyOut": []})
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn rules_past_e2b_limits_are_refused_naming_the_field_never_the_value() {
    // contract: X12
    let server = manual_server().await;
    let api = Api::new(&server);
    let many: serde_json::Map<String, Value> = (0..11)
        .map(|i| {
            (
                format!("d{i}.example.test"),
                rules_with(SECRET)["api.example.test"].clone(),
            )
        })
        .collect();
    let long = format!("{SECRET}{}", "x".repeat(2048));
    let cases = [
        (json!(many), "at most 10"),
        (json!({"*.example.test": []}), "plain DNS name"),
        (json!({"10.1.2.3": []}), "plain DNS name"),
        (
            json!({"a.test": [{"transform": {"headers": {"a": SECRET}}}, {}]}),
            "at most one rule",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x".repeat(65): SECRET}}}]}),
            "1 to 64",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x": long}}}]}),
            "longer than 2048",
        ),
        (
            json!({"a.test": [{"transform": {"headers": {"x": format!("{SECRET}\r\nInjected: 1")}}}]}),
            "not a valid HTTP header value",
        ),
        (
            json!({"a.test": [{"transform": {"headers": SECRET}}]}),
            "headers must be an object",
        ),
    ];
    for (rules, needle) in cases {
        let body = json!({"templateID": "base", "timeout": 60, "network": {"rules": rules}});
        let reply = api.post("/v2/sandboxes", &body.to_string()).await;
        assert_eq!(reply.status, 400, "{needle}: {}", reply.text);
        assert!(reply.text.contains("network.rules"), "{}", reply.text);
        assert!(reply.text.contains(needle), "{needle}: {}", reply.text);
        assert!(!reply.text.contains("sk-e2b-local"), "{}", reply.text);
    }
    server.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Enforcement: a real HTTPS (and HTTP) service on a loopback address stands in for the
// API; e2b-local (the binary, with --upstream-ca and --add-host) sits between it and the
// sandbox.

use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;

pub(crate) fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// One request the upstream saw: connection number, path, and its headers.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) conn: usize,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// A test CA and a service certificate it signed for `names`.
pub(crate) struct TestPki {
    pub(crate) ca_pem: String,
    pub(crate) server: Arc<rustls::ServerConfig>,
}

pub(crate) fn test_pki(names: &[&str]) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        leaf_key.serialize_der(),
    ));
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    TestPki {
        ca_pem: ca_cert.pem(),
        server: Arc::new(server),
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

type TestBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// The service: records every request; `/bytes/N` answers N bytes (streamed in 64 KiB
/// frames), anything else `ok <path> <request body length>`.
pub(crate) async fn upstream(
    ip: IpAddr,
    port: u16,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Arc<Mutex<Vec<Seen>>> {
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
                let service = hyper::service::service_fn(move |request| {
                    let record = Arc::clone(&record);
                    async move {
                        Ok::<_, std::convert::Infallible>(answer(request, conn, &record).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                    .await;
            });
        }
    });
    seen
}

async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    conn: usize,
    record: &Mutex<Vec<Seen>>,
) -> hyper::Response<TestBody> {
    let path = request.uri().path().to_owned();
    let headers = request
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    record.lock().unwrap().push(Seen {
        conn,
        path: path.clone(),
        headers,
    });
    if let Some(n) = path.strip_prefix("/bytes/") {
        let total: usize = n.parse().unwrap_or(0);
        let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let frames = futures::stream::unfold(total, move |left| {
            let chunk = chunk.clone();
            async move {
                (left > 0).then(|| {
                    let n = left.min(chunk.len());
                    (
                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                            chunk.slice(..n),
                        )),
                        left - n,
                    )
                })
            }
        });
        return hyper::Response::new(http_body_util::StreamBody::new(frames).boxed());
    }
    let mut body = request.into_body();
    let mut length = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        length += frame.data_ref().map_or(0, bytes::Bytes::len);
    }
    hyper::Response::new(
        http_body_util::Full::new(bytes::Bytes::from(format!("ok {path} {length}\n"))).boxed(),
    )
}

/// e2b-local as a process (so its log, at debug, can be read), with the given flags.
pub(crate) struct Binary {
    child: std::process::Child,
    pub(crate) api: Api,
    pub(crate) log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Binary {
    pub(crate) fn start(ca_pem: &str, hosts: &[(&str, IpAddr)]) -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        let log = dir.path().join("e2b-local.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_e2b-local"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--upstream-ca")
            .arg(&ca)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, ip) in hosts {
            command.arg("--add-host").arg(format!("{name}:{ip}"));
        }
        let mut child = command.spawn().expect("the binary starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let line = lines.next().expect("the URL line").unwrap();
        let url = line.strip_prefix("E2B_API_URL=").unwrap().to_owned();
        Binary {
            child,
            api: Api {
                url,
                http: reqwest::Client::new(),
            },
            log,
            _dir: dir,
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

pub(crate) async fn sandbox_with_rules(api: &Api, value: &str) -> Sandbox {
    let body = json!({"templateID": "base", "timeout": 300,
        "network": {"rules": rules_with(value)}});
    let reply = api.post("/v2/sandboxes", &body.to_string()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Sandbox {
        id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    }
}

pub(crate) async fn sh(api: &Api, sandbox: &Sandbox, script: &str) -> String {
    let run = api.run(sandbox, script).await;
    format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    )
}

pub(crate) fn take(seen: &Mutex<Vec<Seen>>) -> Vec<Seen> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[tokio::test]
async fn header_rules_set_the_header_on_every_request_to_the_named_host_only() {
    // contract: X13
    if !running_as_root() {
        // Rules need the mount namespace and the filter: elsewhere they are refused (X12).
        return;
    }
    let ip: IpAddr = "127.61.0.1".parse().unwrap();
    let pki = test_pki(&["api.example.test", "other.example.test"]);
    let tls_seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let http_seen = upstream(ip, 80, None).await;
    let server = Binary::start(
        &pki.ca_pem,
        &[("api.example.test", ip), ("other.example.test", ip)],
    );
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let sandbox = sandbox_with_rules(api, SECRET).await;

    // Two URLs in one curl: one kept-alive connection, both requests get the header, and
    // the one the client sent is replaced.
    let out = sh(
        api,
        &sandbox,
        "curl -sS -H 'Authorization: Bearer client-sent' https://api.example.test/one https://api.example.test/two",
    )
    .await;
    assert_eq!(out, "ok /one 0\nok /two 0\n");
    let seen = take(&tls_seen);
    assert_eq!(seen.len(), 2, "{seen:?}");
    for request in &seen {
        assert_eq!(
            request.header("authorization"),
            [SECRET],
            "{}",
            request.path
        );
    }
    assert_eq!(
        seen[0].conn, seen[1].conn,
        "one kept-alive connection upstream"
    );

    // HTTP/2 where the client offers it by ALPN (curl does), HTTP/1.1 where it asks for
    // that alone; the upstream gets HTTP/1.1 with the header either way.
    let out = sh(
        api,
        &sandbox,
        "curl -sS --http1.1 -w '%{http_version}\\n' https://api.example.test/h1 && curl -sS -w '%{http_version}\\n' https://api.example.test/h2a https://api.example.test/h2b",
    )
    .await;
    assert_eq!(out, "ok /h1 0\n1.1\nok /h2a 0\n2\nok /h2b 0\n2\n");
    let seen = take(&tls_seen);
    assert_eq!(seen.len(), 3, "{seen:?}");
    for request in &seen {
        assert_eq!(
            request.header("authorization"),
            [SECRET],
            "{}",
            request.path
        );
        assert_eq!(
            request.header("host"),
            ["api.example.test"],
            "{}",
            request.path
        );
    }

    // A streamed (chunked) upload, and plain HTTP on port 80.
    let out = sh(
        api,
        &sandbox,
        "head -c 300000 /dev/zero | curl -sS -T - https://api.example.test/upload && curl -sS http://api.example.test/plain",
    )
    .await;
    assert_eq!(out, "ok /upload 300000\nok /plain 0\n");
    assert_eq!(take(&tls_seen)[0].header("authorization"), [SECRET]);
    assert_eq!(take(&http_seen)[0].header("authorization"), [SECRET]);

    // Python's urllib trusts the CA through the variables too.
    let out = sh(
        api,
        &sandbox,
        "/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen('https://api.example.test/py').read().decode(), end='')\"",
    )
    .await;
    assert_eq!(out, "ok /py 0\n");
    assert_eq!(take(&tls_seen)[0].header("authorization"), [SECRET]);

    // A host without rules is not intercepted: its own certificate (the test CA's) is
    // what the sandbox sees, and the client's header is what arrives.
    api.upload(
        &sandbox,
        "/home/user/upstream-ca.pem",
        pki.ca_pem.as_bytes(),
    )
    .await;
    let out = sh(
        api,
        &sandbox,
        "curl -sS --cacert /home/user/upstream-ca.pem -H 'Authorization: Bearer client-sent' https://other.example.test/other",
    )
    .await;
    assert_eq!(out, "ok /other 0\n");
    assert_eq!(
        take(&tls_seen)[0].header("authorization"),
        ["Bearer client-sent"]
    );

    // An update reaches the next request.
    let path = format!("/sandboxes/{}/network", sandbox.id);
    let body = json!({"rules": rules_with("Bearer rotated")}).to_string();
    assert_eq!(api.rest(Method::PUT, &path, Some(&body)).await.status, 204);
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/after").await;
    assert_eq!(out, "ok /after 0\n");
    assert_eq!(
        take(&tls_seen)[0].header("authorization"),
        ["Bearer rotated"]
    );
}

#[tokio::test]
async fn header_values_reach_no_log_no_error_and_nothing_in_the_sandbox() {
    // contract: X14
    if !running_as_root() {
        return;
    }
    let ip: IpAddr = "127.61.0.2".parse().unwrap();
    let pki = test_pki(&["api.example.test"]);
    let tls_seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let server = Binary::start(&pki.ca_pem, &[("api.example.test", ip)]);
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let sandbox = sandbox_with_rules(api, SECRET).await;
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/x").await;
    assert_eq!(out, "ok /x 0\n");
    assert_eq!(take(&tls_seen)[0].header("authorization"), [SECRET]);
    // A failing request (nothing listens on port 80 there) and a refused update.
    let failed = sh(api, &sandbox, "curl -sS http://api.example.test/down").await;
    assert!(
        failed.contains("could not reach api.example.test"),
        "{failed}"
    );
    let path = format!("/sandboxes/{}/network", sandbox.id);
    let bad = json!({"rules": {"*.x.test": [{"transform": {"headers": {"a": SECRET}}}]}});
    let reply = api.rest(Method::PUT, &path, Some(&bad.to_string())).await;
    assert_eq!(reply.status, 400);
    assert!(!reply.text.contains("sk-e2b-local"), "{}", reply.text);

    // Nothing in the sandbox holds it: not its environment, not a file it can read.
    let needle = "sk-e2b-local-never-shown";
    let inside = sh(
        api,
        &sandbox,
        &format!("env; cat /proc/self/environ | tr '\\0' '\\n'; grep -rIl --exclude-dir=proc --exclude-dir=sys '{needle}' /etc /home /tmp /root 2>/dev/null; echo done"),
    )
    .await;
    assert!(!inside.contains(needle), "{inside}");
    assert!(
        inside.contains("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"),
        "{inside}"
    );
    // The sandbox's logs and e2b-local's own (at debug) never show it.
    for path in [
        format!("/sandboxes/{}/logs", sandbox.id),
        format!("/v2/sandboxes/{}/logs", sandbox.id),
    ] {
        let logs = api.get(&path).await;
        assert_eq!(logs.status, 200);
        assert!(!logs.text.contains(needle), "{}", logs.text);
    }
    let log = server.log_text();
    assert!(log.contains("DEBUG"), "the log is at debug: {log}");
    assert!(!log.contains(needle), "{log}");
}

/// A SOCKS5 server (RFC 1928, CONNECT only) that wants RFC 1929 username `u` and
/// `password`, and records (username, target) of every tunnel it opened.
async fn socks_server(
    password: &'static str,
) -> (
    std::net::SocketAddr,
    Arc<Mutex<Vec<(String, std::net::SocketAddr)>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let mut head = [0u8; 2];
                client.read_exact(&mut head).await.ok()?;
                let mut methods = vec![0u8; usize::from(head[1])];
                client.read_exact(&mut methods).await.ok()?;
                if head[0] != 5 || !methods.contains(&2) {
                    client.write_all(&[5, 0xff]).await.ok()?;
                    return None;
                }
                client.write_all(&[5, 2]).await.ok()?;
                let mut len = [0u8; 2];
                client.read_exact(&mut len).await.ok()?;
                let mut user = vec![0u8; usize::from(len[1])];
                client.read_exact(&mut user).await.ok()?;
                let mut plen = [0u8; 1];
                client.read_exact(&mut plen).await.ok()?;
                let mut pass = vec![0u8; usize::from(plen[0])];
                client.read_exact(&mut pass).await.ok()?;
                if user != b"u" || pass != password.as_bytes() {
                    client.write_all(&[1, 1]).await.ok()?;
                    return None;
                }
                client.write_all(&[1, 0]).await.ok()?;
                let mut request = [0u8; 4];
                client.read_exact(&mut request).await.ok()?;
                let ip: IpAddr = match request[3] {
                    1 => {
                        let mut octets = [0u8; 4];
                        client.read_exact(&mut octets).await.ok()?;
                        octets.into()
                    }
                    4 => {
                        let mut octets = [0u8; 16];
                        client.read_exact(&mut octets).await.ok()?;
                        octets.into()
                    }
                    _ => return None,
                };
                let mut port = [0u8; 2];
                client.read_exact(&mut port).await.ok()?;
                let target = std::net::SocketAddr::new(ip, u16::from_be_bytes(port));
                let mut upstream = tokio::net::TcpStream::connect(target).await.ok()?;
                record
                    .lock()
                    .unwrap()
                    .push((String::from_utf8_lossy(&user).into_owned(), target));
                client
                    .write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])
                    .await
                    .ok()?;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                Some(())
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn allowed_tcp_goes_through_the_egress_proxy_with_its_credentials() {
    // contract: X18
    if !running_as_root() {
        return;
    }
    let ip: IpAddr = "127.61.0.3".parse().unwrap();
    let pki = test_pki(&["api.example.test"]);
    let plain_seen = upstream(ip, 8080, None).await;
    let tls_seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let (socks, tunnels) = socks_server("p-socks-secret").await;
    let server = Binary::start(&pki.ca_pem, &[("api.example.test", ip)]);
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let create = |network: Value| {
        let body = json!({"templateID": "base", "timeout": 300, "network": network});
        async move {
            let reply = api.post("/v2/sandboxes", &body.to_string()).await;
            assert_eq!(reply.status, 201, "{}", reply.text);
            Sandbox {
                id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
                token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
            }
        }
    };
    let proxy =
        json!({"address": socks.to_string(), "username": "u", "password": "p-socks-secret"});
    let sandbox = create(json!({"egressProxy": proxy, "rules": rules_with(SECRET)})).await;

    // Any port: the tunnel is the proxy's, with its credentials.
    let out = sh(api, &sandbox, "curl -sS http://127.61.0.3:8080/via").await;
    assert_eq!(out, "ok /via 0\n");
    assert_eq!(take(&plain_seen).len(), 1);
    let opened = std::mem::take(&mut *tunnels.lock().unwrap());
    assert_eq!(
        opened,
        [("u".to_owned(), "127.61.0.3:8080".parse().unwrap())]
    );

    // Header rules and the proxy together: the intercepted request goes through it too.
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/both").await;
    assert_eq!(out, "ok /both 0\n");
    assert_eq!(take(&tls_seen)[0].header("authorization"), [SECRET]);
    let opened = std::mem::take(&mut *tunnels.lock().unwrap());
    assert_eq!(
        opened,
        [("u".to_owned(), "127.61.0.3:443".parse().unwrap())]
    );

    // Without the proxy (an update clears it), connections go out directly.
    let path = format!("/sandboxes/{}/network", sandbox.id);
    assert_eq!(api.rest(Method::PUT, &path, Some("{}")).await.status, 204);
    let out = sh(api, &sandbox, "curl -sS http://127.61.0.3:8080/direct").await;
    assert_eq!(out, "ok /direct 0\n");
    assert_eq!(take(&plain_seen).len(), 1);
    assert!(tunnels.lock().unwrap().is_empty());

    // Credentials the proxy refuses: nothing gets out, and the password is nowhere.
    let wrong = json!({"address": socks.to_string(), "username": "u", "password": "wrong-pw-123"});
    let refused = create(json!({"egressProxy": wrong})).await;
    let out = sh(
        api,
        &refused,
        "curl -sS -m 20 http://127.61.0.3:8080/refused; echo exit=$?",
    )
    .await;
    assert!(!out.contains("ok /refused"), "{out}");
    assert!(take(&plain_seen).is_empty());
    let log = server.log_text();
    assert!(
        !log.contains("p-socks-secret") && !log.contains("wrong-pw-123"),
        "{log}"
    );
    for id in [&sandbox.id, &refused.id] {
        let logs = api.get(&format!("/v2/sandboxes/{id}/logs")).await;
        assert!(!logs.text.contains("p-socks-secret") && !logs.text.contains("wrong-pw-123"));
    }
}

#[tokio::test]
async fn allow_and_deny_rules_still_decide_before_header_rules() {
    // contract: X13
    if !running_as_root() {
        return;
    }
    let ip: IpAddr = "127.61.0.4".parse().unwrap();
    let pki = test_pki(&["api.example.test", "other.example.test"]);
    let tls_seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let server = Binary::start(
        &pki.ca_pem,
        &[("api.example.test", ip), ("other.example.test", ip)],
    );
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let body = json!({"templateID": "base", "timeout": 300, "network": {
        "allowOut": ["api.example.test"], "denyOut": ["0.0.0.0/0"], "rules": rules_with(SECRET)}});
    let reply = api.post("/v2/sandboxes", &body.to_string()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let sandbox = Sandbox {
        id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/allowed").await;
    assert_eq!(out, "ok /allowed 0\n");
    assert_eq!(take(&tls_seen)[0].header("authorization"), [SECRET]);
    // Same address, a name no domain entry allows: refused before anything is sent.
    api.upload(
        &sandbox,
        "/home/user/upstream-ca.pem",
        pki.ca_pem.as_bytes(),
    )
    .await;
    let out = sh(
        api,
        &sandbox,
        "curl -sS --cacert /home/user/upstream-ca.pem https://other.example.test/denied; echo exit=$?",
    )
    .await;
    assert!(!out.contains("ok /denied"), "{out}");
    assert!(take(&tls_seen).is_empty());
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_naming_it_and_is_reached_once_it_listens() {
    // contract: X13
    if !running_as_root() {
        return;
    }
    // Nothing listens on this address's port 443 yet: the connection made beside the
    // sandbox's handshake is refused.
    let ip: IpAddr = "127.61.0.5".parse().unwrap();
    let pki = test_pki(&["api.example.test"]);
    let server = Binary::start(&pki.ca_pem, &[("api.example.test", ip)]);
    let api = &server.api;
    if !enforces(api).await {
        return;
    }
    let sandbox = sandbox_with_rules(api, SECRET).await;
    // Two requests on one connection: the first answers the failure of the connection
    // made beside the handshake, the second tries again and fails the same way.
    let out = sh(
        api,
        &sandbox,
        "curl -sS -w '%{http_code} %{num_connects}\\n' https://api.example.test/a https://api.example.test/b",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (body, status) in [(lines[0], lines[1]), (lines[2], lines[3])] {
        assert!(
            body.starts_with("e2b-local could not reach api.example.test: "),
            "{out}"
        );
        assert!(!body.contains(SECRET), "{out}");
        assert!(status.starts_with("502 "), "{out}");
    }
    assert_eq!(
        lines[3], "502 0",
        "the second request reused the connection: {out}"
    );

    // Once the service listens, the next connection reaches it, with the header.
    let seen = upstream(ip, 443, Some(Arc::clone(&pki.server))).await;
    let out = sh(api, &sandbox, "curl -sS https://api.example.test/up").await;
    assert_eq!(out, "ok /up 0\n");
    assert_eq!(take(&seen)[0].header("authorization"), [SECRET]);
}
