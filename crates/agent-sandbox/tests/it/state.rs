//! Roles, admission, recovery and the state transport against e2b-local.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_sandbox::{Backend, NoStateHooks, PullOutcome, RoleKind, SandboxMode, WriterArbitration};
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
fn a_host_edit_after_a_push_supersedes_the_sandbox_copy_across_sessions() {
    // contract: S15, S6
    host_edits_supersede_the_last_push(WriterArbitration::Host);
}

#[test]
fn a_host_edit_after_a_staged_push_supersedes_the_sandbox_copy_under_sandbox_arbitration() {
    // contract: S15, C10 — staged uploads are recorded by the path their commit lands at.
    host_edits_supersede_the_last_push(WriterArbitration::Sandbox {
        term: Duration::from_secs(180),
    });
}

fn host_edits_supersede_the_last_push(arbitration: WriterArbitration) {
    let world = World::new();
    let open = |world: &World, home: &Path| {
        let mut config = world.config(SandboxMode::Persistent);
        config.writer_arbitration = arbitration;
        Backend::new(
            config,
            world.scope("default"),
            world.services(),
            RecordingHooks::new(home),
        )
        .expect("backend")
    };
    let home = world.home.path();
    let skill = home.join("skills/s/SKILL.md");
    std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
    std::fs::write(&skill, "host v0").unwrap();
    let mut id = String::new();
    for session in 1..=3 {
        let backend = open(&world, home);
        id = backend.attach().expect("attach").sandbox_id;
        // The bring-up pushed the host's version over the previous push.
        assert_eq!(
            ok(&backend, "cat /home/user/.hermes/skills/s/SKILL.md"),
            format!("host v{}", session - 1)
        );
        backend.cleanup();
        // Between sessions the host edits the file: the sandbox still holds the last push.
        std::fs::write(&skill, format!("host v{session}")).unwrap();
    }
    let quarantine = home.join(format!("cache/e2b-recovered/{id}"));
    assert!(
        !quarantine.exists(),
        "a copy that is only the last push is never a conflict"
    );
    let records: Vec<_> = std::fs::read_dir(home.join("cache/e2b"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".push-base"))
        .collect();
    assert_eq!(records.len(), 1, "one push base for the scope");

    // A sandbox-side edit is still a conflict, quarantined next to the host's edit (S6).
    let backend = open(&world, home);
    backend.attach().expect("attach");
    ok(
        &backend,
        "printf 'sandbox edit' > /home/user/.hermes/skills/s/SKILL.md",
    );
    backend.cleanup();
    std::fs::write(&skill, "host v4").unwrap();
    let last = open(&world, home);
    assert_eq!(last.attach().expect("attach").sandbox_id, id);
    assert_eq!(std::fs::read_to_string(&skill).unwrap(), "host v4");
    assert_eq!(
        std::fs::read_to_string(quarantine.join("skills/s/SKILL.md")).unwrap(),
        "sandbox edit"
    );
    last.cleanup();
}

#[test]
fn the_push_base_follows_uploads_and_deletes_and_is_rewritten_only_when_they_change_it() {
    // contract: S15
    use std::os::unix::fs::MetadataExt;
    let world = World::new();
    let home = world.home.path();
    let skill = home.join("skills/s/SKILL.md");
    std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
    std::fs::write(&skill, "host").unwrap();
    let backend = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    let id = backend.attach().expect("attach").sandbox_id;
    let record = std::fs::read_dir(home.join("cache/e2b"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".push-base"))
        .expect("the initial push stored a push base");
    let (base, source) = recovery::PushBase::load(&record, &id);
    assert_eq!(source, recovery::BaseSource::Record);
    assert_eq!(base.len(), 1);
    // A sync that moves nothing leaves the record alone (no write per command).
    let inode = std::fs::metadata(&record).unwrap().ino();
    ok(&backend, "true");
    assert_eq!(std::fs::metadata(&record).unwrap().ino(), inode);
    // A delete forgets what it removed; the next successful sync stores that.
    let transport = backend.transport().expect("transport");
    transport
        .delete_many(vec!["/home/user/.hermes/skills/s/SKILL.md".to_owned()])
        .expect("delete");
    ok(&backend, "true");
    assert!(recovery::PushBase::load(&record, &id).0.is_empty());
    // An upload is recorded; a delete of the Hermes home itself forgets everything, even
    // when the sandbox refuses it (the sandbox may have removed part of it).
    transport
        .upload_many(vec![(
            skill.clone(),
            "/home/user/.hermes/skills/s/SKILL.md".to_owned(),
        )])
        .expect("upload");
    ok(&backend, "true");
    assert_eq!(recovery::PushBase::load(&record, &id).0.len(), 1);
    transport
        .delete_many(vec!["/home/user/.hermes".to_owned()])
        .expect_err("rm refuses a directory");
    ok(&backend, "true");
    assert!(recovery::PushBase::load(&record, &id).0.is_empty());
    backend.cleanup();
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

    assert_eq!(writer.cleanup().pull, PullOutcome::Pulled);
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

/// Hooks that, during the initial push, write into the sandbox behind the backend's back:
/// after the recovery snapshot and before the push lands (the window S13 pins).
struct WindowHooks {
    world_url: String,
    runtime: tokio::runtime::Handle,
    host: PathBuf,
}

impl agent_sandbox::StateHooks for WindowHooks {
    fn push(
        &self,
        transport: &agent_sandbox::StateTransport,
        kind: agent_sandbox::PushKind,
    ) -> Result<(), agent_sandbox::HookError> {
        if kind == agent_sandbox::PushKind::Initial {
            let mut config =
                e2b_client::Config::new(e2b_client::ApiKey::new("test-local-key".to_owned()));
            config.api_url = Some(self.world_url.clone());
            config.sandbox_url = Some(self.world_url.clone());
            let client = e2b_client::Client::new(config)?;
            let id = e2b_client::SandboxId::parse(transport.sandbox_id().to_owned()).unwrap();
            let writes = async {
                let connected = client.connect(&id, Duration::from_secs(300)).await?;
                let sandbox = client.sandbox(connected.sandbox.envd_access())?;
                sandbox
                    .run(
                        e2b_client::StartOptions::shell(
                            "mkdir -p /home/user/.hermes/skills/known /home/user/.hermes/skills/late && \
                             printf late-overwrite > /home/user/.hermes/skills/known/SKILL.md && \
                             printf late-new > /home/user/.hermes/skills/late/NEW.md"
                                .to_owned(),
                        ),
                        4096,
                    )
                    .await
            };
            // Hooks run on the caller's thread, outside the runtime: blocking is allowed.
            let output = self.runtime.block_on(writes)?;
            assert_eq!(output.end.exit_code, 0);
            transport.upload_many(vec![(
                self.host.join("skills/known/SKILL.md"),
                "/home/user/.hermes/skills/known/SKILL.md".to_owned(),
            )])?;
        }
        Ok(())
    }

    fn pull(
        &self,
        _transport: &agent_sandbox::StateTransport,
    ) -> Result<(), agent_sandbox::HookError> {
        Ok(())
    }
}

#[test]
fn the_window_between_snapshot_and_push_is_pinned() {
    // contract: S13
    let world = World::new();
    let home = world.home.path().to_path_buf();
    std::fs::create_dir_all(home.join("skills/known")).unwrap();
    std::fs::write(home.join("skills/known/SKILL.md"), "host copy").unwrap();
    let hooks = Arc::new(WindowHooks {
        world_url: world.url.clone(),
        runtime: world.runtime.handle().clone(),
        host: home.clone(),
    });
    let backend = world.backend(SandboxMode::Persistent, "default", hooks);
    backend.attach().expect("attach");
    // A write to a host-known path in the window is overwritten by the push ...
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/known/SKILL.md"),
        "host copy"
    );
    // ... and a file created in the window survives (a force-push deletes nothing).
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/late/NEW.md"),
        "late-new"
    );
    // It was not recovered to the host: the snapshot was taken before it existed.
    assert!(!home.join("skills/late/NEW.md").exists());
}

/// Pulls like Hermes' sync_back: up to three attempts, errors swallowed.
struct RetryingPull;

impl agent_sandbox::StateHooks for RetryingPull {
    fn push(
        &self,
        _transport: &agent_sandbox::StateTransport,
        _kind: agent_sandbox::PushKind,
    ) -> Result<(), agent_sandbox::HookError> {
        Ok(())
    }

    fn pull(
        &self,
        transport: &agent_sandbox::StateTransport,
    ) -> Result<(), agent_sandbox::HookError> {
        for _ in 0..3 {
            if transport.download_state(&mut Vec::new()).is_ok() {
                break;
            }
        }
        Ok(())
    }
}

#[test]
fn a_pull_that_succeeds_on_a_retry_is_not_reported_as_failed() {
    // contract: S12
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(RetryingPull));
    ok(&backend, "mkdir -p /home/user/.hermes/skills");
    let mut rule = e2b_local::FailRule::new(1, 503);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    world.server().faults().fail_next(rule);
    assert_eq!(backend.cleanup().pull, PullOutcome::Pulled);

    // Three failed attempts are a failed pull.
    let again = world.backend(SandboxMode::Persistent, "default", Arc::new(RetryingPull));
    ok(&again, "true");
    let mut rule = e2b_local::FailRule::new(3, 503);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    world.server().faults().fail_next(rule);
    assert!(matches!(again.cleanup().pull, PullOutcome::Failed(_)));
}

/// Leaves a persistent sandbox whose `skills/demo/SKILL.md` conflicts with the host's copy
/// ("host" on the host, "sandbox" in the sandbox), with the writer role released. Returns
/// the sandbox id.
fn a_sandbox_with_a_conflicting_skill(world: &World) -> String {
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/demo")).unwrap();
    std::fs::write(home.join("skills/demo/SKILL.md"), "host").unwrap();
    let first = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    ok(
        &first,
        "printf sandbox > /home/user/.hermes/skills/demo/SKILL.md",
    );
    let id = first.info().expect("attached").sandbox_id;
    // A hard crash: no teardown pull, so the host keeps its older copy.
    first.finalize();
    id
}

/// What a bring-up that failed closed must leave: the error surfaced, the push never ran, no
/// upload reached the sandbox, and the sandbox's copy (the only one) is untouched.
fn assert_failed_closed_without_pushing(
    world: &World,
    id: &str,
    hooks: &RecordingHooks,
    attached: Result<agent_sandbox::AttachInfo, agent_sandbox::Error>,
    before: &e2b_local::RequestCounts,
) -> agent_sandbox::Error {
    let error = attached.expect_err("the bring-up fails closed");
    assert_eq!(error.sandbox_id(), Some(id), "{error}");
    assert!(
        !hooks.calls().iter().any(|call| call.starts_with("push")),
        "{:?}",
        hooks.calls()
    );
    let since = world.server().requests().since(before);
    assert_eq!(
        since.get("files POST"),
        0,
        "{:?}",
        since.routes().collect::<Vec<_>>()
    );
    let sandbox_copy = world
        .server()
        .sandbox_home(id)
        .join(".hermes/skills/demo/SKILL.md");
    assert_eq!(std::fs::read_to_string(sandbox_copy).unwrap(), "sandbox");
    error
}

#[test]
fn a_backend_whose_quarantine_is_redirected_does_not_push() {
    // contract: S8 — quarantine refused fails recovery closed, which blocks the push.
    let world = World::new();
    let id = a_sandbox_with_a_conflicting_skill(&world);
    // The quarantine tree is redirected outside the home.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path(),
        world.home.path().join("cache/e2b-recovered"),
    )
    .unwrap();

    let hooks = RecordingHooks::new(world.home.path());
    let second = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let before = world.server().requests();
    let attached = second.attach();
    let error = assert_failed_closed_without_pushing(&world, &id, &hooks, attached, &before);
    assert!(
        matches!(error, agent_sandbox::Error::Recovery { .. }),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("skills/demo/SKILL.md")).unwrap(),
        "host"
    );
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // Nothing runs on the unrecovered sandbox either.
    assert!(support::run(&second, "true").is_err());
    assert_eq!(
        world.server().requests().since(&before).get("files POST"),
        0
    );
}

#[test]
fn a_backend_whose_snapshot_cannot_be_read_does_not_push() {
    // contract: S11 — an unreadable snapshot fails the bring-up closed, before any push.
    let world = World::new();
    let id = a_sandbox_with_a_conflicting_skill(&world);
    // Every envd stream is cut after a few bytes: the snapshot never arrives whole.
    world
        .server()
        .faults()
        .drop_streams(e2b_local::DropRule::new(100, 16));

    let hooks = RecordingHooks::new(world.home.path());
    let second = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let before = world.server().requests();
    let attached = second.attach();
    world.server().faults().clear();
    let error = assert_failed_closed_without_pushing(&world, &id, &hooks, attached, &before);
    assert!(error.to_string().contains("state snapshot"), "{error}");
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("skills/demo/SKILL.md")).unwrap(),
        "host"
    );
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
