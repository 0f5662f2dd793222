//! What header rules cost: curl in a sandbox against one HTTPS service on a loopback
//! address, reached three ways in one run: intercepted (a name with `network.rules`),
//! relayed (another name of the same sandbox: by the proxy, not terminated) and direct (a
//! sandbox without rules: no filter, no proxy). e2b-local runs as its own process (the
//! binary beside this example, or `--e2b-local`), so its memory is measured alone. Needs
//! root (namespaces, the filter, the service on port 443).
//!
//!   cargo run --release -p e2b-local --example intercept_bench -- [--requests N] [--mib M] [--json]
//!
//! Prints, per way: the median time of a request on a new connection (TCP + TLS + request),
//! on a kept-alive connection, and of downloading M MiB (three times, kept alive), and how
//! far e2b-local's resident memory rose above its level before the downloads (its peak,
//! `VmHWM` after a reset); then the ratios against direct. `--json` prints the figures as
//! one JSON line instead (`scripts/bench` reads it). Each curl trusts one root, so the
//! figures are the proxy's, and asks for HTTP/1.1 (the service's protocol; over HTTP/2
//! `Connection: close` would not open a new connection).
#![allow(clippy::print_stdout, missing_docs)]

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::io::{BufRead as _, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use clap::Parser;
use http_body_util::BodyExt as _;
use serde_json::json;

use support::{Api, Sandbox};

const UPSTREAM_IP: &str = "127.62.0.1";

#[derive(Parser)]
struct Args {
    /// Requests per way on new connections, and again on one kept-alive connection.
    #[arg(long, default_value_t = 30)]
    requests: usize,
    /// MiB of each of the three downloads per way.
    #[arg(long, default_value_t = 100)]
    mib: usize,
    /// The e2b-local binary (default: the one beside this example's directory).
    #[arg(long)]
    e2b_local: Option<PathBuf>,
    /// One JSON line of figures instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(args));
}

/// One way's figures.
struct Way {
    name: &'static str,
    fresh_s: f64,
    kept_s: f64,
    bulk_s: f64,
    rss_growth_kib: u64,
}

async fn run(args: Args) {
    let ip: IpAddr = UPSTREAM_IP.parse().expect("ip");
    let (ca_pem, server_tls) = pki(&["api.bench.test", "plain.bench.test"]);
    serve_upstream(ip, server_tls).await;
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write");
    let binary = args.e2b_local.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("own path");
        exe.parent()
            .and_then(Path::parent)
            .expect("examples directory")
            .join("e2b-local")
    });
    let (mut child, url) = start_e2b_local(&binary, &ca_file, ip);
    let pid = child.id();
    let api = Api {
        url,
        http: reqwest::Client::new(),
    };
    let ruled = create(
        &api,
        json!({"rules": {"api.bench.test": [{"transform": {"headers": {"Authorization": "Bearer bench"}}}]}}),
    )
    .await;
    let plain = create(&api, serde_json::Value::Null).await;
    // Each way's curl trusts one root only (the service's CA, or e2b-local's, the last of
    // the sandbox's bundle): OpenSSL's loading of a whole bundle of some 140 roots costs
    // tens of milliseconds a handshake, which would hide what is measured here.
    for sandbox in [&ruled, &plain] {
        api.upload(sandbox, "/home/user/upstream-ca.pem", ca_pem.as_bytes())
            .await;
    }
    let extract = "awk '/BEGIN CERT/{b=\"\"} {b=b $0 \"\\n\"} /END CERT/{last=b} END{printf \"%s\", last}' /etc/ssl/certs/ca-certificates.crt > /home/user/e2b-ca.pem && grep -c BEGIN /home/user/e2b-ca.pem";
    let run = api.run(&ruled, extract).await;
    assert_eq!(String::from_utf8_lossy(&run.stdout), "1\n");
    let ways = [
        (
            "intercepted",
            &ruled,
            "api.bench.test",
            "--cacert /home/user/e2b-ca.pem",
        ),
        (
            "relayed",
            &ruled,
            "plain.bench.test",
            "--cacert /home/user/upstream-ca.pem",
        ),
        (
            "direct",
            &plain,
            "plain.bench.test",
            "--cacert /home/user/upstream-ca.pem",
        ),
    ];
    let mut rows = Vec::new();
    for (name, sandbox, host, extra) in ways {
        let urls = vec![format!("https://{host}/small"); args.requests].join(" ");
        let fresh = times(
            &api,
            sandbox,
            &format!("curl -sS --http1.1 {extra} -H 'Connection: close' -o /dev/null -w '%{{time_total}}\\n' {urls}"),
        )
        .await;
        let kept = times(
            &api,
            sandbox,
            &format!("curl -sS --http1.1 {extra} -o /dev/null -w '%{{time_total}}\\n' {urls}"),
        )
        .await;
        let bytes = args.mib * 1024 * 1024;
        let before = reset_peak(pid);
        let bulk = times(
            &api,
            sandbox,
            &format!(
                "curl -sS --http1.1 {extra} -o /dev/null -o /dev/null -o /dev/null -w '%{{time_total}}\\n' https://{host}/bytes/{bytes} https://{host}/bytes/{bytes} https://{host}/bytes/{bytes}"
            ),
        )
        .await;
        let peak = status_kib(pid, "VmHWM");
        rows.push(Way {
            name,
            fresh_s: median(&fresh),
            kept_s: median(&kept[1..]),
            bulk_s: median(&bulk),
            rss_growth_kib: peak.saturating_sub(before),
        });
    }
    // End of standard input stops e2b-local, which kills its sandboxes.
    drop(child.stdin.take());
    let status = child.wait().expect("e2b-local exits");
    assert!(status.success(), "e2b-local exited with {status}");
    if args.json {
        let ways: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|way| {
                (
                    way.name.to_owned(),
                    json!({
                        "new_connection_ms": way.fresh_s * 1e3,
                        "kept_alive_ms": way.kept_s * 1e3,
                        "download_s": way.bulk_s,
                        "mib_per_s": args.mib as f64 / way.bulk_s,
                        "rss_growth_kib": way.rss_growth_kib,
                    }),
                )
            })
            .collect();
        println!(
            "{}",
            json!({"requests": args.requests, "mib": args.mib, "ways": ways})
        );
        return;
    }
    let mib = args.mib;
    println!(
        "| way | new connection (median ms) | kept-alive (median ms) | {mib} MiB (s) | MiB/s | e2b-local RSS rise (MiB) |"
    );
    println!("|---|---|---|---|---|---|");
    for way in &rows {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} |",
            way.name,
            way.fresh_s * 1e3,
            way.kept_s * 1e3,
            way.bulk_s,
            mib as f64 / way.bulk_s,
            way.rss_growth_kib as f64 / 1024.0
        );
    }
    let direct = &rows[2];
    for way in &rows[..2] {
        println!(
            "{} / direct: new connection {:.2}x, kept-alive {:.2}x, throughput {:.2}x",
            way.name,
            way.fresh_s / direct.fresh_s,
            way.kept_s / direct.kept_s,
            direct.bulk_s / way.bulk_s
        );
    }
}

/// Starts `e2b-local serve` trusting the service's CA and resolving its names; returns it
/// and its URL.
fn start_e2b_local(binary: &Path, ca_file: &Path, ip: IpAddr) -> (Child, String) {
    let mut child = Command::new(binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof"])
        .arg("--upstream-ca")
        .arg(ca_file)
        .args(["--add-host", &format!("api.bench.test:{ip}")])
        .args(["--add-host", &format!("plain.bench.test:{ip}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("e2b-local printed its URL")
            .expect("read");
        if let Some(url) = line.strip_prefix("E2B_API_URL=") {
            break url.to_owned();
        }
    };
    (child, url)
}

/// Resets the process's peak resident size to its current one (`clear_refs` 5) and
/// returns that, in KiB.
fn reset_peak(pid: u32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    status_kib(pid, "VmRSS")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

async fn create(api: &Api, network: serde_json::Value) -> Sandbox {
    let mut body = json!({"templateID": "base", "timeout": 600});
    if !network.is_null() {
        body["network"] = network;
    }
    let reply = api.post("/v2/sandboxes", &body.to_string()).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Sandbox {
        id: reply.json["sandboxID"].as_str().expect("id").to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    }
}

/// The seconds curl printed, one a line.
async fn times(api: &Api, sandbox: &Sandbox, script: &str) -> Vec<f64> {
    let run = api.run(sandbox, script).await;
    let out = String::from_utf8_lossy(&run.stdout);
    let values: Vec<f64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(
        !values.is_empty(),
        "{script}: {out} {}",
        String::from_utf8_lossy(&run.stderr)
    );
    values
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn pki(names: &[&str]) -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "bench upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf");
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        leaf_key.serialize_der(),
    ));
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .expect("cert");
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca_cert.pem(), Arc::new(server))
}

type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// `/bytes/N`: N bytes in 64 KiB frames; anything else a few bytes.
async fn serve_upstream(ip: IpAddr, tls: Arc<rustls::ServerConfig>) {
    let listener = tokio::net::TcpListener::bind((ip, 443))
        .await
        .expect("bind port 443 of the upstream address (root)");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls));
            tokio::spawn(async move {
                let Ok(io) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |request: hyper::Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(answer(request.uri().path()))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                    .await;
            });
        }
    });
}

fn answer(path: &str) -> hyper::Response<Body> {
    let Some(total) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return hyper::Response::new(
            http_body_util::Full::new(bytes::Bytes::from_static(b"ok\n")).boxed(),
        );
    };
    let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    let frames = futures::stream::unfold(total, move |left| {
        let chunk = chunk.clone();
        async move {
            (left > 0).then(|| {
                let n = left.min(chunk.len());
                (
                    Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk.slice(..n))),
                    left - n,
                )
            })
        }
    });
    let mut response = hyper::Response::new(http_body_util::StreamBody::new(frames).boxed());
    response
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, total.into());
    response
}
