//! Request accounting for agent-sandbox, measured by e2b-local's server-side counter:
//! once attached, a command in steady state costs exactly one request (its Process/Start
//! stream). No lease top-up, no sync and no state check is sent when it has nothing to do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use agent_sandbox::{
    Backend, ChannelSink, DiscardSink, HookError, LEASE_HEADROOM, NoStateHooks, PushKind, RoleKind,
    RunOptions, SandboxMode, StateHooks, StateTransport, Termination,
};
use e2b_local::RequestCounts;

use crate::support::World;

/// Commands in each steady-state run.
const STEADY_COMMANDS: u64 = 6;

/// Time between two commands of an agent at work: the lease must not be topped up for it.
const THINKING_TIME: Duration = Duration::from_secs(5);

/// A command deadline well inside the default 300 s lease.
const SHORT_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `command` to completion with `deadline`; returns what its sink received.
fn run(backend: &Backend, command: &str, deadline: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    let running = backend
        .run(
            command,
            RunOptions::new(deadline),
            Box::new(ChannelSink::unbounded(tx)),
        )
        .unwrap_or_else(|error| panic!("{command}: {error}"));
    let exit = running.wait().expect("command ends");
    assert_eq!(exit.exit_code, 0, "{command}");
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    String::from_utf8(output).expect("utf-8 output")
}

fn routes(counts: &RequestCounts) -> Vec<(&'static str, u64)> {
    counts.routes().collect()
}

/// Runs the steady-state commands, each after some thinking time, and checks that each one
/// cost exactly one Process/Start and nothing else.
fn assert_steady_state(world: &World, backend: &Backend) {
    let before = world.server().requests();
    for i in 0..STEADY_COMMANDS {
        world.advance(THINKING_TIME);
        let step_start = world.server().requests();
        // contract: O1 — the output reaches the caller's sink chunk by chunk.
        let output = run(backend, &format!("echo step {i}"), SHORT_DEADLINE);
        assert_eq!(output, format!("step {i}\n"));
        let step = world.server().requests().since(&step_start);
        assert_eq!(
            routes(&step),
            vec![("Process/Start", 1)],
            "command {i} in steady state must cost exactly its start request"
        );
    }
    let steady = world.server().requests().since(&before);
    assert_eq!(steady.total(), STEADY_COMMANDS);
    assert_eq!(steady.get("Process/Start"), STEADY_COMMANDS);
}

/// Never set-timeout, pause or kill: a persistent sandbox's lease is only ever extended.
fn assert_no_destructive_requests(world: &World) {
    assert_no_destructive_requests_but_pauses_at_close(world, 0);
}

/// As [`assert_no_destructive_requests`], but for `closes` cleanups that each paused their
/// sandbox once its state was on the host (L16).
fn assert_no_destructive_requests_but_pauses_at_close(world: &World, closes: u64) {
    let all = world.server().requests();
    for (route, allowed) in [("timeout", 0), ("pause", closes), ("kill", 0)] {
        assert_eq!(all.get(route), allowed, "{route}: {:?}", routes(&all));
    }
}

#[test]
fn steady_state_commands_cost_one_request_each_without_state_hooks() {
    // contract: L5 — no lease top-up while the known expiry covers the command.
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    assert_eq!(
        world.server().requests().total(),
        0,
        "nothing before first use"
    );

    // Attach (find, create as writer, bring-up) and the first command.
    assert_eq!(run(&backend, "echo first", SHORT_DEADLINE), "first\n");
    let attach = world.server().requests();
    assert_eq!(attach.get("create"), 1, "{:?}", routes(&attach));
    assert!(attach.get("list") >= 1, "{:?}", routes(&attach));

    assert_steady_state(&world, &backend);

    // Once the headroom is used up, the known expiry no longer covers the full lease: one
    // command renews it with one extend-only connect; the next ones are back to one request.
    world.advance(LEASE_HEADROOM);
    let before = world.server().requests();
    run(&backend, "true", SHORT_DEADLINE);
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("connect", 1)]
    );
    assert_steady_state(&world, &backend);
    assert_no_destructive_requests(&world);
    backend.cleanup();
}

#[test]
fn the_cold_paths_cost_only_the_requests_their_guarantees_need() {
    // contract: L13, I4, I6, S5 — create + first command: one list under the creation lock
    // (I4, I6), the create, the home probe (L13), the command; no recovery snapshot of a
    // sandbox this process just created. Resume + first command: the list (I5) with the
    // connect of the sandbox this host remembers beside it, the recovery snapshot (S5), the
    // command; the home comes from this host's cache.
    let world = World::new();
    let first = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    assert_eq!(run(&first, "echo first", SHORT_DEADLINE), "first\n");
    let created = world.server().requests();
    assert_eq!(
        routes(&created),
        vec![("Process/Start", 2), ("create", 1), ("list", 1)],
        "create + first command"
    );
    assert_eq!(first.stats().home_probes, 1);
    first.cleanup();

    // The lease runs out; a new session resumes the paused sandbox.
    world.advance(Duration::from_secs(3600));
    let second = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    let before = world.server().requests();
    assert_eq!(run(&second, "echo again", SHORT_DEADLINE), "again\n");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 2), ("connect", 1), ("list", 1)],
        "resume + first command"
    );
    let info = second.info().expect("attached");
    assert!(info.resumed, "the sandbox was paused and resumed");
    assert_eq!(
        second.stats().home_probes,
        0,
        "the home is cached per sandbox"
    );
    // The first session's cleanup paused its sandbox once its state was on the host (L16).
    assert_no_destructive_requests_but_pauses_at_close(&world, 1);
    second.cleanup();
}

#[test]
fn a_resume_sends_its_connect_together_with_its_list() {
    // contract: I5 — the connect of the sandbox this host last attached does not wait for
    // the list: with the list refused, the connect was sent all the same, and the attach
    // fails on the list (the list alone decides what is adopted).
    let world = World::new();
    let first = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    assert_eq!(run(&first, "echo first", SHORT_DEADLINE), "first\n");
    first.cleanup();
    world.advance(Duration::from_secs(3600));

    // Both control-plane requests of the lookup are refused (400: not retried), whichever
    // arrives first.
    let mut rule = e2b_local::FailRule::new(2, 400);
    rule.scope = e2b_local::FaultScope::Rest;
    rule.path_prefix = Some("/v2/sandboxes".to_owned());
    rule.should_retry = Some(false);
    world.server().faults().fail_next(rule);
    let second = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    let before = world.server().requests();
    let error = second.attach().expect_err("the list was refused");
    assert!(error.to_string().contains("list sandboxes"), "{error}");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("connect", 1), ("list", 1)],
        "the connect went out with the list, not after its answer"
    );
    world.server().faults().clear();

    // Without the refusal the same resume costs one list and one connect.
    let before = world.server().requests();
    assert_eq!(run(&second, "echo again", SHORT_DEADLINE), "again\n");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 2), ("connect", 1), ("list", 1)]
    );
    assert!(second.info().expect("attached").resumed);
    second.cleanup();
}

#[test]
fn a_create_sends_its_home_probe_together_with_its_first_command() {
    // contract: L13 — the home probe of a sandbox this process just created does not hold up
    // the first command that names no directory: with both start requests refused, both were
    // sent (the command did not wait for the probe's answer), the run fails on its own start,
    // and nothing stays attached with an unknown home.
    let world = World::new();
    let mut rule = e2b_local::FailRule::new(2, 400);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    rule.should_retry = Some(false);
    world.server().faults().fail_next(rule);
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    let error = backend
        .run(
            "echo first",
            RunOptions::new(SHORT_DEADLINE),
            Box::new(ChannelSink::unbounded(mpsc::channel().0)),
        )
        .expect_err("both starts were refused");
    assert!(error.to_string().contains("start command"), "{error}");
    assert_eq!(
        routes(&world.server().requests()),
        vec![("Process/Start", 2), ("create", 1), ("list", 1)],
        "the probe and the command went out together"
    );
    assert!(
        backend.info().is_none(),
        "no attachment with an unknown home"
    );
    world.server().faults().clear();

    // The next use attaches again (the list finds the sandbox) and learns the home then.
    assert_eq!(run(&backend, "echo again", SHORT_DEADLINE), "again\n");
    let info = backend.info().expect("attached");
    assert_eq!(info.home.home, "/home/user");
    assert_eq!(info.default_cwd, "/home/user");
    assert_eq!(backend.stats().home_probes, 2);
    backend.cleanup();
}

/// Pushes the host's skills/ tree, and on a per-command sync only what changed since the
/// last push: when nothing changed it sends nothing (as Hermes' FileSyncManager does).
struct ChangedSkillsHooks {
    home: PathBuf,
    pushed: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl ChangedSkillsHooks {
    fn new(home: &Path) -> Arc<ChangedSkillsHooks> {
        Arc::new(ChangedSkillsHooks {
            home: home.to_path_buf(),
            pushed: Mutex::new(BTreeMap::new()),
        })
    }

    /// Every file under `<home>/skills`, by path relative to it.
    fn host_skills(&self) -> BTreeMap<String, Vec<u8>> {
        let root = self.home.join("skills");
        let mut files = BTreeMap::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(bytes) = std::fs::read(&path) {
                    let relative = path.strip_prefix(&root).expect("under root");
                    files.insert(relative.to_string_lossy().into_owned(), bytes);
                }
            }
        }
        files
    }
}

impl StateHooks for ChangedSkillsHooks {
    fn push(&self, transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        let host = self.host_skills();
        let mut pushed = self.pushed.lock().expect("pushed");
        let changed: Vec<(PathBuf, String)> = host
            .iter()
            .filter(|(relative, bytes)| pushed.get(*relative) != Some(*bytes))
            .map(|(relative, _)| {
                (
                    self.home.join("skills").join(relative),
                    format!("/home/user/.hermes/skills/{relative}"),
                )
            })
            .collect();
        if !changed.is_empty() {
            transport.upload_many(changed)?;
        }
        *pushed = host;
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

#[test]
fn steady_state_commands_cost_one_request_each_when_the_sync_has_nothing_to_push() {
    // contract: L5, S3 — the per-command sync runs, but sends nothing when nothing changed.
    let world = World::new();
    let skill = world
        .home
        .path()
        .join("skills")
        .join("demo")
        .join("SKILL.md");
    std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
    std::fs::write(&skill, "# demo v1\n").unwrap();
    let backend = world.backend(
        SandboxMode::Persistent,
        "default",
        ChangedSkillsHooks::new(world.home.path()),
    );

    assert_eq!(
        run(
            &backend,
            "cat ~/.hermes/skills/demo/SKILL.md",
            SHORT_DEADLINE
        ),
        "# demo v1\n",
        "the bring-up pushed the host's skill"
    );
    assert_eq!(
        world.server().requests().get("files POST"),
        1,
        "the initial push"
    );

    assert_steady_state(&world, &backend);

    // The hooks are live: a host change costs exactly one upload with the next command.
    std::fs::write(&skill, "# demo v2\n").unwrap();
    let before = world.server().requests();
    assert_eq!(
        run(
            &backend,
            "cat ~/.hermes/skills/demo/SKILL.md",
            SHORT_DEADLINE
        ),
        "# demo v2\n"
    );
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("files POST", 1)]
    );
    assert_no_destructive_requests(&world);
    backend.cleanup();
}

#[test]
fn a_command_whose_lease_is_not_covered_adds_exactly_one_connect() {
    // contract: L5 — extend through connect only, and only when the known expiry does not
    // cover the command's deadline plus grace.
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    run(&backend, "true", SHORT_DEADLINE);
    let id = backend.info().expect("attached").sandbox_id;

    // A deadline beyond the known expiry: one extend-only connect, then the start.
    let before = world.server().requests();
    assert_eq!(
        run(&backend, "echo long", Duration::from_secs(900)),
        "long\n"
    );
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("connect", 1)]
    );
    // Now covered again: back to one request.
    let before = world.server().requests();
    run(&backend, "true", SHORT_DEADLINE);
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1)]
    );

    // The lease runs out between commands and E2B pauses the sandbox: the next command's
    // one connect resumes it, transparently.
    world.advance(Duration::from_secs(3600));
    let before = world.server().requests();
    assert_eq!(run(&backend, "echo back", SHORT_DEADLINE), "back\n");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("connect", 1)]
    );
    let info = backend.info().expect("attached");
    assert_eq!(info.sandbox_id, id, "the same sandbox, resumed");
    assert!(info.resumed);
    assert_no_destructive_requests(&world);
    backend.cleanup();
}

#[test]
fn an_ephemeral_owner_in_steady_state_costs_one_request_per_command() {
    // contract: L5 — the ephemeral lease floor is a floor: its extensions buy the same
    // headroom as a persistent sandbox's, so time passing between commands costs nothing.
    let world = World::new();
    let ephemeral = SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(300),
    };
    let backend = world.backend(ephemeral, "default", Arc::new(NoStateHooks));
    run(&backend, "true", SHORT_DEADLINE);
    assert_eq!(backend.info().expect("attached").role, RoleKind::Owner);
    assert_steady_state(&world, &backend);

    // Past the headroom one command renews it with one extend-only connect.
    world.advance(LEASE_HEADROOM);
    let before = world.server().requests();
    run(&backend, "true", SHORT_DEADLINE);
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("connect", 1)]
    );
    assert_steady_state(&world, &backend);
    backend.cleanup();
}

#[test]
fn a_reader_in_steady_state_costs_one_request_per_command() {
    // contract: L5, C2 — a reader's admission gates are host files: no request.
    let world = World::new();
    let writer = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    run(&writer, "true", SHORT_DEADLINE);
    // A second session on the same scope while the writer holds the role.
    let reader = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    let info = reader.attach().expect("reader attaches");
    assert_eq!(info.role, RoleKind::Reader);
    assert_eq!(info.sandbox_id, writer.info().expect("attached").sandbox_id);
    run(&reader, "true", SHORT_DEADLINE);
    assert_steady_state(&world, &reader);
    assert_no_destructive_requests(&world);
    reader.cleanup();
    writer.cleanup();
}

#[test]
fn a_kill_costs_one_group_kill_command_and_one_signal_request() {
    // contract: L6 — the kill is one short command that kills the command's process group,
    // then one SendSignal to its pid; the sandbox lives on.
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    run(&backend, "true", SHORT_DEADLINE);
    let before = world.server().requests();
    let running = backend
        .run(
            "echo started; sleep 30",
            RunOptions::new(SHORT_DEADLINE),
            Box::new(DiscardSink),
        )
        .expect("starts");
    running.kill();
    let exit = running.wait().expect("ends");
    assert_eq!(exit.termination, Termination::Killed);
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/SendSignal", 1), ("Process/Start", 2)]
    );
    // The sandbox survives: the next command is back to one request.
    let before = world.server().requests();
    assert_eq!(run(&backend, "echo alive", SHORT_DEADLINE), "alive\n");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1)]
    );
    assert_no_destructive_requests(&world);
    backend.cleanup();
}

/// Hooks whose per-command sync takes `delay` on both clocks (a long incremental upload),
/// without sleeping.
struct SlowSyncHooks {
    server_clock: e2b_local::Clock,
    clock: Arc<agent_sandbox::ManualClock>,
    delay: Mutex<Duration>,
}

impl StateHooks for SlowSyncHooks {
    fn push(&self, _transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        if kind == PushKind::Incremental {
            let delay = *self.delay.lock().expect("delay");
            self.server_clock.advance(delay);
            self.clock.advance(delay);
        }
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

#[test]
fn a_sync_longer_than_the_grace_is_followed_by_a_lease_that_covers_the_command() {
    // contract: L5 — the lease covering a command is computed after its per-command sync.
    let world = World::new();
    let hooks = Arc::new(SlowSyncHooks {
        server_clock: world.server().clock(),
        clock: world.clock.clone(),
        delay: Mutex::new(Duration::ZERO),
    });
    let backend = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let grace = backend.lease_policy().command_grace;
    let long = Duration::from_secs(900);
    run(&backend, "true", SHORT_DEADLINE);
    // The known expiry now covers the long deadline, plus grace, plus the headroom.
    run(&backend, "true", long);
    let id = backend.info().expect("attached").sandbox_id;

    // The next sync takes longer than the grace and the headroom together: the expiry known
    // before the sync no longer covers the command once the sync is done.
    *hooks.delay.lock().expect("delay") = grace * 3;
    assert!(grace * 3 > LEASE_HEADROOM);
    let before = world.server().requests();
    assert_eq!(run(&backend, "echo after", long), "after\n");
    let step = world.server().requests().since(&before);
    let now = time::OffsetDateTime::from(world.server().clock().now());
    let end = world.detail(&id).expect("sandbox").summary.end_at;
    assert!(
        end >= now + long + grace,
        "the lease ends at {end}, before the command's deadline plus grace ({now} + {long:?} + {grace:?})"
    );
    assert_eq!(routes(&step), vec![("Process/Start", 1), ("connect", 1)]);

    // A quick sync again: steady state is back to one request per command.
    *hooks.delay.lock().expect("delay") = Duration::ZERO;
    assert_steady_state(&world, &backend);
    assert_no_destructive_requests(&world);
    backend.cleanup();
}

#[test]
fn a_command_with_stdin_costs_one_upload_more_and_one_without_costs_nothing_more() {
    // contract: O4 — stdin is staged with one upload whatever its size; none when empty.
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    run(&backend, "true", SHORT_DEADLINE);
    for (stdin, expected) in [
        (
            Some(vec![b'x'; 3 << 20]),
            vec![("Process/Start", 1), ("files POST", 1)],
        ),
        (Some(Vec::new()), vec![("Process/Start", 1)]),
        (None, vec![("Process/Start", 1)]),
    ] {
        let before = world.server().requests();
        let (tx, rx) = mpsc::channel();
        let mut options = RunOptions::new(SHORT_DEADLINE);
        options.stdin = stdin.clone().map(Into::into);
        let exit = backend
            .run("wc -c", options, Box::new(ChannelSink::unbounded(tx)))
            .expect("starts")
            .wait()
            .expect("ends");
        assert_eq!(exit.exit_code, 0);
        let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
        let length = stdin.map_or(0, |data| data.len());
        assert_eq!(String::from_utf8_lossy(&output).trim(), length.to_string());
        assert_eq!(routes(&world.server().requests().since(&before)), expected);
    }
    backend.cleanup();
}

/// The sandbox's temporary teardown archives left in its `/tmp`, as `ls` names them.
fn pull_leftovers(backend: &Backend) -> String {
    run(
        backend,
        "ls -a /tmp | grep '^hermes-e2b-pull\\.' || true",
        SHORT_DEADLINE,
    )
}

/// The pull's requests as counted, with its ranged downloads checked apart: one or more
/// (one per slice of the archive `tar` had written when it was asked for), then the rest.
fn pull_routes(counts: &RequestCounts) -> Vec<(&'static str, u64)> {
    let downloads = counts.get("files GET");
    assert!(downloads >= 1, "at least one range: {:?}", routes(counts));
    routes(counts)
        .into_iter()
        .filter(|(route, _)| *route != "files GET")
        .collect()
}

#[test]
fn the_teardown_pull_downloads_its_archive_by_ranges_and_leaves_none_behind() {
    // contract: S12 — the pull reconnects (connect), has the sandbox write its tar to a
    // private temp file (one Process/Start), downloads that file by ranges while it grows
    // (files GET, one or more), and removes it (Filesystem/Remove) once the last range has
    // it open.
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(NoStateHooks));
    run(
        &backend,
        "mkdir -p ~/.hermes/skills/demo && printf pulled > ~/.hermes/skills/demo/SKILL.md",
        SHORT_DEADLINE,
    );
    let transport = backend.transport().expect("attached");
    let before = world.server().requests();
    let mut archive = Vec::new();
    let summary = transport.download_state(&mut archive).expect("pulls");
    assert_eq!(
        pull_routes(&world.server().requests().since(&before)),
        vec![
            ("Filesystem/Remove", 1),
            ("Process/Start", 1),
            ("connect", 1),
        ]
    );
    assert_eq!((summary.files, summary.file_bytes), (1, 6));
    let mut entries = tar::Archive::new(&archive[..]);
    let names: Vec<String> = entries
        .entries()
        .expect("a tar")
        .map(|entry| {
            let entry = entry.expect("an entry");
            entry.path().expect("a path").display().to_string()
        })
        .collect();
    assert!(
        names.contains(&"home/user/.hermes/skills/demo/SKILL.md".to_owned()),
        "{names:?}"
    );
    assert_eq!(pull_leftovers(&backend), "");

    // A download that fails still removes the archive, and the pull reports the failure.
    let mut rule = e2b_local::FailRule::new(1, 500);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/files".to_owned());
    rule.should_retry = Some(false);
    world.server().faults().fail_next(rule);
    let error = transport
        .download_state(&mut Vec::new())
        .expect_err("the download failed");
    assert!(error.to_string().contains("teardown pull"), "{error}");
    world.server().faults().clear();
    assert_eq!(pull_leftovers(&backend), "");

    // Without a Hermes home there is verifiably nothing to pull: an empty archive, and no
    // download at all.
    run(&backend, "rm -rf ~/.hermes", SHORT_DEADLINE);
    let before = world.server().requests();
    let mut archive = Vec::new();
    let summary = transport
        .download_state(&mut archive)
        .expect("pulls nothing");
    assert_eq!(
        routes(&world.server().requests().since(&before)),
        vec![("Process/Start", 1), ("connect", 1)]
    );
    assert_eq!((summary.files, summary.file_bytes), (0, 0));
    let entries = tar::Archive::new(&archive[..])
        .entries()
        .expect("a tar")
        .count();
    assert_eq!(entries, 0);
    assert!(!archive.is_empty(), "an end marker, not nothing");
    backend.cleanup();
}
