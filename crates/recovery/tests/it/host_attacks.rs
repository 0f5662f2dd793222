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

// Relative symlinks: cap-std refuses an absolute target by itself, and a relative one that
// climbs out of the directory handle it is met from, but it follows one that stays inside
// that handle (`skills/team -> mine`). Only the no-follow walk keeps those from being
// written through, so each test below has such a link next to the escapes.

/// The sandbox copy sits in quarantine under its own member name, with `reason`.
fn assert_quarantined(
    world: &World,
    report: &recovery::RecoveryReport,
    member: &str,
    body: &str,
    reason: QuarantineReason,
) {
    assert_eq!(
        report.outcome_of(member),
        Some(&Outcome::Quarantined {
            at: quarantined_at(member),
            reason
        }),
        "{member}"
    );
    assert_eq!(world.read(quarantined_at(member)), body, "{member}");
}

/// The names directly in `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("listable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// contract: S7, X5
#[test]
fn relatively_symlinked_directories_inside_skills_are_not_written_through() {
    let world = World::new();
    world.host("skills/mine/SKILL.md", "host mine");
    // A sibling inside the root, climbs out of the home, one from deeper down, back into the
    // home's quarantine tree, and a dangling one out of the home.
    let links = [
        ("skills/team", "mine"),
        ("skills/up", "../../outside"),
        ("skills/deep/a", "../../../outside"),
        ("skills/loop", "../cache"),
        ("skills/dangling", "../../outside/absent"),
    ];
    for (link, target) in links {
        world.symlink(link, std::path::Path::new(target));
    }
    let members = [
        ("skills/team/SKILL.md", "skills/team"),
        ("skills/team/new/x.md", "skills/team"),
        ("skills/up/secret", "skills/up"),
        ("skills/up/new.md", "skills/up"),
        ("skills/deep/a/new.md", "skills/deep/a"),
        (
            "skills/loop/e2b-recovered/sbx42/skills/planted",
            "skills/loop",
        ),
        ("skills/dangling/x.md", "skills/dangling"),
    ];
    let files: Vec<(&str, String)> = members
        .iter()
        .map(|(member, _)| (*member, format!("sandbox {member}")))
        .collect();
    let pairs: Vec<(&str, &str)> = files.iter().map(|(m, b)| (*m, b.as_str())).collect();
    let report = world.recover(&snapshot(&pairs)).expect("recovers");
    for ((member, at), (_, body)) in members.iter().zip(&files) {
        let reason = QuarantineReason::SymlinkedDirectory {
            at: (*at).to_owned(),
        };
        assert_quarantined(&world, &report, member, body, reason);
    }
    assert_eq!(listing(&world.home().join("skills/mine")), ["SKILL.md"]);
    assert_eq!(world.read("skills/mine/SKILL.md"), "host mine");
    assert_eq!(listing(&world.outside()), ["secret"]);
    assert_eq!(
        std::fs::read_to_string(world.outside().join("secret")).expect("decoy"),
        "outside secret"
    );
}

// contract: S7, X5
#[test]
fn relatively_symlinked_files_are_never_written_through() {
    let world = World::new();
    world.host("skills/mine/SKILL.md", "host mine");
    // Existing and dangling targets, inside the root, across roots and out of the home; and
    // a directory link met by a file member.
    let links = [
        ("skills/alias.md", "mine/SKILL.md"),
        ("skills/leak.md", "../../outside/secret"),
        ("skills/plant.md", "../../outside/planted"),
        ("skills/ghost.md", "mine/absent.md"),
        ("memories/MEMORY.md", "../skills/mine/SKILL.md"),
        ("skills/team", "mine"),
    ];
    for (link, target) in links {
        world.symlink(link, std::path::Path::new(target));
    }
    let files: Vec<(&str, String)> = links
        .iter()
        .map(|(member, _)| (*member, format!("sandbox {member}")))
        .collect();
    let pairs: Vec<(&str, &str)> = files.iter().map(|(m, b)| (*m, b.as_str())).collect();
    let report = world.recover(&snapshot(&pairs)).expect("recovers");
    for (member, body) in &files {
        assert_quarantined(
            &world,
            &report,
            member,
            body,
            QuarantineReason::HostNotRegularFile,
        );
    }
    assert_eq!(listing(&world.home().join("skills/mine")), ["SKILL.md"]);
    assert_eq!(world.read("skills/mine/SKILL.md"), "host mine");
    assert_eq!(listing(&world.outside()), ["secret"]);
}

// contract: S7, X5
#[test]
fn relatively_symlinked_roots_are_redirections() {
    // Into the home, out of it to a directory, out of it to nothing.
    for memories in ["my-memories", "../outside/mem", "../outside/absent"] {
        let world = World::new();
        world.host("my-skills/x/SKILL.md", "host copy");
        world.host("my-memories/M.md", "host memory");
        std::fs::create_dir_all(world.outside().join("mem")).expect("mkdir");
        world.symlink("skills", std::path::Path::new("my-skills"));
        world.symlink("memories", std::path::Path::new(memories));
        let report = world
            .recover(&snapshot(&[
                ("skills/x/SKILL.md", "sandbox skill"),
                ("skills/y/SKILL.md", "sandbox new"),
                ("memories/M.md", "sandbox memory"),
                ("memories/N.md", "sandbox new memory"),
            ]))
            .expect("recovers");
        for (member, body) in [
            ("skills/x/SKILL.md", "sandbox skill"),
            ("skills/y/SKILL.md", "sandbox new"),
        ] {
            let reason = QuarantineReason::RedirectedRoot {
                root: "skills".to_owned(),
            };
            assert_quarantined(&world, &report, member, body, reason);
        }
        for (member, body) in [
            ("memories/M.md", "sandbox memory"),
            ("memories/N.md", "sandbox new memory"),
        ] {
            let reason = QuarantineReason::RedirectedRoot {
                root: "memories".to_owned(),
            };
            assert_quarantined(&world, &report, member, body, reason);
        }
        assert_eq!(
            listing(&world.home().join("my-skills")),
            ["x"],
            "{memories}"
        );
        assert_eq!(listing(&world.home().join("my-skills/x")), ["SKILL.md"]);
        assert_eq!(listing(&world.home().join("my-memories")), ["M.md"]);
        assert_eq!(world.read("my-memories/M.md"), "host memory");
        assert!(
            listing(&world.outside().join("mem")).is_empty(),
            "{memories}"
        );
        assert_eq!(listing(&world.outside()), ["mem", "secret"], "{memories}");
    }
}

// contract: S8, X5
#[test]
fn a_relatively_symlinked_quarantine_tree_is_refused_at_every_level() {
    let q = format!("cache/e2b-recovered/{ID}");
    // Each level out of the home; links that stay inside the directory handle they are met
    // from, which cap-std would follow (into the home's memories root, into a sibling in the
    // tree); and at the copy's own name, existing and dangling targets in and out of the home.
    let cases = [
        ("cache".to_owned(), "../outside/target"),
        ("cache".to_owned(), "memories"),
        ("cache/e2b-recovered".to_owned(), "../../outside/target"),
        (q.clone(), "../../../outside/target"),
        (format!("{q}/memories"), "../../../../outside/target"),
        (format!("{q}/memories"), "../../../../memories"),
        (format!("{q}/memories"), "skills"),
        (
            format!("{q}/memories/MEMORY.md"),
            "../../../../../memories/MEMORY.md",
        ),
        (
            format!("{q}/memories/MEMORY.md"),
            "../../../../../outside/target/new",
        ),
        (format!("{q}/memories/MEMORY.md"), "new.md"),
    ];
    for (level, target) in &cases {
        let world = World::new();
        std::fs::create_dir_all(world.outside().join("target")).expect("mkdir");
        let sibling = world.home().join(&q).join("skills");
        let below_q = level.starts_with(&format!("{q}/"));
        if below_q {
            std::fs::create_dir_all(&sibling).expect("mkdir");
        }
        world.host("memories/MEMORY.md", "host");
        world.symlink(level, std::path::Path::new(target));
        let err = world
            .recover(&snapshot(&[("memories/MEMORY.md", "sandbox")]))
            .expect_err("refused");
        assert!(
            matches!(&err, recovery::Error::QuarantineRefused { path, .. } if path == &PathBuf::from(level)),
            "{level} -> {target}: {err}"
        );
        assert!(err.blocks_push(), "{level}");
        assert!(
            listing(&world.outside().join("target")).is_empty(),
            "{level} -> {target}"
        );
        assert_eq!(
            listing(&world.home().join("memories")),
            ["MEMORY.md"],
            "{level} -> {target}"
        );
        assert_eq!(
            world.read("memories/MEMORY.md"),
            "host",
            "{level} -> {target}"
        );
        if below_q {
            assert!(listing(&sibling).is_empty(), "{level} -> {target}");
        }
    }
}
