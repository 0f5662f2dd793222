//! The inventory against e2b-local: ownership by profile label (and, for sandboxes made
//! before it, by this host's scope files), duplicates, the host view, removal refusals, the
//! on-demand pull.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use agent_sandbox::{
    EntryState, Force, Inventory, Listing, Loss, Owner, Refusal, RemovalOutcome, RemovalTarget,
    SandboxMode, Verdict, WriterHolder,
};
use e2b_client::{CreateOptions, OnTimeout, PauseMemory};
use sandbox_identity::{
    IdentityMetadata, InternetAccess, Mode, PROFILE_KEY, ScopeIdentity, Security, stamp_scope,
};

use crate::support::{self, World};

/// e2b-local's manual clock starts here (see `World::new`).
fn server_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn inventory(world: &World) -> Inventory {
    Inventory::new(
        world.config(SandboxMode::Persistent),
        world.home.path().to_path_buf(),
        world.services(),
    )
}

fn identity(home: &std::path::Path, task: &str) -> ScopeIdentity {
    ScopeIdentity {
        profile_home: home.to_string_lossy().into_owned(),
        task_id: task.to_owned(),
        template: "base".to_owned(),
        mode: Mode::Persistent,
        internet: InternetAccess::Allowed,
        security: Security::Secure,
    }
}

/// Creates a sandbox the way the backend would, with `metadata`; returns its id.
fn create_with(world: &World, metadata: BTreeMap<String, String>) -> String {
    let mut options = CreateOptions::new("base".to_owned());
    options.metadata = metadata;
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options.timeout = Some(Duration::from_secs(3600));
    let id = world
        .runtime
        .block_on(world.client().create(options))
        .expect("create")
        .sandbox_id;
    // Distinct start times, so "newest" is well defined.
    world.server().clock().advance(Duration::from_secs(5));
    id.as_str().to_owned()
}

// contract: I7
#[test]
fn new_sandboxes_carry_the_profile_label_and_no_path() {
    let world = World::new();
    let backend = world.persistent();
    support::ok(&backend, "true");
    let listed = world.list();
    let metadata = support::metadata_of(&listed[0]);
    let home = world.home.path().to_string_lossy().into_owned();
    assert_eq!(
        metadata.get(PROFILE_KEY),
        Some(&sandbox_identity::ProfileDigest::of(&home).to_hex())
    );
    assert!(metadata.values().all(|v| !v.contains(&home)));
}

// contract: I7
#[test]
fn the_listing_marks_owners_duplicates_and_this_hosts_view() {
    let world = World::new();
    let backend = world.persistent();
    support::ok(&backend, "true");
    let live = backend.info().expect("attached").sandbox_id;
    world.server().clock().advance(Duration::from_secs(5));

    // Made before the profile label existed: this host coordinated its scope, so it is ours.
    let legacy_scope = identity(world.home.path(), "legacy");
    let legacy_files = writer_lease::ScopeFiles::new(
        world.coordination_dir(),
        writer_lease::ScopeKey::from_bytes(*legacy_scope.digest().as_bytes()),
    );
    legacy_files.writer_status().expect("lock file created");
    let legacy = create_with(&world, IdentityMetadata::for_scope(&legacy_scope).to_map());
    // Another profile's, labelled; and an unlabelled one nobody here knows.
    let elsewhere = tempfile::tempdir().expect("other home");
    let theirs = create_with(
        &world,
        stamp_scope(&BTreeMap::new(), &identity(elsewhere.path(), "default")).metadata,
    );
    let unknown = create_with(
        &world,
        IdentityMetadata::for_scope(&identity(elsewhere.path(), "old")).to_map(),
    );
    // A second sandbox for the live scope, newer: the live one becomes its duplicate.
    let newer = create_with(
        &world,
        stamp_scope(&BTreeMap::new(), &identity(world.home.path(), "default")).metadata,
    );

    let inventory = inventory(&world);
    let mine = inventory
        .list(Listing::ThisProfile, server_now())
        .expect("list");
    let ids: Vec<&str> = mine.iter().map(|e| e.sandbox_id.as_str()).collect();
    assert_eq!(
        ids,
        [newer.as_str(), legacy.as_str(), live.as_str()],
        "newest first"
    );

    let live_entry = mine.iter().find(|e| e.sandbox_id == live).expect("live");
    assert_eq!(live_entry.duplicate_of.as_deref(), Some(newer.as_str()));
    assert_eq!(live_entry.state, EntryState::Running);
    assert_eq!(
        live_entry.posture.as_deref(),
        Some("internet-allowed secure")
    );
    assert!(
        live_entry
            .lease_left
            .is_some_and(|left| left > Duration::ZERO && left <= Duration::from_secs(3600))
    );
    let host = live_entry.host.as_ref().expect("this host knows the scope");
    assert_eq!(host.task_id.as_deref(), Some("default"));
    assert_eq!(
        host.writer,
        WriterHolder::Held {
            pid: Some(std::process::id())
        }
    );
    assert_eq!(host.dirty, None);
    assert_eq!(host.prepared_for.as_deref(), Some(live.as_str()));
    assert!(
        host.last_recovery
            .as_deref()
            .is_some_and(|line| line.contains("0 restored") && line.contains(&live)),
        "{host:?}"
    );
    let legacy_entry = mine
        .iter()
        .find(|e| e.sandbox_id == legacy)
        .expect("legacy");
    assert_eq!(legacy_entry.owner, Owner::ThisProfile);
    assert_eq!(legacy_entry.posture, None);

    let all = inventory
        .list(Listing::AllProfiles, server_now())
        .expect("list all");
    let owner_of = |id: &str| all.iter().find(|e| e.sandbox_id == id).map(|e| e.owner);
    assert_eq!(owner_of(&theirs), Some(Owner::OtherProfile));
    assert_eq!(owner_of(&unknown), Some(Owner::Unknown));
    assert!(
        all.iter()
            .filter(|e| e.owner != Owner::ThisProfile)
            .all(|e| e.host.is_none()),
        "no host view of scopes that are not this profile's"
    );
    backend.cleanup();
}

// contract: I8
#[test]
fn rm_duplicates_keeps_the_newest_and_refuses_a_live_writer() {
    let world = World::new();
    let scope = identity(world.home.path(), "default");
    let ids: Vec<String> = (0..3)
        .map(|_| create_with(&world, stamp_scope(&BTreeMap::new(), &scope).metadata))
        .collect();
    let inventory = inventory(&world);

    let plan = inventory
        .plan_removal(&RemovalTarget::Duplicates, Force::No, server_now())
        .expect("plan");
    let planned: Vec<&str> = plan.iter().map(|p| p.sandbox_id.as_str()).collect();
    assert_eq!(planned, [ids[1].as_str(), ids[0].as_str()]);
    assert!(
        plan.iter()
            .all(|p| matches!(&p.verdict, Verdict::Kill { loses: Loss::Duplicate { newest } } if newest == &ids[2]))
    );
    let removed = inventory.remove(&plan).expect("remove");
    assert!(removed.iter().all(|r| r.outcome == RemovalOutcome::Killed));
    let left: Vec<String> = world
        .list()
        .iter()
        .map(|s| s.sandbox_id.as_str().to_owned())
        .collect();
    assert_eq!(left, [ids[2].clone()]);

    // A session on this host now writes to the survivor: removal is refused unless forced.
    let backend = world.persistent();
    support::ok(&backend, "true");
    assert_eq!(backend.info().expect("attached").sandbox_id, ids[2]);
    let by_id = RemovalTarget::Ids(vec![ids[2].clone(), ids[0].clone()]);
    let plan = inventory
        .plan_removal(&by_id, Force::No, server_now())
        .expect("plan");
    assert!(
        plan[0].verdict
            == Verdict::Refused(Refusal::LiveWriter {
                pid: Some(std::process::id())
            }),
        "{plan:?}"
    );
    assert_eq!(
        plan[1].verdict,
        Verdict::AlreadyGone,
        "gone already is success"
    );
    let removed = inventory.remove(&plan).expect("remove");
    assert!(matches!(removed[0].outcome, RemovalOutcome::Refused(_)));
    assert!(removed[1].outcome.is_success());
    assert_eq!(world.list().len(), 1, "the refused sandbox lives");

    let forced = inventory
        .plan_removal(&by_id, Force::Yes, server_now())
        .expect("plan");
    assert!(matches!(forced[0].verdict, Verdict::Kill { .. }));
    backend.cleanup();
}

// contract: I8
#[test]
fn pull_recovers_into_the_home_and_waits_for_a_live_writer() {
    let world = World::new();
    let backend = world.persistent();
    support::ok(
        &backend,
        "mkdir -p ~/.hermes/skills/made && echo remote > ~/.hermes/skills/made/SKILL.md",
    );
    let inventory = inventory(&world);
    let refused = inventory.pull("default").expect_err("the writer is live");
    assert!(refused.is_not_ready(), "{refused}");
    assert!(
        refused
            .to_string()
            .contains(&std::process::id().to_string())
    );
    // The session ends without its teardown (a crash; the finalizer pulls nothing, L9), so
    // the file is still only in the sandbox.
    backend.finalize();

    let summary = inventory.pull("default").expect("pull");
    assert_eq!((summary.restored, summary.quarantined), (1, 0));
    let host = world.home.path().join("skills/made/SKILL.md");
    assert_eq!(std::fs::read_to_string(host).expect("restored"), "remote\n");

    let none = inventory.pull("never-used").expect_err("no sandbox");
    assert!(none.is_no_sandbox(), "{none}");
    assert_eq!(world.list().len(), 1, "a pull never creates");
}

#[test]
fn the_live_check_creates_runs_and_kills_a_probe() {
    // contract: O6 — e2b-local's sandboxes have every tool and a writable home.
    let world = World::new();
    let steps = inventory(&world).live_check();
    let names: Vec<&str> = steps.iter().map(|s| s.step).collect();
    assert_eq!(names, ["create", "check template", "kill"]);
    assert!(steps.iter().all(|s| s.result.is_ok()), "{steps:?}");
    assert!(world.list().is_empty(), "the probe is gone");
}
