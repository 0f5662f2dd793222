//! The account's limit of concurrently running sandboxes (contract L14): e2b-local's
//! `max_running` stands in for E2B's; the backends of one [`World`] share a fleet as one
//! process's do. A start refused for the limit pauses the fleet's idlest own sandbox and
//! tries again; a sandbox with a command running, or of another process, is never paused.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use agent_sandbox::{
    Backend, Fleet, NoStateHooks, Progress, ProgressObserver, SandboxMode, Services,
};
use e2b_client::SandboxState;

use crate::support::{World, hold_until, ok, output};

fn state_of(world: &World, backend: &Backend) -> SandboxState {
    let id = backend.info().expect("attached").sandbox_id;
    world.detail(&id).expect("sandbox").summary.state
}

/// A persistent backend of this world with its own settings.
fn member(world: &World, task: &str, adjust: impl FnOnce(&mut agent_sandbox::Config)) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    adjust(&mut config);
    Backend::new(
        config,
        world.scope(task),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

/// A persistent backend standing for another process: a fleet of its own.
fn other_process(world: &World, task: &str) -> Backend {
    let services = Services {
        fleet: Fleet::new(),
        ..world.services()
    };
    Backend::new(
        world.config(SandboxMode::Persistent),
        world.scope(task),
        services,
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

#[test]
fn a_start_refused_for_the_limit_pauses_the_idlest_sandbox_of_the_process_and_loses_nothing() {
    // contract: L14
    let world = World::new();
    world.server().set_max_running(Some(2));
    let first = world.persistent_task("first");
    let second = world.persistent_task("second");
    ok(&first, "echo first > ~/mark");
    world.advance(Duration::from_secs(1));
    ok(&second, "echo second > ~/mark");
    world.advance(Duration::from_secs(1));

    // A third session: E2B refuses the create; the idlest (first) is paused, then it runs.
    let third = world.persistent_task("third");
    assert_eq!(ok(&third, "echo third > ~/mark; cat ~/mark"), "third\n");
    assert_eq!(state_of(&world, &first), SandboxState::Paused);
    assert_eq!(state_of(&world, &second), SandboxState::Running);
    assert_eq!(world.server().running_limit(), (Some(2), 2));

    // The first session's next command resumes it (pausing the idlest now, second), its
    // files intact, in the same sandbox.
    let first_id = first.info().expect("attached").sandbox_id;
    assert_eq!(ok(&first, "cat ~/mark"), "first\n");
    assert_eq!(first.info().expect("attached").sandbox_id, first_id);
    assert_eq!(state_of(&world, &second), SandboxState::Paused);
    assert_eq!(ok(&second, "cat ~/mark"), "second\n");
    assert_eq!(world.server().running_limit().1, 2);
    // One sandbox per scope: pausing never made a scope create another.
    assert_eq!(world.list().len(), 3);
}

#[test]
fn a_sandbox_with_a_command_running_is_never_paused() {
    // contract: L14
    let world = World::new();
    world.server().set_max_running(Some(2));
    let busy = world.persistent_task("busy");
    let idle = world.persistent_task("idle");
    // The busy one is the least recently used, and its command still runs.
    ok(&busy, "true");
    world.advance(Duration::from_secs(1));
    ok(&idle, "true");
    world.advance(Duration::from_secs(1));
    let (held, rx) = hold_until(&busy, "/tmp/release-busy");

    let third = world.persistent_task("third");
    ok(&third, "true");
    assert_eq!(state_of(&world, &busy), SandboxState::Running);
    assert_eq!(state_of(&world, &idle), SandboxState::Paused);

    // Now every running sandbox of the process is busy or is the one asking: a fourth waits
    // its (short) slot wait, then fails naming the limit.
    let (third_held, _third_rx) = hold_until(&third, "/tmp/release-third");
    let fourth = member(&world, "fourth", |config| config.slot_wait = Duration::ZERO);
    let error = fourth.attach().expect_err("no slot");
    assert!(error.is_concurrency_limit(), "{error:?}");
    let text = agent_sandbox::ErrorChain(&error).to_string();
    assert!(
        text.starts_with("E2B create failed: the account's limit of concurrently running sandboxes is reached (2 running now); 2 other sandbox(es) of this process run and none could be paused"),
        "{text}"
    );
    assert!(
        text.ends_with("HTTP 429: you have reached the maximum number of concurrent E2B sandboxes (2). If you need more, please visit 'https://e2b.dev/docs/billing'"),
        "{text}"
    );

    // The busy commands were never interrupted.
    for (backend, release) in [(&busy, "/tmp/release-busy"), (&third, "/tmp/release-third")] {
        backend
            .write_file(release, b"go".to_vec())
            .expect("release");
    }
    assert_eq!(held.wait().expect("ends").exit_code, 0);
    assert_eq!(output(&rx), "released\n");
    assert_eq!(third_held.wait().expect("ends").exit_code, 0);
}

#[test]
fn another_process_s_sandbox_is_never_paused() {
    // contract: L14
    let world = World::new();
    world.server().set_max_running(Some(1));
    let elsewhere = other_process(&world, "elsewhere");
    ok(&elsewhere, "true");
    let mine = member(&world, "mine", |config| config.slot_wait = Duration::ZERO);
    let error = mine.attach().expect_err("no slot of its own to free");
    assert!(error.is_concurrency_limit(), "{error:?}");
    assert_eq!(state_of(&world, &elsewhere), SandboxState::Running);
}

#[test]
fn a_start_waits_for_a_slot_and_takes_it_when_a_command_ends() {
    // contract: L14
    let world = World::new();
    world.server().set_max_running(Some(1));
    let busy = world.persistent_task("busy");
    let (held, rx) = hold_until(&busy, "/tmp/release");
    // The waiter reports its wait through the progress observer: the release below comes
    // only once it waits, so the wait itself is what is tested.
    let (waits_tx, waits_rx) = mpsc::channel();
    let waits_tx = std::sync::Mutex::new(waits_tx);
    let mut config = world.config(SandboxMode::Persistent);
    config.slot_wait = Duration::from_secs(120);
    let services = Services {
        progress: Some(ProgressObserver::new(move |progress: &Progress| {
            if progress.operation == "wait for a sandbox slot" && !progress.finished {
                let _ = waits_tx.lock().unwrap().send(progress.done);
            }
        })),
        ..world.services()
    };
    let waiting = Backend::new(
        config,
        world.scope("waiting"),
        services,
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    let waiter = std::thread::spawn(move || {
        let result = waiting.attach().map(|info| info.sandbox_id);
        (waiting, result)
    });
    waits_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the start waits for a slot while the only running sandbox is busy");
    // Pausing the busy sandbox would have killed its command, which its exit would show.
    busy.write_file("/tmp/release", b"go".to_vec())
        .expect("release");
    assert_eq!(held.wait().expect("ends").exit_code, 0);
    assert_eq!(output(&rx), "released\n");
    let (waiting, result) = waiter.join().expect("waiter");
    result.expect("a slot freed by pausing the now idle sandbox");
    assert_eq!(state_of(&world, &busy), SandboxState::Paused);
    assert_eq!(ok(&waiting, "echo in"), "in\n");
}

#[test]
fn max_running_keeps_the_process_under_its_own_cap() {
    // contract: L14
    let world = World::new();
    let capped = |task: &str| member(&world, task, |config| config.max_running = Some(2));
    let backends: Vec<Backend> = ["a", "b", "c", "d"].iter().map(|t| capped(t)).collect();
    for backend in &backends {
        ok(backend, "true");
        world.advance(Duration::from_secs(1));
        assert!(world.server().running_limit().1 <= 2);
    }
    // E2B never refused anything (no limit on the server): the cap alone paused a and b.
    assert_eq!(state_of(&world, &backends[0]), SandboxState::Paused);
    assert_eq!(state_of(&world, &backends[1]), SandboxState::Paused);
    assert_eq!(world.fleet.running(), 2);
    assert_eq!(ok(&backends[0], "echo back"), "back\n");
    assert_eq!(state_of(&world, &backends[2]), SandboxState::Paused);
}

#[test]
fn a_teardown_pull_resumes_its_paused_sandbox_within_the_limit() {
    // contract: L14
    let world = World::new();
    world.server().set_max_running(Some(1));
    let leaving = world.persistent_task("leaving");
    ok(
        &leaving,
        "mkdir -p ~/.hermes/memories && echo kept > ~/.hermes/memories/MEMORY.md",
    );
    world.advance(Duration::from_secs(1));
    // Another session takes the only slot: the leaving one, idle, is paused for it.
    let staying = world.persistent_task("staying");
    ok(&staying, "true");
    assert_eq!(state_of(&world, &leaving), SandboxState::Paused);

    // The teardown pull resumes the paused sandbox: refused for the limit, it pauses the
    // idle other session's rather than failing the session's last transfer.
    let mut archive = Vec::new();
    leaving
        .transport()
        .expect("attached")
        .download_state(&mut archive)
        .expect("the pull finds a slot");
    assert_eq!(state_of(&world, &staying), SandboxState::Paused);
    assert_eq!(state_of(&world, &leaving), SandboxState::Running);
    let mut names = Vec::new();
    for entry in tar::Archive::new(archive.as_slice()).entries().unwrap() {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert!(
        names
            .iter()
            .any(|name| name.ends_with("memories/MEMORY.md")),
        "{names:?}"
    );
}

#[test]
fn a_sandbox_an_earlier_process_left_running_is_paused_for_a_slot_and_resumed_by_its_scope() {
    // contract: L15
    let world = World::new();
    world.server().set_max_running(Some(1));
    // An earlier process: its sandbox runs on its lease when the process dies (dropping the
    // backend does what a crash does on the host: the writer's lock goes with it).
    let crashed = other_process(&world, "crashed-chat");
    ok(&crashed, "echo kept > ~/mark");
    let left = crashed.info().expect("attached").sandbox_id;
    drop(crashed);
    assert_eq!(
        world.detail(&left).expect("sandbox").summary.state,
        SandboxState::Running
    );

    // The restarted process's first chat: E2B refuses the create, no sandbox of this
    // process runs, and the leftover is paused instead of the chat waiting for its lease.
    let restarted = member(&world, "new-chat", |config| {
        config.slot_wait = Duration::ZERO
    });
    assert_eq!(ok(&restarted, "echo in"), "in\n");
    assert_eq!(
        world.detail(&left).expect("sandbox").summary.state,
        SandboxState::Paused
    );
    assert_eq!(world.server().running_limit(), (Some(1), 1));

    // The old chat's next session resumes the same sandbox with its files (the new chat,
    // now idle, is paused for it).
    world.advance(Duration::from_secs(1));
    let again = member(&world, "crashed-chat", |config| {
        config.slot_wait = Duration::ZERO
    });
    assert_eq!(ok(&again, "cat ~/mark"), "kept\n");
    assert_eq!(again.info().expect("attached").sandbox_id, left);
    assert_eq!(state_of(&world, &restarted), SandboxState::Paused);
}

#[test]
fn a_leftover_whose_record_says_a_command_runs_is_not_paused_and_the_error_says_why() {
    // contract: L15
    let world = World::new();
    world.server().set_max_running(Some(1));
    let crashed = other_process(&world, "mid-command");
    ok(&crashed, "true");
    let left = crashed.info().expect("attached").sandbox_id;
    // The process died while a command ran: its start is the record's last word.
    let files = world.scope_files(&crashed);
    let ended = files.activity().expect("read").expect("record").last_used();
    files
        .activity_recorder()
        .command_started(&left, ended + Duration::from_secs(1))
        .expect("record");
    drop(crashed);

    let restarted = member(&world, "new-chat", |config| {
        config.slot_wait = Duration::ZERO
    });
    let error = restarted
        .attach()
        .expect_err("the only slot runs a command");
    assert!(error.is_concurrency_limit(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("0 are held by a live Hermes session on this host, 1 run a command"),
        "{error}"
    );
    assert_eq!(
        world.detail(&left).expect("sandbox").summary.state,
        SandboxState::Running
    );
}

#[test]
fn a_sandbox_a_live_session_of_another_process_holds_is_counted_not_paused() {
    // contract: L15
    let world = World::new();
    world.server().set_max_running(Some(1));
    let live = other_process(&world, "live-chat");
    ok(&live, "true");
    let restarted = member(&world, "new-chat", |config| {
        config.slot_wait = Duration::ZERO
    });
    let error = restarted
        .attach()
        .expect_err("the only slot is held by a live session");
    assert!(
        error
            .to_string()
            .contains("1 are held by a live Hermes session on this host"),
        "{error}"
    );
    assert_eq!(state_of(&world, &live), SandboxState::Running);
}
