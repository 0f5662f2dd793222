//! Cleanup and the finalizer (L3, L7, L8, L9), and the teardown's own recovery: what the
//! caller's pull hook cannot map back under `skills/` and `memories/` reaches the host before
//! an ephemeral sandbox is killed, and at every persistent teardown (L4, S5, S6).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_sandbox::{
    Backend, HookError, KillOutcomeReport, NoStateHooks, PullOutcome, PushKind, RecoverySummary,
    SandboxMode, StateHooks, StateTransport, TeardownRecovery,
};

use e2b_client::SandboxState;

use crate::support::{self, RecordingHooks, World, ok, run};

fn ephemeral() -> SandboxMode {
    SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(300),
    }
}

fn write(home: &Path, rel: &str, text: &str) {
    let path = home.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn read(home: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(home.join(rel)).ok()
}

/// What an agent does in its sandbox's Hermes home: a new skill in a new directory, an
/// appended memory line (the host's `MEMORY.md` is a prefix of the sandbox's), a new memory.
fn agent_writes_state(backend: &Backend) {
    ok(
        backend,
        "mkdir -p ~/.hermes/skills/made-here ~/.hermes/memories && cd ~/.hermes \
         && printf 'made in the sandbox\\n' > skills/made-here/SKILL.md \
         && printf 'host line\\nsandbox line\\n' > memories/MEMORY.md \
         && printf 'new\\n' > memories/NEW.md",
    );
}

fn recovered(report: &TeardownRecovery) -> RecoverySummary {
    match report {
        TeardownRecovery::Recovered(summary) => *summary,
        other => panic!("the teardown recovery did not complete: {other:?}"),
    }
}

/// The host after a teardown that recovered `agent_writes_state`'s files over a host whose
/// `MEMORY.md` held only "host line".
fn assert_state_reached_the_host(home: &Path, id: &str) {
    assert_eq!(
        read(home, "skills/made-here/SKILL.md").as_deref(),
        Some("made in the sandbox\n")
    );
    assert_eq!(read(home, "memories/NEW.md").as_deref(), Some("new\n"));
    // The host's MEMORY.md is a prefix of the sandbox's: a conflict, so the host copy stays
    // and the sandbox's appended version is kept in quarantine (S6).
    assert_eq!(
        read(home, "memories/MEMORY.md").as_deref(),
        Some("host line\n")
    );
    assert_eq!(
        read(
            home,
            &format!("cache/e2b-recovered/{id}/memories/MEMORY.md")
        )
        .as_deref(),
        Some("host line\nsandbox line\n")
    );
}

#[test]
fn an_ephemeral_cleanup_recovers_what_a_pull_that_pushed_nothing_cannot_map_back() {
    // contract: L4, S5, S6 — a new user's profile: nothing pushed, a pull hook that maps
    // nothing back (Hermes' sync_back skips with "no prior push state").
    let world = World::new();
    let home = world.home.path();
    write(home, "memories/MEMORY.md", "host line\n");
    let backend = world.backend(ephemeral(), "t1", Arc::new(NoStateHooks));
    agent_writes_state(&backend);
    let id = backend.info().unwrap().sandbox_id;

    let report = backend.cleanup();
    assert_eq!(report.pull, PullOutcome::Pulled);
    let summary = recovered(&report.recovery);
    assert_eq!((summary.restored, summary.quarantined), (2, 1), "{summary}");
    assert_eq!(report.sandbox, KillOutcomeReport::Killed);
    assert!(world.detail(&id).expect_err("killed").is_not_found());
    assert_state_reached_the_host(home, &id);
}

#[test]
fn an_ephemeral_cleanup_recovers_what_a_pull_of_pushed_files_only_leaves_out() {
    // contract: L4, S5, S6 — a profile with skills: the hook pushes them and its pull maps
    // nothing new back; a pushed skill the sandbox left alone compares unchanged.
    let world = World::new();
    let home = world.home.path();
    write(home, "skills/mine/SKILL.md", "host skill\n");
    write(home, "memories/MEMORY.md", "host line\n");
    let hooks = RecordingHooks::new(home);
    let backend = world.backend(ephemeral(), "t1", hooks.clone());
    agent_writes_state(&backend);
    let id = backend.info().unwrap().sandbox_id;

    let report = backend.cleanup();
    assert_eq!(hooks.calls().last().map(String::as_str), Some("pull"));
    let summary = recovered(&report.recovery);
    assert_eq!(
        (summary.restored, summary.quarantined, summary.unchanged),
        (2, 1, 1),
        "{summary}"
    );
    assert_eq!(report.sandbox, KillOutcomeReport::Killed);
    assert_state_reached_the_host(home, &id);
    assert_eq!(
        read(home, "skills/mine/SKILL.md").as_deref(),
        Some("host skill\n")
    );
}

#[test]
fn a_persistent_teardown_recovers_too_and_reconnects_a_sandbox_paused_behind_it() {
    // contract: L4, L3, S5, L16 — the hook downloads nothing, so the recovery itself must
    // resume the sandbox E2B paused; once the state is on the host the sandbox is paused
    // again (no other session uses it), never killed.
    let world = World::new();
    let home = world.home.path();
    write(home, "memories/MEMORY.md", "host line\n");
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    agent_writes_state(&backend);
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().pause_sandbox(&id).expect("pause");

    let report = backend.cleanup();
    let summary = recovered(&report.recovery);
    assert_eq!((summary.restored, summary.quarantined), (2, 1), "{summary}");
    assert_eq!(report.sandbox, KillOutcomeReport::Paused);
    assert_eq!(
        world.detail(&id).expect("kept").summary.state,
        SandboxState::Paused
    );
    assert_eq!(backend.stats().sandbox_kills, 0);
    assert_state_reached_the_host(home, &id);
}

#[test]
fn a_transfer_connect_earlier_in_the_session_does_not_excuse_the_teardown_from_its_own() {
    // contract: L4, L3 — a download mid-session reconnected long before; the sandbox is
    // paused behind the backend since, and the teardown's pull hook downloads nothing: the
    // recovery still resumes it rather than trusting the old connect.
    let world = World::new();
    let home = world.home.path();
    write(home, "memories/MEMORY.md", "host line\n");
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    agent_writes_state(&backend);
    let id = backend.info().unwrap().sandbox_id;
    let mut archive = Vec::new();
    backend
        .transport()
        .expect("transport")
        .download_state(&mut archive)
        .expect("a mid-session download");
    world.server().faults().pause_sandbox(&id).expect("pause");

    let report = backend.cleanup();
    let summary = recovered(&report.recovery);
    assert_eq!((summary.restored, summary.quarantined), (2, 1), "{summary}");
    assert_state_reached_the_host(home, &id);
}

#[test]
fn a_teardown_after_a_pull_that_reconnected_adds_one_start_and_no_connect() {
    // contract: L4 — the recovery rides on the pull's transfer connect: its cost is the
    // snapshot's one start request.
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let backend = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    agent_writes_state(&backend);
    let before = world.server().requests();
    let report = backend.cleanup();
    recovered(&report.recovery);
    let spent = world.server().requests().since(&before);
    // The pull: one connect, one start (the archive), its ranged downloads, one remove; the
    // recovery: one start.
    assert_eq!(
        spent.get("connect"),
        1,
        "{:?}",
        spent.routes().collect::<Vec<_>>()
    );
    assert_eq!(
        spent.get("Process/Start"),
        2,
        "{:?}",
        spent.routes().collect::<Vec<_>>()
    );
}

#[test]
fn a_failed_teardown_recovery_is_reported_and_the_ephemeral_sandbox_still_killed() {
    // contract: L4, S8 — a redirected quarantine fails the recovery closed (nothing written
    // outside the home); the report and the log say so; destruction still runs.
    let world = World::new();
    let home = world.home.path();
    write(home, "memories/MEMORY.md", "host line\n");
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.join("cache")).unwrap();
    std::os::unix::fs::symlink(outside.path(), home.join("cache/e2b-recovered")).unwrap();
    let backend = world.backend(ephemeral(), "t1", Arc::new(NoStateHooks));
    agent_writes_state(&backend);
    let id = backend.info().unwrap().sandbox_id;

    let report = backend.cleanup();
    let TeardownRecovery::Failed(text) = &report.recovery else {
        panic!("expected a failed recovery: {:?}", report.recovery);
    };
    assert!(text.contains(&id), "names the sandbox: {text}");
    assert_eq!(report.sandbox, KillOutcomeReport::Killed);
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    assert_eq!(
        read(home, "memories/MEMORY.md").as_deref(),
        Some("host line\n")
    );
}

#[test]
fn cleanup_is_idempotent_and_never_creates_after_the_sandbox_vanished() {
    // contract: L7
    let world = World::new();
    for mode in [SandboxMode::Persistent, ephemeral()] {
        let hooks = RecordingHooks::new(world.home.path());
        let backend = world.backend(mode.clone(), "vanish", hooks.clone());
        ok(&backend, "true");
        let id = backend.info().unwrap().sandbox_id;
        world.server().faults().vanish_sandbox(&id).expect("vanish");
        let before = world.list().len();
        let report = backend.cleanup();
        assert!(!report.repeated);
        assert!(
            matches!(report.pull, PullOutcome::Failed(_)),
            "{mode:?}: {:?}",
            report.pull
        );
        let expected = match mode {
            SandboxMode::Persistent => KillOutcomeReport::LeftRunning,
            _ => KillOutcomeReport::AlreadyGone,
        };
        assert_eq!(report.sandbox, expected);
        assert_eq!(world.list().len(), before, "cleanup created nothing");
        let again = backend.cleanup();
        assert!(again.repeated);
        assert!(again.sandbox_id.is_some());
        assert_eq!(
            again.sandbox_id, report.sandbox_id,
            "a repeat still names it"
        );
        assert_eq!(again.pull, PullOutcome::NotAttempted);
        assert_eq!(hooks.pulls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A cleaned-up backend never attaches again.
        let error = backend
            .run(
                "true",
                agent_sandbox::RunOptions::new(Duration::from_secs(5)),
                Box::new(agent_sandbox::DiscardSink),
            )
            .expect_err("closed");
        assert!(error.is_closed(), "{error}");
        assert_eq!(world.list().len(), before);
    }
    // Cleanup of a backend that never attached touches nothing.
    let idle = world.persistent();
    let report = idle.cleanup();
    assert_eq!(report.sandbox_id, None);
    assert_eq!(idle.stats(), agent_sandbox::Stats::default());
}

/// Hooks whose pull records whether the gated command's last output had arrived by then.
struct PullSeesFinished(Arc<AtomicBool>, Arc<AtomicBool>);

impl StateHooks for PullSeesFinished {
    fn push(&self, _transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        self.1
            .store(self.0.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn cleanup_waits_for_a_running_command() {
    // contract: L8 — no timing: the command blocks on a fifo that only this test opens, and
    // only once cleanup has begun (new commands are refused as closed); the pull, which
    // cleanup runs after its wait, records whether the command's output had all arrived.
    let world = World::new();
    let finished = Arc::new(AtomicBool::new(false));
    let pulled_after_end = Arc::new(AtomicBool::new(false));
    let backend = Arc::new(world.backend(
        SandboxMode::Persistent,
        "default",
        Arc::new(PullSeesFinished(finished.clone(), pulled_after_end.clone())),
    ));
    ok(&backend, "rm -f /tmp/gate && mkfifo /tmp/gate");
    let id = backend.info().unwrap().sandbox_id;
    let seen = finished.clone();
    let handle = backend
        .run(
            "read line < /tmp/gate; echo finished",
            agent_sandbox::RunOptions::new(Duration::from_secs(120)),
            Box::new(agent_sandbox::FnSink(
                move |_: agent_sandbox::OutputStream, bytes: &[u8]| {
                    if bytes.windows(8).any(|w| w == b"finished") {
                        seen.store(true, Ordering::SeqCst);
                    }
                    Ok(())
                },
            )),
        )
        .expect("run");
    let cleaner = {
        let backend = Arc::clone(&backend);
        std::thread::spawn(move || backend.cleanup())
    };
    // Cleanup has begun once a new command is refused as closed (bounded: 30 s).
    let start = std::time::Instant::now();
    loop {
        match run(&backend, "true") {
            Err(error) if error.is_closed() => break,
            Ok(_) if start.elapsed() < Duration::from_secs(30) => std::thread::yield_now(),
            other => panic!("cleanup never began: {other:?}"),
        }
    }
    assert!(
        !finished.load(Ordering::SeqCst),
        "the command is still blocked on its gate"
    );
    support::sandbox_shell(&world, &id, "echo go > /tmp/gate");
    let report = cleaner.join().expect("cleanup thread");
    assert!(
        pulled_after_end.load(Ordering::SeqCst),
        "the pull ran before the command it should have waited for had ended"
    );
    let exit = handle
        .poll()
        .expect("the command finished before cleanup returned");
    assert_eq!(exit.expect("exit").exit_code, 0);
    assert!(!report.repeated);
}

#[test]
fn the_finalizer_releases_locally_and_kills_only_ephemeral_sandboxes() {
    // contract: L9
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let persistent = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    ok(&persistent, "true");
    let id = persistent.info().unwrap().sandbox_id;
    let files = world.scope_files(&persistent);
    assert_eq!(
        files.writer_status().unwrap(),
        writer_lease::WriterStatus::Held
    );
    persistent.finalize();
    assert_eq!(
        files.writer_status().unwrap(),
        writer_lease::WriterStatus::Free
    );
    assert_eq!(
        world.detail(&id).unwrap().summary.state,
        SandboxState::Running
    );
    assert_eq!(
        hooks.pulls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "never pulls"
    );

    let ephemeral_hooks = RecordingHooks::new(world.home.path());
    let eph = world.backend(ephemeral(), "t2", ephemeral_hooks.clone());
    ok(&eph, "true");
    let eph_id = eph.info().unwrap().sandbox_id;
    eph.finalize();
    assert!(world.detail(&eph_id).expect_err("killed").is_not_found());
    assert_eq!(
        ephemeral_hooks
            .pulls
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[test]
fn the_teardown_pull_reconnects_a_sandbox_paused_behind_the_backend() {
    // contract: L3, S12
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let backend = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    ok(
        &backend,
        "mkdir -p /home/user/.hermes/memories && echo m > /home/user/.hermes/memories/MEMORY.md",
    );
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().pause_sandbox(&id).expect("pause");
    let report = backend.cleanup();
    assert_eq!(report.pull, PullOutcome::Pulled);
    let names = support::tar_names(&hooks.pulled.lock().unwrap());
    assert!(
        names.contains(&"home/user/.hermes/memories/MEMORY.md".to_owned()),
        "{names:?}"
    );
    // The backend only reconnected (extend-only); it did not pause or kill.
    assert_eq!(backend.stats().sandbox_kills, 0);
    assert_eq!(world.list().len(), 1);
}

#[test]
fn a_cleanup_leaves_the_last_commands_end_on_record_at_once() {
    // contract: I9 (the writer gathers a scope's updates; a cleanup does not wait for it)
    let world = World::new();
    let backend = world.persistent_task("ended-on-record");
    ok(&backend, "true");
    backend.cleanup();
    // Read as another process would, without waiting for this process's writer.
    let path = world
        .scope_files(&backend)
        .path(writer_lease::ScopeFile::Activity);
    let text = std::fs::read_to_string(&path).expect("the record is on disk");
    let field = |name: &str| -> u128 {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text:?}"))
    };
    assert!(field("ended:") >= field("started:"), "{text:?}");
}
