//! Attach, adoption, leases and cleanup against e2b-local.

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{
    ApiKeySource, Backend, ErrorChain, KillOutcomeReport, NoStateHooks, Origin, PROBE_TASK_ID,
    PullOutcome, RoleKind, SandboxMode,
};
use e2b_client::{CreateOptions, OnTimeout, PauseMemory, SandboxState};
use sandbox_identity::{IdentityMetadata, InternetAccess, Mode, ScopeIdentity, Security};

use crate::support::{self, RecordingHooks, World, ok, run};

fn ephemeral() -> SandboxMode {
    SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(300),
    }
}

#[test]
fn nothing_happens_before_first_use() {
    // contract: L1
    let world = World::new();
    let backend = world.persistent();
    assert!(backend.info().is_none());
    assert_eq!(backend.stats(), agent_sandbox::Stats::default());
    assert!(world.list().is_empty());
    assert!(
        !world.coordination_dir().exists(),
        "no host file at construction"
    );

    let info = backend.attach().expect("attach");
    assert_eq!(info.origin, Origin::Created);
    assert_eq!(info.role, RoleKind::Writer);
    let listed = world.list();
    assert_eq!(listed.len(), 1);
    // contract: I1 — identity is metadata: the digest, no task id or host path.
    let metadata = &listed[0].metadata;
    assert_eq!(metadata["hermes.scope"], backend.scope_digest());
    let home = world.home.path().to_string_lossy().into_owned();
    assert!(
        metadata
            .values()
            .all(|v| !v.contains(&home) && v != "default")
    );
}

#[test]
fn persistent_sandbox_is_found_again_and_resumed_after_a_restart() {
    // contract: L2, L3, L16
    let world = World::new();
    let first = world.persistent();
    ok(&first, "echo kept > /home/user/kept.txt");
    let id = first.info().expect("attached").sandbox_id;
    let report = first.cleanup();
    // Its state pulled and no other session on it: paused at close, never killed.
    assert_eq!(report.sandbox, KillOutcomeReport::Paused);
    assert_eq!(first.stats().sandbox_kills, 0);
    assert_eq!(
        world.detail(&id).expect("still there").summary.state,
        SandboxState::Paused
    );
    let lifecycle = world.detail(&id).unwrap().lifecycle.expect("lifecycle");
    assert_eq!(lifecycle.on_timeout, "pause");
    // Created to pause keeping the filesystem only: no memory snapshot.
    let stored = world.raw_detail(&id);
    assert!(stored.contains(r#""pauseMode":"filesystem""#), "{stored}");

    // Whenever it pauses, the next session resumes it with its files.
    world.advance(Duration::from_secs(3600));
    assert_eq!(
        world.detail(&id).unwrap().summary.state,
        SandboxState::Paused
    );
    let second = world.persistent();
    assert_eq!(ok(&second, "cat /home/user/kept.txt"), "kept\n");
    let info = second.info().expect("attached");
    assert_eq!(info.sandbox_id, id);
    assert_eq!(info.origin, Origin::Adopted { duplicates: 0 });
    assert!(info.resumed);
    assert_eq!(world.list().len(), 1);
}

#[test]
fn duplicates_adopt_the_newest_and_report_the_count() {
    // contract: I5
    let world = World::new();
    let backend = world.persistent();
    let identity = ScopeIdentity {
        profile_home: world.home.path().to_string_lossy().into_owned(),
        task_id: "default".to_owned(),
        template: "base".to_owned(),
        mode: Mode::Persistent,
        internet: InternetAccess::Allowed,
        security: Security::Secure,
    };
    let metadata = IdentityMetadata::for_scope(&identity).to_map();
    assert_eq!(metadata["hermes.scope"], backend.scope_digest());
    let client = world.client();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut options = CreateOptions::new("base".to_owned());
        options.metadata = metadata.clone();
        options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
        options.timeout = Some(Duration::from_secs(3600));
        ids.push(
            world
                .runtime
                .block_on(client.create(options))
                .expect("create")
                .sandbox_id,
        );
        world.server().clock().advance(Duration::from_secs(5));
    }
    let log = support::WarningLog::default();
    let info = log.capture(|| backend.attach()).expect("attach");
    assert_eq!(info.origin, Origin::Adopted { duplicates: 2 });
    assert_eq!(info.sandbox_id, ids[2].as_str());
    assert_eq!(backend.stats().creates, 0);
    // A single warning gives the count and names the adopted sandbox.
    let warnings = log.warnings();
    assert_eq!(log.count("sandboxes for this scope"), 1, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("found 3 sandboxes") && w.contains(&info.sandbox_id)),
        "{warnings:?}"
    );
    // Once per cause per process: another session of the scope in this process adopts the
    // same sandbox without repeating it.
    let other = world.persistent();
    let again = log
        .capture(|| other.attach())
        .expect("second session attaches");
    assert_eq!(again.sandbox_id, info.sandbox_id);
    assert_eq!(
        log.count("sandboxes for this scope"),
        1,
        "{:?}",
        log.warnings()
    );
}

#[test]
fn the_remembered_sandbox_never_overrides_the_lists_choice() {
    // contract: I5, I4 — this host remembers the sandbox its scope last attached and connects
    // it together with the list; when the list finds a newer duplicate, the newer one is
    // adopted all the same, and a remembered sandbox that is gone costs nothing but its
    // refused connect (the list finds none and the writer creates).
    let world = World::new();
    let first = world.persistent();
    ok(&first, "true");
    let remembered = first.info().expect("attached").sandbox_id;
    first.cleanup();
    world.advance(Duration::from_secs(3600));

    let mut options = CreateOptions::new("base".to_owned());
    options.metadata = world
        .list()
        .iter()
        .find(|listed| listed.sandbox_id.as_str() == remembered)
        .map(|listed| support::metadata_of(listed).clone())
        .expect("the first sandbox is listed");
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options.timeout = Some(Duration::from_secs(3600));
    let newer = world
        .runtime
        .block_on(world.client().create(options))
        .expect("create")
        .sandbox_id;
    let second = world.persistent();
    let info = second.attach().expect("attach");
    assert_eq!(
        info.sandbox_id,
        newer.as_str(),
        "the list's newest, not the hint"
    );
    assert_eq!(info.origin, Origin::Adopted { duplicates: 1 });
    assert_eq!(
        second.stats().connects,
        2,
        "the remembered one early, the chosen one after the list"
    );
    second.cleanup();

    // The scope's sandboxes are gone: the remembered one's connect is refused, and the list,
    // finding none, lets the writer create.
    for listed in world.list() {
        world
            .runtime
            .block_on(world.client().kill(&listed.sandbox_id))
            .expect("kill");
    }
    let third = world.persistent();
    let info = third.attach().expect("attach");
    assert_eq!(info.origin, Origin::Created);
    assert_eq!(third.stats().creates, 1);
    third.cleanup();
}

#[test]
fn another_template_or_posture_is_never_adopted() {
    // contract: I3
    let world = World::new();
    let first = world.persistent();
    let first_id = first.attach().expect("attach").sandbox_id;
    first.cleanup();
    let mut config = world.config(SandboxMode::Persistent);
    config.internet = InternetAccess::Denied;
    let second = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    let info = second.attach().expect("attach");
    assert_eq!(info.origin, Origin::Created);
    assert_ne!(info.sandbox_id, first_id);
    // contract: X6 — the posture reaches E2B: deny-all egress for the new sandbox.
    let detail = world.detail(&info.sandbox_id).unwrap();
    assert_eq!(detail.allow_internet_access, Some(false));
    assert_ne!(
        world.detail(&first_id).unwrap().allow_internet_access,
        Some(false)
    );
}

#[test]
fn a_lost_create_response_is_found_by_metadata_on_the_next_attach() {
    // contract: I4
    let world = World::new();
    let faults = world.server().faults();
    // The one list (under the creation lock) passes untouched (its rule's cut lies beyond its
    // body); the create's response is cut after E2B created the sandbox.
    for after_bytes in [1 << 20, 0] {
        let mut rule = e2b_local::DropRule::new(1, after_bytes);
        rule.scope = e2b_local::FaultScope::Rest;
        rule.path_prefix = Some("/v2/sandboxes".to_owned());
        faults.drop_streams(rule);
    }
    let backend = world.persistent();
    let error = backend.attach().expect_err("the create response is lost");
    assert!(error.to_string().contains("E2B create failed"), "{error}");
    assert_eq!(world.list().len(), 1, "the server did create it");

    let info = backend.attach().expect("second attach");
    assert_eq!(info.origin, Origin::Adopted { duplicates: 0 });
    assert_eq!(world.list().len(), 1);
    assert_eq!(backend.stats().creates, 1);
}

#[test]
fn lease_is_extended_only_when_the_known_expiry_does_not_cover_the_command() {
    // contract: L5
    let world = World::new();
    let backend = world.persistent();
    let long = agent_sandbox::RunOptions::new(Duration::from_secs(600));
    let short = agent_sandbox::RunOptions::new(Duration::from_secs(10));
    let run_with = |options: agent_sandbox::RunOptions| {
        let handle = backend
            .run("true", options, Box::new(agent_sandbox::DiscardSink))
            .expect("run");
        assert_eq!(handle.wait().expect("exit").exit_code, 0);
    };
    // Created with the 300 s baseline: a short command is covered.
    run_with(short.clone());
    assert_eq!(backend.stats().lease_extensions, 0);
    // 600 s + 30 s grace is not: one extend-only connect.
    run_with(long.clone());
    assert_eq!(backend.stats().lease_extensions, 1);
    let id = backend.info().unwrap().sandbox_id;
    let end_after_long = world.detail(&id).unwrap().summary.end_at;
    // Covered now; nothing is sent.
    run_with(long.clone());
    run_with(short.clone());
    assert_eq!(backend.stats().lease_extensions, 1);
    // Later, the known expiry no longer covers 630 s: extend again.
    world.advance(Duration::from_secs(100));
    run_with(long.clone());
    assert_eq!(backend.stats().lease_extensions, 2);
    let end_after_second = world.detail(&id).unwrap().summary.end_at;
    assert!(end_after_second > end_after_long);
    // A short command never shortens it (extend-only connect, no set-timeout).
    run_with(short);
    assert_eq!(world.detail(&id).unwrap().summary.end_at, end_after_second);

    // Someone else (another host's session) extends the sandbox well past what this
    // backend knows. When this backend's own extension asks for less, the lease must stay
    // where it is: a set-timeout would cut it short.
    let client = world.client();
    let sandbox_id = e2b_client::SandboxId::parse(id.clone()).unwrap();
    world
        .runtime
        .block_on(client.connect(&sandbox_id, Duration::from_secs(3600)))
        .expect("another session extends");
    let end_extended = world.detail(&id).unwrap().summary.end_at;
    assert!(end_extended > end_after_second);
    world.advance(Duration::from_secs(100));
    let extensions = backend.stats().lease_extensions;
    run_with(long);
    assert_eq!(
        backend.stats().lease_extensions,
        extensions + 1,
        "it did extend"
    );
    assert_eq!(world.detail(&id).unwrap().summary.end_at, end_extended);
    assert_eq!(world.server().requests().get("timeout"), 0);
}

#[test]
fn a_sandbox_paused_between_commands_is_resumed_transparently() {
    // contract: L3
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "echo one > /home/user/one.txt");
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().pause_sandbox(&id).expect("pause");
    assert_eq!(ok(&backend, "cat /home/user/one.txt"), "one\n");
    assert!(backend.info().unwrap().resumed);
    assert_eq!(world.list().len(), 1);
}

#[test]
fn ephemeral_sandboxes_are_fresh_pulled_and_killed() {
    // contract: L4
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let first = world.backend(ephemeral(), "t1", hooks.clone());
    ok(
        &first,
        "mkdir -p /home/user/.hermes/skills/x && echo s > /home/user/.hermes/skills/x/SKILL.md",
    );
    let id = first.info().unwrap().sandbox_id;
    assert_eq!(first.info().unwrap().role, RoleKind::Owner);
    let detail = world.detail(&id).unwrap();
    assert_eq!(detail.lifecycle.expect("lifecycle").on_timeout, "kill");
    // Lease floor: lifetime + reaper interval + control-plane margin.
    let lease = detail.summary.end_at - detail.summary.started_at;
    assert!(lease >= time::Duration::seconds(300 + 60 + 60), "{lease}");

    // A second ephemeral backend on the same scope never adopts.
    let second = world.backend(ephemeral(), "t1", Arc::new(NoStateHooks));
    assert_ne!(second.attach().unwrap().sandbox_id, id);

    let report = first.cleanup();
    assert_eq!(report.pull, PullOutcome::Pulled);
    assert_eq!(report.sandbox, KillOutcomeReport::Killed);
    assert!(world.detail(&id).expect_err("killed").is_not_found());
    let names = support::tar_names(&hooks.pulled.lock().unwrap());
    assert!(
        names.contains(&"home/user/.hermes/skills/x/SKILL.md".to_owned()),
        "{names:?}"
    );
    // The bring-up push, the per-command sync (a no-op for an unchanged tree), the pull.
    assert_eq!(hooks.calls(), ["push:Initial", "push:Incremental", "pull"]);
    second.cleanup();
}

#[test]
fn the_prompt_probe_gets_a_short_kill_lease_no_sync_and_no_adoption() {
    // contract: L11
    let world = World::new();
    // A persistent sandbox of the same profile exists; the probe must not adopt it.
    let main = world.persistent();
    let main_id = main.attach().unwrap().sandbox_id;
    let hooks = RecordingHooks::new(world.home.path());
    let probe = world.backend(SandboxMode::Persistent, PROBE_TASK_ID, hooks.clone());
    assert_eq!(ok(&probe, "uname -s").trim(), "Linux");
    let info = probe.info().unwrap();
    assert_eq!(info.role, RoleKind::Probe);
    assert_ne!(info.sandbox_id, main_id);
    let detail = world.detail(&info.sandbox_id).unwrap();
    assert_eq!(detail.lifecycle.expect("lifecycle").on_timeout, "kill");
    let lease = detail.summary.end_at - detail.summary.started_at;
    assert!(lease <= time::Duration::seconds(120), "{lease}");
    let report = probe.cleanup();
    assert_eq!(report.pull, PullOutcome::NotAttempted);
    assert_eq!(report.sandbox, KillOutcomeReport::Killed);
    assert!(hooks.calls().is_empty(), "no sync: {:?}", hooks.calls());
    assert_eq!(
        world.detail(&main_id).unwrap().summary.state,
        SandboxState::Running
    );
}

#[test]
fn attach_mode_connects_by_id_and_never_pauses_or_kills() {
    // contract: L12
    let world = World::new();
    let client = world.client();
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(600));
    let external = world
        .runtime
        .block_on(client.create(options))
        .unwrap()
        .sandbox_id;
    let backend = world.backend(
        SandboxMode::Attach {
            sandbox_id: external.clone(),
        },
        "default",
        Arc::new(NoStateHooks),
    );
    assert_eq!(ok(&backend, "echo hi"), "hi\n");
    let info = backend.info().unwrap();
    assert_eq!(info.origin, Origin::Connected);
    assert_eq!(info.role, RoleKind::External);
    let report = backend.cleanup();
    assert_eq!(report.sandbox, KillOutcomeReport::LeftRunning);
    backend.finalize();
    assert_eq!(
        world.detail(external.as_str()).unwrap().summary.state,
        SandboxState::Running
    );
    assert_eq!(backend.stats().sandbox_kills, 0);
}

#[test]
fn a_missing_api_key_fails_without_any_request() {
    // contract: X2
    let world = World::new();
    let mut config = world.config(SandboxMode::Persistent);
    config.api_key = ApiKeySource::Resolver(Arc::new(|| None));
    let backend = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .unwrap();
    let error = backend.attach().expect_err("unconfigured");
    assert!(error.to_string().contains("no E2B API key"), "{error}");
    assert!(world.list().is_empty());
}

#[test]
fn infrastructure_errors_name_the_operation_and_the_sandbox() {
    // contract: O3
    // That the text Hermes sees never says "timeout" is the Hermes boundary's rule, checked
    // in hermes-binding (`error::tests::a_vanished_sandbox_message_never_says_timeout`).
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().vanish_sandbox(&id).expect("vanish");
    let (error, _) = match run(&backend, "true") {
        Err(error) => (error, ()),
        Ok(result) => panic!("ran in a vanished sandbox: {result:?}"),
    };
    let text = error.to_string();
    assert!(text.starts_with("E2B "), "{text}");
    assert!(text.contains(&id), "{text}");
    assert_eq!(error.sandbox_id(), Some(id.as_str()));
}

#[test]
fn a_sandbox_killed_under_a_running_command_fails_it_saying_so() {
    // contract: O3 — the stream breaks off as on E2B; the error names the sandbox and says it
    // was killed or reached its end of life, and is classified as the sandbox being gone.
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let id = backend.info().unwrap().sandbox_id;
    let handle = backend
        .run(
            "sleep 300",
            agent_sandbox::RunOptions::new(Duration::from_secs(600)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect("run");
    world.server().faults().vanish_sandbox(&id).expect("vanish");
    let error = handle
        .wait()
        .expect_err("the sandbox went away under the command");
    assert!(error.is_sandbox_gone(), "{error}");
    assert_eq!(error.sandbox_id(), Some(id.as_str()));
    let text = error.to_string();
    assert!(text.starts_with("E2B "), "{text}");
    assert!(text.contains(&id), "{text}");
    let chain = ErrorChain(&*error).to_string();
    assert!(
        chain.contains("killed or reached its end of life"),
        "{chain}"
    );
}

#[test]
fn steady_state_commands_send_no_control_plane_request() {
    // contract: L5 — request accounting: once attached, a command covered by the known lease
    // costs only its own start request (no list, connect or create).
    let world = World::new();
    let backend = world.persistent();
    ok(&backend, "true");
    let before = backend.stats();
    for _ in 0..5 {
        // Time passes between an agent's commands; within the lease headroom it costs nothing.
        world.advance(Duration::from_secs(5));
        ok(&backend, "true");
    }
    let after = backend.stats();
    assert_eq!(after.commands, before.commands + 5);
    assert_eq!(
        (after.lists, after.connects, after.creates),
        (before.lists, before.connects, before.creates)
    );
}

#[test]
fn the_api_key_never_shows_in_debug_output_or_errors() {
    // contract: X1
    let world = World::new();
    let mut config = world.config(SandboxMode::Persistent);
    let secret = "e2b_0123456789abcdef0123456789abcdef";
    config.api_key = ApiKeySource::Key(e2b_client::ApiKey::new(secret.to_owned()));
    let backend = Backend::new(
        config.clone(),
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .unwrap();
    // The key never reaches the sandbox's environment.
    assert!(!ok(&backend, "env").contains("0123456789abcdef"));
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().vanish_sandbox(&id).unwrap();
    let error = run(&backend, "true").expect_err("vanished");
    for text in [
        format!("{config:?}"),
        format!("{backend:?}"),
        error.to_string(),
        ErrorChain(&error).to_string(),
        format!("{error:?}"),
    ] {
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }
}

#[test]
fn a_vanished_sandbox_fails_the_command_and_the_next_use_recreates_it() {
    // contract: L7 (only cleanup never replaces), I6
    let world = World::new();
    let hooks = RecordingHooks::new(world.home.path());
    let backend = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    ok(&backend, "true");
    let old = backend.info().unwrap().sandbox_id;
    world.server().faults().vanish_sandbox(&old).unwrap();
    // Known lease still covers it: the per-command sync is what fails first.
    let error = run(&backend, "true").expect_err("gone");
    assert!(
        error.is_state_failure() || error.is_sandbox_gone(),
        "{error}"
    );
    assert!(
        world.list().is_empty(),
        "a failing command replaces nothing"
    );
    // The next uses reconnect, see it gone, and attach afresh with a full bring-up.
    let mut attempts = 0;
    let output = loop {
        attempts += 1;
        match run(&backend, "echo fresh") {
            Ok((_, output)) => break output,
            Err(error) if attempts < 3 => assert!(error.to_string().contains(&old), "{error}"),
            Err(error) => panic!("not recreated: {error}"),
        }
    };
    assert_eq!(output, "fresh\n");
    let info = backend.info().unwrap();
    assert_ne!(info.sandbox_id, old);
    assert_eq!(info.replaced.as_deref(), Some(old.as_str()));
    assert_eq!(info.role, RoleKind::Writer);
    assert_eq!(world.list().len(), 1);
    assert_eq!(
        hooks
            .calls()
            .iter()
            .filter(|c| *c == "push:Initial")
            .count(),
        2,
        "{:?}",
        hooks.calls()
    );
}

#[test]
fn each_resolved_task_key_gets_its_own_persistent_sandbox() {
    // contract: I2
    let world = World::new();
    let cli = world.persistent();
    let cli_again = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    let session = world.backend(
        SandboxMode::Persistent,
        "session:agent:main:telegram:dm:42",
        Arc::new(NoStateHooks),
    );
    let a = cli.attach().unwrap().sandbox_id;
    let b = cli_again.attach().unwrap().sandbox_id;
    let c = session.attach().unwrap().sandbox_id;
    assert_eq!(a, b, "CLI runs of one profile share one sandbox");
    assert_ne!(a, c, "a gateway session key gets its own");
    assert_eq!(world.list().len(), 2);
    assert_ne!(cli.scope_digest(), session.scope_digest());
}

#[test]
fn command_reconnects_resolve_the_key_again() {
    // contract: X2 — key rotation takes effect at the next lease renewal.
    let world = World::new();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let mut config = world.config(SandboxMode::Persistent);
    config.api_key = ApiKeySource::Resolver(Arc::new(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(e2b_client::ApiKey::new("rotating-key".to_owned()))
    }));
    let backend = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0, "lazy");
    ok(&backend, "true");
    let at_attach = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(at_attach, 1);
    // Covered: no renewal, no lookup.
    ok(&backend, "true");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), at_attach);
    // A renewal looks the key up again.
    let handle = backend
        .run(
            "true",
            agent_sandbox::RunOptions::new(Duration::from_secs(900)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .unwrap();
    handle.wait().unwrap();
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        at_attach + 1
    );
}
