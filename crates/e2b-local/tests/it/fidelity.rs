//! e2b-local as clients nobody here wrote see it (issue 11): early error replies and
//! keep-alive over raw sockets, 501 for the published routes it lacks, spec statuses,
//! `Allow`, `Content-Disposition`, `Server-Timing` and the request log.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::support::{Api, KEY, Sandbox, manual_server, new_sandbox};

/// One HTTP/1.1 connection driven by hand, the way the failing clients drove it.
struct Raw {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

struct RawReply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Raw {
    async fn connect(url: &str) -> Raw {
        let addr = url.trim_start_matches("http://");
        let (read, write) = TcpStream::connect(addr).await.unwrap().into_split();
        Raw {
            reader: BufReader::new(read),
            writer: write,
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes).await?;
        self.writer.flush().await
    }

    async fn chunk(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut out = format!("{:x}\r\n", data.len()).into_bytes();
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        self.send(&out).await
    }

    async fn read_reply(&mut self) -> std::io::Result<RawReply> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = line.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').unwrap();
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        let reply = RawReply {
            status,
            headers,
            body: Vec::new(),
        };
        let mut body = Vec::new();
        if let Some(len) = reply.header("content-length") {
            body.resize(len.parse().unwrap(), 0);
            self.reader.read_exact(&mut body).await?;
        } else if reply
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size).await?;
                let size = usize::from_str_radix(size.trim(), 16).unwrap();
                let mut data = vec![0; size + 2];
                self.reader.read_exact(&mut data).await?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&data[..size]);
            }
        }
        Ok(RawReply { body, ..reply })
    }
}

fn envd_head(sandbox: &Sandbox, method: &str, target: &str, extra: &str) -> String {
    let token = sandbox
        .token
        .as_ref()
        .map(|t| format!("X-Access-Token: {t}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nE2b-Sandbox-Id: {}\r\n{token}{extra}\r\n",
        sandbox.id
    )
}

const BOUNDARY: &str = "raw-test-boundary";

fn part_head(filename: &str) -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes()
}

/// A pause long enough for the server to decide its answer while the client is still
/// sending, as a slow client would (the assertions do not depend on it).
const CLIENT_PAUSE: Duration = Duration::from_millis(150);

#[tokio::test]
async fn a_rejected_multipart_still_being_sent_gets_its_400_and_the_connection_survives() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    assert_eq!(
        api.upload(&sandbox, "/home/user/dir/x", b"x").await.status,
        200
    );

    let mut raw = Raw::connect(&server.url()).await;
    let head = envd_head(
        &sandbox,
        "POST",
        "/files",
        &format!(
            "Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nTransfer-Encoding: chunked\r\n"
        ),
    );
    raw.send(head.as_bytes()).await.unwrap();
    // The first part targets a directory: the 400 is decided on its header.
    let mut first = part_head("/home/user/dir");
    first.extend_from_slice(&[b'a'; 1024]);
    raw.chunk(&first).await.unwrap();
    tokio::time::sleep(CLIENT_PAUSE).await;
    // The client keeps sending the rest of its body (100 KiB more) and ends it.
    for _ in 0..100 {
        raw.chunk(&[b'b'; 1024])
            .await
            .expect("the server still reads the body it rejected");
    }
    let mut tail = b"\r\n".to_vec();
    tail.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    raw.chunk(&tail).await.unwrap();
    raw.send(b"0\r\n\r\n").await.unwrap();
    let reply = raw
        .read_reply()
        .await
        .expect("the 400 arrives, not a reset");
    assert_eq!(
        reply.status,
        400,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(
        String::from_utf8_lossy(&reply.body).contains("is a directory"),
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_ne!(reply.header("connection"), Some("close"));

    // The same connection serves the next request.
    raw.send(envd_head(&sandbox, "GET", "/health", "").as_bytes())
        .await
        .unwrap();
    let next = raw
        .read_reply()
        .await
        .expect("the connection is still open");
    assert_eq!(next.status, 204);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_multipart_whose_final_chunk_arrives_later_keeps_the_connection() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;

    let mut raw = Raw::connect(&server.url()).await;
    let head = envd_head(
        &sandbox,
        "POST",
        "/files",
        &format!(
            "Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nTransfer-Encoding: chunked\r\n"
        ),
    );
    raw.send(head.as_bytes()).await.unwrap();
    let mut body = part_head("/home/user/later.txt");
    body.extend_from_slice(b"arrived");
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    raw.chunk(&body).await.unwrap();
    // The closing boundary is in; the body's final chunk comes in a later packet.
    tokio::time::sleep(CLIENT_PAUSE).await;
    raw.send(b"0\r\n\r\n").await.unwrap();
    let reply = raw.read_reply().await.unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_ne!(reply.header("connection"), Some("close"));

    raw.send(envd_head(&sandbox, "GET", "/files?path=/home/user/later.txt", "").as_bytes())
        .await
        .unwrap();
    let next = raw
        .read_reply()
        .await
        .expect("the connection is still open");
    assert_eq!(next.status, 200);
    assert_eq!(next.body, b"arrived");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_early_401_on_a_control_plane_body_keeps_the_connection() {
    let server = manual_server().await;
    let mut raw = Raw::connect(&server.url()).await;
    let body = format!(
        "{{\"templateID\":\"base\",\"pad\":\"{}\"}}",
        "p".repeat(64 * 1024)
    );
    let head = format!(
        "POST /sandboxes HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    raw.send(head.as_bytes()).await.unwrap();
    raw.send(&body.as_bytes()[..1024]).await.unwrap();
    tokio::time::sleep(CLIENT_PAUSE).await;
    raw.send(&body.as_bytes()[1024..]).await.unwrap();
    let reply = raw.read_reply().await.unwrap();
    assert_eq!(reply.status, 401);
    raw.send(
        format!("GET /sandboxes HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {KEY}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(raw.read_reply().await.unwrap().status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_remainder_over_the_bound_is_answered_with_connection_close() {
    let server = manual_server().await;
    let mut raw = Raw::connect(&server.url()).await;
    // No API key: the 401 is decided at once; the declared body is far over 256 KiB.
    raw.send(
        b"POST /sandboxes HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4194304\r\n\r\n",
    )
    .await
    .unwrap();
    let writer = tokio::spawn(async move {
        let mut raw = raw;
        let block = vec![b' '; 64 * 1024];
        for _ in 0..64 {
            if raw.send(&block).await.is_err() {
                break;
            }
        }
        raw
    });
    let mut raw = writer.await.unwrap();
    match raw.read_reply().await {
        Ok(reply) => {
            assert_eq!(reply.status, 401);
            assert_eq!(reply.header("connection"), Some("close"));
        }
        // A client that kept sending past the bound may see the close first.
        Err(error) => assert!(
            matches!(
                error.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            "{error}"
        ),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn published_routes_e2b_local_lacks_answer_501_naming_the_route() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = &sandbox.id;
    let cases = [
        (reqwest::Method::GET, "/templates".to_owned(), "/templates"),
        (
            reqwest::Method::GET,
            "/templates/base".to_owned(),
            "/templates",
        ),
        // The v2 create of a template (the build API e2b-local serves is v3's request and
        // v2's start, crate::builds).
        (
            reqwest::Method::POST,
            "/v2/templates".to_owned(),
            "/v2/templates",
        ),
        (reqwest::Method::GET, "/teams".to_owned(), "/teams"),
        (reqwest::Method::GET, "/api-keys".to_owned(), "/api-keys"),
    ];
    for (method, path, route) in cases {
        let reply = api.rest(method.clone(), &path, Some("{}")).await;
        assert_eq!(reply.status, 501, "{method} {path}: {}", reply.text);
        assert_eq!(reply.json["code"], 501, "{path}");
        let message = reply.json["message"].as_str().unwrap();
        assert_eq!(
            message,
            format!("{method} {route} is not supported by e2b-local"),
            "{path}"
        );
    }
    // The sandbox is still there: 501 never reads as "sandbox not found".
    assert_eq!(api.get(&format!("/sandboxes/{id}")).await.status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_ids_are_404_and_405_names_the_allowed_methods() {
    let server = manual_server().await;
    let api = Api::new(&server);
    for (method, path) in [
        (reqwest::Method::GET, "/sandboxes/NOT-valid"),
        (reqwest::Method::DELETE, "/sandboxes/a_b"),
        (reqwest::Method::POST, "/sandboxes/%20x/timeout"),
        (reqwest::Method::POST, "/sandboxes/X/pause"),
        (reqwest::Method::POST, "/sandboxes/X/connect"),
        (reqwest::Method::POST, "/v2/sandboxes/X/connect"),
        (reqwest::Method::POST, "/sandboxes/X/resume"),
        (reqwest::Method::POST, "/sandboxes/X/refreshes"),
    ] {
        let reply = api
            .rest(method.clone(), path, Some(r#"{"timeout":10}"#))
            .await;
        assert_eq!(reply.status, 404, "{method} {path}: {}", reply.text);
        assert_eq!(reply.json["code"], 404);
    }
    for (method, path, allow) in [
        (reqwest::Method::PUT, "/v2/sandboxes", "GET, POST"),
        (reqwest::Method::PATCH, "/sandboxes", "GET, POST"),
        (reqwest::Method::POST, "/sandboxes/abc", "GET, DELETE"),
        (reqwest::Method::GET, "/sandboxes/abc/pause", "POST"),
        (reqwest::Method::DELETE, "/v2/sandboxes/abc/connect", "POST"),
        (reqwest::Method::POST, "/health", "GET"),
    ] {
        let reply = api.rest(method.clone(), path, None).await;
        assert_eq!(reply.status, 405, "{method} {path}: {}", reply.text);
        assert_eq!(reply.headers["allow"], allow, "{method} {path}");
    }
    let sandbox = new_sandbox(&api).await;
    for (method, path, allow) in [
        (reqwest::Method::GET, "/process.Process/List", "POST"),
        (reqwest::Method::PUT, "/filesystem.Filesystem/Stat", "POST"),
        (reqwest::Method::DELETE, "/files", "GET, POST"),
        (reqwest::Method::POST, "/health", "GET"),
    ] {
        let response = api
            .envd(&sandbox, method.clone(), path)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 405, "envd {method} {path}");
        assert_eq!(response.headers()["allow"], allow, "envd {method} {path}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn non_ascii_file_names_go_out_as_rfc_6266_filename_star() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    assert_eq!(
        api.upload(&sandbox, "/home/user/résumé v2.txt", b"cv")
            .await
            .status,
        200
    );
    let response = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "/home/user/résumé v2.txt")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let disposition = response.headers()["content-disposition"].to_str().unwrap();
    assert_eq!(
        disposition,
        "inline; filename=\"r_sum_ v2.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20v2.txt"
    );
    assert!(disposition.is_ascii());
    // A plain name stays as envd sends it.
    api.upload(&sandbox, "/home/user/plain.txt", b"p").await;
    let (_, _) = api.download(&sandbox, "/home/user/plain.txt").await;
    let response = api
        .envd(&sandbox, reqwest::Method::GET, "/files")
        .query(&[("path", "/home/user/plain.txt")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-disposition"],
        "inline; filename=plain.txt"
    );
    server.shutdown().await.unwrap();
}

fn server_timing_ms(headers: &reqwest::header::HeaderMap) -> f64 {
    let value = headers
        .get("server-timing")
        .expect("every answer carries Server-Timing")
        .to_str()
        .unwrap();
    value
        .strip_prefix("app;dur=")
        .unwrap_or_else(|| panic!("{value}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn every_answer_reports_the_server_time() {
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let replies = [
        api.get("/v2/sandboxes").await.headers,
        api.get("/nowhere").await.headers,
        api.get("/_e2b_local/clock").await.headers,
        api.rpc(&sandbox, "process.Process/List", serde_json::json!({}))
            .await
            .headers,
        api.upload(&sandbox, "/home/user/t", b"t").await.headers,
    ];
    for headers in &replies {
        assert!(server_timing_ms(headers) >= 0.0);
    }
    // Injected latency is the server's own time too.
    server.faults().set_latency(Duration::from_millis(50));
    let slow = api.get("/v2/sandboxes").await;
    assert!(server_timing_ms(&slow.headers) >= 50.0);
    server.shutdown().await.unwrap();
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// A current-thread runtime: every task logs on this thread, under the scoped subscriber.
#[tokio::test(flavor = "current_thread")]
async fn requests_are_logged_at_debug_without_key_or_token() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = manual_server().await;
    let api = Api::new(&server);
    // Other tests, on other threads without this subscriber, may have registered the
    // log's callsite as uninteresting while this one was being set: once it is
    // registered (this request), recompute every callsite's interest.
    api.get("/v2/sandboxes").await;
    tracing::callsite::rebuild_interest_cache();
    let secure = api
        .post(
            "/v2/sandboxes",
            r#"{"templateID":"base","timeout":60,"secure":true}"#,
        )
        .await;
    assert_eq!(secure.status, 201);
    let sandbox = Sandbox {
        id: secure.json["sandboxID"].as_str().unwrap().to_owned(),
        token: secure.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let token = sandbox.token.clone().expect("a secure sandbox has a token");
    api.rpc(&sandbox, "process.Process/List", serde_json::json!({}))
        .await;
    api.get("/sandboxes/inotthere000").await;
    server.shutdown().await.unwrap();

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("e2b_local::request"))
        .collect();
    let create = lines
        .iter()
        .find(|l| l.contains("method=POST") && l.contains("path=/v2/sandboxes "))
        .unwrap_or_else(|| panic!("no create line in:\n{log}"));
    assert!(create.contains("DEBUG"), "{create}");
    assert!(create.contains("status=201"), "{create}");
    assert!(create.contains("duration_ms="), "{create}");
    let list = lines
        .iter()
        .find(|l| l.contains("path=/process.Process/List"))
        .unwrap_or_else(|| panic!("no envd line in:\n{log}"));
    assert!(list.contains(&format!("sandbox={}", sandbox.id)), "{list}");
    assert!(list.contains("status=200"), "{list}");
    let missing = lines
        .iter()
        .find(|l| l.contains("path=/sandboxes/inotthere000"))
        .unwrap_or_else(|| panic!("no get line in:\n{log}"));
    assert!(missing.contains("sandbox=inotthere000"), "{missing}");
    assert!(missing.contains("status=404"), "{missing}");
    assert!(
        !log.contains(KEY),
        "the API key leaked into the log:\n{log}"
    );
    assert!(
        !log.contains(&token),
        "the access token leaked into the log:\n{log}"
    );
}
