//! What a quiet session costs (L16, L17): a sandbox is paused once its session has been
//! quiet for `pause_after_idle`, whatever lease its last command asked for, and a watcher's
//! polls neither keep it running nor resume it; a cleanup pulls only what changed, within
//! the account's limit, and pauses the sandbox once its state is on the host.

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{
    Backend, ChannelSink, KillOutcomeReport, NoStateHooks, PullOutcome, Purpose, RunOptions,
    SandboxMode, TeardownRecovery,
};
use e2b_client::SandboxState;

use crate::support::{RecordingHooks, World, hold_until, ok, output};

fn state(world: &World, backend: &Backend) -> SandboxState {
    let id = backend.info().expect("attached").sandbox_id;
    world.detail(&id).expect("sandbox").summary.state
}

/// A persistent backend of the world's fleet that pauses after `quiet` without a command.
fn quiet_after(world: &World, task: &str, quiet: Duration) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    config.pause_after_idle = Some(quiet);
    Backend::new(
        config,
        world.scope(task),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

/// Runs `command` for `purpose`; its output, or the error that kept it from starting.
fn run_for(
    backend: &Backend,
    command: &str,
    purpose: Purpose,
) -> Result<String, agent_sandbox::Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut options = RunOptions::new(Duration::from_secs(30));
    options.purpose = purpose;
    let running = backend.run(command, options, Box::new(ChannelSink::unbounded(tx)))?;
    running.wait().expect("ends");
    Ok(output(&rx))
}

#[test]
fn a_quiet_sandbox_is_paused_after_its_quiet_time_whatever_lease_its_last_command_asked() {
    // contract: L17
    let world = World::new();
    let backend = quiet_after(&world, "quiet", Duration::from_secs(60));
    // A long deadline: the lease is extended well past the quiet time (L5).
    let (tx, rx) = std::sync::mpsc::channel();
    backend
        .run(
            "echo kept > ~/mark",
            RunOptions::new(Duration::from_secs(1800)),
            Box::new(ChannelSink::unbounded(tx)),
        )
        .expect("starts")
        .wait()
        .expect("ends");
    drop(rx);
    world.advance(Duration::from_secs(59));
    world.fleet.pause_quiet();
    assert_eq!(
        state(&world, &backend),
        SandboxState::Running,
        "not quiet long enough"
    );
    world.advance(Duration::from_secs(2));
    world.fleet.pause_quiet();
    assert_eq!(state(&world, &backend), SandboxState::Paused);
    // Its next command resumes it, files intact.
    assert_eq!(ok(&backend, "cat ~/mark"), "kept\n");
    assert_eq!(state(&world, &backend), SandboxState::Running);
}

#[test]
fn a_watchers_poll_neither_keeps_a_sandbox_running_nor_resumes_it() {
    // contract: L17
    let world = World::new();
    let backend = quiet_after(&world, "server", Duration::from_secs(60));
    ok(&backend, "echo started");
    world.advance(Duration::from_secs(40));
    // The host's sync before each of Hermes' commands, polls included: no use either.
    backend.sync_state().expect("sync");
    assert_eq!(
        run_for(&backend, "echo poll", Purpose::Watch).expect("poll"),
        "poll\n"
    );
    world.advance(Duration::from_secs(21));
    world.fleet.pause_quiet();
    assert_eq!(
        state(&world, &backend),
        SandboxState::Paused,
        "the poll 21 s ago did not restart the quiet time"
    );
    let before = world.server().requests();
    let error = run_for(&backend, "echo poll", Purpose::Watch).expect_err("not resumed");
    assert!(error.is_paused_by_backend(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("paused after 60 s without a command"),
        "{error}"
    );
    // Nor does the sync before it resume what this process paused.
    backend.sync_state().expect("sync skipped");
    assert_eq!(
        world.server().requests().since(&before).total(),
        0,
        "nothing sent"
    );
    assert_eq!(state(&world, &backend), SandboxState::Paused);
    // The session's own command resumes it; polls work again.
    assert_eq!(ok(&backend, "echo back"), "back\n");
    assert_eq!(
        run_for(&backend, "echo poll", Purpose::Watch).expect("poll"),
        "poll\n"
    );
}

#[test]
fn a_cleanup_with_nothing_used_since_attach_pulls_nothing_and_resumes_nothing() {
    // contract: L16
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let backend = world.backend(SandboxMode::Persistent, "idle", hooks.clone());
    let id = backend.attach().expect("attach").sandbox_id;
    world.server().faults().pause_sandbox(&id).expect("pause");
    let before = world.server().requests();
    let report = backend.cleanup();
    assert_eq!(report.pull, PullOutcome::Unchanged);
    assert_eq!(report.recovery, TeardownRecovery::NotAttempted);
    assert!(
        !hooks.calls().iter().any(|call| call == "pull"),
        "{:?}",
        hooks.calls()
    );
    // Not resumed, nothing run: at most the pause at close, which finds it paused.
    let sent = world.server().requests().since(&before);
    assert_eq!(sent.total(), sent.get("pause"));
    assert_eq!(
        world.detail(&id).expect("kept").summary.state,
        SandboxState::Paused
    );
}

#[test]
fn a_shutdown_under_the_limit_pulls_every_session_in_turn_and_never_passes_it() {
    // contract: L16, L14
    let world = World::new();
    world.server().set_max_running(Some(1));
    let chats: Vec<Backend> = (0..3)
        .map(|n| {
            let backend = world.persistent_task(&format!("chat-{n}"));
            ok(
                &backend,
                &format!("mkdir -p ~/.hermes/memories && echo chat-{n} > ~/.hermes/memories/MEMORY-{n}.md"),
            );
            world.advance(Duration::from_secs(1));
            backend
        })
        .collect();
    for (n, chat) in chats.iter().enumerate() {
        let report = chat.cleanup();
        assert_eq!(report.pull, PullOutcome::Pulled, "chat {n}");
        assert_eq!(report.sandbox, KillOutcomeReport::Paused, "chat {n}");
        assert!(world.server().running_limit().1 <= 1);
        let memory = world.home.path().join(format!("memories/MEMORY-{n}.md"));
        assert_eq!(
            std::fs::read_to_string(memory).expect("pulled"),
            format!("chat-{n}\n")
        );
    }
    assert_eq!(
        world.server().running_limit().1,
        0,
        "each paused at its close"
    );
}

#[test]
fn a_pull_the_limit_leaves_no_slot_for_is_deferred_and_the_sandbox_keeps_its_state() {
    // contract: L16
    let world = World::new();
    world.server().set_max_running(Some(1));
    let mine = world.persistent_task("mine");
    ok(
        &mine,
        "mkdir -p ~/.hermes/memories && echo later > ~/.hermes/memories/MEMORY.md",
    );
    let id = mine.info().expect("attached").sandbox_id;
    world.advance(Duration::from_secs(1));
    // Another chat of the process takes the only slot (mine, idle, is paused for it) and
    // keeps it with a command running.
    let busy = world.persistent_task("busy");
    let (held, _rx) = hold_until(&busy, "/tmp/go");
    assert_eq!(
        world.detail(&id).expect("kept").summary.state,
        SandboxState::Paused
    );

    let report = mine.cleanup();
    let PullOutcome::Deferred(reason) = &report.pull else {
        panic!("{:?}", report.pull);
    };
    assert!(
        reason.contains("limit of concurrently running sandboxes"),
        "{reason}"
    );
    assert_eq!(
        world.detail(&id).expect("kept").summary.state,
        SandboxState::Paused
    );
    assert!(!world.home.path().join("memories/MEMORY.md").exists());
    // Its next session brings the state back (resume recovery) once a slot is free.
    busy.write_file("/tmp/go", b"go".to_vec()).expect("release");
    held.wait().expect("ends");
    busy.cleanup();
    let again = world.persistent_task("mine");
    ok(&again, "true");
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("memories/MEMORY.md")).expect("recovered"),
        "later\n"
    );
}

#[test]
fn a_sandbox_serving_a_background_process_is_paused_for_the_limit_last_and_polls_do_not_resume_it()
{
    // contract: L17, L14
    let world = World::new();
    world.server().set_max_running(Some(2));
    // The older chat serves something its watcher polls; the newer one is plainly idle.
    let serving = world.persistent_task("serving");
    ok(&serving, "true");
    world.advance(Duration::from_secs(1));
    let idle = world.persistent_task("idle");
    ok(&idle, "true");
    world.advance(Duration::from_secs(1));
    assert_eq!(
        run_for(&serving, "echo poll", Purpose::Watch).expect("poll"),
        "poll\n"
    );
    // A third chat needs a slot: the idle one is paused although the serving one has been
    // idle longer by its own commands.
    let third = world.persistent_task("third");
    ok(&third, "true");
    assert_eq!(state(&world, &idle), SandboxState::Paused);
    assert_eq!(state(&world, &serving), SandboxState::Running);
    // Once its watcher has not polled for 10 s it is idle like any other and, idle longest,
    // goes next; its watcher's polls then leave it paused and say why.
    world.advance(Duration::from_secs(11));
    let fourth = world.persistent_task("fourth");
    ok(&fourth, "true");
    assert_eq!(state(&world, &serving), SandboxState::Paused);
    let error = run_for(&serving, "echo poll", Purpose::Watch).expect_err("not resumed");
    assert!(error.is_paused_by_backend(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("to free a slot under the account's limit"),
        "{error}"
    );
    assert_eq!(state(&world, &serving), SandboxState::Paused);
    // A watcher that gives its stand-in answer gets it, still without a request: it reads
    // "still running" while the process is frozen with the sandbox.
    let before = world.server().requests();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut options = RunOptions::new(Duration::from_secs(30));
    options.purpose = Purpose::Watch;
    options.answer_while_paused = Some(bytes::Bytes::from_static(b"0\n"));
    let answered = serving
        .run(
            "kill -0 1; echo $?",
            options,
            Box::new(ChannelSink::unbounded(tx)),
        )
        .expect("answered");
    let exit = answered.wait().expect("ends");
    assert_eq!((exit.exit_code, exit.sandbox_pid), (0, 0));
    assert_eq!(output(&rx), "0\n");
    assert_eq!(
        world.server().requests().since(&before).total(),
        0,
        "nothing sent"
    );
    assert_eq!(state(&world, &serving), SandboxState::Paused);
}
