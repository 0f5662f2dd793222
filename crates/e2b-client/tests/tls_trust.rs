//! The client trusts the platform's CA store and `SSL_CERT_FILE` besides the bundled roots,
//! so a corporate TLS proxy's CA works as it does for the E2B SDKs. An HTTPS server on
//! loopback whose certificate a test CA signed (fixtures in `tests/tls/`, valid until 2126)
//! answers a sandbox lookup: a client built with `SSL_CERT_FILE` naming that CA reaches it;
//! one built without it refuses the certificate, and says so.
//!
//! `harness = false`: each case is this binary run again as a child with its own environment,
//! because the variables are read when a client is built and changing them inside a running
//! multi-threaded test harness is unsound.

// A `harness = false` test reports through stdout and stderr itself.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use e2b_client::{ApiKey, Client, Config, RetryPolicy, SandboxId};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";
const SANDBOX: &str = "itlstrust0000000000001";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2]);
    }
    parent()
}

/// Serves every connection the cases open (bounded: the process ends with the last case).
fn serve(listener: TcpListener) {
    let certs = CertificateDer::pem_file_iter(fixtures().join("server.pem"))
        .expect("server.pem")
        .collect::<Result<Vec<_>, _>>()
        .expect("server certificate");
    let key = PrivateKeyDer::from_pem_file(fixtures().join("server-key.pem")).expect("server key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config"),
    );
    let body = format!(
        r#"{{"templateID":"base","sandboxID":"{SANDBOX}","clientID":"6532622b","startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"metadata":{{}},"state":"running","envdVersion":"0.6.13"}}"#
    );
    for stream in listener.incoming().take(64) {
        let Ok(stream) = stream else { continue };
        let config = config.clone();
        let body = body.clone();
        std::thread::spawn(move || {
            let Ok(connection) = rustls::ServerConnection::new(config) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(connection, stream);
            // A refused handshake ends here: the client closed the connection.
            let mut reader = BufReader::new(&mut tls);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(answer.as_bytes());
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
    }
}

fn parent() -> ExitCode {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    std::thread::spawn(move || serve(listener));
    // No certificate directory: only what a case names is added to the bundled roots.
    let empty = std::env::temp_dir().join(format!("tls-trust-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("empty dir");
    let run = |ca: Option<&Path>| {
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .args(["child", &url])
            .env("SSL_CERT_DIR", &empty)
            .env_remove("SSL_CERT_FILE");
        if let Some(ca) = ca {
            command.env("SSL_CERT_FILE", ca);
        }
        command.output().expect("child runs")
    };

    let mut failures = Vec::new();
    let trusted = run(Some(&fixtures().join("ca.pem")));
    let trusted_text = String::from_utf8_lossy(&trusted.stdout).into_owned();
    if !trusted.status.success() || !trusted_text.contains(SANDBOX) {
        failures.push(format!(
            "a CA named by SSL_CERT_FILE is not trusted: {trusted_text}"
        ));
    }
    let untrusted = run(None);
    let untrusted_text = String::from_utf8_lossy(&untrusted.stdout).into_owned();
    if untrusted.status.success() {
        failures.push(format!(
            "a certificate no trusted CA signed was accepted: {untrusted_text}"
        ));
    } else if !untrusted_text.to_lowercase().contains("certificate") {
        failures.push(format!(
            "the refusal does not say it is the certificate: {untrusted_text}"
        ));
    } else if !untrusted_text.starts_with("error tls ") {
        // contract: O6 — a TLS failure is told apart from an unreachable host.
        failures.push(format!(
            "the refusal is not classified as a TLS failure: {untrusted_text}"
        ));
    } else if !untrusted_text.contains(&format!("({url})")) {
        failures.push(format!(
            "the refusal does not name the endpoint {url}: {untrusted_text}"
        ));
    }
    for text in [&trusted_text, &untrusted_text] {
        if text.contains(KEY) {
            failures.push(format!("the API key reached the output: {text}"));
        }
    }
    let _ = std::fs::remove_dir(&empty);
    println!("tls_trust: untrusted case said: {}", untrusted_text.trim());
    println!("tls_trust: 2 cases, {} failed", failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for failure in failures {
            eprintln!("FAILED: {failure}");
        }
        ExitCode::FAILURE
    }
}

/// One case: looks a sandbox up over HTTPS and prints the answer or the whole error chain.
fn child(url: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = Config::new(ApiKey::new(KEY.to_owned()));
    config.api_url = Some(url.to_owned());
    config.sandbox_url = Some(url.to_owned());
    // One attempt: a refused certificate is not worth retrying here.
    config.retry = RetryPolicy::none();
    let client = Client::new(config).expect("valid config");
    let id = SandboxId::parse(SANDBOX.to_owned()).expect("valid id");
    match runtime.block_on(client.get(&id)) {
        Ok(detail) => {
            println!("ok {}", detail.summary.sandbox_id);
            ExitCode::SUCCESS
        }
        Err(error) => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            let kind = if error.is_tls() { "tls" } else { "other" };
            println!("error {kind} {text}");
            ExitCode::FAILURE
        }
    }
}
