//! Fuzz target: e2b-local's multipart `POST /files` upload, parser and path resolution, on a
//! real in-process server over loopback. Each input is one request body; the first byte
//! chooses whether a `?path=` is given (else the parts' file names decide). Checks: the server
//! answers every body with a well-formed response that is a success or a client error (never
//! a 5xx, a reset or silence), a success names only paths under `/home/user` or `/tmp`, and
//! nothing appears in the state directory beside the one sandbox.
#![no_main]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

const BOUNDARY: &str = "fuzzboundary";

struct Fixture {
    addr: SocketAddr,
    sandbox_id: String,
    home: PathBuf,
    tmp: PathBuf,
    state_dir: PathBuf,
    state_entries: BTreeSet<PathBuf>,
    _runtime: tokio::runtime::Runtime,
    _server: e2b_local::Server,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let mut config = e2b_local::ServerConfig::loopback();
        // A clock that never moves: the sandbox's lease cannot run out during a long run.
        config.clock =
            e2b_local::Clock::manual(SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 31));
        config.isolation = e2b_local::IsolationMode::PathMapping;
        let server = runtime
            .block_on(e2b_local::Server::start(config))
            .expect("e2b-local starts");
        let addr = server.addr();
        let (status, body) = request(
            addr,
            "POST /sandboxes",
            &[
                ("X-API-Key", "fuzz-key"),
                ("Content-Type", "application/json"),
            ],
            br#"{"templateID":"base","timeout":3600}"#,
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let info: serde_json::Value = serde_json::from_slice(&body).expect("create answer");
        let sandbox_id = info["sandboxID"].as_str().expect("sandboxID").to_owned();
        let home = server.sandbox_home(&sandbox_id);
        let tmp = home.with_file_name("tmp");
        let state_dir = server.state_dir().to_path_buf();
        let state_entries = walk_outside(&state_dir, &home, &tmp);
        Fixture {
            addr,
            sandbox_id,
            home,
            tmp,
            state_dir,
            state_entries,
            _runtime: runtime,
            _server: server,
        }
    })
}

/// Every path under the state directory except the sandbox's own home and tmp trees.
fn walk_outside(
    root: &std::path::Path,
    home: &std::path::Path,
    tmp: &std::path::Path,
) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.starts_with(home) || path.starts_with(tmp) {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path.clone());
            }
            out.insert(path);
        }
    }
    out
}

/// Sends one HTTP/1.1 request and reads the whole answer: (status, body).
fn request(addr: SocketAddr, line: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut head = format!(
        "{line} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send head");
    stream.write_all(body).expect("send body");
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .expect("the server answers and closes");
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let status_line = String::from_utf8_lossy(&answer[..split])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    (status, answer[split + 4..].to_vec())
}

fn clear(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let line = if mode & 1 == 1 {
        "POST /files?path=/home/user/given/name.txt"
    } else {
        "POST /files"
    };
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let (status, answer) = request(
        f.addr,
        line,
        &[
            ("E2b-Sandbox-Id", &f.sandbox_id),
            ("Content-Type", &content_type),
        ],
        body,
    );
    assert!(
        status == 200 || (400..500).contains(&status),
        "status {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    if status == 200 {
        let entries: serde_json::Value = serde_json::from_slice(&answer).expect("a JSON answer");
        for entry in entries.as_array().expect("an array of entries") {
            let path = entry["path"].as_str().expect("a path");
            assert!(
                path.starts_with("/home/user/") || path.starts_with("/tmp/"),
                "wrote outside the sandbox areas: {path}"
            );
        }
    }
    assert_eq!(
        walk_outside(&f.state_dir, &f.home, &f.tmp),
        f.state_entries,
        "the upload created something beside the sandbox"
    );
    clear(&f.home);
    clear(&f.tmp);
});
