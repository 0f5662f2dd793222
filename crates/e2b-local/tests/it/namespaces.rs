//! Sandboxes that see only themselves (issue 11): a PID namespace per sandbox, whose
//! pids are the ones envd reports, and with internet access off a network namespace
//! with only loopback. Where the host cannot, the admin `isolation` route says so.

use std::time::{Duration, Instant};

use e2b_local::{IsolationMode, Server, ServerConfig};
use serde_json::json;

use crate::support::{Api, Sandbox, manual_server, new_sandbox};

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The admin route's answer, which on a root host must report both namespaces.
async fn isolation(api: &Api) -> serde_json::Value {
    let reply = api.get("/_e2b_local/isolation").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json
}

/// True when this host gives sandboxes their namespaces (it must when we are root).
async fn namespaces_expected(api: &Api) -> bool {
    let report = isolation(api).await;
    if running_as_root() {
        assert_eq!(report["mode"], "mount-namespace", "{report}");
        assert_eq!(report["pidNamespace"], true, "{report}");
        assert_eq!(report["networkNamespace"], true, "{report}");
        assert_eq!(report["rootLayers"], true, "{report}");
        assert_eq!(report["missing"], json!([]), "{report}");
        true
    } else {
        assert_eq!(report["pidNamespace"], false, "{report}");
        assert!(
            !report["missing"].as_array().unwrap().is_empty(),
            "{report}"
        );
        false
    }
}

#[tokio::test]
async fn commands_see_only_their_sandbox_and_envd_reports_their_pids() {
    let server = manual_server().await;
    let api = Api::new(&server);
    if !namespaces_expected(&api).await {
        return;
    }
    let a = new_sandbox(&api).await;
    let b = new_sandbox(&api).await;
    let mut long = api.start(&a, "sleep 300", &[]).await;
    let long_pid = long.next().await.unwrap().json["event"]["start"]["pid"]
        .as_u64()
        .unwrap();

    // A sees its own command under the pid envd reported, and nothing of the host.
    let seen_in_a = api.run(&a, "ps -eo pid=,args=").await;
    let seen_in_a = String::from_utf8_lossy(&seen_in_a.stdout).into_owned();
    // `bash -l -c 'sleep 300'` until bash has exec'd `sleep 300`: same pid either way.
    assert!(
        seen_in_a.lines().any(|l| {
            let l = l.trim();
            l.starts_with(&format!("{long_pid} ")) && l.ends_with("sleep 300")
        }),
        "{seen_in_a}"
    );
    let me = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert!(
        !seen_in_a.contains(me.trim()),
        "the host shows through:\n{seen_in_a}"
    );
    assert!(seen_in_a.lines().count() <= 5, "{seen_in_a}");

    // B sees neither A's processes nor the host's.
    let seen_in_b = api.run(&b, "ps -eo pid=,args=").await;
    let seen_in_b = String::from_utf8_lossy(&seen_in_b.stdout).into_owned();
    assert!(!seen_in_b.contains("sleep 300"), "{seen_in_b}");
    assert!(!seen_in_b.contains(me.trim()), "{seen_in_b}");

    // Start, `$$`, List and SendSignal agree on the sandbox's pids.
    let shell = api.run(&a, "echo $$").await;
    let inside: u64 = String::from_utf8_lossy(&shell.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(shell.pid, inside);
    let listed = api.rpc(&a, "process.Process/List", json!({})).await;
    let pids = listed.listed_pids();
    assert_eq!(pids, vec![long_pid]);
    let killed = api
        .rpc(
            &a,
            "process.Process/SendSignal",
            json!({"process": {"pid": long_pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(killed.status, 200, "{}", killed.text);
    let mut end = None;
    while let Some(frame) = long.next().await {
        if let Some(e) = frame.json["event"].get("end") {
            end = Some(e.clone());
        }
    }
    assert_eq!(end.unwrap()["status"], "signal: killed");
    server.shutdown().await.unwrap();
}

/// Host pids whose command line is exactly `sleep <arg>`.
fn host_pids_running_sleep(arg: &str) -> Vec<u32> {
    let wanted = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted.as_bytes())
        })
        .collect()
}

/// Polls (bounded) until no `sleep <arg>` is left on the host; kills leftovers on failure.
async fn assert_gone(arg: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = host_pids_running_sleep(arg);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for pid in &left {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
            panic!("{what}: processes survived: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pause_and_kill_reach_processes_that_left_the_group_and_the_tag() {
    let server = manual_server().await;
    let api = Api::new(&server);
    if !namespaces_expected(&api).await {
        return;
    }
    for action in ["kill", "pause"] {
        let sandbox = new_sandbox(&api).await;
        // A new session and an empty environment: no process group, no E2B_SANDBOX_ID.
        let unique = format!(
            "86399.{}",
            std::process::id() * 10 + u32::from(action == "pause")
        );
        let started = api
            .run(
                &sandbox,
                &format!("env -i setsid sleep {unique} </dev/null >/dev/null 2>&1 &"),
            )
            .await;
        assert_eq!(started.end["exited"], true, "{:?}", started.end);
        let deadline = Instant::now() + Duration::from_secs(5);
        while host_pids_running_sleep(&unique).is_empty() {
            assert!(
                Instant::now() < deadline,
                "the escaped process never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reply = if action == "kill" {
            api.delete(&format!("/sandboxes/{}", sandbox.id)).await
        } else {
            api.post(
                &format!("/sandboxes/{}/pause", sandbox.id),
                r#"{"memory":false}"#,
            )
            .await
        };
        assert_eq!(reply.status, 204, "{action}: {}", reply.text);
        assert_gone(&unique, action).await;
    }
    server.shutdown().await.unwrap();
}

/// `(ppid, start time)` of a live host process; `None` once it is gone or a zombie
/// (a zombie runs nothing; it waits for whoever adopted it to reap it).
fn ppid_and_start(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every live descendant of `root` as `(pid, start time)`, so a recycled pid is not
/// mistaken for a survivor.
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| ppid_and_start(pid).map(|(ppid, start)| (pid, ppid, start)))
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(pid, ppid, start) in &all {
            if ppid == parent {
                found.push((pid, start));
                parents.push(pid);
            }
        }
    }
    found
}

fn cmdline(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
}

#[tokio::test]
async fn no_process_of_a_sigkilled_server_survives_it() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    // A state directory of the test's, or the killed server would leave its own behind.
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_e2b-local"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            crate::support::KEY,
        ])
        .arg("--state-dir")
        .arg(state.path())
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
    // Held to the end: if the test fails early, the pipe closes and the server exits
    // instead of outliving the test.
    let _stdin = child.stdin.take();
    let server_pid = child.id();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .expect("URL line")
        .expect("utf-8");
    let api = Api {
        url: line.strip_prefix("E2B_API_URL=").unwrap().to_owned(),
        http: reqwest::Client::new(),
    };
    if !namespaces_expected(&api).await {
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    // The first command starts the sandbox's init; this one leaves a process behind in
    // its namespace that left the command's group and environment.
    let sandbox = new_sandbox(&api).await;
    let unique = format!("86398.{}", std::process::id());
    let started = api
        .run(
            &sandbox,
            &format!("env -i setsid sleep {unique} </dev/null >/dev/null 2>&1 &"),
        )
        .await;
    assert_eq!(started.end["exited"], true, "{:?}", started.end);
    let escaped = format!("sleep\0{unique}\0");
    let deadline = Instant::now() + Duration::from_secs(5);
    let before = loop {
        let before = descendants(server_pid);
        if before
            .iter()
            .any(|&(p, _)| cmdline(p) == escaped.as_bytes())
        {
            break before;
        }
        assert!(
            Instant::now() < deadline,
            "the escaped process never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        before
            .iter()
            .any(|&(p, _)| cmdline(p) == b"sleep\0infinity\0"),
        "no namespace init among the server's processes"
    );

    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    assert_eq!(unsafe { libc::kill(server_pid as i32, libc::SIGKILL) }, 0);
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u32> = before
            .iter()
            .filter(|&&(pid, start)| ppid_and_start(pid).is_some_and(|(_, s)| s == start))
            .map(|&(pid, _)| pid)
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for pid in &left {
                // SAFETY: as above; these are the test's leftovers.
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
            let named: Vec<String> = left
                .iter()
                .map(|&p| format!("{p} {:?}", String::from_utf8_lossy(&cmdline(p))))
                .collect();
            panic!("processes of the killed server survived: {named:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Interface names in a `/proc/net/dev` listing.
fn interfaces(dev: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(dev)
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_owned()))
        .collect()
}

#[tokio::test]
async fn internet_access_off_leaves_only_loopback() {
    // contract: X6 (the server's half: a sandbox created offline has no route out)
    let server = manual_server().await;
    let api = Api::new(&server);
    if !namespaces_expected(&api).await {
        return;
    }
    let created = api
        .post(
            "/v2/sandboxes",
            r#"{"templateID":"base","timeout":60,"allow_internet_access":false}"#,
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let offline = Sandbox {
        id: created.json["sandboxID"].as_str().unwrap().to_owned(),
        token: created.json["envdAccessToken"].as_str().map(str::to_owned),
    };
    let dev = api.run(&offline, "cat /proc/net/dev").await;
    assert_eq!(interfaces(&dev.stdout), vec!["lo".to_owned()]);
    let routes = api.run(&offline, "cat /proc/net/route").await;
    assert_eq!(
        String::from_utf8_lossy(&routes.stdout).lines().count(),
        1,
        "no route out: {}",
        String::from_utf8_lossy(&routes.stdout)
    );
    // Loopback is up: a listener and a client inside the sandbox talk.
    let talk = api
        .run(
            &offline,
            "if command -v python3 >/dev/null; then python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"up\")'; else echo up; fi",
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&talk.stdout).trim(),
        "up",
        "{}",
        String::from_utf8_lossy(&talk.stderr)
    );

    // Internet access on (the default) keeps the host's network.
    let host = interfaces(&std::fs::read("/proc/net/dev").unwrap());
    let online = new_sandbox(&api).await;
    let dev = api.run(&online, "cat /proc/net/dev").await;
    assert_eq!(interfaces(&dev.stdout), host);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn path_mapping_says_it_has_no_namespaces() {
    let mut config = ServerConfig::loopback();
    config.isolation = IsolationMode::PathMapping;
    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    let report = isolation(&api).await;
    assert_eq!(report["mode"], "path-mapping");
    assert_eq!(report["pidNamespace"], false);
    assert_eq!(report["networkNamespace"], false);
    assert_eq!(report["rootLayers"], false);
    assert!(
        !report["missing"].as_array().unwrap().is_empty(),
        "{report}"
    );
    // Commands are host processes: the pid envd reports is the host's.
    let sandbox = new_sandbox(&api).await;
    let shell = api.run(&sandbox, "echo $$").await;
    let pid: u64 = String::from_utf8_lossy(&shell.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(shell.pid, pid);
    server.shutdown().await.unwrap();
}
