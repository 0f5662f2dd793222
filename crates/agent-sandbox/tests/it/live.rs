//! Live processes against e2b-local: output streamed as written and exactly once across
//! pauses and cuts, stdin, terminals, signals, and what the host says when a process could
//! not survive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox::{
    Backend, LiveEnd, LiveOptions, LiveProcess, LiveRead, LiveSignal, LostReason, NoStateHooks,
    SandboxMode, Shell, TerminalSize,
};
use e2b_client::SandboxState;
use e2b_local::DropRule;

use crate::support::{World, ok, run};

/// Reads until the end (30 s of real time at most); the output and how it ended.
fn read_to_end(process: &LiveProcess) -> (Vec<u8>, LiveEnd) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut output = Vec::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "no end within 30 s; so far: {:?}",
            String::from_utf8_lossy(&output)
        );
        match process.read(Duration::from_millis(200)) {
            LiveRead::Output(bytes) => output.extend_from_slice(&bytes),
            LiveRead::Ended(end) => return (output, end),
            LiveRead::Pending => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Reads until `needle` has been seen; the output so far.
fn read_until(process: &LiveProcess, output: &mut Vec<u8>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(output).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "{needle:?} not seen within 30 s; so far: {:?}",
            String::from_utf8_lossy(output)
        );
        match process.read(Duration::from_millis(200)) {
            LiveRead::Output(bytes) => output.extend_from_slice(&bytes),
            LiveRead::Pending => {}
            other => panic!("ended before {needle:?}: {other:?}"),
        }
    }
}

fn state(world: &World, backend: &Backend) -> SandboxState {
    let id = backend.info().expect("attached").sandbox_id;
    world.detail(&id).expect("sandbox").summary.state
}

/// `count` numbered lines, one every `gap_ms`.
fn counter(count: u32, gap_ms: u32) -> String {
    format!("for i in $(seq 1 {count}); do echo line-$i; sleep 0.{gap_ms:03}; done; echo done")
}

fn expected_counter(count: u32) -> String {
    let mut text: String = (1..=count).map(|i| format!("line-{i}\n")).collect();
    text.push_str("done\n");
    text
}

#[test]
fn a_live_process_takes_stdin_streams_as_it_writes_and_reports_its_exit_without_polling() {
    // contract: O9
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let process = backend
        .start_live(
            "greeter",
            "echo ready; read name; echo \"hello $name\"; echo oops >&2; sleep 1; exit 7",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    assert!(process.sandbox_pid() > 0);
    let mut output = Vec::new();
    read_until(&process, &mut output, "ready\n");
    process.write(b"world\n").expect("written");
    read_until(&process, &mut output, "oops\n");
    // Nothing is asked of the sandbox while the process sleeps: its stream is open.
    let before = world.server().requests();
    let (rest, end) = read_to_end(&process);
    assert_eq!(
        world.server().requests().since(&before).total(),
        0,
        "no request polls the process"
    );
    output.extend_from_slice(&rest);
    assert_eq!(
        String::from_utf8_lossy(&output),
        "ready\nhello world\noops\n"
    );
    assert_eq!(end, LiveEnd::Exited { code: 7 });
    assert_eq!(process.end(), Some(LiveEnd::Exited { code: 7 }));
    assert_eq!(process.delivered(), output.len() as u64);
}

#[test]
fn a_pause_that_keeps_memory_cuts_the_stream_and_the_output_goes_on_after_the_next_use_exactly_once()
 {
    // contract: O10
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let id = backend.info().unwrap().sandbox_id;
    let process = backend
        .start_live(
            "counter",
            &counter(60, 20),
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "line-10\n");
    world.server().faults().pause_sandbox(&id).expect("paused");
    // The stream is cut; nothing resumes the sandbox until the session uses it.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(state(&world, &backend), SandboxState::Paused);
    ok(&backend, "echo resumed");
    let (rest, end) = read_to_end(&process);
    output.extend_from_slice(&rest);
    assert_eq!(String::from_utf8_lossy(&output), expected_counter(60));
    assert_eq!(end, LiveEnd::Exited { code: 0 });
}

#[test]
fn a_dropped_stream_is_taken_up_at_once_where_it_broke() {
    // contract: O10
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let mut rule = DropRule::new(1, 400);
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    world.server().faults().drop_streams(rule);
    let process = backend
        .start_live(
            "dropped",
            &counter(40, 10),
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let (output, end) = read_to_end(&process);
    assert_eq!(String::from_utf8_lossy(&output), expected_counter(40));
    assert_eq!(end, LiveEnd::Exited { code: 0 });
}

#[test]
fn a_quiet_sandbox_is_paused_with_a_live_process_in_it_and_the_process_goes_on_at_the_next_use() {
    // contract: L17, O10
    let world = World::new();
    let mut config = world.config(SandboxMode::Persistent);
    config.pause_after_idle = Some(Duration::from_secs(60));
    let backend = Backend::new(
        config,
        world.scope("quiet"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    ok(&backend, "true");
    let process = backend
        .start_live(
            "server",
            "echo serving; while read line; do echo \"got $line\"; done",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "serving\n");
    world.advance(Duration::from_secs(61));
    world.fleet.pause_quiet();
    assert_eq!(
        state(&world, &backend),
        SandboxState::Paused,
        "an open stream does not keep a quiet sandbox running"
    );
    let before = world.server().requests();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        world.server().requests().since(&before).total(),
        0,
        "the cut follower waits for a use: it neither resumes the sandbox nor polls"
    );
    // Writing to it is a use: it resumes the sandbox, and the process (frozen) goes on.
    process.write(b"after the pause\n").expect("written");
    read_until(&process, &mut output, "got after the pause\n");
    process.close_stdin().expect("closed");
    let (rest, end) = read_to_end(&process);
    output.extend_from_slice(&rest);
    assert_eq!(
        String::from_utf8_lossy(&output),
        "serving\ngot after the pause\n"
    );
    assert_eq!(end, LiveEnd::Exited { code: 0 });
}

#[test]
fn a_pause_without_memory_ends_the_process_and_the_host_says_it_was_lost() {
    // contract: O10
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let id = backend.info().unwrap().sandbox_id;
    let process = backend
        .start_live(
            "doomed",
            "echo started; sleep 300",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "started\n");
    pause_without_memory(&world, &id);
    ok(&backend, "echo resumed");
    let (rest, end) = read_to_end(&process);
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(end, LiveEnd::Lost(LostReason::Restarted));
}

#[test]
fn a_replaced_sandbox_loses_its_processes_and_input_to_them_is_refused() {
    // contract: O10
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let id = backend.info().unwrap().sandbox_id;
    let process = backend
        .start_live("orphan", "sleep 300", LiveOptions::pipes(Shell::Plain))
        .expect("starts");
    world
        .server()
        .faults()
        .vanish_sandbox(&id)
        .expect("vanished");
    // The next command finds it gone and lets it go; the one after creates another.
    let _ = crate::support::run(&backend, "true");
    ok(&backend, "true");
    assert_ne!(backend.info().unwrap().sandbox_id, id);
    let (_, end) = read_to_end(&process);
    assert_eq!(end, LiveEnd::Lost(LostReason::Replaced));
    let error = process.write(b"x").expect_err("refused");
    assert!(error.is_live_process_lost(), "{error:?}");
    assert!(error.to_string().contains(&id), "{error}");
}

#[test]
fn a_kill_ends_the_command_and_what_it_started_and_an_interrupt_reaches_the_command() {
    // contract: O9
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let process = backend
        .start_live(
            "tree",
            "setsid sleep 300 & echo $! > ~/escaped; echo started; sleep 300",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "started\n");
    let escaped = ok(&backend, "cat ~/escaped");
    process.signal(LiveSignal::Kill).expect("signalled");
    let (_, end) = read_to_end(&process);
    assert_eq!(end, LiveEnd::Killed);
    assert_eq!(
        ok(
            &backend,
            &format!(
                "kill -0 {} 2>/dev/null && echo alive || echo gone",
                escaped.trim()
            )
        ),
        "gone\n",
        "what the command started in a session of its own went with it"
    );

    let interrupted = backend
        .start_live(
            "interrupted",
            "trap 'echo interrupted; exit 130' INT; echo waiting; while :; do sleep 0.05; done",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&interrupted, &mut output, "waiting\n");
    interrupted
        .signal(LiveSignal::Interrupt)
        .expect("signalled");
    let (rest, end) = read_to_end(&interrupted);
    output.extend_from_slice(&rest);
    assert_eq!(String::from_utf8_lossy(&output), "waiting\ninterrupted\n");
    assert_eq!(end, LiveEnd::Exited { code: 130 });
}

#[test]
fn a_terminal_command_sees_a_terminal_and_ctrl_c_written_to_it_interrupts_its_foreground_job() {
    // contract: O9
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let process = backend
        .start_live(
            "repl",
            "python3 -c 'import sys, os; print(sys.stdin.isatty(), sys.stdout.isatty(), os.get_terminal_size())'; \
             python3 -c 'import time\ntry:\n    print(\"waiting\", flush=True)\n    time.sleep(300)\nexcept KeyboardInterrupt:\n    print(\"interrupted\")'; \
             read -r line; echo \"got $line\"",
            LiveOptions::terminal(Shell::Plain, TerminalSize { rows: 30, cols: 120 }),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "waiting");
    process.write(b"\x03").expect("typed");
    read_until(&process, &mut output, "interrupted");
    process.write(b"typed\r").expect("typed");
    let (rest, end) = read_to_end(&process);
    output.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&output);
    assert!(
        text.contains("True True os.terminal_size(columns=120, lines=30)"),
        "{text:?}"
    );
    assert!(text.contains("got typed"), "{text:?}");
    assert_eq!(end, LiveEnd::Exited { code: 0 });
}

#[test]
fn a_new_backend_takes_a_running_process_up_by_its_id_with_its_whole_output() {
    // contract: O10
    let world = World::new();
    let first = world.persistent();
    ok(&first, "true");
    let process = first
        .start_live(
            "survivor",
            "echo one; read go; echo two",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("starts");
    let mut output = Vec::new();
    read_until(&process, &mut output, "one\n");
    let (id, sandbox_id, pid) = (
        process.id().to_owned(),
        process.sandbox_id().to_owned(),
        process.sandbox_pid(),
    );
    // The host process ends (no cleanup: a crash); another takes the scope over.
    drop(process);
    first.finalize();
    drop(first);
    let second = world.persistent();
    ok(&second, "true");
    let taken = second
        .follow_live(&id, &sandbox_id, pid, 0)
        .expect("followed");
    let mut again = Vec::new();
    read_until(&taken, &mut again, "one\n");
    taken
        .write(b"\n")
        .expect("its stdin is still the command's");
    let (rest, end) = read_to_end(&taken);
    again.extend_from_slice(&rest);
    assert_eq!(String::from_utf8_lossy(&again), "one\ntwo\n");
    assert_eq!(end, LiveEnd::Exited { code: 0 });
}

/// `POST /sandboxes/{id}/pause` with `memory: false`: processes die, files stay.
pub(crate) fn pause_without_memory(world: &World, id: &str) {
    use std::io::{Read, Write};
    let address = world.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect to e2b-local");
    let body = r#"{"memory":false}"#;
    write!(
        stream,
        "POST /sandboxes/{id}/pause HTTP/1.1\r\nHost: {address}\r\nX-API-Key: test-local-key\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    assert!(response.starts_with("HTTP/1.1 204"), "{response}");
}

#[test]
fn a_sandbox_serving_a_live_background_process_is_paused_for_the_limit_last_and_a_kernel_is_no_server()
 {
    // contract: L17, L14, O9
    let world = World::new();
    world.server().set_max_running(Some(2));
    // The older chat serves a live background process (no watcher polls it); the newer one
    // holds only an idle kernel.
    let serving = world.persistent_task("serving");
    ok(&serving, "true");
    let process = serving
        .start_live("server", "sleep 300", LiveOptions::pipes(Shell::Plain))
        .expect("starts");
    world.advance(Duration::from_secs(1));
    let idle = world.persistent_task("idle");
    let kernel = idle
        .start_kernel(agent_sandbox::KernelOptions::new("python3"))
        .expect("starts");
    world.advance(Duration::from_secs(20));
    // A third chat needs a slot: the one with only a kernel is paused, although the serving
    // one has been idle longer by its own commands.
    let third = world.persistent_task("third");
    ok(&third, "true");
    assert_eq!(state(&world, &idle), SandboxState::Paused);
    assert_eq!(state(&world, &serving), SandboxState::Running);
    // Once its process has ended it is idle like any other, and goes next.
    process.signal(LiveSignal::Kill).expect("killed");
    assert_eq!(read_to_end(&process).1, LiveEnd::Killed);
    world.advance(Duration::from_secs(1));
    let fourth = world.persistent_task("fourth");
    ok(&fourth, "true");
    assert_eq!(state(&world, &serving), SandboxState::Paused);
    drop(kernel);
}

#[test]
fn a_port_of_one_sandbox_is_reachable_from_another_through_the_host() {
    // contract: R16 — what a handed-off server listens on is reached from the parent's
    // sandbox: as it is where the two share a network (e2b-local's sandboxes online share the
    // host's), else through a forward (here to another port, which only the forward serves).
    let world = World::new();
    let (here, there) = (
        world.persistent_task("here"),
        world.persistent_task("there"),
    );
    ok(
        &there,
        "mkdir -p ~/site && cd ~/site && echo hello > index.html && head -c 2000000 /dev/urandom > big.bin",
    );
    let server = there
        .start_live(
            "srv",
            "cd ~/site && exec python3 -u -m http.server 8766 --bind 127.0.0.1",
            LiveOptions::pipes(Shell::Plain),
        )
        .expect("server");
    let mut output = Vec::new();
    read_until(&server, &mut output, "Serving HTTP");
    assert_eq!(there.listening_ports("srv").expect("ports"), [8766]);
    assert_eq!(
        here.listening_ports("srv").expect("none here"),
        Vec::<u16>::new()
    );
    let shared = here.share_ports(&there, "srv").expect("shared");
    assert!(
        matches!(
            shared[..],
            [agent_sandbox::SharedPort::Reachable { port: 8766 }]
        ),
        "{shared:?}"
    );
    let fetch = |port: u16| {
        format!(
            "python3 -c \"import urllib.request as u, hashlib; \
             print(u.urlopen('http://127.0.0.1:{port}/index.html').read().decode().strip()); \
             print(hashlib.sha256(u.urlopen('http://localhost:{port}/big.bin').read()).hexdigest())\""
        )
    };
    let refused = |backend: &Backend, port: u16| {
        run(backend, &fetch(port)).map_or(true, |(exit, _)| exit.exit_code != 0)
    };
    assert!(refused(&here, 8767), "nothing serves 8767 yet");
    let forward = here.forward_port(8767, &there, 8766).expect("forwarded");
    assert_eq!(forward.port(), 8767);
    assert!(forward.is_running());
    let seen = ok(&here, &fetch(8767));
    let expected = ok(&there, "sha256sum ~/site/big.bin | cut -d' ' -f1");
    assert_eq!(seen, format!("hello\n{expected}"));
    // A port taken in the first sandbox cannot be forwarded: the error says so.
    let error = here.forward_port(8767, &there, 8766).expect_err("taken");
    assert!(error.to_string().contains("8767"), "{error}");
    forward.stop();
    assert!(refused(&here, 8767), "the forward ended");
    server.signal(LiveSignal::Kill).expect("killed");
    here.cleanup();
    there.cleanup();
}
