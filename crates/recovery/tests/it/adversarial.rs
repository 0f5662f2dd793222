//! The adversarial corpus against recovery: archives a hostile sandbox could send, each with
//! its exact outcome, and a walk proving nothing was written outside the Hermes home and no
//! host file changed.

#![allow(clippy::print_stdout)] // Prints counts and timings as figures, never asserts on time.

use crate::support;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::PathBuf;

use recovery::{
    Outcome, QuarantineReason, RecoveryConfig, RecoveryReport, RejectReason, SkipReason,
    SnapshotState, recover,
};
use support::{Counting, HugeArchive, TarMaker};

use support::world::{ID, World};

fn outcomes(report: &RecoveryReport) -> BTreeMap<String, Outcome> {
    report
        .files
        .iter()
        .map(|f| (f.member.clone(), f.outcome.clone()))
        .collect()
}

fn skipped(reason: SkipReason) -> Outcome {
    Outcome::Skipped { reason }
}

// contract: X5
#[test]
fn hostile_members_are_skipped_and_named_and_the_rest_is_restored() {
    let long_component = format!("skills/{}", "c".repeat(300));
    let long_path = format!("skills/{}", vec!["d".repeat(200); 25].join("/"));
    let cases: Vec<(&str, TarMaker, &str, Outcome)> = vec![
        (
            "traversal",
            {
                let mut t = TarMaker::new();
                t.file("skills/../../outside/secret", b"x");
                t
            },
            "skills/../../outside/secret",
            skipped(SkipReason::Rejected(RejectReason::ParentTraversal)),
        ),
        (
            "absolute",
            {
                let mut t = TarMaker::new();
                t.file("/etc/evil", b"x");
                t
            },
            "/etc/evil",
            skipped(SkipReason::Rejected(RejectReason::AbsolutePath)),
        ),
        (
            "symlink",
            {
                let mut t = TarMaker::new();
                t.symlink("skills/link", "/etc/passwd");
                t
            },
            "skills/link",
            skipped(SkipReason::Rejected(RejectReason::Symlink)),
        ),
        (
            "hardlink",
            {
                let mut t = TarMaker::new();
                t.hardlink("skills/hard", "skills/ok/SKILL.md");
                t
            },
            "skills/hard",
            skipped(SkipReason::Rejected(RejectReason::HardLink)),
        ),
        (
            "char device",
            {
                let mut t = TarMaker::new();
                t.raw(b"skills/null", b'3', b"", b"");
                t
            },
            "skills/null",
            skipped(SkipReason::Rejected(RejectReason::CharacterDevice)),
        ),
        (
            "block device",
            {
                let mut t = TarMaker::new();
                t.raw(b"skills/sda", b'4', b"", b"");
                t
            },
            "skills/sda",
            skipped(SkipReason::Rejected(RejectReason::BlockDevice)),
        ),
        (
            "fifo",
            {
                let mut t = TarMaker::new();
                t.raw(b"memories/pipe", b'6', b"", b"");
                t
            },
            "memories/pipe",
            skipped(SkipReason::Rejected(RejectReason::Fifo)),
        ),
        (
            "parent is a file member",
            {
                let mut t = TarMaker::new();
                t.file("skills/f", b"f").file("skills/f/g", b"g");
                t
            },
            "skills/f/g",
            skipped(SkipReason::Rejected(RejectReason::ParentIsFile)),
        ),
        (
            "not UTF-8",
            {
                let mut t = TarMaker::new();
                t.raw(b"skills/\xff.md", b'0', b"x", b"");
                t
            },
            "skills/\u{fffd}.md",
            skipped(SkipReason::Rejected(RejectReason::NotUtf8)),
        ),
        (
            "component too long",
            {
                let mut t = TarMaker::new();
                t.file(&long_component, b"x");
                t
            },
            long_component.as_str(),
            skipped(SkipReason::NameTooLong),
        ),
        (
            "path too long",
            {
                let mut t = TarMaker::new();
                t.file(&long_path, b"x");
                t
            },
            long_path.as_str(),
            skipped(SkipReason::PathTooLong),
        ),
        (
            "outside the trees",
            {
                let mut t = TarMaker::new();
                t.file("config.yaml", b"evil: true");
                t
            },
            "config.yaml",
            skipped(SkipReason::OutsideRecoverableTrees),
        ),
        (
            "a file named like a root",
            {
                let mut t = TarMaker::new();
                t.file("memories", b"x");
                t
            },
            "memories",
            skipped(SkipReason::OutsideRecoverableTrees),
        ),
    ];
    for (label, mut archive, member, expected) in cases {
        let world = World::new();
        world.host("config.yaml", "host config");
        archive.file("skills/ok/SKILL.md", b"safe");
        let report = world
            .recover(&archive.finish())
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let got = outcomes(&report);
        assert_eq!(got.get(member), Some(&expected), "{label}: {got:?}");
        assert_eq!(
            got.get("skills/ok/SKILL.md"),
            Some(&Outcome::Restored),
            "{label}"
        );
        assert_eq!(world.read("skills/ok/SKILL.md"), "safe", "{label}");
        assert_eq!(world.read("config.yaml"), "host config", "{label}");
        assert_eq!(
            report.warnings().len(),
            report.files.len() - 1 - usize::from(label == "parent is a file member"),
            "{label}"
        );
        assert!(report.warnings().iter().all(|w| w.contains(ID)), "{label}");
    }
}

// contract: X5
#[test]
fn duplicate_members_keep_the_first_and_name_the_second() {
    let world = World::new();
    let mut archive = TarMaker::new();
    archive
        .file("skills/x/SKILL.md", b"first")
        .file("skills/x/SKILL.md", b"second");
    let report = world.recover(&archive.finish()).expect("recovers");
    assert_eq!(report.files.len(), 2);
    assert_eq!(report.files[0].outcome, Outcome::Restored);
    assert_eq!(
        report.files[1].outcome,
        skipped(SkipReason::Rejected(RejectReason::Duplicate))
    );
    assert_eq!(world.read("skills/x/SKILL.md"), "first");
}

// contract: S10
#[test]
fn an_ancestor_that_is_a_host_file_costs_that_file_only() {
    let world = World::new();
    world.host("skills/tool", "host file where the sandbox has a directory");
    let mut archive = TarMaker::new();
    archive
        .file("skills/tool/SKILL.md", b"x")
        .file("memories/MEMORY.md", b"m");
    let report = world.recover(&archive.finish()).expect("recovers");
    assert_eq!(
        outcomes(&report).get("skills/tool/SKILL.md"),
        Some(&skipped(SkipReason::AncestorIsFile {
            at: "skills/tool".to_owned()
        }))
    );
    assert_eq!(
        outcomes(&report).get("memories/MEMORY.md"),
        Some(&Outcome::Restored)
    );
}

// contract: S10
#[test]
fn a_member_below_a_file_of_the_same_snapshot_is_refused_by_the_reader() {
    // Restores take their names in batches, which is sound only because no member can
    // depend on an earlier one still waiting: the reader refuses a member below a file
    // member (and a second member at a path, see the duplicate test).
    let world = World::new();
    let mut archive = TarMaker::new();
    archive
        .file("skills/tool", b"a file first")
        .file("memories/MEMORY.md", b"m")
        .file("skills/tool/SKILL.md", b"then a directory");
    let report = world.recover(&archive.finish()).expect("recovers");
    let outcomes = outcomes(&report);
    assert_eq!(outcomes.get("skills/tool"), Some(&Outcome::Restored));
    assert_eq!(
        outcomes.get("skills/tool/SKILL.md"),
        Some(&skipped(SkipReason::Rejected(RejectReason::ParentIsFile)))
    );
    assert_eq!(world.read("skills/tool"), "a file first");
    assert_eq!(world.read("memories/MEMORY.md"), "m");
}

// contract: S5, S6
#[test]
fn restore_unchanged_and_conflict() {
    let world = World::new();
    world
        .host("skills/same/SKILL.md", "same")
        .host("memories/MEMORY.md", "host memory");
    let mut archive = TarMaker::new();
    archive
        .dir("skills/")
        .file("skills/new/SKILL.md", b"new")
        .file("skills/same/SKILL.md", b"same")
        .file("memories/MEMORY.md", b"sandbox memory")
        .raw(b"skills/new/run.sh", b'0', b"#!/bin/sh", b"");
    let report = world.recover(&archive.finish()).expect("recovers");
    let got = outcomes(&report);
    assert_eq!(got["skills/new/SKILL.md"], Outcome::Restored);
    assert_eq!(got["skills/same/SKILL.md"], Outcome::Unchanged);
    assert_eq!(
        got["memories/MEMORY.md"],
        Outcome::Quarantined {
            at: PathBuf::from(format!("cache/e2b-recovered/{ID}/memories/MEMORY.md")),
            reason: QuarantineReason::Conflict
        }
    );
    assert_eq!(world.read("memories/MEMORY.md"), "host memory");
    assert_eq!(
        world.read(format!("cache/e2b-recovered/{ID}/memories/MEMORY.md")),
        "sandbox memory"
    );
    assert_eq!(report.state, SnapshotState::Recovered);
    let warnings = report.warnings();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].contains("memories/MEMORY.md") && warnings[0].contains(ID),
        "{warnings:?}"
    );
}

// contract: S6
#[test]
fn repeated_recovery_does_not_duplicate_and_never_overwrites_an_earlier_copy() {
    let world = World::new();
    world.host("memories/MEMORY.md", "host");
    let snapshot = |body: &[u8]| {
        let mut t = TarMaker::new();
        t.file("memories/MEMORY.md", body);
        t.finish()
    };
    let first = world.recover(&snapshot(b"sandbox v1")).expect("first");
    let again = world.recover(&snapshot(b"sandbox v1")).expect("again");
    assert_eq!(
        first.files, again.files,
        "an identical copy is recognised, not written twice"
    );
    let third = world.recover(&snapshot(b"sandbox v2")).expect("third");
    let Outcome::Quarantined { at, .. } = &third.files[0].outcome else {
        panic!("{third:?}")
    };
    assert_eq!(
        at,
        &PathBuf::from(format!("cache/e2b-recovered/{ID}/memories/MEMORY.md~1"))
    );
    assert_eq!(
        world.read(format!("cache/e2b-recovered/{ID}/memories/MEMORY.md")),
        "sandbox v1"
    );
    assert_eq!(world.read(at), "sandbox v2");
}

// contract: S6
#[test]
fn a_host_path_that_is_not_a_regular_file_sends_the_file_to_quarantine() {
    let world = World::new();
    std::fs::create_dir_all(world.home().join("skills/x/SKILL.md"))
        .expect("a directory where the file is");
    std::os::unix::fs::symlink(world.tmp.path().join("outside/secret"), {
        std::fs::create_dir_all(world.home().join("skills/y")).expect("mkdir");
        world.home().join("skills/y/SKILL.md")
    })
    .expect("symlink");
    let mut archive = TarMaker::new();
    archive
        .file("skills/x/SKILL.md", b"x")
        .file("skills/y/SKILL.md", b"y overwrites?");
    let report = world.recover(&archive.finish()).expect("recovers");
    for member in ["skills/x/SKILL.md", "skills/y/SKILL.md"] {
        assert!(
            matches!(
                outcomes(&report)[member],
                Outcome::Quarantined {
                    reason: QuarantineReason::HostNotRegularFile,
                    ..
                }
            ),
            "{member}: {report:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(world.tmp.path().join("outside/secret")).expect("decoy"),
        "outside secret"
    );
}

// contract: S9
#[test]
fn credential_paths_are_never_restored_or_created() {
    let mut world = World::new();
    world
        .host_only
        .push(PathBuf::from("skills/acme/token.json"));
    world
        .host_only
        .push(world.home().join("skills/acme/absent-credential"));
    world.host("skills/acme/token.json", "host token");
    let mut archive = TarMaker::new();
    archive
        .file("skills/acme/token.json", b"sandbox token")
        .file("skills/acme/absent-credential", b"planted")
        .file("skills/acme/SKILL.md", b"skill");
    let report = world.recover(&archive.finish()).expect("recovers");
    let got = outcomes(&report);
    for member in ["skills/acme/token.json", "skills/acme/absent-credential"] {
        assert!(
            matches!(
                got[member],
                Outcome::Quarantined {
                    reason: QuarantineReason::HostOnlyPath,
                    ..
                }
            ),
            "{member}"
        );
    }
    assert_eq!(got["skills/acme/SKILL.md"], Outcome::Restored);
    assert_eq!(world.read("skills/acme/token.json"), "host token");
    assert!(!world.home().join("skills/acme/absent-credential").exists());
}

// contract: S11
#[test]
fn an_empty_archive_is_nothing_to_recover_and_an_empty_stream_is_an_error() {
    let world = World::new();
    let report = world
        .recover(&TarMaker::new().finish())
        .expect("empty archive");
    assert_eq!(report.state, SnapshotState::NothingToRecover);
    assert!(report.files.is_empty());
    let err = world.recover(b"").expect_err("empty stream");
    assert!(
        err.is_snapshot_unreadable() && err.is_truncated() && err.blocks_push(),
        "{err}"
    );
    assert_eq!(err.sandbox_id(), Some(ID));
}

// contract: S11
#[test]
fn a_truncated_snapshot_fails_and_restores_no_partial_file() {
    let world = World::new();
    let mut archive = TarMaker::new();
    archive
        .file("skills/a/SKILL.md", b"complete")
        .file("skills/b/SKILL.md", &[b'b'; 3000]);
    let full = archive.finish();
    let err = world.recover(&full[..2000]).expect_err("truncated");
    assert!(err.is_truncated(), "{err}");
    let text = support::error_chain(&err);
    assert!(text.contains("skills/b/SKILL.md"), "{text}");
    assert_eq!(world.read("skills/a/SKILL.md"), "complete");
    assert!(
        !world.home().join("skills/b/SKILL.md").exists(),
        "a partial file never gets its name"
    );
    let err = world
        .recover(&full[..full.len() - 1024])
        .expect_err("no end marker");
    assert!(err.is_truncated());
}

// contract: S11, S12
#[test]
fn an_over_cap_snapshot_fails_while_streaming() {
    let mut world = World::new();
    world.cap = 64 * 1024;
    let mut source = Counting {
        inner: HugeArchive::new("skills/huge/blob", 1 << 30),
        pulled: 0,
    };
    let err = world.recover_from(&mut source).expect_err("over cap");
    assert!(err.is_over_cap() && err.is_snapshot_unreadable(), "{err}");
    assert!(source.pulled <= world.cap + 1, "pulled {}", source.pulled);
    assert!(!world.home().join("skills/huge/blob").exists());
}

#[test]
fn a_malformed_snapshot_is_unreadable() {
    let world = World::new();
    let err = world.recover(&[0x42u8; 2048]).expect_err("garbage");
    assert!(err.is_snapshot_unreadable() && !err.is_truncated(), "{err}");
}

#[test]
fn ten_thousand_files_are_all_restored() {
    let world = World::new();
    let mut archive = TarMaker::new();
    for i in 0..10_000 {
        archive.file(
            &format!("skills/s{:02}/f{i:05}.md", i % 50),
            format!("{i}").as_bytes(),
        );
    }
    let started = std::time::Instant::now();
    let report = world.recover(&archive.finish()).expect("recovers");
    println!("10,000-file recovery took {:?}", started.elapsed());
    assert_eq!(report.files.len(), 10_000);
    assert_eq!(report.count(|o| *o == Outcome::Restored), 10_000);
    assert_eq!(world.read("skills/s07/f09257.md"), "9257");
}

#[test]
fn large_conflicts_spool_through_the_quarantine_tree() {
    let world = World::new();
    let big_host = vec![b'h'; 9 * 1024 * 1024];
    let mut big_sandbox = big_host.clone();
    big_sandbox[5_000_000] = b's';
    std::fs::create_dir_all(world.home().join("skills/big")).expect("mkdir");
    std::fs::write(world.home().join("skills/big/blob"), &big_host).expect("write");
    std::fs::write(world.home().join("skills/big/same"), &big_host).expect("write");
    let mut archive = TarMaker::new();
    archive
        .file("skills/big/blob", &big_sandbox)
        .file("skills/big/same", &big_host);
    let report = world.recover(&archive.finish()).expect("recovers");
    let got = outcomes(&report);
    assert_eq!(got["skills/big/same"], Outcome::Unchanged);
    let Outcome::Quarantined {
        at,
        reason: QuarantineReason::Conflict,
    } = &got["skills/big/blob"]
    else {
        panic!("{got:?}")
    };
    assert_eq!(
        std::fs::read(world.home().join(at)).expect("parked"),
        big_sandbox
    );
}

#[cfg(unix)]
#[test]
fn the_execute_bit_survives_and_nothing_else_does() {
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    let mut archive = TarMaker::new();
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o4777);
    header.set_cksum();
    let mut raw = Vec::new();
    raw.extend_from_slice(header.as_bytes());
    archive.file("skills/t/plain", b"p");
    let mut bytes = archive.unterminated();
    let mut tool = tar::Builder::new(Vec::new());
    tool.append_data(&mut header, "skills/t/tool", &b"#!"[..])
        .expect("append");
    bytes.extend(tool.into_inner().expect("finish"));
    world.recover(&bytes).expect("recovers");
    let mode = |p: &str| {
        std::fs::metadata(world.home().join(p))
            .expect("meta")
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("skills/t/tool"), 0o755);
    assert_eq!(mode("skills/t/plain"), 0o644);
}

#[test]
fn invalid_sandbox_ids_are_refused_before_anything_happens() {
    let world = World::new();
    for id in ["", ".", "..", "a/b", "x\0", &"n".repeat(129)] {
        let config = RecoveryConfig {
            hermes_home: world.home(),
            sandbox_id: id.to_owned(),
            host_only: Vec::new(),
            max_snapshot_bytes: 1024,
            push_base: None,
        };
        let err =
            recover(&config, &mut Cursor::new(TarMaker::new().finish())).expect_err("refused");
        assert!(err.is_invalid_input(), "{id:?}");
    }
    let config = RecoveryConfig {
        hermes_home: world.tmp.path().join("missing"),
        sandbox_id: ID.to_owned(),
        host_only: Vec::new(),
        max_snapshot_bytes: 1024,
        push_base: None,
    };
    let err = recover(&config, &mut Cursor::new(TarMaker::new().finish())).expect_err("no home");
    assert!(err.is_host_failure());
}

#[test]
fn the_snapshot_command_produces_the_documented_stream() {
    let sandbox = tempfile::tempdir().expect("tempdir");
    let remote_home = sandbox.path().join(".hermes");
    let run = |command: &str| -> Vec<u8> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .output()
            .expect("sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let command = recovery::snapshot_command(remote_home.to_str().expect("utf-8")).expect("valid");

    // No Hermes home at all: an empty archive, i.e. nothing to recover.
    let world = World::new();
    let report = world.recover(&run(&command)).expect("empty archive");
    assert_eq!(report.state, SnapshotState::NothingToRecover);

    std::fs::create_dir_all(remote_home.join("skills/x")).expect("mkdir");
    std::fs::create_dir_all(remote_home.join("cache")).expect("mkdir");
    std::fs::write(remote_home.join("skills/x/SKILL.md"), "from the sandbox").expect("write");
    std::fs::write(remote_home.join("cache/other"), "not recovered").expect("write");
    let report = world.recover(&run(&command)).expect("recovers");
    assert_eq!(
        outcomes(&report),
        BTreeMap::from([("skills/x/SKILL.md".to_owned(), Outcome::Restored)])
    );
    assert!(
        recovery::snapshot_command("relative")
            .expect_err("invalid")
            .is_invalid_input()
    );
}
