//! Egress rules enforced: commands of a sandbox with rules reach only what the rules allow.
//! The internet is played by listeners of this test on loopback addresses other than
//! 127.0.0.1 (which is the sandbox's own and always reachable); nothing leaves the host.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this server enforces rules: it must as root; otherwise rules are refused.
async fn enforced(api: &Api) -> bool {
    let report = api.get("/_e2b_local/isolation").await.json;
    if running_as_root() {
        assert_eq!(report["egressRules"], true, "{report}");
        true
    } else {
        let reply = create_with(api, json!({"denyOut": ["0.0.0.0/0"]})).await;
        assert_eq!(reply.status, 400, "{}", reply.text);
        assert!(reply.text.contains("cannot be enforced"), "{}", reply.text);
        false
    }
}

async fn create_with(api: &Api, network: Value) -> Reply {
    api.post(
        "/v2/sandboxes",
        &json!({"templateID": "base", "timeout": 300, "network": network}).to_string(),
    )
    .await
}

async fn sandbox_with(api: &Api, network: Value) -> Sandbox {
    let reply = create_with(api, network).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    Sandbox {
        id: reply.json["sandboxID"].as_str().unwrap().to_owned(),
        token: reply.json["envdAccessToken"].as_str().map(str::to_owned),
    }
}

async fn update(api: &Api, sandbox: &Sandbox, network: Value) {
    let reply = api
        .rest(
            Method::PUT,
            &format!("/sandboxes/{}/network", sandbox.id),
            Some(&network.to_string()),
        )
        .await;
    assert_eq!(reply.status, 204, "{}", reply.text);
}

/// A stand-in for a host on the internet: a listener that records the first bytes of
/// every connection it accepts.
struct Host {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Host {
    fn start(ip: &str, port: u16) -> Host {
        let listener = TcpListener::bind((ip, port)).expect("bind a loopback address");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).unwrap_or(0);
                record.lock().unwrap().push(buf[..n].to_vec());
                // Answered only once recorded, so a client that read the answer knows.
                use std::io::Write;
                let _ = if buf[..n].starts_with(b"GET ") {
                    stream.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nreached",
                    )
                } else if buf[..n].ends_with(b"\n") {
                    stream.write_all(b"ack\n")
                } else {
                    Ok(())
                };
            }
        });
        Host { addr, seen }
    }

    fn seen(&self) -> Vec<Vec<u8>> {
        self.seen.lock().unwrap().clone()
    }
}

/// A shell line that connects to `addr`, sends `text` and waits for the host's `ack`,
/// printing `ok <text> ack`, or the error bash reports.
fn dial(addr: SocketAddr, text: &str) -> String {
    format!(
        "(exec 3<>/dev/tcp/{}/{} && printf '{text}\\n' >&3 && read -r ack <&3 && echo \"ok {text} $ack\")",
        addr.ip(),
        addr.port()
    )
}

async fn sh(api: &Api, sandbox: &Sandbox, script: &str) -> (String, String) {
    let run = api.run(sandbox, script).await;
    (
        String::from_utf8_lossy(&run.stdout).into_owned(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

#[tokio::test]
async fn only_allowed_addresses_are_reached_and_allow_beats_deny() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let allowed = Host::start("127.61.0.2", 0);
    let denied = Host::start("127.61.0.3", 0);
    let in_block = Host::start("127.61.1.5", 0);
    let own = Host::start("127.0.0.1", 0);
    let sandbox = sandbox_with(
        &api,
        json!({"allowOut": ["127.61.0.2", "127.61.1.0/24"], "denyOut": ["0.0.0.0/0", "127.61.1.5"]}),
    )
    .await;
    let script = [
        dial(allowed.addr, "a"),
        dial(denied.addr, "d"),
        dial(in_block.addr, "b"),
        dial(own.addr, "o"),
    ]
    .join("; ");
    let (out, err) = sh(&api, &sandbox, &script).await;
    assert_eq!(out, "ok a ack\nok b ack\nok o ack\n", "stderr: {err}");
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(allowed.seen(), vec![b"a\n".to_vec()]);
    // Allow beats deny: the block's allow wins over the address's own deny entry.
    assert_eq!(in_block.seen(), vec![b"b\n".to_vec()]);
    // Refused before any packet: the listener never accepted anything.
    assert!(denied.seen().is_empty());
    // The refusal is in the sandbox's log, naming the destination.
    let logs = api
        .get(&format!("/v2/sandboxes/{}/logs?level=warn", sandbox.id))
        .await;
    assert_eq!(logs.status, 200, "{}", logs.text);
    let refused = logs.json["logs"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{}", logs.text);
    assert_eq!(refused[0]["fields"]["destination"], "127.61.0.3");
    assert_eq!(refused[0]["fields"]["port"], denied.addr.port().to_string());
    assert_eq!(refused[0]["level"], "warn");

    // e2b-local's own API is a host elsewhere (E2B's is on the internet), not the
    // sandbox's loopback: the sandbox cannot reach it to lift its own rules.
    let port = server.addr().port();
    let lift = format!(
        "curl -s -m 5 -X PUT -H 'X-API-Key: any' -d '{{}}' http://127.0.0.1:{port}/sandboxes/{}/network || echo refused",
        sandbox.id
    );
    let (out, _) = sh(&api, &sandbox, &lift).await;
    assert_eq!(out, "refused\n");
    assert_eq!(
        api.get(&format!("/sandboxes/{}", sandbox.id)).await.json["network"]["denyOut"],
        json!(["0.0.0.0/0", "127.61.1.5"])
    );

    // A sandbox without rules is not filtered at all.
    let open = new_sandbox(&api).await;
    let (out, _) = sh(&api, &open, &dial(denied.addr, "free")).await;
    assert_eq!(out, "ok free ack\n");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_update_applies_to_the_next_connection() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let host = Host::start("127.61.3.2", 0);
    let sandbox = sandbox_with(&api, json!({"denyOut": ["0.0.0.0/0"]})).await;
    let (out, _) = sh(&api, &sandbox, &dial(host.addr, "before")).await;
    assert_eq!(out, "");
    update(
        &api,
        &sandbox,
        json!({"allowOut": ["127.61.3.2"], "denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    let (out, err) = sh(&api, &sandbox, &dial(host.addr, "allowed")).await;
    assert_eq!(out, "ok allowed ack\n", "{err}");
    // Replace semantics: rules left out are cleared, so everything is reachable again...
    update(&api, &sandbox, json!({})).await;
    let (out, _) = sh(&api, &sandbox, &dial(host.addr, "cleared")).await;
    assert_eq!(out, "ok cleared ack\n");
    // ...until a deny comes back (allow_internet_access=false is denyOut 0.0.0.0/0).
    update(&api, &sandbox, json!({"allow_internet_access": false})).await;
    let (out, _) = sh(&api, &sandbox, &dial(host.addr, "after")).await;
    assert_eq!(out, "");
    assert_eq!(
        host.seen(),
        vec![b"allowed\n".to_vec(), b"cleared\n".to_vec()]
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_running_command_is_held_to_rules_set_after_it_started() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let host = Host::start("127.61.4.2", 0);
    let sandbox = sandbox_with(&api, json!({})).await;
    // The command waits for a file, then dials: the rules change in between.
    let script = format!(
        "while [ ! -e /tmp/go ]; do sleep 0.05; done; {}",
        dial(host.addr, "late")
    );
    let mut stream = api.start(&sandbox, &script, &[]).await;
    update(&api, &sandbox, json!({"denyOut": ["127.61.4.0/24"]})).await;
    assert_eq!(api.upload(&sandbox, "/tmp/go", b"").await.status, 200);
    let run = stream.collect().await;
    assert_eq!(String::from_utf8_lossy(&run.stdout), "");
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("Connection refused"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(host.seen().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn domains_are_matched_by_host_header_and_tls_sni() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let http = Host::start("127.61.2.2", 80);
    let tls = Host::start("127.61.2.2", 443);
    let sandbox = sandbox_with(
        &api,
        json!({"allowOut": ["allowed.test", "*.wild.test"], "denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    let curl = |host: &str| {
        format!("curl -s -m 10 -H 'Host: {host}' http://127.61.2.2/ || echo ' failed {host}'")
    };
    let (out, _) = sh(&api, &sandbox, &curl("allowed.test")).await;
    assert_eq!(out, "reached");
    let (out, _) = sh(&api, &sandbox, &curl("other.test")).await;
    assert_eq!(out, " failed other.test\n");
    let seen = http.seen();
    assert_eq!(seen.len(), 1, "only the allowed request arrived");
    assert!(String::from_utf8_lossy(&seen[0]).contains("Host: allowed.test"));

    // TLS: the name is the ClientHello's SNI (the proxy does not terminate TLS).
    let hello = |name: &str| {
        format!(
            "openssl s_client -connect 127.61.2.2:443 -servername {name} </dev/null >/dev/null 2>&1; echo done"
        )
    };
    let (out, _) = sh(&api, &sandbox, &hello("api.wild.test")).await;
    assert_eq!(out, "done\n");
    let (out, _) = sh(&api, &sandbox, &hello("wild.test")).await;
    assert_eq!(out, "done\n");
    let seen = tls.seen();
    assert_eq!(seen.len(), 1, "only the allowed ClientHello arrived");
    assert_eq!(seen[0][0], 0x16, "a TLS handshake record");
    assert!(seen[0].windows(13).any(|w| w == b"api.wild.test"));

    // Other ports follow the address rules only: a name does not open them.
    let other = Host::start("127.61.2.2", 0);
    let (out, _) = sh(&api, &sandbox, &dial(other.addr, "x")).await;
    assert_eq!(out, "");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn what_bypasses_connect_is_refused_under_rules() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let sandbox = sandbox_with(&api, json!({"denyOut": ["10.0.0.0/8"]})).await;
    // UDP needs no connect, so datagram sockets are refused; DNS asks over TCP.
    let (out, err) = sh(
        &api,
        &sandbox,
        "echo x > /dev/udp/127.61.5.2/9 && echo sent; grep -c use-vc /etc/resolv.conf",
    )
    .await;
    assert_eq!(out, "1\n", "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    server.shutdown().await.unwrap();
}

/// The Python a sandbox runs to try each way out; prints one word per attempt.
const ROUTES_OUT: &str = r#"
import ctypes, errno, socket, sys
allowed, denied = int(sys.argv[1]), int(sys.argv[2])
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def v6_allowed():
    s = socket.socket(socket.AF_INET6)
    s.settimeout(5)  # non-blocking underneath: EINPROGRESS, then the answer
    s.connect(("::ffff:127.61.6.2", allowed))
    s.sendall(b"v6\n")
    assert s.recv(4) == b"ack\n"
libc = ctypes.CDLL(None, use_errno=True)
def io_uring():
    if libc.syscall(425, 1, ctypes.create_string_buffer(120)) < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
print(
    attempt(lambda: socket.socket(socket.AF_INET6).connect(("::ffff:127.61.6.3", denied))),
    attempt(v6_allowed),
    attempt(io_uring),
    attempt(lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, ("127.61.6.3", denied))),
    attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
)
"#;

#[tokio::test]
async fn ipv6_non_blocking_sockets_and_other_routes_out_follow_the_rules() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let allowed = Host::start("127.61.6.2", 0);
    let denied = Host::start("127.61.6.3", 0);
    let sandbox = sandbox_with(
        &api,
        json!({"allowOut": ["127.61.6.2"], "denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    assert_eq!(
        api.upload(&sandbox, "/home/user/routes.py", ROUTES_OUT.as_bytes())
            .await
            .status,
        200
    );
    let script = format!(
        "/usr/bin/python3 /home/user/routes.py {} {}",
        allowed.addr.port(),
        denied.addr.port()
    );
    // As root, who could open a packet socket without the filter.
    let mut stream = api
        .start(&sandbox, &script, &[("authorization", "Basic cm9vdDo=")])
        .await;
    let run = stream.collect().await;
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "ECONNREFUSED ok EPERM ENOTSUP EAFNOSUPPORT\n",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(allowed.seen(), vec![b"v6\n".to_vec()]);
    assert!(denied.seen().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_update_that_cannot_hold_every_process_is_a_409_saying_why() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let host = Host::start("127.61.7.2", 0);
    // Created without rules: its commands run unfiltered, so rules cannot come while one runs.
    let plain = new_sandbox(&api).await;
    // No login shell: a SIGKILL landing while its profile runs would orphan the profile's
    // own children, which run unfiltered too and would rightly keep the update refused.
    let body = json!({"process": {"cmd": "/bin/sleep", "args": ["30"]}, "stdin": false});
    let mut running = api.start_request(&plain, &body, &[]).await;
    let path = format!("/sandboxes/{}/network", plain.id);
    let deny = r#"{"denyOut": ["0.0.0.0/0"]}"#;
    let reply = api.rest(Method::PUT, &path, Some(deny)).await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert!(reply.text.contains("run unfiltered"), "{}", reply.text);
    let first = running.next().await.expect("start event");
    let pid = first.json["event"]["start"]["pid"].as_u64().unwrap();
    let killed = api
        .rpc(
            &plain,
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(killed.status, 200, "{}", killed.text);
    while running.next().await.is_some() {}
    // Nothing runs any more: the rules hold for every command from now on.
    let reply = api.rest(Method::PUT, &path, Some(deny)).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    let (out, _) = sh(&api, &plain, &dial(host.addr, "x")).await;
    assert_eq!(out, "");

    // Internet off without rules is a loopback-only network namespace: it stays closed.
    let offline = api
        .post(
            "/v2/sandboxes",
            r#"{"templateID": "base", "timeout": 60, "allow_internet_access": false}"#,
        )
        .await;
    let id = offline.json["sandboxID"].as_str().unwrap();
    let path = format!("/sandboxes/{id}/network");
    let reply = api
        .rest(Method::PUT, &path, Some(r#"{"allowOut": ["127.61.7.2"]}"#))
        .await;
    assert_eq!(reply.status, 409, "{}", reply.text);
    assert!(reply.text.contains("denyOut"), "{}", reply.text);
    let reply = api.rest(Method::PUT, &path, Some(deny)).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
    assert!(host.seen().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn rules_hold_after_a_pause_and_a_restart() {
    // contract: X11
    let dir = tempfile::tempdir().unwrap();
    let mut config = e2b_local::ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = e2b_local::Clock::manual(t0());
    let server = e2b_local::Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let allowed = Host::start("127.61.8.2", 0);
    let denied = Host::start("127.61.8.3", 0);
    let sandbox = sandbox_with(
        &api,
        json!({"allowOut": ["127.61.8.2"], "denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    let path = format!("/sandboxes/{}", sandbox.id);
    assert_eq!(api.post(&format!("{path}/pause"), "{}").await.status, 204);
    server.shutdown().await.unwrap();

    let server = e2b_local::Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let resumed = api
        .post(&format!("/v2{path}/connect"), r#"{"timeout": 60}"#)
        .await;
    assert_eq!(resumed.status, 201, "{}", resumed.text);
    let sandbox = Sandbox {
        id: sandbox.id,
        token: resumed.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let script = [dial(allowed.addr, "a"), dial(denied.addr, "d")].join("; ");
    let (out, err) = sh(&api, &sandbox, &script).await;
    assert_eq!(out, "ok a ack\n", "{err}");
    assert!(denied.seen().is_empty());
    assert_eq!(
        api.get(&path).await.json["network"]["allowOut"],
        json!(["127.61.8.2"])
    );
    server.shutdown().await.unwrap();
}

/// The Python a sandbox runs to connect from a thread other than the main one (the
/// notification names the thread, not the process); prints one word per attempt.
const FROM_A_THREAD: &str = r#"
import errno, socket, sys, threading
allowed, denied = int(sys.argv[1]), int(sys.argv[2])
results = []
def attempt(ip, port, text):
    try:
        s = socket.socket()
        s.connect((ip, port))
        s.sendall(text + b"\n")
        assert s.recv(4) == b"ack\n"
        results.append("ok")
    except OSError as e:
        results.append(errno.errorcode[e.errno])
def both():
    attempt("127.61.9.2", allowed, b"thread")
    attempt("127.61.9.3", denied, b"denied")
thread = threading.Thread(target=both)
thread.start()
thread.join()
print(*results)
"#;

#[tokio::test]
async fn a_connect_from_a_second_thread_is_judged_as_any_other() {
    // contract: X11
    let server = manual_server().await;
    let api = Api::new(&server);
    if !enforced(&api).await {
        return;
    }
    let allowed = Host::start("127.61.9.2", 0);
    let denied = Host::start("127.61.9.3", 0);
    let sandbox = sandbox_with(
        &api,
        json!({"allowOut": ["127.61.9.2"], "denyOut": ["0.0.0.0/0"]}),
    )
    .await;
    assert_eq!(
        api.upload(&sandbox, "/home/user/thread.py", FROM_A_THREAD.as_bytes())
            .await
            .status,
        200
    );
    let script = format!(
        "/usr/bin/python3 /home/user/thread.py {} {}",
        allowed.addr.port(),
        denied.addr.port()
    );
    let (out, err) = sh(&api, &sandbox, &script).await;
    assert_eq!(out, "ok ECONNREFUSED\n", "{err}");
    assert_eq!(allowed.seen(), vec![b"thread\n".to_vec()]);
    assert!(denied.seen().is_empty());
    server.shutdown().await.unwrap();
}
