//! Pausing as E2B pauses: keeping memory (the default) freezes the sandbox's processes and
//! the resume lets them go on, same pids and same boot id; keeping the files only
//! (`memory: false`, or `autoPauseMemory: false` at the lease end) kills them and the
//! resume is a fresh boot with a new boot id. No sleeping to wait for an outcome: every
//! wait polls an observable condition with a bounded deadline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use e2b_local::{Clock, IsolationMode, Server, ServerConfig};
use serde_json::{Value, json};

use crate::support::{Api, FrameStream, Sandbox, manual_server, new_sandbox, t0};

/// Appends 1, 2, 3, ... to `~/counter` and prints each, one every 20 ms (`~` is the
/// sandbox's home under every isolation, `/tmp` only under a mount namespace).
const COUNTER_LOOP: &str =
    r#"i=0; while :; do i=$((i+1)); echo "$i" >> "$HOME/counter"; echo "$i"; sleep 0.02; done"#;

/// The deadline of every wait for something that should happen.
const WAIT: Duration = Duration::from_secs(20);

/// A server on the manual clock with each isolation: the host's best (a mount and PID
/// namespace as root) and path mapping (what a server that is not root gets).
async fn servers() -> Vec<Server> {
    let mut servers = Vec::new();
    for isolation in [IsolationMode::Auto, IsolationMode::PathMapping] {
        let mut config = ServerConfig::loopback();
        config.clock = Clock::manual(t0());
        config.isolation = isolation;
        servers.push(Server::start(config).await.expect("server starts"));
    }
    servers
}

/// The host path of a file in a sandbox's home.
fn home_file(server: &Server, id: &str, name: &str) -> PathBuf {
    server.sandbox_home(id).join(name)
}

/// The numbers written to `~/counter` so far, read on the host (also while paused).
fn counted(server: &Server, id: &str) -> Vec<u64> {
    std::fs::read_to_string(home_file(server, id, "counter"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn last_count(server: &Server, id: &str) -> u64 {
    counted(server, id).last().copied().unwrap_or(0)
}

/// Polls `condition` until it holds, failing with `what` after [`WAIT`].
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The host pids of the live processes whose environment names the sandbox (every
/// command carries `E2B_SANDBOX_ID`), with their state letter.
fn sandbox_processes(id: &str) -> Vec<(u32, char)> {
    let needle = format!("E2B_SANDBOX_ID={id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        })
        .filter_map(|pid| Some((pid, state(pid)?)))
        .filter(|(_, state)| *state != 'Z')
        .collect()
}

/// The state letter of a host process (`None` once it is gone).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The pid the start event reports.
async fn started_pid(stream: &mut FrameStream) -> u64 {
    let first = stream.next().await.expect("start frame");
    first.json["event"]["start"]["pid"]
        .as_u64()
        .expect("first event is start")
}

/// Reads `stream` to its end: it must break off (the connection reset), with no `end`
/// event and no end-stream frame, as envd's streams do when the VM goes.
async fn assert_breaks_off(stream: &mut FrameStream) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let broken = loop {
        let next = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .expect("the stream breaks off at the pause");
        match next {
            Ok(Some(frame)) => {
                assert!(frame.flags & 2 == 0, "end-stream frame on pause");
                assert!(
                    frame.json["event"].get("end").is_none(),
                    "end event on pause: {}",
                    frame.json
                );
            }
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    assert!(
        broken.is_some(),
        "the stream ended cleanly instead of breaking off"
    );
}

/// The sandbox's boot id as `/files` serves it, checked to be in Linux's format.
async fn boot_id(api: &Api, sandbox: &Sandbox) -> String {
    let (status, body) = api
        .download(sandbox, "/proc/sys/kernel/random/boot_id")
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    let id = text.trim_end().to_owned();
    assert_uuid(&id);
    id
}

/// A random (version 4) UUID, lowercase hex with dashes, as the kernel writes boot ids.
fn assert_uuid(id: &str) {
    let groups: Vec<&str> = id.split('-').collect();
    assert_eq!(
        groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
        vec![8, 4, 4, 4, 12],
        "{id}"
    );
    assert!(
        id.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "{id}"
    );
    assert!(groups[2].starts_with('4'), "{id}");
    assert!(matches!(groups[3].as_bytes()[0], b'8'..=b'b'), "{id}");
}

/// Whether commands run in a mount namespace (where the boot id is bound for them).
async fn mount_namespace(api: &Api) -> bool {
    let report = api.get("/_e2b_local/isolation").await;
    assert_eq!(report.status, 200, "{}", report.text);
    report.json["mode"] == "mount-namespace"
}

/// A `WatchDir` stream of the sandbox's home, past its `start`.
async fn watch_home(api: &Api, sandbox: &Sandbox) -> FrameStream {
    let response = api
        .envd(
            sandbox,
            reqwest::Method::POST,
            "/filesystem.Filesystem/WatchDir",
        )
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(crate::support::envelope(&json!({"path": "~"})))
        .send()
        .await
        .expect("watch");
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = FrameStream::new(response);
    let start = stream.next().await.expect("start frame");
    assert_eq!(start.json, json!({"start": {}}));
    stream
}

/// The pids `Process/List` reports.
async fn listed(api: &Api, sandbox: &Sandbox) -> Vec<u64> {
    let reply = api.rpc(sandbox, "process.Process/List", json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.listed_pids()
}

async fn pause(api: &Api, id: &str, body: &str) {
    let reply = api.post(&format!("/sandboxes/{id}/pause"), body).await;
    assert_eq!(reply.status, 204, "{}", reply.text);
}

async fn resume(api: &Api, id: &str) {
    let reply = api
        .post(&format!("/sandboxes/{id}/resume"), r#"{"timeout":300}"#)
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
}

/// Asserts every process of the sandbox is stopped, and that the counter stands still for
/// 25 of its periods (checked by reading it again and again over that time).
async fn assert_frozen(server: &Server, id: &str) {
    let procs = sandbox_processes(id);
    assert!(!procs.is_empty(), "the paused sandbox's processes are gone");
    assert!(
        procs.iter().all(|(_, state)| *state == 'T'),
        "not every process is stopped: {procs:?}"
    );
    let frozen_at = last_count(server, id);
    let window = Instant::now() + Duration::from_millis(500);
    while Instant::now() < window {
        assert_eq!(
            last_count(server, id),
            frozen_at,
            "the counter went on while paused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stdout numbers of a re-attached stream, until one above `above` arrives.
async fn reattach_and_read_past(api: &Api, sandbox: &Sandbox, pid: u64, above: u64) -> u64 {
    let response = api
        .envd(sandbox, reqwest::Method::POST, "/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(crate::support::envelope(&json!({"process": {"pid": pid}})))
        .send()
        .await
        .expect("connect");
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = FrameStream::new(response);
    assert_eq!(started_pid(&mut stream).await, pid);
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "no output past {above} after the resume"
        );
        let frame = stream.next().await.expect("the process goes on");
        let Some(data) = frame.json["event"]["data"]["stdout"].as_str() else {
            continue;
        };
        let text = String::from_utf8(STANDARD.decode(data).unwrap()).unwrap();
        if let Some(n) = text.lines().filter_map(|l| l.parse::<u64>().ok()).max()
            && n > above
        {
            return n;
        }
    }
}

#[tokio::test]
async fn a_pause_that_keeps_memory_freezes_processes_and_the_resume_lets_them_go_on() {
    // contract: L18 (a pause keeps memory by default: frozen, then going on, same boot id)
    for server in servers().await {
        memory_pause_goes_on(server).await;
    }
}

async fn memory_pause_goes_on(server: Server) {
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = sandbox.id.clone();
    let boot_before = boot_id(&api, &sandbox).await;
    let mut stream = api.start(&sandbox, COUNTER_LOOP, &[]).await;
    let pid = started_pid(&mut stream).await;
    wait_until("the loop counts", || last_count(&server, &id) >= 3).await;
    let mut watch = watch_home(&api, &sandbox).await;

    pause(&api, &id, "").await;
    assert_breaks_off(&mut stream).await;
    assert_breaks_off(&mut watch).await;
    assert_frozen(&server, &id).await;
    let frozen_at = last_count(&server, &id);
    assert_eq!(
        api.rpc(&sandbox, "process.Process/List", json!({}))
            .await
            .status,
        502,
        "envd is paused with the sandbox"
    );

    resume(&api, &id).await;
    assert_eq!(listed(&api, &sandbox).await, vec![pid], "the same process");
    wait_until("the loop counts on", || {
        last_count(&server, &id) > frozen_at + 2
    })
    .await;
    let numbers = counted(&server, &id);
    assert_eq!(
        numbers,
        (1..=numbers.len() as u64).collect::<Vec<_>>(),
        "the count went on where it stood, never started over"
    );
    // What it prints after the resume reaches a client that re-attaches, and what it
    // writes reaches later commands.
    let seen = reattach_and_read_past(&api, &sandbox, pid, frozen_at).await;
    assert!(seen > frozen_at);
    let tail = api.run(&sandbox, "tail -n 1 ~/counter").await;
    let tail: u64 = String::from_utf8(tail.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(tail > frozen_at, "{tail} after {frozen_at}");

    assert_eq!(boot_id(&api, &sandbox).await, boot_before, "the same boot");
    if mount_namespace(&api).await {
        let read = api
            .run(&sandbox, "cat /proc/sys/kernel/random/boot_id")
            .await;
        assert_eq!(String::from_utf8(read.stdout).unwrap().trim(), boot_before);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn output_pipes_are_drained_after_a_resume_whoever_reads() {
    // contract: L18 (a thawed process never blocks on a pipe nobody reads any more)
    for server in servers().await {
        pipes_are_drained(server).await;
    }
}

async fn pipes_are_drained(server: Server) {
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = sandbox.id.clone();
    // After the resume (its go file), it prints 4 MB, far more than a pipe holds, to a
    // stream that the pause broke off, then says it is done.
    let mut stream = api
        .start(
            &sandbox,
            r#"touch "$HOME/waiting"; while [ ! -e "$HOME/go" ]; do sleep 0.02; done; head -c 4000000 /dev/zero; touch "$HOME/drained""#,
            &[],
        )
        .await;
    let pid = started_pid(&mut stream).await;
    wait_until("it waits", || home_file(&server, &id, "waiting").exists()).await;

    pause(&api, &id, r#"{"memory":true}"#).await;
    assert_breaks_off(&mut stream).await;
    resume(&api, &id).await;
    assert_eq!(listed(&api, &sandbox).await, vec![pid]);
    assert_eq!(api.upload(&sandbox, "go", b"").await.status, 200);
    wait_until("its output has all been read", || {
        home_file(&server, &id, "drained").exists()
    })
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_filesystem_only_pause_kills_processes_and_the_resume_boots_anew() {
    // contract: L18 (memory: false kills the processes; the resume is a new boot)
    for server in servers().await {
        filesystem_only_pause_boots_anew(server).await;
    }
}

async fn filesystem_only_pause_boots_anew(server: Server) {
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = sandbox.id.clone();
    let boot_before = boot_id(&api, &sandbox).await;
    let mut stream = api.start(&sandbox, COUNTER_LOOP, &[]).await;
    started_pid(&mut stream).await;
    wait_until("the loop counts", || last_count(&server, &id) >= 2).await;

    pause(&api, &id, r#"{"memory":false}"#).await;
    assert_breaks_off(&mut stream).await;
    wait_until("the sandbox's processes are gone", || {
        sandbox_processes(&id).is_empty()
    })
    .await;
    let stood_at = last_count(&server, &id);

    resume(&api, &id).await;
    assert_eq!(listed(&api, &sandbox).await, Vec::<u64>::new());
    let boot_after = boot_id(&api, &sandbox).await;
    assert_ne!(boot_after, boot_before, "a fresh boot");
    assert_eq!(last_count(&server, &id), stood_at, "nothing counts on");
    assert!(stood_at >= 2, "the files are kept");
    if mount_namespace(&api).await {
        let read = api
            .run(&sandbox, "cat /proc/sys/kernel/random/boot_id")
            .await;
        assert_eq!(String::from_utf8(read.stdout).unwrap().trim(), boot_after);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_resume_without_memory_boots_a_sandbox_paused_with_it_afresh() {
    // contract: L18 (connect's `memory: false` resumes from the files only)
    let server = manual_server().await;
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = sandbox.id.clone();
    let boot_before = boot_id(&api, &sandbox).await;
    let mut stream = api.start(&sandbox, COUNTER_LOOP, &[]).await;
    started_pid(&mut stream).await;
    wait_until("the loop counts", || last_count(&server, &id) >= 2).await;
    pause(&api, &id, "").await;
    assert_frozen(&server, &id).await;

    let reply = api
        .post(
            &format!("/v2/sandboxes/{id}/connect"),
            r#"{"timeout":300,"memory":false}"#,
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    wait_until("the frozen processes are gone", || {
        sandbox_processes(&id).is_empty()
    })
    .await;
    assert_eq!(listed(&api, &sandbox).await, Vec::<u64>::new());
    assert_ne!(boot_id(&api, &sandbox).await, boot_before, "a fresh boot");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_lease_end_pauses_with_memory_unless_created_without_it() {
    // contract: L18 (autoPause keeps memory at the lease end; autoPauseMemory: false does not)
    let server = manual_server().await;
    let api = Api::new(&server);
    let create = |memory: Option<bool>| {
        let mut body = json!({"templateID": "base", "timeout": 60, "autoPause": true});
        if let Some(memory) = memory {
            body["autoPauseMemory"] = Value::Bool(memory);
        }
        body
    };
    let (kept, kept_token) = api.create(create(None)).await;
    let (dropped, dropped_token) = api.create(create(Some(false))).await;
    let kept = Sandbox {
        id: kept,
        token: kept_token,
    };
    let dropped = Sandbox {
        id: dropped,
        token: dropped_token,
    };
    let mut boots = Vec::new();
    let mut pids = Vec::new();
    let mut streams = Vec::new();
    for sandbox in [&kept, &dropped] {
        boots.push(boot_id(&api, sandbox).await);
        let mut stream = api.start(sandbox, COUNTER_LOOP, &[]).await;
        pids.push(started_pid(&mut stream).await);
        streams.push(stream);
        wait_until("the loop counts", || last_count(&server, &sandbox.id) >= 2).await;
    }
    assert_ne!(
        boots[0], boots[1],
        "every sandbox boots with an id of its own"
    );

    server.clock().advance(Duration::from_secs(61));
    for sandbox in [&kept, &dropped] {
        let detail = api.get(&format!("/sandboxes/{}", sandbox.id)).await;
        assert_eq!(detail.json["state"], "paused", "{}", detail.text);
    }
    for stream in &mut streams {
        assert_breaks_off(stream).await;
    }
    assert_frozen(&server, &kept.id).await;
    wait_until("the filesystem-only sandbox's processes are gone", || {
        sandbox_processes(&dropped.id).is_empty()
    })
    .await;

    let frozen_at = last_count(&server, &kept.id);
    for sandbox in [&kept, &dropped] {
        let reply = api
            .post(
                &format!("/v2/sandboxes/{}/connect", sandbox.id),
                r#"{"timeout":300}"#,
            )
            .await;
        assert_eq!(reply.status, 201, "{}", reply.text);
    }
    assert_eq!(listed(&api, &kept).await, vec![pids[0]]);
    wait_until("the kept loop counts on", || {
        last_count(&server, &kept.id) > frozen_at
    })
    .await;
    assert_eq!(boot_id(&api, &kept).await, boots[0]);
    assert_eq!(listed(&api, &dropped).await, Vec::<u64>::new());
    assert_ne!(boot_id(&api, &dropped).await, boots[1]);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_a_restart_a_sandbox_paused_with_memory_resumes_as_a_fresh_boot() {
    // contract: L18 (memory does not outlive the server; the files do)
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::loopback();
    config.state_dir = Some(dir.path().to_path_buf());
    config.clock = Clock::manual(t0());
    let server = Server::start(config.clone()).await.unwrap();
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let id = sandbox.id.clone();
    let boot_before = boot_id(&api, &sandbox).await;
    let mut stream = api.start(&sandbox, COUNTER_LOOP, &[]).await;
    started_pid(&mut stream).await;
    wait_until("the loop counts", || last_count(&server, &id) >= 2).await;
    pause(&api, &id, "{}").await;
    assert_frozen(&server, &id).await;
    server.shutdown().await.unwrap();
    wait_until("the frozen processes died with the server", || {
        sandbox_processes(&id).is_empty()
    })
    .await;

    let server = Server::start(config).await.unwrap();
    let api = Api::new(&server);
    assert_eq!(
        api.get(&format!("/sandboxes/{id}")).await.json["state"],
        "paused"
    );
    let stood_at = last_count(&server, &id);
    resume(&api, &id).await;
    assert_eq!(listed(&api, &sandbox).await, Vec::<u64>::new());
    assert_ne!(boot_id(&api, &sandbox).await, boot_before, "a fresh boot");
    assert_eq!(last_count(&server, &id), stood_at);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_memory_pause_freezes_what_left_the_group_and_the_tag_too() {
    // contract: L18 (with a PID namespace, every process of the sandbox is frozen)
    let server = manual_server().await;
    let api = Api::new(&server);
    let report = api.get("/_e2b_local/isolation").await;
    if report.json["pidNamespace"] != true {
        return;
    }
    let sandbox = new_sandbox(&api).await;
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let seen = api
        .run(&sandbox, "cat /proc/sys/kernel/random/boot_id")
        .await;
    let seen = String::from_utf8(seen.stdout).unwrap();
    assert_uuid(seen.trim());
    assert_ne!(
        seen.trim(),
        host_boot.trim(),
        "the sandbox's own, not the host's"
    );
    // A new session and an empty environment: no process group, no E2B_SANDBOX_ID.
    let unique = format!("86398.{}", std::process::id());
    let started = api
        .run(
            &sandbox,
            &format!("env -i setsid sleep {unique} </dev/null >/dev/null 2>&1 &"),
        )
        .await;
    assert_eq!(started.end["exited"], true, "{:?}", started.end);
    let escaped = || -> Vec<u32> {
        let wanted = format!("sleep\0{unique}\0");
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted.as_bytes())
            })
            .collect()
    };
    wait_until("the escaped process runs", || escaped().len() == 1).await;
    let pid = escaped()[0];

    pause(&api, &sandbox.id, "").await;
    assert_eq!(state(pid), Some('T'), "the escaped process is frozen");
    resume(&api, &sandbox.id).await;
    wait_until("the escaped process goes on", || {
        state(pid).is_some_and(|s| s != 'T')
    })
    .await;
    assert_eq!(escaped(), vec![pid], "the same process");
    assert_eq!(
        api.delete(&format!("/sandboxes/{}", sandbox.id))
            .await
            .status,
        204
    );
    wait_until("the kill takes it", || escaped().is_empty()).await;
    server.shutdown().await.unwrap();
}

/// A pty stream's output until it holds `needle`; all of it.
async fn pty_until(stream: &mut FrameStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let frame = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {needle:?} in time, only {:?}",
                    String::from_utf8_lossy(&seen)
                )
            })
            .expect("the terminal stream stays open");
        if let Some(data) = frame.json["event"]["data"]["pty"].as_str() {
            seen.extend(STANDARD.decode(data).unwrap());
            let text = String::from_utf8_lossy(&seen);
            if text.contains(needle) {
                return text.into_owned();
            }
        }
    }
}

async fn type_on(api: &Api, sandbox: &Sandbox, pid: u64, text: &str) {
    let reply = api
        .rpc(
            sandbox,
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": STANDARD.encode(text)}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

#[tokio::test]
async fn an_interactive_shell_keeps_its_foreground_job_across_a_memory_pause() {
    // contract: L18 (a shell with job control never sees its job stop: its `cat` still
    // reads the terminal after the resume)
    for server in servers().await {
        shell_keeps_its_job(server).await;
    }
}

async fn shell_keeps_its_job(server: Server) {
    let api = Api::new(&server);
    let sandbox = new_sandbox(&api).await;
    let body = json!({
        "process": {"cmd": "/bin/bash", "args": ["--norc", "--noprofile", "-i"], "envs": {"TERM": "dumb", "PS1": "ready$ "}},
        "pty": {"size": {"cols": 80, "rows": 24}},
    });
    let mut stream = api.start_request(&sandbox, &body, &[]).await;
    let shell = started_pid(&mut stream).await;
    pty_until(&mut stream, "ready$ ").await;
    type_on(&api, &sandbox, shell, "cat\n").await;
    let cat_reads = || {
        sandbox_processes(&sandbox.id).iter().any(|(pid, state)| {
            *state == 'S'
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "cat")
        })
    };
    wait_until("cat reads the terminal", cat_reads).await;

    pause(&api, &sandbox.id, "").await;
    assert_breaks_off(&mut stream).await;
    resume(&api, &sandbox.id).await;

    let response = api
        .envd(&sandbox, reqwest::Method::POST, "/process.Process/Connect")
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(crate::support::envelope(
            &json!({"process": {"pid": shell}}),
        ))
        .send()
        .await
        .expect("connect");
    let mut stream = FrameStream::new(response);
    assert_eq!(started_pid(&mut stream).await, shell);
    type_on(&api, &sandbox, shell, "hello\n").await;
    // The terminal's echo, then cat's copy: cat is still the foreground job.
    let seen = pty_until(&mut stream, "hello\r\nhello\r\n").await;
    type_on(&api, &sandbox, shell, "\u{4}echo after-$((6*7))\n").await;
    let seen = seen + &pty_until(&mut stream, "after-42").await;
    assert!(
        !seen.contains("Stopped") && !seen.contains("not found"),
        "the shell took its job for stopped: {seen:?}"
    );
    type_on(&api, &sandbox, shell, "exit\n").await;
    server.shutdown().await.unwrap();
}
