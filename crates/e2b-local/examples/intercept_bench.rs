//! What header rules cost: curl in a sandbox against one HTTPS service on a loopback
//! address, reached three ways in one run: intercepted (a name with `network.rules`),
//! relayed (another name of the same sandbox: by the proxy, not terminated) and direct (a
//! sandbox without rules: no filter, no proxy). Needs root (namespaces and the filter).
//!
//!   cargo run --release -p e2b-local --example intercept_bench [REQUESTS] [MIB]
//!
//! Prints, per way: the median time of a request on a new connection (TCP + TLS + request),
//! on a kept-alive connection, and of downloading MIB MiB (three times, kept alive); then
//! the ratios against direct. Each curl trusts one root, so the figures are the proxy's,
//! and asks for HTTP/1.1 (the service's protocol; over HTTP/2 `Connection: close` would
//! not open a new connection).
#![allow(clippy::print_stdout, missing_docs)]

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::net::IpAddr;
use std::sync::Arc;

use http_body_util::BodyExt as _;
use serde_json::json;

use support::{Api, Sandbox};

const UPSTREAM_IP: &str = "127.62.0.1";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let requests: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(30);
    let mib: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(requests, mib));
}

async fn run(requests: usize, mib: usize) {
    let ip: IpAddr = UPSTREAM_IP.parse().expect("ip");
    let (ca_pem, server_tls) = pki(&["api.bench.test", "plain.bench.test"]);
    serve_upstream(ip, server_tls).await;
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).expect("write");
    let mut config = e2b_local::ServerConfig::loopback();
    config.upstream_ca = vec![ca_file];
    config.add_hosts = vec![
        ("api.bench.test".to_owned(), ip),
        ("plain.bench.test".to_owned(), ip),
    ];
    let server = e2b_local::Server::start(config).await.expect("server");
    let api = Api::new(&server);
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
    for (way, sandbox, host, extra) in ways {
        let urls = vec![format!("https://{host}/small"); requests].join(" ");
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
        let bytes = mib * 1024 * 1024;
        let bulk = times(
            &api,
            sandbox,
            &format!(
                "curl -sS --http1.1 {extra} -o /dev/null -o /dev/null -o /dev/null -w '%{{time_total}}\\n' https://{host}/bytes/{bytes} https://{host}/bytes/{bytes} https://{host}/bytes/{bytes}"
            ),
        )
        .await;
        rows.push((way, median(&fresh), median(&kept[1..]), median(&bulk)));
    }
    println!(
        "| way | new connection (median ms) | kept-alive (median ms) | {mib} MiB (s) | MiB/s |"
    );
    println!("|---|---|---|---|---|");
    for (way, fresh, kept, bulk) in &rows {
        println!(
            "| {way} | {:.2} | {:.2} | {bulk:.2} | {:.0} |",
            fresh * 1e3,
            kept * 1e3,
            mib as f64 / bulk
        );
    }
    let (_, fresh0, kept0, bulk0) = rows[2];
    for (way, fresh, kept, bulk) in &rows[..2] {
        println!(
            "{way} / direct: new connection {:.2}x, kept-alive {:.2}x, download time {:.2}x",
            fresh / fresh0,
            kept / kept0,
            bulk / bulk0
        );
    }
    server.shutdown().await.expect("shutdown");
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
