//! Checkpoints, rollback, fork and adoption against e2b-local (contract R1–R9).

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{
    CheckpointReason, CheckpointRequest, CheckpointTarget, NoStateHooks, Origin, RoleKind,
    SandboxMode,
};
use e2b_client::{CreateOptions, OnTimeout, PauseMemory, SandboxId};
use sandbox_identity::{BRANCH_KEY, RESTORED_FROM_KEY, SUPERSEDES_KEY};

use crate::support::{self, RecordingHooks, World, ok};

const WORK: &str = "/home/user/work";

fn request(label: Option<&str>) -> CheckpointRequest {
    CheckpointRequest {
        label: label.map(str::to_owned),
        reason: CheckpointReason::Manual,
        wait: Duration::ZERO,
    }
}

/// The scope's sandboxes E2B lists (any state).
fn scope_sandboxes(world: &World, digest: &str) -> Vec<e2b_client::ListedSandbox> {
    world
        .list()
        .into_iter()
        .filter(|listed| {
            support::metadata_of(listed)
                .get(sandbox_identity::SCOPE_KEY)
                .map(String::as_str)
                == Some(digest)
        })
        .collect()
}

// contract: R1
#[test]
fn only_the_writer_checkpoints_or_rolls_back() {
    let world = World::new();
    let writer = world.persistent();
    let id = writer.attach().expect("writer").sandbox_id;
    let reader = world.persistent();
    assert_eq!(reader.attach().expect("reader").role, RoleKind::Reader);
    for error in [
        reader
            .checkpoint(request(None))
            .expect_err("reader refused"),
        reader
            .rollback(CheckpointTarget::Latest, Duration::ZERO)
            .expect_err("reader refused"),
        reader.fork(1, Duration::ZERO).expect_err("reader refused"),
    ] {
        assert!(error.is_checkpoint_refused(), "{error}");
        let text = error.to_string();
        assert!(text.contains("writer") && text.contains(&id), "{text}");
    }
    assert!(writer.checkpoint(request(None)).is_ok());
}

// contract: R2
#[test]
fn a_checkpoint_waits_for_or_is_refused_by_running_commands_and_names_them() {
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    let (tx, rx) = std::sync::mpsc::channel();
    let running = backend
        .run(
            "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done",
            agent_sandbox::RunOptions::new(Duration::from_secs(60)),
            Box::new(agent_sandbox::ChannelSink::unbounded(tx)),
        )
        .expect("started");
    let snapshots_before = backend.stats().snapshots;
    let error = backend.checkpoint(request(None)).expect_err("busy");
    assert!(error.is_busy(), "{error}");
    let commands = error.running_commands();
    assert_eq!(commands.len(), 1, "{commands:?}");
    assert!(
        commands[0].starts_with(&format!("pid {}:", running.sandbox_pid()))
            && commands[0].contains("/tmp/go"),
        "{commands:?}"
    );
    assert!(error.to_string().contains("would cut it"), "{error}");
    // Refused before any request: the command was never cut.
    assert_eq!(backend.stats().snapshots, snapshots_before);
    // A wait long enough lets it finish; the command ran to its end, then the checkpoint.
    let world_ref = &world;
    let id = backend.info().unwrap().sandbox_id;
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            backend.checkpoint(CheckpointRequest {
                wait: Duration::from_secs(60),
                ..request(None)
            })
        });
        support::sandbox_shell(world_ref, &id, "touch /tmp/go");
        let exit = running.wait().expect("command ends");
        assert_eq!(exit.exit_code, 0);
        waiter
            .join()
            .unwrap()
            .expect("checkpoint after the command");
    });
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    assert_eq!(String::from_utf8_lossy(&output), "done\n");
}

// contract: R3
#[test]
fn checkpoints_are_found_from_any_host_newest_first_and_cost_one_request() {
    let world = World::new();
    let backend = world.persistent();
    let id = backend.attach().expect("attach").sandbox_id;
    let before = world.server().requests();
    let first = backend
        .checkpoint(request(Some("Before Upgrade")))
        .expect("first");
    let spent = world.server().requests().since(&before);
    assert_eq!(
        spent.total(),
        1,
        "steady state: only the snapshot request: {spent:?}"
    );
    let second = backend
        .checkpoint(CheckpointRequest {
            reason: CheckpointReason::Agent,
            ..request(None)
        })
        .expect("second");
    assert_eq!(first.label.as_deref(), Some("before-upgrade"));
    assert_eq!(first.source_sandbox, id);
    assert!(second.taken_at > first.taken_at);
    // Another scope's checkpoint is not this scope's.
    let other = world.persistent_task("other");
    other
        .checkpoint(request(Some("theirs")))
        .expect("other scope");
    // Another host: a backend that never attached, of the same scope.
    let elsewhere = world.persistent();
    let listed = elsewhere.checkpoints().expect("list");
    let ids: Vec<&str> = listed.iter().map(|c| c.snapshot_id.as_str()).collect();
    assert_eq!(
        ids,
        [second.snapshot_id.as_str(), first.snapshot_id.as_str()]
    );
    assert_eq!(listed[0].reason, CheckpointReason::Agent);
    assert!(elsewhere.info().is_none(), "listing attaches nothing");
}

/// A workspace, a checkpoint, a broken workspace and a memory the agent wrote after the
/// checkpoint; returns the backend, the checkpoint and the first sandbox.
fn broken_after_checkpoint(
    world: &World,
    hooks: Arc<RecordingHooks>,
) -> (agent_sandbox::Backend, agent_sandbox::Checkpoint, String) {
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/host")).unwrap();
    std::fs::write(home.join("skills/host/SKILL.md"), "host skill v1").unwrap();
    let backend = world.backend(SandboxMode::Persistent, "default", hooks);
    let id = backend.attach().expect("attach").sandbox_id;
    ok(
        &backend,
        &format!(
            "mkdir -p {WORK} /home/user/.hermes/memories && printf good > {WORK}/app.txt && \
             printf stale > /home/user/.hermes/memories/FORGOTTEN.md"
        ),
    );
    let checkpoint = backend
        .checkpoint(request(Some("good")))
        .expect("checkpoint");
    // After the checkpoint the agent breaks the workspace, drops one memory and learns
    // another.
    ok(
        &backend,
        &format!(
            "rm -rf {WORK} /home/user/.hermes/memories/FORGOTTEN.md && \
             printf 'learned after the checkpoint' > /home/user/.hermes/memories/MEMORY.md"
        ),
    );
    // The host's skill changed after the checkpoint too.
    std::fs::write(home.join("skills/host/SKILL.md"), "host skill v2").unwrap();
    (backend, checkpoint, id)
}

// contract: R4, R8
#[test]
fn a_rollback_restores_the_workspace_and_keeps_the_newest_hermes_state() {
    let world = World::new();
    let home = world.home.path();
    let (backend, checkpoint, old) = broken_after_checkpoint(&world, RecordingHooks::new(home));
    let digest = backend.scope_digest();
    let before = world.server().requests();
    let report = backend
        .rollback(CheckpointTarget::Named("good".to_owned()), Duration::ZERO)
        .expect("rollback");
    // Its cost: the list (a label was asked for), the recovery's start, the undo snapshot,
    // the create, the kill, the start that empties the new sandbox's state roots and the push.
    let spent = world.server().requests().since(&before);
    let routes: Vec<(&str, u64)> = spent.routes().collect();
    assert_eq!(
        routes,
        [
            ("Process/Start", 2),
            ("create", 1),
            ("files POST", 1),
            ("kill", 1),
            ("list snapshots", 1),
            ("snapshot", 1)
        ],
        "{spent:?}"
    );
    assert_eq!(report.restored.snapshot_id, checkpoint.snapshot_id);
    assert_eq!(report.retired_sandbox, old);
    assert_ne!(report.sandbox_id, old);
    assert_eq!(report.undo.reason, CheckpointReason::BeforeRollback);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let info = backend.info().unwrap();
    assert_eq!(info.sandbox_id, report.sandbox_id);
    assert_eq!(
        (info.origin, info.role),
        (Origin::Restored, RoleKind::Writer)
    );
    // The workspace is the checkpoint's.
    assert_eq!(ok(&backend, &format!("cat {WORK}/app.txt")), "good");
    // The memory written after the checkpoint reached the host before the old sandbox went.
    assert_eq!(
        std::fs::read_to_string(home.join("memories/MEMORY.md")).unwrap(),
        "learned after the checkpoint"
    );
    // The checkpoint's older Hermes state is gone from the new sandbox: a memory the agent
    // dropped after the checkpoint does not come back (a later recovery would take it for
    // new work).
    assert!(!home.join("memories/FORGOTTEN.md").exists());
    let (exit, _) =
        support::run(&backend, "test -e /home/user/.hermes/memories/FORGOTTEN.md").unwrap();
    assert_ne!(exit.exit_code, 0, "the checkpoint's memories/ were emptied");
    // skills/ in the new sandbox are the host's newest, not the checkpoint's.
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/host/SKILL.md"),
        "host skill v2"
    );
    // Exactly one sandbox of the scope is left, stamped as the old one's successor.
    let left = scope_sandboxes(&world, &digest);
    assert_eq!(left.len(), 1, "{left:?}");
    let metadata = support::metadata_of(&left[0]);
    assert_eq!(metadata.get(SUPERSEDES_KEY), Some(&old));
    assert_eq!(
        metadata.get(RESTORED_FROM_KEY),
        Some(&checkpoint.snapshot_id)
    );
    // contract: R8 — a listing shows the scope's template and the checkpoint, not the
    // snapshot's internal name E2B reports as the template.
    let listed = agent_sandbox::Inventory::new(
        world.config(SandboxMode::Persistent),
        home.to_path_buf(),
        world.services(),
    )
    .list(
        agent_sandbox::Listing::ThisProfile,
        std::time::SystemTime::now(),
    )
    .expect("list");
    let entry = listed
        .iter()
        .find(|entry| entry.sandbox_id == report.sandbox_id)
        .expect("listed");
    assert_eq!(
        (entry.template.as_str(), entry.restored_from.as_deref()),
        (
            world.config(SandboxMode::Persistent).template.as_str(),
            Some("good")
        ),
        "{entry:?}"
    );
    // Another process adopts the new one.
    let later = world.persistent();
    assert_eq!(
        later.attach().expect("reader").sandbox_id,
        report.sandbox_id
    );
    drop(later);
    // And the rollback can be undone, by the undo point's id (which needs no list).
    let before = world.server().requests();
    let undone = backend
        .rollback(
            CheckpointTarget::Named(report.undo.snapshot_id.clone()),
            Duration::ZERO,
        )
        .expect("undo");
    assert_eq!(undone.retired_sandbox, report.sandbox_id);
    let spent = world.server().requests().since(&before);
    assert_eq!(spent.get("list snapshots"), 0, "{spent:?}");
    let (exit, _) = support::run(&backend, &format!("test -e {WORK}/app.txt")).unwrap();
    assert_ne!(exit.exit_code, 0, "the undo restored the broken workspace");
    assert_eq!(scope_sandboxes(&world, &digest).len(), 1);
}

// contract: R5
#[test]
fn a_rollback_interrupted_after_its_create_resolves_to_the_new_sandbox_and_retires_the_old() {
    let world = World::new();
    let home = world.home.path();
    let (backend, checkpoint, old) = broken_after_checkpoint(&world, RecordingHooks::new(home));
    let digest = backend.scope_digest();
    // The host dies after the create request of a rollback: the new sandbox exists, stamped
    // as the old one's successor, and the old one still runs.
    let listed = scope_sandboxes(&world, &digest);
    let mut metadata = support::metadata_of(&listed[0]).clone();
    metadata.insert(SUPERSEDES_KEY.to_owned(), old.clone());
    metadata.insert(RESTORED_FROM_KEY.to_owned(), checkpoint.snapshot_id.clone());
    let mut options = CreateOptions::new(checkpoint.snapshot_id.clone());
    options.metadata = metadata;
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    let client = world.client();
    let new = world
        .runtime
        .block_on(client.create(options))
        .expect("create")
        .sandbox_id;
    backend.finalize();
    let log = support::WarningLog::default();
    let next = world.persistent();
    let info = log.capture(|| next.attach().expect("bring-up"));
    assert_eq!(info.sandbox_id, new.as_str());
    assert_eq!(info.role, RoleKind::Writer);
    let left = scope_sandboxes(&world, &digest);
    assert_eq!(left.len(), 1, "the old sandbox was retired: {left:?}");
    assert_eq!(log.count(&old), 1, "{:?}", log.warnings());
}

// contract: R6
#[test]
fn fork_gives_branches_that_wait_until_one_is_adopted_and_the_rest_discarded() {
    let world = World::new();
    let backend = world.persistent();
    let parent = backend.attach().expect("attach").sandbox_id;
    let digest = backend.scope_digest();
    ok(
        &backend,
        &format!("mkdir -p {WORK} && printf base > {WORK}/app.txt"),
    );
    // An earlier fork nobody adopted or discarded (its host died): left over.
    let leftover = backend.fork(1, Duration::ZERO).expect("earlier fork");
    let fork = backend.fork(3, Duration::ZERO).expect("fork");
    assert_eq!(fork.parent, parent);
    assert_eq!(fork.checkpoint.reason, CheckpointReason::Fork);
    let branches: Vec<_> = fork.started().cloned().collect();
    assert_eq!(branches.len(), 3);
    for (n, branch) in branches.iter().enumerate() {
        let branch_backend = backend.branch(branch).expect("branch backend");
        assert_eq!(ok(&branch_backend, &format!("cat {WORK}/app.txt")), "base");
        ok(
            &branch_backend,
            &format!("printf attempt-{n} > {WORK}/app.txt"),
        );
        branch_backend.cleanup();
    }
    // While the parent lives, every bring-up keeps it.
    let other = world.persistent();
    assert_eq!(other.attach().expect("reader").sandbox_id, parent);
    drop(other);
    assert_eq!(ok(&backend, &format!("cat {WORK}/app.txt")), "base");
    let listed = scope_sandboxes(&world, &digest);
    assert_eq!(listed.len(), 5);
    assert!(
        listed
            .iter()
            .filter(|l| support::metadata_of(l).get(BRANCH_KEY) == Some(&parent))
            .count()
            == 4
    );

    let report = backend
        .adopt(&fork, &branches[1], Duration::ZERO)
        .expect("adopt");
    assert_eq!(report.sandbox_id, branches[1].sandbox_id.as_str());
    assert_eq!(report.retired_sandbox, parent);
    assert_eq!(report.undo.reason, CheckpointReason::BeforeAdopt);
    assert_eq!(ok(&backend, &format!("cat {WORK}/app.txt")), "attempt-1");
    // Every other branch is gone, the earlier fork's leftover too.
    let left = scope_sandboxes(&world, &digest);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].sandbox_id.as_str(), branches[1].sandbox_id.as_str());
    assert!(
        leftover
            .started()
            .all(|b| b.sandbox_id != left[0].sandbox_id)
    );
    // A later bring-up adopts the adopted branch; its own forks wait in turn.
    let second = backend.fork(1, Duration::ZERO).expect("fork again");
    let later = world.persistent();
    assert_eq!(
        later.attach().expect("reader").sandbox_id,
        branches[1].sandbox_id.as_str()
    );
    drop(later);
    let discarded = backend.discard(&second).expect("discard");
    assert_eq!(discarded.killed.len(), 1);
    assert_eq!(scope_sandboxes(&world, &digest).len(), 1);
    // An adoption refuses a branch of another fork.
    let error = backend
        .adopt(&fork, &branches[0], Duration::ZERO)
        .expect_err("stale fork");
    assert!(error.is_checkpoint_refused(), "{error}");
}

// contract: R7
#[test]
fn retention_deletes_only_the_scopes_oldest_automatic_checkpoints() {
    let world = World::new();
    let backend = world.persistent();
    backend.attach().expect("attach");
    let automatic = |n| {
        backend
            .checkpoint(CheckpointRequest {
                reason: CheckpointReason::SessionStart,
                ..request(None)
            })
            .unwrap_or_else(|e| panic!("automatic {n}: {e}"))
    };
    let a1 = automatic(1);
    let named = backend.checkpoint(request(Some("keep me"))).expect("named");
    let a2 = automatic(2);
    let a3 = automatic(3);
    let other = world.persistent_task("other");
    let foreign = other
        .checkpoint(CheckpointRequest {
            reason: CheckpointReason::SessionStart,
            ..request(None)
        })
        .expect("other scope");
    let deleted = backend.prune_checkpoints(1).expect("prune");
    let deleted: Vec<&str> = deleted.iter().map(|c| c.snapshot_id.as_str()).collect();
    assert_eq!(deleted, [a2.snapshot_id.as_str(), a1.snapshot_id.as_str()]);
    let left: Vec<String> = backend
        .checkpoints()
        .unwrap()
        .into_iter()
        .map(|c| c.snapshot_id)
        .collect();
    assert_eq!(left, [a3.snapshot_id, named.snapshot_id]);
    assert_eq!(
        other.checkpoints().unwrap()[0].snapshot_id,
        foreign.snapshot_id
    );
}

#[test]
fn attach_mode_and_a_missing_checkpoint_are_refused_with_what_to_do() {
    let world = World::new();
    let backend = world.persistent();
    let id = backend.attach().expect("attach").sandbox_id;
    let error = backend
        .rollback(CheckpointTarget::Named("nope".to_owned()), Duration::ZERO)
        .expect_err("no such checkpoint");
    assert!(
        error
            .to_string()
            .contains("no checkpoint of this scope matches checkpoint `nope`"),
        "{error}"
    );
    let attached = world.backend(
        SandboxMode::Attach {
            sandbox_id: SandboxId::parse(id).unwrap(),
        },
        "default",
        Arc::new(NoStateHooks),
    );
    let error = attached.checkpoint(request(None)).expect_err("attach mode");
    assert!(
        error.to_string().contains("has no scope of its own"),
        "{error}"
    );
}
