//! Boundaries the other suites left open (found by cargo-mutants): exact name and path
//! limits, files where directories belong, spools and their execute bit.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use recovery::{Outcome, QuarantineReason, SkipReason};
use support::TarMaker;
use support::world::{ID, World};

fn snapshot(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut archive = TarMaker::new();
    for (member, body) in files {
        archive.file(member, body);
    }
    archive.finish()
}

// contract: S10
#[test]
fn a_255_byte_name_is_restored_and_a_256_byte_name_is_skipped() {
    let world = World::new();
    let fits = format!("skills/{}", "n".repeat(255));
    let over = format!("skills/{}", "o".repeat(256));
    let report = world
        .recover(&snapshot(&[(&fits, b"fits"), (&over, b"over")]))
        .expect("recovers");
    assert_eq!(report.outcome_of(&fits), Some(&Outcome::Restored));
    assert_eq!(world.read(&fits), "fits");
    assert_eq!(
        report.outcome_of(&over),
        Some(&Outcome::Skipped {
            reason: SkipReason::NameTooLong
        })
    );
}

// contract: S10
#[test]
fn the_path_limit_counts_the_home_and_one_separator() {
    // PATH_MAX is 4096 with the terminator: `<home>/<member>` may be 4095 bytes, not 4096.
    let world = World::new();
    let home_len = world.home().as_os_str().len();
    let member_of = |total: usize| {
        let mut member = String::from("skills");
        while home_len + 1 + member.len() + 201 < total {
            member.push('/');
            member.push_str(&"d".repeat(200));
        }
        member.push('/');
        let rest = total - home_len - 1 - member.len();
        member.push_str(&"f".repeat(rest));
        assert_eq!(home_len + 1 + member.len(), total);
        member
    };
    let longest = member_of(4095);
    let one_over = member_of(4096);
    let report = world
        .recover(&snapshot(&[(&longest, b"fits"), (&one_over, b"over")]))
        .expect("recovers");
    assert_eq!(
        report.outcome_of(&one_over),
        Some(&Outcome::Skipped {
            reason: SkipReason::PathTooLong
        })
    );
    assert_ne!(
        report.outcome_of(&longest),
        Some(&Outcome::Skipped {
            reason: SkipReason::PathTooLong
        }),
        "4095 bytes is within the limit"
    );
}

// contract: S6, S10
#[test]
fn a_long_conflict_is_still_quarantined() {
    // About 1,500 bytes: far from the limit, but four times over it if miscounted.
    let world = World::new();
    let member = format!(
        "skills/{}/{}/{}/{}/SKILL.md",
        "a".repeat(250),
        "b".repeat(250),
        "c".repeat(250),
        "d".repeat(250)
    );
    world.host(&member, "host");
    let report = world
        .recover(&snapshot(&[(&member, b"sandbox")]))
        .expect("recovers");
    assert_eq!(
        report.outcome_of(&member),
        Some(&Outcome::Quarantined {
            at: PathBuf::from(format!("cache/e2b-recovered/{ID}/{member}")),
            reason: QuarantineReason::Conflict,
        })
    );
}

// contract: S10
#[test]
fn a_skills_root_that_is_a_file_costs_its_files_only() {
    let world = World::new();
    world.host("skills", "a file where the root belongs");
    let report = world
        .recover(&snapshot(&[
            ("skills/x/SKILL.md", b"sandbox"),
            ("memories/MEMORY.md", b"memory"),
        ]))
        .expect("recovers");
    assert_eq!(
        report.outcome_of("skills/x/SKILL.md"),
        Some(&Outcome::Skipped {
            reason: SkipReason::AncestorIsFile {
                at: "skills".to_owned()
            }
        })
    );
    assert_eq!(
        report.outcome_of("memories/MEMORY.md"),
        Some(&Outcome::Restored)
    );
    assert!(!world.home().join("cache/e2b-recovered").exists());
}

// contract: S8, S10
#[test]
fn a_file_in_the_quarantine_tree_where_a_directory_belongs_costs_that_file_only() {
    let world = World::new();
    world
        .host("skills/x/SKILL.md", "host")
        .host("skills/y/SKILL.md", "host")
        .host(&format!("cache/e2b-recovered/{ID}/skills/x"), "a file");
    let report = world
        .recover(&snapshot(&[
            ("skills/x/SKILL.md", b"sandbox x"),
            ("skills/y/SKILL.md", b"sandbox y"),
        ]))
        .expect("a file in the way is not a redirection");
    assert_eq!(
        report.outcome_of("skills/x/SKILL.md"),
        Some(&Outcome::Skipped {
            reason: SkipReason::AncestorIsFile {
                at: format!("cache/e2b-recovered/{ID}/skills/x")
            }
        })
    );
    assert!(matches!(
        report.outcome_of("skills/y/SKILL.md"),
        Some(Outcome::Quarantined {
            reason: QuarantineReason::Conflict,
            ..
        })
    ));
    assert_eq!(
        world.read(format!("cache/e2b-recovered/{ID}/skills/x")),
        "a file"
    );
}

// contract: S8
#[test]
fn comparing_files_up_to_8_mib_never_touches_a_redirected_quarantine_tree() {
    // Files up to 8 MiB are compared in memory: a redirected `cache/` matters only to files
    // that need quarantine (or are larger).
    let world = World::new();
    std::fs::create_dir_all(world.outside().join("cache")).expect("mkdir");
    world.symlink("cache", &world.outside().join("cache"));
    let limit = vec![b's'; 8 * 1024 * 1024];
    world.host("skills/same/SKILL.md", "same");
    std::fs::write(world.home().join("skills/same/limit.bin"), &limit).expect("write");
    let report = world
        .recover(&snapshot(&[
            ("skills/same/SKILL.md", b"same"),
            ("skills/same/limit.bin", &limit),
        ]))
        .expect("nothing needs quarantine");
    for member in ["skills/same/SKILL.md", "skills/same/limit.bin"] {
        assert_eq!(
            report.outcome_of(member),
            Some(&Outcome::Unchanged),
            "{member}"
        );
    }
    assert!(
        std::fs::read_dir(world.outside().join("cache"))
            .expect("listable")
            .next()
            .is_none()
    );
}

// contract: S5, S11
#[test]
fn a_snapshot_of_files_without_directory_members_is_recovered_not_empty() {
    let world = World::new();
    let report = world
        .recover(&snapshot(&[("skills/only/SKILL.md", b"one file")]))
        .expect("recovers");
    assert_eq!(report.state, recovery::SnapshotState::Recovered);
    assert_eq!(
        report.outcome_of("skills/only/SKILL.md"),
        Some(&Outcome::Restored)
    );
    // A directory alone is state too: only a complete empty archive is nothing to recover.
    let mut archive = TarMaker::new();
    archive.dir("skills/").dir("memories/");
    let report = world.recover(&archive.finish()).expect("recovers");
    assert_eq!(report.state, recovery::SnapshotState::Recovered);
    assert!(report.files.is_empty());
}

// contract: S6
#[test]
fn a_large_quarantined_copy_keeps_its_missing_execute_bit() {
    // Over the 8 MiB in-memory limit: spooled through a temp file, whose mode must not
    // invent an execute bit.
    let world = World::new();
    world.host("skills/big/data.bin", "host");
    let body = vec![b'x'; 8 * 1024 * 1024 + 1];
    let report = world
        .recover(&snapshot(&[("skills/big/data.bin", &body)]))
        .expect("recovers");
    let Some(Outcome::Quarantined { at, .. }) = report.outcome_of("skills/big/data.bin") else {
        panic!("{report:?}")
    };
    let meta = std::fs::metadata(world.home().join(at)).expect("quarantined");
    assert_eq!(meta.len(), body.len() as u64);
    assert_eq!(meta.permissions().mode() & 0o111, 0, "no execute bit");
}

// contract: S8
#[test]
fn a_symlinked_quarantine_level_is_refused_as_a_redirection() {
    let world = World::new();
    std::fs::create_dir_all(world.outside().join("target")).expect("mkdir");
    world.symlink("cache/e2b-recovered", &world.outside().join("target"));
    world.host("memories/MEMORY.md", "host");
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", b"sandbox")]))
        .expect_err("refused");
    // The reason tells a person what to undo: a symlink, not a stray file.
    assert!(
        matches!(&err, recovery::Error::QuarantineRefused { reason, .. } if reason.contains("symlink")),
        "{err}"
    );
}

/// A member `skills/...` of exactly `len` bytes whose last component is 250 bytes long.
fn member_of_len(len: usize) -> String {
    let tail = 1 + 250;
    let fixed = "skills".len() + tail;
    let dirs = (len - fixed - 2) / 201;
    let middle = len - fixed - 201 * dirs - 1;
    assert!((1..=255).contains(&middle), "{len}");
    let mut member = String::from("skills");
    for _ in 0..dirs {
        member.push('/');
        member.push_str(&"d".repeat(200));
    }
    member.push('/');
    member.push_str(&"e".repeat(middle));
    member.push('/');
    member.push_str(&"f".repeat(250));
    assert_eq!(member.len(), len);
    member
}

// contract: S10
#[test]
fn a_quarantine_destination_keeps_room_for_its_alternative_suffix() {
    // `<home>/cache/e2b-recovered/<id>/<member>` plus four bytes for `~999` must stay
    // under 4096 (PATH_MAX with its terminator).
    let world = World::new();
    let fixed = world.home().as_os_str().len() + 1 + format!("cache/e2b-recovered/{ID}/").len() + 4;
    let fits = member_of_len(4095 - fixed);
    let over = member_of_len(4096 - fixed);
    world.host(&fits, "host").host(&over, "host");
    let report = world
        .recover(&snapshot(&[(&fits, b"sandbox"), (&over, b"sandbox")]))
        .expect("recovers");
    assert_eq!(
        report.outcome_of(&over),
        Some(&Outcome::Skipped {
            reason: SkipReason::PathTooLong
        })
    );
    assert!(
        matches!(
            report.outcome_of(&fits),
            Some(Outcome::Quarantined {
                reason: QuarantineReason::Conflict,
                ..
            })
        ),
        "{report:?}"
    );
}

// contract: S6
#[test]
fn a_directory_holding_the_quarantine_name_moves_the_copy_to_the_next_alternative() {
    let world = World::new();
    world.host("skills/x/SKILL.md", "host");
    std::fs::create_dir_all(
        world
            .home()
            .join(format!("cache/e2b-recovered/{ID}/skills/x/SKILL.md")),
    )
    .expect("a directory at the quarantine name");
    let report = world
        .recover(&snapshot(&[("skills/x/SKILL.md", b"sandbox")]))
        .expect("recovers");
    let next = format!("cache/e2b-recovered/{ID}/skills/x/SKILL.md~1");
    assert_eq!(
        report.outcome_of("skills/x/SKILL.md"),
        Some(&Outcome::Quarantined {
            at: PathBuf::from(&next),
            reason: QuarantineReason::Conflict,
        })
    );
    assert_eq!(world.read(&next), "sandbox");
}

// contract: S8
#[test]
fn a_symlink_at_the_quarantine_destination_fails_closed() {
    let world = World::new();
    world.host("memories/MEMORY.md", "host");
    world.symlink(
        &format!("cache/e2b-recovered/{ID}/memories/MEMORY.md"),
        &world.outside().join("secret"),
    );
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", b"sandbox")]))
        .expect_err("refused");
    assert!(err.is_quarantine_refused(), "{err}");
    assert_eq!(
        std::fs::read_to_string(world.outside().join("secret")).expect("decoy"),
        "outside secret"
    );
}

// contract: S8
#[test]
fn a_file_where_the_quarantine_tree_goes_is_named_as_not_a_directory() {
    let world = World::new();
    world
        .host("cache/e2b-recovered", "a file")
        .host("memories/MEMORY.md", "host");
    let err = world
        .recover(&snapshot(&[("memories/MEMORY.md", b"sandbox")]))
        .expect_err("refused");
    assert!(
        matches!(&err, recovery::Error::QuarantineRefused { reason, .. } if reason.contains("not a directory")),
        "{err}"
    );
}

// contract: S6
#[test]
fn a_large_quarantined_copy_keeps_its_execute_bit() {
    let world = World::new();
    world.host("skills/big/tool", "host");
    let body = vec![b'x'; 8 * 1024 * 1024 + 1];
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(0o755);
    let mut archive = tar::Builder::new(Vec::new());
    archive
        .append_data(&mut header, "skills/big/tool", &body[..])
        .expect("append");
    let report = world
        .recover(&archive.into_inner().expect("finish"))
        .expect("recovers");
    let Some(Outcome::Quarantined { at, .. }) = report.outcome_of("skills/big/tool") else {
        panic!("{report:?}")
    };
    let meta = std::fs::metadata(world.home().join(at)).expect("quarantined");
    assert_eq!(meta.permissions().mode() & 0o111, 0o111, "execute bit kept");
}
