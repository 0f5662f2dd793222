//! Fencing under `writer_arbitration: sandbox` (C10): a writer taken over is refused by
//! generation, its staged pushes and held-back deletes never land, and a failed commit stays
//! pending. The hosts and hooks are `arbitration`'s.

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{ManualClock, PullOutcome, RoleKind};

use crate::arbitration::{
    Host, SHORT_TERM, admitted_within_takeover_wait, sandbox_backend, sandbox_id,
};
use crate::support::{WarningLog, World, ok, run, sandbox_file, sandbox_shell};

#[test]
fn a_paused_writer_is_fenced_by_generation_and_the_new_writers_state_survives() {
    // contract: C10 — SIGSTOP past the term, another host takes over and pushes; after
    // SIGCONT the first host's push is refused, it demotes, and nothing of it lands.
    let world = World::new();
    let mut a = Host::start(&world, SHORT_TERM);
    a.write_skill("s.md", "a1\n");
    let id = sandbox_id(&a.ask("attach"));
    a.signal("STOP");

    let mut b = Host::start(&world, 60);
    let b_bytes = b"b1: the new writer's bytes\n\x00\xff";
    std::fs::write(b.src.join("skills").join("s.md"), b_bytes).expect("write");
    b.take_over();
    let skill = "/home/user/.hermes/skills/s.md";
    assert_eq!(
        sandbox_file(&world, &id, skill).as_deref(),
        Some(&b_bytes[..])
    );

    a.signal("CONT");
    a.write_skill("s.md", "a2: a stale write\n");
    let refused = a.ask("run true");
    assert!(refused.starts_with("error"), "{refused}");
    assert!(refused.contains("no longer the writer"), "{refused}");
    assert!(a.ask("attach").ends_with("Reader"), "demoted");
    assert_eq!(
        sandbox_file(&world, &id, skill).as_deref(),
        Some(&b_bytes[..]),
        "byte for byte"
    );
    // a stays a reader (b holds the record), and b's next commit discards a's staging.
    let again = a.ask("run true");
    assert!(
        again.contains("another host holds the writer role"),
        "{again}"
    );
    assert!(b.ask("run true").starts_with("exit 0"));
    assert!(
        b.ask("run test ! -e /home/user/.hermes.writer/staging/1")
            .starts_with("exit 0")
    );
    assert_eq!(
        sandbox_file(&world, &id, skill).as_deref(),
        Some(&b_bytes[..])
    );
}

#[test]
fn a_fenced_writer_warns_once_naming_the_holder_and_pulls_nothing_at_teardown() {
    // contract: C10
    let world = World::new();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().expect("dir")).collect();
    let clock = || Arc::new(ManualClock::new());
    let a = sandbox_backend(&world, Duration::from_secs(1), clock(), dirs[0].path());
    std::fs::write(dirs[0].path().join("skills").join("s.md"), "a1\n").expect("write");
    ok(&a, "true");
    let b_clock = clock();
    let b = sandbox_backend(
        &world,
        Duration::from_secs(60),
        b_clock.clone(),
        dirs[1].path(),
    );
    admitted_within_takeover_wait(&b, &b_clock);
    assert_eq!(b.info().expect("attached").role, RoleKind::Writer);
    let b_host =
        std::fs::read_to_string(dirs[1].path().join("lock").join("host-id")).expect("b's host id");

    std::fs::write(dirs[0].path().join("skills").join("s.md"), "a2\n").expect("write");
    let log = WarningLog::default();
    let fenced = log.capture(|| run(&a, "true")).expect_err("fenced");
    assert!(fenced.is_fenced(), "{fenced}");
    assert!(fenced.to_string().contains(&b_host), "{fenced}");
    let a_files = writer_lease::ScopeFiles::new(
        dirs[0].path().join("lock"),
        a.scope_digest().parse().expect("scope key"),
    );
    assert!(
        a_files.dirty().expect("read").is_some(),
        "the fenced host marked its scope dirty"
    );
    let refused = log
        .capture(|| run(&a, "true"))
        .expect_err("b holds the role");
    assert!(refused.is_not_ready(), "{refused}");
    assert_eq!(log.count(&b_host), 1, "{:?}", log.warnings());
    assert_eq!(a.info().expect("attached").role, RoleKind::Reader);
    assert_eq!(
        ok(&b, "cat ~/.hermes/skills/s.md"),
        "a1\n",
        "what a committed while it held the role, never its fenced a2"
    );

    // A writer taken over while silent finds out at teardown: no pull, no release.
    b.cleanup();
    let c = sandbox_backend(&world, Duration::from_secs(1), clock(), dirs[2].path());
    ok(&c, "true");
    assert_eq!(c.info().expect("attached").role, RoleKind::Writer);
    let d_clock = clock();
    let d = sandbox_backend(
        &world,
        Duration::from_secs(60),
        d_clock.clone(),
        dirs[3].path(),
    );
    admitted_within_takeover_wait(&d, &d_clock);
    assert_eq!(c.cleanup().pull, PullOutcome::NotAttempted);
    assert_eq!(d.cleanup().pull, PullOutcome::Pulled);
    a.cleanup();
}

#[test]
fn a_stale_writers_held_back_deletes_never_land() {
    // contract: C10 — deletes wait in the staging until a commit under the writer's
    // generation; a writer taken over meanwhile has them refused, and the new writer's
    // commit discards them.
    let world = World::new();
    let (a_src, b_src) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let a = sandbox_backend(
        &world,
        Duration::from_secs(1),
        Arc::new(ManualClock::new()),
        a_src.path(),
    );
    let kept = a_src.path().join("skills").join("kept.md");
    std::fs::write(&kept, "a1\n").expect("write");
    std::fs::write(a_src.path().join("skills").join("gone.md"), "g1\n").expect("write");
    ok(&a, "true");
    let id = a.info().expect("attached").sandbox_id;
    let remote = "/home/user/.hermes/skills/kept.md";
    assert_eq!(
        sandbox_file(&world, &id, remote).as_deref(),
        Some(&b"a1\n"[..])
    );

    // While a still holds the role, its delete lands through its own commit.
    std::fs::remove_file(a_src.path().join("skills").join("gone.md")).expect("remove");
    ok(&a, "true");
    assert_eq!(
        sandbox_file(&world, &id, "/home/user/.hermes/skills/gone.md"),
        None,
        "a current writer's delete is committed"
    );

    let b_clock = Arc::new(ManualClock::new());
    let b = sandbox_backend(
        &world,
        Duration::from_secs(60),
        b_clock.clone(),
        b_src.path(),
    );
    admitted_within_takeover_wait(&b, &b_clock);
    assert_eq!(b.info().expect("attached").role, RoleKind::Writer);

    // a, taken over without knowing it, deletes: the delete is held back and refused.
    std::fs::remove_file(&kept).expect("remove");
    let fenced = run(&a, "true").expect_err("fenced");
    assert!(fenced.is_fenced(), "{fenced}");
    assert_eq!(a.info().expect("attached").role, RoleKind::Reader);
    assert_eq!(
        sandbox_file(&world, &id, remote).as_deref(),
        Some(&b"a1\n"[..]),
        "the stale delete did not land"
    );
    // The new writer's next commit discards the stale staging; the file is still there.
    ok(&b, "true");
    assert!(
        run(&a, "true")
            .expect_err("b holds the role")
            .is_not_ready()
    );
    assert_eq!(
        sandbox_file(&world, &id, remote).as_deref(),
        Some(&b"a1\n"[..]),
        "nor after the new writer's commit"
    );
    assert_eq!(ok(&b, "ls ~/.hermes.writer/staging | wc -l").trim(), "0");
    b.cleanup();
    a.cleanup();
}

#[test]
fn a_commit_that_failed_is_retried_by_the_next_sync_before_dirty_clears() {
    // contract: C10 — a staged push whose commit failed stays pending: the scope stays dirty
    // and the next sync commits it again.
    let world = World::new();
    let src = tempfile::tempdir().expect("src");
    let skill = src.path().join("skills").join("s.md");
    std::fs::create_dir_all(skill.parent().unwrap()).expect("skills");
    std::fs::write(&skill, "v1\n").expect("write");
    let backend = sandbox_backend(
        &world,
        Duration::from_secs(90),
        world.clock.clone(),
        src.path(),
    );
    assert_eq!(ok(&backend, "cat ~/.hermes/skills/s.md"), "v1\n");
    let id = backend.info().expect("attached").sandbox_id;
    let files = writer_lease::ScopeFiles::new(
        src.path().join("lock"),
        backend.scope_digest().parse().expect("scope key"),
    );

    // A file where the staged skills/ directory must land makes the commit fail.
    sandbox_shell(
        &world,
        &id,
        "rm -rf ~/.hermes/skills && echo blocker > ~/.hermes/skills",
    );
    std::fs::write(&skill, "v2\n").expect("write");
    let failed = run(&backend, "true").expect_err("the commit fails");
    assert!(
        failed.to_string().contains("commit staged state"),
        "{failed}"
    );
    assert!(
        files.dirty().expect("read").is_some(),
        "a failed commit leaves the scope dirty"
    );

    sandbox_shell(&world, &id, "rm -f ~/.hermes/skills");
    assert_eq!(
        ok(&backend, "cat ~/.hermes/skills/s.md"),
        "v2\n",
        "committed on the next sync"
    );
    assert!(files.dirty().expect("read").is_none());
    backend.cleanup();
}
