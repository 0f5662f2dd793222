//! The push base: a sandbox copy that is only what the host pushed last gives way to the
//! host's edit; anything the sandbox wrote is still quarantined; a damaged record is no base.

use crate::support;

use std::path::{Path, PathBuf};

use recovery::{BaseSource, Outcome, PushBase, QuarantineReason};
use support::TarMaker;
use support::world::{ID, World};

const MEMORY: &str = "memories/MEMORY.md";
const SKILL: &str = "skills/notes/SKILL.md";

fn snapshot(files: &[(&str, &str)]) -> Vec<u8> {
    let mut archive = TarMaker::new();
    for (member, body) in files {
        archive.file(member, body.as_bytes());
    }
    archive.finish()
}

fn outcome(report: &recovery::RecoveryReport, member: &str) -> Outcome {
    report.outcome_of(member).cloned().expect(member)
}

/// Files under the quarantine tree, if it exists.
fn quarantined(world: &World) -> Vec<PathBuf> {
    let root = world.home().join("cache/e2b-recovered");
    if !root.exists() {
        return Vec::new();
    }
    support::walk(&root)
        .into_iter()
        .filter(|(_, node)| matches!(node, support::Node::File(_)))
        .map(|(path, _)| path)
        .collect()
}

/// What a successful push of `files` leaves: the base on disk, as the backend stores it.
fn push(record: &Path, base: &mut PushBase, files: &[(&str, &str)]) {
    for (member, body) in files {
        base.record(member, body.as_bytes());
    }
    base.store(record).expect("store the push base");
}

// contract: S15, S6
#[test]
fn eleven_hundred_sessions_of_host_edits_recover_without_failing_closed_or_growing_quarantine() {
    let mut world = World::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("scope.push-base");
    let version = |member: &str, session: usize| format!("host edit {session} of {member}\n");
    // Session 0 pushes the first versions; the sandbox holds them from then on.
    let mut base = PushBase::new(ID);
    let first = [(MEMORY, version(MEMORY, 0)), (SKILL, version(SKILL, 0))];
    let pushed: Vec<(&str, &str)> = first.iter().map(|(m, b)| (*m, b.as_str())).collect();
    push(&record, &mut base, &pushed);
    let mut in_sandbox: Vec<(&str, String)> = first.to_vec();
    // More sessions than the 1000 `name~N` alternatives one path may use.
    for session in 1..=1100 {
        // Between sessions the host edits both files.
        for member in [MEMORY, SKILL] {
            world.host(member, &version(member, session));
        }
        let (loaded, source) = PushBase::load(&record, ID);
        assert_eq!(source, BaseSource::Record, "session {session}");
        world.base = Some(loaded);
        let files: Vec<(&str, &str)> = in_sandbox.iter().map(|(m, b)| (*m, b.as_str())).collect();
        let report = world
            .recover(&snapshot(&files))
            .unwrap_or_else(|e| panic!("session {session} failed closed: {e}"));
        for member in [MEMORY, SKILL] {
            assert_eq!(
                outcome(&report, member),
                Outcome::Superseded,
                "session {session}"
            );
            assert_eq!(world.read(member), version(member, session));
        }
        assert!(report.warnings().is_empty(), "{:?}", report.warnings());
        // The push then sends the host's versions.
        in_sandbox = [MEMORY, SKILL]
            .map(|member| (member, version(member, session)))
            .to_vec();
        let files: Vec<(&str, &str)> = in_sandbox.iter().map(|(m, b)| (*m, b.as_str())).collect();
        push(&record, &mut base, &files);
    }
    assert_eq!(quarantined(&world), Vec::<PathBuf>::new());
}

// contract: S6, S15
#[test]
fn a_sandbox_edit_is_still_quarantined_with_a_base() {
    let mut world = World::new();
    world.host(MEMORY, "host edit").host(SKILL, "host edit");
    let mut base = PushBase::new(ID);
    for member in [MEMORY, SKILL, "skills/gone/SKILL.md"] {
        base.record(member, b"pushed");
    }
    world.base = Some(base.clone());
    let report = world
        .recover(&snapshot(&[
            (MEMORY, "written in the sandbox"),
            (SKILL, "pushed"),
            // The host deleted it since the push: the copy comes back, as without a base.
            ("skills/gone/SKILL.md", "pushed"),
        ]))
        .expect("recovers");
    assert_eq!(
        outcome(&report, MEMORY),
        Outcome::Quarantined {
            at: PathBuf::from(format!("cache/e2b-recovered/{ID}/{MEMORY}")),
            reason: QuarantineReason::Conflict,
        }
    );
    assert_eq!(
        world.read(format!("cache/e2b-recovered/{ID}/{MEMORY}")),
        "written in the sandbox"
    );
    assert_eq!(outcome(&report, SKILL), Outcome::Superseded);
    assert_eq!(outcome(&report, "skills/gone/SKILL.md"), Outcome::Restored);
    assert_eq!(world.read(MEMORY), "host edit");
    assert_eq!(world.read(SKILL), "host edit");
    assert_eq!(report.warnings().len(), 1, "{:?}", report.warnings());

    // A base recorded for another sandbox says nothing about this one.
    let other = World::new();
    other.host(SKILL, "host edit");
    let mut foreign = PushBase::new("another-sandbox");
    foreign.record(SKILL, b"pushed");
    let mut other = other;
    other.base = Some(foreign);
    let report = other
        .recover(&snapshot(&[(SKILL, "pushed")]))
        .expect("recovers");
    assert!(
        matches!(
            outcome(&report, SKILL),
            Outcome::Quarantined {
                reason: QuarantineReason::Conflict,
                ..
            }
        ),
        "{report:?}"
    );
}

// contract: S15, S6
#[test]
fn a_corrupt_base_record_is_no_base_and_conflicts_are_quarantined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("scope.push-base");
    let mut base = PushBase::new(ID);
    base.record(SKILL, b"pushed");
    base.store(&record).expect("store");
    let good = std::fs::read(&record).expect("read");
    let mut flipped = good.clone();
    let at = good.len() / 2;
    flipped[at] ^= 0x20;
    for (what, data) in [
        ("truncated", good[..good.len() - 5].to_vec()),
        ("a changed byte", flipped),
        ("garbage", b"\x00\x01 not a record".to_vec()),
    ] {
        std::fs::write(&record, &data).expect("damage");
        let (loaded, source) = PushBase::load(&record, ID);
        assert!(
            matches!(source, BaseSource::Unusable(_)),
            "{what}: {source:?}"
        );
        let mut world = World::new();
        world.host(SKILL, "host edit");
        world.base = Some(loaded);
        let report = world
            .recover(&snapshot(&[(SKILL, "pushed")]))
            .expect("recovers");
        assert_eq!(
            outcome(&report, SKILL),
            Outcome::Quarantined {
                at: PathBuf::from(format!("cache/e2b-recovered/{ID}/{SKILL}")),
                reason: QuarantineReason::Conflict,
            },
            "{what}"
        );
        assert_eq!(world.read(SKILL), "host edit");
    }
}

// contract: S15
#[test]
fn a_realistic_tree_fits_in_the_record() {
    // 20,000 skills: every one gets a base, and the record round-trips.
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("scope.push-base");
    let mut base = PushBase::new(ID);
    for index in 0..20_000 {
        base.record(&format!("skills/skill-{index:05}/SKILL.md"), b"pushed");
    }
    assert_eq!(base.len(), 20_000);
    assert!(!base.is_empty());
    base.store(&record).expect("store");
    let (loaded, source) = PushBase::load(&record, ID);
    assert_eq!(source, BaseSource::Record);
    assert_eq!(loaded.len(), 20_000);
}
