//! Host-side attacks prepared before recovery: redirected roots, symlinked directories, a
//! redirected quarantine tree, host-owned paths inside it. Each is quarantined or refused, and
//! the world's walk proves nothing outside the home and no host file changed.

use crate::support;

use std::io::Cursor;
use std::path::PathBuf;

use recovery::{Outcome, QuarantineReason, RecoveryConfig, recover};
use support::TarMaker;
use support::world::{ID, World};

fn snapshot(files: &[(&str, &str)]) -> Vec<u8> {
    let mut archive = TarMaker::new();
    for (name, body) in files {
        archive.file(name, body.as_bytes());
    }
    archive.finish()
}

fn quarantined_at(member: &str) -> PathBuf {
    PathBuf::from(format!("cache/e2b-recovered/{ID}/{member}"))
}

// contract: S7, X5
#[test]
fn a_skills_root_symlinked_outside_the_home_is_quarantined_wholesale() {
    let world = World::new();
    std::fs::create_dir_all(world.outside().join("elsewhere/x")).expect("mkdir");
    std::fs::write(world.outside().join("elsewhere/x/SKILL.md"), "outside copy").expect("write");
    world.symlink("skills", &world.outside().join("elsewhere"));
    let report = world
        .recover(&snapshot(&[
            ("skills/x/SKILL.md", "sandbox"),
            ("skills/new.md", "new"),
            ("memories/M.md", "m"),
        ]))
        .expect("recovers");
    let redirected = QuarantineReason::RedirectedRoot {
        root: "skills".to_owned(),
    };
    for member in ["skills/x/SKILL.md", "skills/new.md"] {
        assert_eq!(
            report.outcome_of(member),
            Some(&Outcome::Quarantined {
                at: quarantined_at(member),
                reason: redirected.clone()
            }),
            "{member}"
        );
        assert!(world.home().join(quarantined_at(member)).is_file());
    }
    assert_eq!(report.outcome_of("memories/M.md"), Some(&Outcome::Restored));
    assert!(!world.outside().join("elsewhere/new.md").exists());
}

// contract: S7
#[test]
fn a_skills_root_symlinked_inside_the_home_is_still_a_redirection() {
    let world = World::new();
    world.host("my-skills/x/SKILL.md", "host copy");
    world.symlink("skills", &world.home().join("my-skills"));
    let report = world
        .recover(&snapshot(&[("skills/y/SKILL.md", "sandbox")]))
        .expect("recovers");
    assert!(matches!(
        report.outcome_of("skills/y/SKILL.md"),
        Some(Outcome::Quarantined {
            reason: QuarantineReason::RedirectedRoot { .. },
            ..
        })
    ));
    assert!(!world.home().join("my-skills/y").exists());
}

// contract: S7, X5
#[test]
fn a_symlinked_directory_inside_skills_is_not_written_through() {
    let world = World::new();
    std::fs::create_dir_all(world.outside().join("team")).expect("mkdir");
    world.host("skills/mine/SKILL.md", "host");
    world.symlink("skills/team", &world.outside().join("team"));
    world.symlink("skills/loop", &world.home().join("cache"));
    let report = world
        .recover(&snapshot(&[
            ("skills/team/x/SKILL.md", "through the link"),
            (
                "skills/loop/e2b-recovered/planted",
                "into the quarantine tree",
            ),
            ("skills/other/SKILL.md", "fine"),
        ]))
        .expect("recovers");
    assert_eq!(
        report.outcome_of("skills/team/x/SKILL.md"),
        Some(&Outcome::Quarantined {
            at: quarantined_at("skills/team/x/SKILL.md"),
            reason: QuarantineReason::SymlinkedDirectory {
                at: "skills/team".to_owned()
            }
        })
    );
    assert!(matches!(
        report.outcome_of("skills/loop/e2b-recovered/planted"),
        Some(Outcome::Quarantined {
            reason: QuarantineReason::SymlinkedDirectory { .. },
            ..
        })
    ));
    assert_eq!(
        report.outcome_of("skills/other/SKILL.md"),
        Some(&Outcome::Restored)
    );
    assert!(
        std::fs::read_dir(world.outside().join("team"))
            .expect("listable")
            .next()
            .is_none()
    );
}

// contract: S8
#[test]
fn a_redirected_cache_refuses_quarantine_and_fails_closed() {
    let world = World::new();
    std::fs::create_dir_all(world.outside().join("cache")).expect("mkdir");
    world.symlink("cache", &world.outside().join("cache"));
    world.host("memories/MEMORY.md", "host");
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", "sandbox")]))
        .expect_err("fails closed");
    assert!(err.is_quarantine_refused() && err.blocks_push(), "{err}");
    assert!(
        matches!(&err, recovery::Error::QuarantineRefused { path, .. } if path == &PathBuf::from("cache"))
    );
    assert!(
        std::fs::read_dir(world.outside().join("cache"))
            .expect("listable")
            .next()
            .is_none()
    );

    // With nothing to quarantine, the redirection is never used and recovery proceeds.
    let report = world
        .recover(&snapshot(&[("skills/fresh.md", "new")]))
        .expect("nothing needs quarantine");
    assert_eq!(
        report.outcome_of("skills/fresh.md"),
        Some(&Outcome::Restored)
    );
}

// contract: S8
#[test]
fn every_level_of_the_quarantine_tree_must_be_itself() {
    let levels = [
        "cache/e2b-recovered".to_owned(),
        format!("cache/e2b-recovered/{ID}"),
        format!("cache/e2b-recovered/{ID}/memories"),
    ];
    for level in &levels {
        let world = World::new();
        std::fs::create_dir_all(world.outside().join("target")).expect("mkdir");
        world.symlink(level, &world.outside().join("target"));
        world.host("memories/MEMORY.md", "host");
        let err = world
            .recover(&snapshot(&[("memories/MEMORY.md", "sandbox")]))
            .expect_err("refused");
        assert!(err.is_quarantine_refused(), "{level}: {err}");
        assert!(
            matches!(&err, recovery::Error::QuarantineRefused { path, .. } if path == &PathBuf::from(level)),
            "{level}: {err}"
        );
        assert!(
            std::fs::read_dir(world.outside().join("target"))
                .expect("listable")
                .next()
                .is_none(),
            "{level}"
        );
    }
    let world = World::new();
    world.host("cache", "a file where the quarantine tree goes");
    world.host("memories/MEMORY.md", "host");
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", "sandbox")]))
        .expect_err("refused");
    assert!(err.is_quarantine_refused(), "{err}");
}

// contract: S8, S9
#[test]
fn a_credential_registered_inside_the_quarantine_tree_is_never_replaced() {
    let mut world = World::new();
    let credential = format!("cache/e2b-recovered/{ID}/memories/MEMORY.md");
    world.host(&credential, "host credential");
    world.host_only.push(PathBuf::from(&credential));
    world.host("memories/MEMORY.md", "host");
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", "sandbox")]))
        .expect_err("refused");
    assert!(err.is_quarantine_refused(), "{err}");
    assert_eq!(world.read(&credential), "host credential");

    // An absent credential path inside the tree is refused just the same (never created).
    let mut world = World::new();
    world.host_only.push(
        world
            .home()
            .join(format!("cache/e2b-recovered/{ID}/skills")),
    );
    let err = world
        .recover(&snapshot(&[("skills/cred/x", "planted")]))
        .map(|r| r.files);
    assert_eq!(
        err.expect("restored in place, not quarantined")[0].outcome,
        Outcome::Restored
    );
    world.host("skills/cred/x", "host");
    let err = world
        .recover(&snapshot(&[("skills/cred/x", "planted v2")]))
        .expect_err("refused");
    assert!(err.is_quarantine_refused(), "{err}");
    assert!(
        !world
            .home()
            .join(format!("cache/e2b-recovered/{ID}/skills"))
            .exists()
    );
}

// contract: S9
#[test]
fn a_credential_registered_through_a_symlinked_alias_is_matched_physically() {
    let mut world = World::new();
    world.host("skills/acme/token.json", "host token");
    world.symlink("alias", &world.home().join("skills/acme"));
    world.host_only.push(world.home().join("alias/token.json"));
    let report = world
        .recover(&snapshot(&[("skills/acme/token.json", "sandbox token")]))
        .expect("recovers");
    assert!(matches!(
        report.outcome_of("skills/acme/token.json"),
        Some(Outcome::Quarantined {
            reason: QuarantineReason::HostOnlyPath,
            ..
        })
    ));
}

// contract: S7
#[test]
fn a_symlinked_hermes_home_restores_in_place() {
    let world = World::new();
    let link = world.tmp.path().join("linked-home");
    std::os::unix::fs::symlink(world.home(), &link).expect("symlink");
    let config = RecoveryConfig {
        hermes_home: link,
        sandbox_id: ID.to_owned(),
        host_only: Vec::new(),
        max_snapshot_bytes: recovery::DEFAULT_MAX_SNAPSHOT_BYTES,
        push_base: None,
    };
    let report = recover(
        &config,
        &mut Cursor::new(snapshot(&[("skills/x/SKILL.md", "sandbox")])),
    )
    .expect("recovers");
    assert_eq!(
        report.outcome_of("skills/x/SKILL.md"),
        Some(&Outcome::Restored)
    );
    assert_eq!(world.read("skills/x/SKILL.md"), "sandbox");
}
