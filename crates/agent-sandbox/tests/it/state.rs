//! Roles, admission, recovery and the state transport against e2b-local.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_sandbox::{NoStateHooks, PullOutcome, RoleKind, SandboxMode};
use writer_lease::{Admission, Refusal, WriterStatus};

use crate::support::{self, RecordingHooks, World, ok};

#[test]
fn writer_bring_up_recovers_then_pushes_then_stamps() {
    // contract: C3, S5, S11, C1
    let world = World::new();
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/host")).unwrap();
    std::fs::write(home.join("skills/host/SKILL.md"), "host skill").unwrap();

    // Session 1: the writer pushes the host's skills; the agent then writes new state.
    let first_hooks = RecordingHooks::new(home);
    let first = world.backend(SandboxMode::Persistent, "default", first_hooks.clone());
    let info = first.attach().expect("attach");
    assert_eq!(info.role, RoleKind::Writer);
    assert_eq!(
        ok(&first, "cat /home/user/.hermes/skills/host/SKILL.md"),
        "host skill"
    );
    ok(
        &first,
        "mkdir -p /home/user/.hermes/skills/agent /home/user/.hermes/memories && \
         printf agent > /home/user/.hermes/skills/agent/SKILL.md && \
         printf remember > /home/user/.hermes/memories/MEMORY.md",
    );
    let files = world.scope_files(&first);
    let stamp = files.prepared().unwrap().expect("stamped prepared");
    assert_eq!(stamp.sandbox_id, info.sandbox_id);
    assert!(files.dirty().unwrap().is_none());
    // A hard crash: no teardown pull, the role is released by the OS.
    first.finalize();

    // Session 2: recovery restores what the host lacks before the push (S5).
    let second_hooks = RecordingHooks::new(home);
    let second = world.backend(SandboxMode::Persistent, "default", second_hooks.clone());
    let again = second.attach().expect("attach");
    assert_eq!(again.sandbox_id, info.sandbox_id);
    assert_eq!(again.role, RoleKind::Writer);
    assert_eq!(
        std::fs::read_to_string(home.join("skills/agent/SKILL.md")).unwrap(),
        "agent"
    );
    assert_eq!(
        std::fs::read_to_string(home.join("memories/MEMORY.md")).unwrap(),
        "remember"
    );
    // The push ran after recovery: it saw the recovered skill.
    let pushed = second_hooks.seen_at_push.lock().unwrap().clone();
    assert!(
        pushed.contains(&"/home/user/.hermes/skills/agent/SKILL.md".to_owned()),
        "{pushed:?}"
    );
    let stamp2 = files.prepared().unwrap().expect("re-stamped");
    assert!(
        stamp2.generation > stamp.generation,
        "a new generation invalidated the old stamp"
    );
    assert!(files.dirty().unwrap().is_none());
}

#[test]
fn a_conflicting_sandbox_copy_is_quarantined_and_the_host_copy_kept() {
    // contract: S6
    let world = World::new();
    let home = world.home.path();
    let first = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    ok(
        &first,
        "mkdir -p /home/user/.hermes/skills/s && printf sandbox > /home/user/.hermes/skills/s/SKILL.md",
    );
    let id = first.info().unwrap().sandbox_id;
    first.finalize();
    std::fs::create_dir_all(home.join("skills/s")).unwrap();
    std::fs::write(home.join("skills/s/SKILL.md"), "host").unwrap();
    let second = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    second.attach().expect("attach");
    assert_eq!(
        std::fs::read_to_string(home.join("skills/s/SKILL.md")).unwrap(),
        "host"
    );
    let parked = home.join(format!("cache/e2b-recovered/{id}/skills/s/SKILL.md"));
    assert_eq!(std::fs::read_to_string(parked).unwrap(), "sandbox");
}

#[test]
fn readers_are_admitted_only_through_the_gates_and_fail_closed_with_a_hint() {
    // contract: C2, C3, S3, C7
    let world = World::new();
    let home = world.home.path();
    let writer_hooks = RecordingHooks::new(home);
    let writer = world.backend(SandboxMode::Persistent, "default", writer_hooks.clone());
    let id = writer.attach().expect("writer").sandbox_id;

    let reader_hooks = RecordingHooks::new(home);
    let reader = world.backend(SandboxMode::Persistent, "default", reader_hooks.clone());
    let info = reader.attach().expect("reader attaches");
    assert_eq!(info.role, RoleKind::Reader);
    assert_eq!(info.sandbox_id, id);
    assert_eq!(ok(&reader, "echo admitted"), "admitted\n");

    // A failed per-command sync aborts the writer's command and closes the gate (S3).
    writer_hooks.fail_sync.store(true, Ordering::SeqCst);
    let error = support::run(&writer, "echo must-not-run").expect_err("sync failed");
    assert!(error.is_state_failure(), "{error}");
    // Its Hermes-facing text never says "timeout": checked at the Hermes boundary
    // (hermes-binding `error::tests::a_failed_sync_message_never_says_timeout`).
    let refused = support::run(&reader, "echo refused").expect_err("gate closed");
    assert!(refused.is_not_ready(), "{refused}");
    assert!(refused.retry_hint().expect("hint").contains("Retry"));
    assert!(refused.to_string().contains(&id), "{refused}");

    // A later successful sync clears it.
    writer_hooks.fail_sync.store(false, Ordering::SeqCst);
    ok(&writer, "true");
    assert_eq!(ok(&reader, "echo again"), "again\n");
    // Readers never push or pull (C1).
    assert!(
        reader_hooks.calls().is_empty(),
        "{:?}",
        reader_hooks.calls()
    );
    assert_eq!(reader.cleanup().pull, PullOutcome::NotAttempted);
    writer.cleanup();
}

#[test]
fn a_reader_takes_the_writer_role_over_when_it_is_released() {
    // contract: C4
    let world = World::new();
    let home = world.home.path();
    let writer = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    writer.attach().expect("writer");
    let reader_hooks = RecordingHooks::new(home);
    let reader = world.backend(SandboxMode::Persistent, "default", reader_hooks.clone());
    assert_eq!(reader.attach().unwrap().role, RoleKind::Reader);
    let files = world.scope_files(&writer);
    let before = files.generation().unwrap();

    // The writer ran nothing: its state is the host's, nothing to pull (L16).
    assert_eq!(writer.cleanup().pull, PullOutcome::Unchanged);
    assert_eq!(files.writer_status().unwrap(), WriterStatus::Free);
    ok(&reader, "true");
    assert_eq!(reader.info().unwrap().role, RoleKind::Writer);
    // A full recover-then-push under a new generation.
    assert_eq!(reader_hooks.calls()[0], "push:Initial");
    assert!(files.generation().unwrap() > before);
    assert_eq!(files.writer_status().unwrap(), WriterStatus::Held);
}

#[test]
fn a_new_writer_closes_the_gate_before_it_looks_its_sandbox_up() {
    // contract: C3, C2
    // Found by the crash/fault campaign (scripts/campaign --seed 1): a writer held the role
    // through its lookup (list, connect) before marking the scope dirty, so a reader that
    // came meanwhile was admitted on the previous session's stamp and ran a command on state
    // the host had changed since. Here the lookup fails, which freezes that moment: the
    // role was held, so the old stamp must admit nobody any more.
    let world = World::new();
    let home = world.home.path();
    let first = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    let id = first.attach().expect("first writer").sandbox_id;
    first.cleanup();
    let files = world.scope_files(&first);
    assert!(
        matches!(files.admission(&id), Admission::Admitted { .. }),
        "the first session left the scope prepared"
    );

    let mut rule = e2b_local::FailRule::new(1000, 503);
    rule.scope = e2b_local::FaultScope::Rest;
    world.server().faults().fail_next(rule);
    let hooks = RecordingHooks::new(home);
    let second = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    second.attach().expect_err("the lookup fails");
    world.server().faults().clear();
    assert!(
        matches!(files.admission(&id), Admission::Refused(Refusal::Dirty(_))),
        "{:?}",
        files.admission(&id)
    );
    assert!(
        hooks.calls().is_empty(),
        "nothing was pushed: {:?}",
        hooks.calls()
    );
    // The next writer recovers and pushes as after any abandoned transition.
    ok(&second, "true");
    assert!(matches!(files.admission(&id), Admission::Admitted { .. }));
}

#[test]
fn only_the_writer_creates_a_persistent_sandbox() {
    // contract: I6
    let world = World::new();
    let probe = world.persistent();
    let files = world.scope_files(&probe);
    let writer_lease::Role::Writer(held) = files.try_acquire_writer().unwrap() else {
        panic!("the test takes the writer role first");
    };
    let error = probe.attach().expect_err("a reader never creates");
    assert!(error.is_not_ready(), "{error}");
    assert!(world.list().is_empty());
    drop(held);
    assert_eq!(probe.attach().unwrap().role, RoleKind::Writer);
    assert_eq!(world.list().len(), 1);
}

#[test]
fn a_failed_bring_up_releases_the_role_and_runs_nothing() {
    // contract: C5, S2
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    hooks.fail_initial.store(true, Ordering::SeqCst);
    let backend = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let error = support::run(&backend, "touch /home/user/ran").expect_err("initial push failed");
    assert!(error.is_state_failure(), "{error}");
    let files = world.scope_files(&backend);
    assert_eq!(files.writer_status().unwrap(), WriterStatus::Free);
    assert!(
        files.dirty().unwrap().is_some(),
        "readers stay refused after an abandoned transition"
    );
    assert_eq!(backend.info().unwrap().role, RoleKind::Reader);
    // Next use retries the bring-up; once the push works, the command runs.
    hooks.fail_initial.store(false, Ordering::SeqCst);
    ok(&backend, "test ! -e /home/user/ran");
    assert_eq!(backend.info().unwrap().role, RoleKind::Writer);
}

#[test]
fn an_ephemeral_failed_initial_upload_is_fatal() {
    // contract: S2
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    hooks.fail_initial.store(true, Ordering::SeqCst);
    let backend = world.backend(
        SandboxMode::Ephemeral {
            lifetime: Duration::from_secs(300),
        },
        "t",
        hooks.clone(),
    );
    let error = backend.attach().expect_err("fatal");
    assert!(error.is_state_failure(), "{error}");
    assert!(error.to_string().contains("initial push"), "{error}");
}

#[test]
fn upload_many_creates_parents_in_one_request_and_delete_many_is_idempotent() {
    // contract: S4
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    let stage = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, remote) in [
        "/home/user/.hermes/skills/a/b/c/one.md",
        "/home/user/.hermes/cache/images/two.png",
        "/home/user/.hermes/.creds/three",
    ]
    .into_iter()
    .enumerate()
    {
        let host = stage.path().join(i.to_string());
        std::fs::write(&host, format!("content {i}")).unwrap();
        files.push((host, remote.to_owned()));
    }
    let transport = backend.transport().expect("transport");
    let before = world.server().requests();
    assert_eq!(transport.upload_many(files).expect("upload"), 3);
    let upload: Vec<_> = world.server().requests().since(&before).routes().collect();
    assert_eq!(upload, vec![("files POST", 1)], "three files, one request");
    // Many files in nested directories, several to a directory: still one request.
    let mut many = Vec::new();
    for i in 0..40 {
        let host = stage.path().join(format!("many-{i}"));
        std::fs::write(&host, format!("many {i}")).unwrap();
        let remote = format!(
            "/home/user/.hermes/skills/bulk/d{}/e{}/f{i}.md",
            i % 5,
            i % 3
        );
        many.push((host, remote));
    }
    let before = world.server().requests();
    assert_eq!(transport.upload_many(many).expect("bulk upload"), 40);
    let upload: Vec<_> = world.server().requests().since(&before).routes().collect();
    assert_eq!(upload, vec![("files POST", 1)], "forty files, one request");
    assert_eq!(
        ok(
            &backend,
            "find /home/user/.hermes/skills/bulk -type f | wc -l; \
             cat /home/user/.hermes/skills/bulk/d4/e0/f39.md"
        ),
        "40\nmany 39"
    );
    assert_eq!(
        ok(
            &backend,
            "cat /home/user/.hermes/skills/a/b/c/one.md /home/user/.hermes/.creds/three"
        ),
        "content 0content 2"
    );
    let delete = vec![
        "/home/user/.hermes/cache/images/two.png".to_owned(),
        "/home/user/.hermes/never/existed".to_owned(),
    ];
    transport.delete_many(delete.clone()).expect("delete");
    transport.delete_many(delete).expect("delete again");
    assert_eq!(
        ok(&backend, "ls /home/user/.hermes/cache/images | wc -l").trim(),
        "0"
    );
    // A missing host file fails, and names the path.
    let error = transport
        .upload_many(vec![(
            PathBuf::from("/nonexistent/x"),
            "/home/user/x".to_owned(),
        )])
        .expect_err("missing host file");
    assert!(error.to_string().contains("/nonexistent/x"), "{error}");
}

#[test]
fn the_teardown_pull_is_capped_while_downloading_and_a_failure_is_reported() {
    // contract: S12
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let mut config = world.config(SandboxMode::Persistent);
    config.state_cap = 256 * 1024;
    let backend = agent_sandbox::Backend::new(
        config,
        world.scope("default"),
        world.services(),
        hooks.clone(),
    )
    .unwrap();
    ok(
        &backend,
        "mkdir -p /home/user/.hermes/cache/documents && \
         head -c 4194304 /dev/urandom > /home/user/.hermes/cache/documents/big.bin",
    );
    let transport = backend.transport().unwrap();
    let mut sink = Vec::new();
    let error = transport
        .download_state(&mut sink)
        .expect_err("over the cap");
    assert!(error.is_over_cap(), "{error}");
    assert!(
        sink.len() < 4 * 1024 * 1024,
        "refused before the whole archive arrived"
    );
    assert_eq!(
        ok(&backend, "ls -a /tmp | grep '^hermes-e2b-pull\\.' || true"),
        "",
        "the refused archive is not left in the sandbox"
    );
    // The pull hook swallows the error like Hermes' sync_back; cleanup still reports it.
    let report = backend.cleanup();
    let PullOutcome::Failed(detail) = report.pull else {
        panic!("the pull failure was lost: {:?}", report.pull);
    };
    assert!(
        detail.contains(report.sandbox_id.as_deref().unwrap()),
        "{detail}"
    );
    // The scope note people read says so too.
    let note = world.scope_files(&backend).note().unwrap().expect("a note");
    let line = note.get("last-pull").expect("a last-pull line");
    assert!(line.contains("failed from"), "{line}");
}

#[test]
fn the_probe_and_attach_mode_never_touch_the_scope_files() {
    // contract: L11, L12
    let world = World::new();
    let probe = world.backend(
        SandboxMode::Persistent,
        agent_sandbox::PROBE_TASK_ID,
        Arc::new(NoStateHooks),
    );
    ok(&probe, "true");
    probe.cleanup();
    assert!(!world.coordination_dir().exists());

    // An attach-mode backend on someone else's sandbox: no scope files either, and the
    // sandbox is neither paused nor killed.
    let client = world.client();
    let mut options = e2b_client::CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(600));
    let external = world
        .runtime
        .block_on(client.create(options))
        .unwrap()
        .sandbox_id;
    let attach = world.backend(
        SandboxMode::Attach {
            sandbox_id: external.clone(),
        },
        "default",
        Arc::new(NoStateHooks),
    );
    assert_eq!(ok(&attach, "echo attached"), "attached\n");
    assert_eq!(attach.info().unwrap().role, RoleKind::External);
    attach.cleanup();
    attach.finalize();
    assert!(!world.coordination_dir().exists());
    assert_eq!(
        world.detail(external.as_str()).unwrap().summary.state,
        e2b_client::SandboxState::Running
    );
    let requests = world.server().requests();
    assert_eq!(requests.get("pause"), 0);
    assert_eq!(requests.get("kill"), 1, "the probe's kill only");
}

#[test]
fn a_host_that_cannot_coordinate_warns_and_acts_as_sole_writer() {
    // contract: C6
    let world = World::new();
    // The coordination directory is held by a regular file: nothing can be created there.
    std::fs::create_dir_all(world.home.path().join("cache")).unwrap();
    std::fs::write(world.coordination_dir(), "not a directory").unwrap();
    let backend = world.persistent();
    let log = support::WarningLog::default();
    let info = log
        .capture(|| backend.attach())
        .expect("a single session still works");
    assert_eq!(info.role, RoleKind::Writer);
    let degradation = info.degradation.expect("degradation reported");
    assert!(degradation.contains("not supported"), "{degradation}");
    assert_eq!(
        log.warnings(),
        vec![degradation.clone()],
        "warned once, as reported"
    );
    assert_eq!(log.capture(|| ok(&backend, "echo works")), "works\n");
    assert_eq!(backend.cleanup().pull, PullOutcome::Pulled);
    // Once per cause per process: later sessions of this process (a gateway's) find the same
    // host degraded and say nothing more.
    for task in ["default", "gateway-session-2"] {
        let session = world.persistent_task(task);
        log.capture(|| {
            let info = session.attach().expect("attach");
            assert_eq!(info.degradation.as_deref(), Some(degradation.as_str()));
            assert_eq!(ok(&session, "echo works"), "works\n");
            session.cleanup();
        });
    }
    assert_eq!(log.count("not supported"), 1, "{:?}", log.warnings());
}

#[test]
fn sync_state_pushes_as_the_writer_and_never_as_a_reader() {
    // contract: S14, C2
    let world = World::new();
    let home = world.home.path();
    let writer_hooks = RecordingHooks::new(home);
    let writer = world.backend(SandboxMode::Persistent, "default", writer_hooks.clone());
    // Before any command: attaches, brings the writer up (initial push), then syncs once more.
    writer.sync_state().expect("writer syncs");
    assert_eq!(writer.info().expect("attached").role, RoleKind::Writer);
    let after_bring_up = writer_hooks.calls();
    assert!(!after_bring_up.is_empty(), "the writer pushed");
    writer.sync_state().expect("writer syncs again");
    assert_eq!(
        writer_hooks.calls().len(),
        after_bring_up.len() + 1,
        "one more push: {:?}",
        writer_hooks.calls()
    );

    let reader_hooks = RecordingHooks::new(home);
    let reader = world.backend(SandboxMode::Persistent, "default", reader_hooks.clone());
    reader.sync_state().expect("an admitted reader passes");
    assert_eq!(reader.info().expect("attached").role, RoleKind::Reader);
    // Refused while the writer's sync fails, like a command (fail closed, with the hint).
    writer_hooks.fail_sync.store(true, Ordering::SeqCst);
    writer.sync_state().expect_err("the writer's sync fails");
    let refused = reader.sync_state().expect_err("gate closed");
    assert!(refused.is_not_ready(), "{refused}");
    assert!(
        reader_hooks.calls().is_empty(),
        "{:?}",
        reader_hooks.calls()
    );
    writer_hooks.fail_sync.store(false, Ordering::SeqCst);
    writer.cleanup();
    reader.cleanup();
}
