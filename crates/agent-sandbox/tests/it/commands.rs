//! Running commands: streaming into sinks, waiting, polling, killing by pid.

use std::io::Read;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use agent_sandbox::{
    ChannelSink, CommandReads, ErrorChain, FnSink, OutputStream, RunOptions, Shell, Termination,
    WriteSink,
};
use e2b_client::SandboxState;

use crate::support::{World, ok};

#[test]
fn output_reaches_the_sink_while_the_command_still_runs() {
    // contract: O1
    let world = World::new();
    let backend = world.persistent();
    let (tx, rx) = mpsc::sync_channel(4);
    let handle = backend
        .run(
            "echo first; echo oops >&2; sleep 30; echo never",
            RunOptions::new(Duration::from_secs(120)),
            Box::new(ChannelSink::bounded(tx)),
        )
        .expect("run");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(rx.recv().expect("a chunk arrives before the command ends"));
    }
    // The command sleeps for 30 s after printing: the chunks arrived while it ran.
    assert!(handle.poll().is_none());
    let stdout: Vec<u8> = seen
        .iter()
        .filter(|c| c.stream == OutputStream::Stdout)
        .flat_map(|c| c.bytes.clone())
        .collect();
    let stderr: Vec<u8> = seen
        .iter()
        .filter(|c| c.stream == OutputStream::Stderr)
        .flat_map(|c| c.bytes.clone())
        .collect();
    assert_eq!(stdout, b"first\n");
    assert_eq!(stderr, b"oops\n");
    handle.kill();
    let exit = handle.wait().expect("exit");
    assert_eq!(exit.termination, Termination::Killed);
}

#[test]
fn a_kill_by_pid_from_another_thread_leaves_the_sandbox_and_background_processes_alive() {
    // contract: L6
    let world = World::new();
    let backend = world.persistent();
    let background = ok(&backend, "nohup sleep 600 >/dev/null 2>&1 & echo $!");
    let background_pid = background.trim().to_owned();
    let handle = backend
        .run(
            "sleep 300",
            RunOptions::new(Duration::from_secs(600)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect("run");
    assert!(handle.sandbox_pid() > 0);
    let killer = {
        let handle = handle.clone();
        std::thread::spawn(move || handle.kill())
    };
    killer.join().expect("kill thread");
    let exit = handle.wait().expect("exit");
    assert_eq!(exit.termination, Termination::Killed);
    assert_ne!(exit.exit_code, 0);
    // The sandbox and the background process survived.
    let id = backend.info().expect("attached").sandbox_id;
    assert_eq!(
        world.detail(&id).expect("sandbox").summary.state,
        SandboxState::Running
    );
    assert_eq!(
        ok(&backend, &format!("kill -0 {background_pid} && echo alive")),
        "alive\n"
    );
    // Killing a finished command does nothing.
    handle.kill();
    assert_eq!(
        handle.wait().expect("exit").termination,
        Termination::Killed
    );
}

#[test]
fn a_passed_deadline_kills_the_command_by_pid() {
    // contract: L6
    let world = World::new();
    let backend = world.persistent();
    let handle = backend
        .run(
            "sleep 60",
            RunOptions::new(Duration::from_secs(1)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect("run");
    let exit = handle.wait().expect("exit");
    assert_eq!(exit.termination, Termination::DeadlineExceeded);
    assert_eq!(ok(&backend, "echo still-here"), "still-here\n");
}

#[test]
fn a_pipe_write_end_sink_is_closed_when_the_command_finishes() {
    // contract: O1 — Hermes drains an os.pipe() until end-of-file.
    let world = World::new();
    let backend = world.persistent();
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    let handle = backend
        .run(
            "seq 1 20000",
            RunOptions::new(Duration::from_secs(60)),
            Box::new(WriteSink::new(writer)),
        )
        .expect("run");
    let drain = std::thread::spawn(move || {
        let mut out = Vec::new();
        reader.read_to_end(&mut out).expect("read to EOF");
        out
    });
    let exit = handle.wait().expect("exit");
    let out = drain.join().expect("drain");
    let expected: String = (1..=20000).map(|n| format!("{n}\n")).collect();
    assert_eq!(out.len(), expected.len());
    assert_eq!(out, expected.as_bytes());
    assert_eq!(exit.forwarded_bytes, expected.len() as u64);
    assert_eq!(exit.sink_error, None);
}

#[test]
fn a_failing_sink_stops_forwarding_but_the_command_completes() {
    // contract: O1
    let world = World::new();
    let backend = world.persistent();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let handle = backend
        .run(
            "for i in 1 2 3; do echo $i; sleep 0.05; done; exit 3",
            RunOptions::new(Duration::from_secs(60)),
            Box::new(FnSink(move |_, _: &[u8]| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(std::io::Error::other("reader went away"))
            })),
        )
        .expect("run");
    let exit = handle.wait().expect("exit");
    assert_eq!(exit.exit_code, 3);
    assert_eq!(exit.termination, Termination::Exited);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        exit.sink_error
            .expect("reported")
            .contains("reader went away")
    );
}

#[test]
fn options_carry_cwd_env_and_shell() {
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "mkdir -p /home/user/work");
    let (tx, rx) = mpsc::channel();
    let mut options = RunOptions::new(Duration::from_secs(30));
    options.cwd = Some("/home/user/work".to_owned());
    options
        .env
        .insert("GREETING".to_owned(), "hi there".to_owned());
    let handle = backend
        .run(
            "printf '%s|%s|%s' \"$PWD\" \"$GREETING\" \"$0\"; shopt -q login_shell && echo ' login' || echo ' plain'",
            options.clone(),
            Box::new(ChannelSink::unbounded(tx)),
        )
        .expect("run");
    assert_eq!(handle.wait().expect("exit").exit_code, 0);
    let out: Vec<u8> = rx.try_iter().flat_map(|c| c.bytes).collect();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "/home/user/work|hi there|/bin/bash plain\n"
    );
    let (tx, rx) = mpsc::channel();
    options.shell = Shell::Login;
    let handle = backend
        .run(
            "shopt -q login_shell && echo login || echo plain",
            options,
            Box::new(ChannelSink::unbounded(tx)),
        )
        .expect("run");
    assert_eq!(handle.wait().expect("exit").exit_code, 0);
    let out: Vec<u8> = rx.try_iter().flat_map(|c| c.bytes).collect();
    assert_eq!(out, b"login\n");
}

#[test]
fn waiting_with_a_limit_reports_a_running_command() {
    let world = World::new();
    let backend = world.persistent();
    let handle = backend
        .run(
            "sleep 30",
            RunOptions::new(Duration::from_secs(60)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect("run");
    assert!(handle.wait_for(Duration::from_millis(50)).is_none());
    handle.kill();
    let exit = handle
        .wait_for(Duration::from_secs(30))
        .expect("finished")
        .expect("exit");
    assert_eq!(exit.termination, Termination::Killed);
    assert_eq!(handle.poll().expect("done").expect("exit"), exit);
}

#[test]
fn commands_from_many_threads_share_one_sandbox() {
    // contract: O2
    let world = World::new();
    let backend = Arc::new(world.persistent());
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let backend = Arc::clone(&backend);
            std::thread::spawn(move || {
                let (tx, rx) = mpsc::channel();
                let handle = backend
                    .run(
                        &format!("echo worker-{i}"),
                        RunOptions::new(Duration::from_secs(60)),
                        Box::new(ChannelSink::unbounded(tx)),
                    )
                    .expect("run");
                let exit = handle.wait().expect("exit");
                let out: Vec<u8> = rx.try_iter().flat_map(|c| c.bytes).collect();
                (
                    exit.exit_code,
                    String::from_utf8(out).unwrap(),
                    handle.sandbox_id().to_owned(),
                )
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for (i, worker) in workers.into_iter().enumerate() {
        let (code, out, id) = worker.join().expect("worker");
        assert_eq!(code, 0);
        assert_eq!(out, format!("worker-{i}\n"));
        ids.insert(id);
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(world.list().len(), 1);
    assert_eq!(backend.stats().creates, 1);
}

#[test]
fn files_are_read_and_written_through_the_admitted_sandbox() {
    // contract: O2, S4
    let world = World::new();
    let backend = world.persistent();
    backend
        .write_file("/home/user/notes/deep/a.txt", b"written".to_vec())
        .expect("write");
    assert_eq!(ok(&backend, "cat /home/user/notes/deep/a.txt"), "written");
    assert_eq!(
        backend
            .read_file("/home/user/notes/deep/a.txt", 1024)
            .unwrap(),
        b"written"
    );
    ok(&backend, "head -c 4096 /dev/zero > /home/user/big");
    let error = backend
        .read_file("/home/user/big", 100)
        .expect_err("capped");
    // The cap is the client's step, below the backend's own.
    let text = ErrorChain(&error).to_string();
    assert!(text.contains("cap"), "{text}");
    let missing = backend
        .read_file("/home/user/none", 100)
        .expect_err("missing");
    assert!(missing.to_string().contains("/home/user/none") || missing.sandbox_id().is_some());
}

#[test]
fn a_kill_reaches_what_the_command_started_but_not_earlier_background_processes() {
    // contract: L6
    let world = World::new();
    let backend = world.persistent();
    let background = ok(&backend, "nohup sleep 601 >/dev/null 2>&1 & echo $!");
    let background_pid = background.trim().to_owned();
    for deadline in [Duration::from_secs(600), Duration::from_secs(2)] {
        let handle = backend
            .run(
                "sleep 31; echo after",
                RunOptions::new(deadline),
                Box::new(agent_sandbox::DiscardSink),
            )
            .expect("run");
        if deadline > Duration::from_secs(60) {
            handle.kill();
        }
        let exit = handle.wait().expect("exit");
        assert_ne!(exit.termination, Termination::Exited);
        // Bounded (10 s) wait inside the sandbox until the child `sleep` is gone.
        let left = ok(
            &backend,
            "for i in $(seq 100); do ps -eo args | grep -q '^sleep 31$' || break; sleep 0.1; done; \
             ps -eo args | grep -c '^sleep 31$' || true",
        );
        assert_eq!(
            left.trim(),
            "0",
            "{deadline:?}: the command's child survived"
        );
    }
    assert_eq!(
        ok(&backend, &format!("kill -0 {background_pid} && echo alive")),
        "alive\n"
    );
}

#[test]
fn stdin_of_any_size_reaches_the_command_byte_exact() {
    // contract: O4
    let world = World::new();
    let backend = world.persistent();
    // Over Linux's 128 KiB single-argument limit, with every byte value.
    let data: Vec<u8> = (0..(5u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for shell in [Shell::Plain, Shell::Login] {
        let (tx, rx) = mpsc::channel();
        let mut options = RunOptions::new(Duration::from_secs(120));
        options.shell = shell;
        options.stdin = Some(data.clone().into());
        let exit = backend
            .run(
                "cat; ls -a ~ | grep -c agent-stdin || true",
                options,
                Box::new(ChannelSink::unbounded(tx)),
            )
            .expect("run")
            .wait()
            .expect("exit");
        assert_eq!(exit.exit_code, 0);
        let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
        assert_eq!(output.len(), data.len() + 2, "{shell:?}");
        assert!(
            output[..data.len()] == data[..],
            "{shell:?}: the bytes differ"
        );
        // The staged file was unlinked before the command ran.
        assert_eq!(&output[data.len()..], b"0\n");
    }
}

#[test]
fn commands_read_by_the_runtime_stream_are_killed_and_keep_their_deadlines() {
    // contract: O1, L6 — the path E2B's cloud (HTTPS) takes, where a command's output is
    // read by the runtime's connection instead of the forwarding thread's own socket.
    let world = World::new();
    let mut config = world.config(agent_sandbox::SandboxMode::Persistent);
    config.command_reads = CommandReads::Runtime;
    let backend = agent_sandbox::Backend::new(
        config,
        world.scope("runtime-reads"),
        world.services(),
        Arc::new(agent_sandbox::NoStateHooks),
    )
    .expect("backend");
    let (tx, rx) = mpsc::sync_channel(4);
    let handle = backend
        .run(
            "echo first; sleep 30; echo never",
            RunOptions::new(Duration::from_secs(120)),
            Box::new(ChannelSink::bounded(tx)),
        )
        .expect("run");
    let chunk = rx.recv().expect("a chunk arrives before the command ends");
    assert_eq!(chunk.bytes, b"first\n");
    assert!(handle.poll().is_none());
    handle.kill();
    assert_eq!(
        handle.wait().expect("exit").termination,
        Termination::Killed
    );
    let late = backend
        .run(
            "sleep 60",
            RunOptions::new(Duration::from_secs(1)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect("run");
    assert_eq!(
        late.wait().expect("exit").termination,
        Termination::DeadlineExceeded
    );
    assert_eq!(ok(&backend, "echo still-here"), "still-here\n");
}
