//! The adversarial corpus: archives a hostile sandbox could send, each with its exact outcome,
//! and a walk of the filesystem proving nothing was materialised outside the target.

#![allow(clippy::print_stdout)] // Prints the 3 GiB benchmark figure.

mod support;

use std::io::{Cursor, Read};
use std::path::PathBuf;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use state_sync::{
    DEFAULT_MAX_BYTES, DirExtractor, Error, MAX_NAME_BYTES, ReadConfig, RejectReason,
    UnsafeMembers, pull_teardown, read_archive,
};
use support::{Counting, Failing, HugeArchive, Node, TarMaker, walk};

/// Files materialised under the target: (relative path, content).
type Files = Vec<(String, Vec<u8>)>;
/// One corpus case: label, archive, expected rejections.
type Case = (&'static str, TarMaker, Vec<(&'static str, RejectReason)>);

fn skip() -> ReadConfig {
    ReadConfig {
        max_bytes: DEFAULT_MAX_BYTES,
        unsafe_members: UnsafeMembers::Skip,
    }
}

/// Extracts `archive` into `<tmp>/target`, next to `<tmp>/outside/secret`, and returns the
/// result, the files under target, and whether everything outside target is as before.
fn extract(
    archive: &[u8],
    config: &ReadConfig,
) -> (Result<state_sync::ArchiveSummary, Error>, Files) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("target")).expect("target");
    std::fs::create_dir_all(tmp.path().join("outside")).expect("outside");
    std::fs::write(tmp.path().join("outside/secret"), b"host secret").expect("secret");
    std::os::unix::fs::symlink("../outside", tmp.path().join("target/escape")).expect("symlink");
    let before = walk(tmp.path());

    let target =
        Dir::open_ambient_dir(tmp.path().join("target"), ambient_authority()).expect("open");
    let result = read_archive(
        &mut Cursor::new(archive),
        config,
        &mut DirExtractor::new(&target),
    );

    let after = walk(tmp.path());
    let mut files = Vec::new();
    for (path, node) in &after {
        let Ok(rel) = path.strip_prefix("target") else {
            assert_eq!(
                before.get(path),
                Some(node),
                "{path:?} changed outside the target"
            );
            continue;
        };
        if let Node::File(data) = node {
            files.push((rel.to_string_lossy().into_owned(), data.clone()));
        }
    }
    for (path, node) in &before {
        assert_eq!(
            after.get(path),
            Some(node),
            "{path:?} disappeared or changed"
        );
    }
    (result, files)
}

fn rejected(summary: &state_sync::ArchiveSummary) -> Vec<(String, RejectReason)> {
    summary
        .rejected
        .iter()
        .map(|r| (r.name.clone(), r.reason))
        .collect()
}

// contract: X5
#[test]
fn each_unsafe_member_is_skipped_and_named_and_nothing_escapes() {
    let cases: Vec<Case> = vec![
        (
            "traversal",
            {
                let mut t = TarMaker::new();
                t.file("../evil", b"x").file("ok/a", b"a");
                t
            },
            vec![("../evil", RejectReason::ParentTraversal)],
        ),
        (
            "nested traversal",
            {
                let mut t = TarMaker::new();
                t.file("ok/../../evil", b"x").file("ok/a", b"a");
                t
            },
            vec![("ok/../../evil", RejectReason::ParentTraversal)],
        ),
        (
            "absolute",
            {
                let mut t = TarMaker::new();
                t.file("/tmp/evil", b"x").file("ok/a", b"a");
                t
            },
            vec![("/tmp/evil", RejectReason::AbsolutePath)],
        ),
        (
            "symlink",
            {
                let mut t = TarMaker::new();
                t.symlink("ok/link", "/etc/passwd").file("ok/a", b"a");
                t
            },
            vec![("ok/link", RejectReason::Symlink)],
        ),
        (
            "hardlink",
            {
                let mut t = TarMaker::new();
                t.hardlink("ok/hard", "/etc/passwd").file("ok/a", b"a");
                t
            },
            vec![("ok/hard", RejectReason::HardLink)],
        ),
        (
            "char device",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/null", b'3', b"", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/null", RejectReason::CharacterDevice)],
        ),
        (
            "block device",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/sda", b'4', b"", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/sda", RejectReason::BlockDevice)],
        ),
        (
            "fifo",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/pipe", b'6', b"", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/pipe", RejectReason::Fifo)],
        ),
        (
            "sparse",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/sparse", b'S', b"", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/sparse", RejectReason::Sparse)],
        ),
        (
            "unknown type",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/vol", b'V', b"", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/vol", RejectReason::UnsupportedType(b'V'))],
        ),
        (
            "duplicate",
            {
                let mut t = TarMaker::new();
                t.file("ok/a", b"a").file("ok/a", b"second");
                t
            },
            vec![("ok/a", RejectReason::Duplicate)],
        ),
        (
            "parent is a file",
            {
                let mut t = TarMaker::new();
                t.file("ok/a", b"a").file("ok/a/b", b"x");
                t
            },
            vec![("ok/a/b", RejectReason::ParentIsFile)],
        ),
        (
            "file where a directory was",
            {
                let mut t = TarMaker::new();
                t.file("ok/a", b"a").file("ok", b"x");
                t
            },
            vec![("ok", RejectReason::PathIsDirectory)],
        ),
        (
            "file name ends with slash",
            {
                let mut t = TarMaker::new();
                t.file("ok/dir/", b"x").file("ok/a", b"a");
                t
            },
            vec![("ok/dir/", RejectReason::FileNameEndsWithSlash)],
        ),
        (
            "NUL in a long name",
            {
                let mut t = TarMaker::new();
                t.raw(
                    &[b"ok/".as_slice(), &[b'n'; 120], b"\0tail"].concat(),
                    b'0',
                    b"x",
                    b"",
                )
                .file("ok/a", b"a");
                t
            },
            vec![],
        ),
        (
            "not UTF-8",
            {
                let mut t = TarMaker::new();
                t.raw(b"ok/\xff\xfe", b'0', b"x", b"").file("ok/a", b"a");
                t
            },
            vec![("ok/\u{fffd}\u{fffd}", RejectReason::NotUtf8)],
        ),
        (
            "empty name",
            {
                let mut t = TarMaker::new();
                t.raw(b"", b'0', b"x", b"").file("ok/a", b"a");
                t
            },
            vec![("", RejectReason::EmptyName)],
        ),
        (
            "through a symlink already in the target",
            {
                let mut t = TarMaker::new();
                t.file("ok/a", b"a");
                t
            },
            vec![],
        ),
    ];
    for (label, archive, expected) in cases {
        let (result, files) = extract(&archive.finish(), &skip());
        let summary = result.unwrap_or_else(|e| panic!("{label}: {e}"));
        let got = rejected(&summary);
        if label == "NUL in a long name" {
            assert_eq!(got.len(), 1, "{label}");
            assert_eq!(got[0].1, RejectReason::NulByte, "{label}");
            assert!(got[0].0.starts_with("ok/nnn"), "{label}");
        } else {
            let expected: Vec<(String, RejectReason)> = expected
                .into_iter()
                .map(|(n, r)| (n.to_owned(), r))
                .collect();
            assert_eq!(got, expected, "{label}");
        }
        assert_eq!(
            files,
            vec![("ok/a".to_owned(), b"a".to_vec())],
            "{label}: only the safe member materialised"
        );
        assert_eq!(summary.files, 1, "{label}");
    }
}

// contract: X5
#[test]
fn a_member_aimed_through_a_target_symlink_fails_without_writing_outside() {
    let mut archive = TarMaker::new();
    archive.file("escape/secret", b"overwritten");
    let (result, files) = extract(&archive.finish(), &skip());
    let err = result.expect_err("cap-std refuses to leave the target");
    assert!(err.is_sink_failure(), "{err}");
    assert_eq!(err.member(), Some("escape/secret"));
    assert!(files.is_empty());
}

#[test]
fn refuse_mode_names_the_first_unsafe_member() {
    let mut archive = TarMaker::new();
    archive
        .file("ok/a", b"a")
        .symlink("ok/link", "../../x")
        .file("ok/b", b"b");
    let config = ReadConfig {
        max_bytes: DEFAULT_MAX_BYTES,
        unsafe_members: UnsafeMembers::Refuse,
    };
    let (result, _) = extract(&archive.finish(), &config);
    let err = result.expect_err("refused");
    assert!(err.is_unsafe_member() && err.is_archive_unusable());
    assert!(
        matches!(err, Error::UnsafeMember { ref member, reason: RejectReason::Symlink, .. } if member == "ok/link")
    );
    assert!(
        err.to_string().contains("ok/link") && err.to_string().contains("symbolic link"),
        "{err}"
    );
}

#[test]
fn a_long_name_over_the_limit_costs_only_that_member() {
    let long = "ok/".to_owned() + &"n".repeat(MAX_NAME_BYTES as usize + 10);
    let mut archive = TarMaker::new();
    archive
        .raw(long.as_bytes(), b'0', b"x", b"")
        .file("ok/a", b"a");
    let (result, files) = extract(&archive.finish(), &skip());
    let summary = result.expect("readable");
    assert_eq!(summary.rejected.len(), 1);
    assert_eq!(summary.rejected[0].reason, RejectReason::NameTooLong);
    assert_eq!(files, vec![("ok/a".to_owned(), b"a".to_vec())]);
}

#[test]
fn pax_names_are_honoured_and_pax_sizes_must_agree() {
    let mut archive = TarMaker::new();
    archive
        .pax(&[("path", b"ok/from-pax")])
        .file("ok/header-name", b"p");
    let (result, files) = extract(&archive.finish(), &skip());
    result.expect("readable");
    assert_eq!(files, vec![("ok/from-pax".to_owned(), b"p".to_vec())]);

    let mut archive = TarMaker::new();
    archive
        .pax(&[("path", b"../escape")])
        .file("ok/innocent", b"p");
    let (result, files) = extract(&archive.finish(), &skip());
    assert_eq!(
        rejected(&result.expect("readable")),
        vec![("../escape".to_owned(), RejectReason::ParentTraversal)]
    );
    assert!(files.is_empty());

    let mut archive = TarMaker::new();
    archive.pax(&[("size", b"99")]).file("ok/a", b"a");
    let (result, _) = extract(&archive.finish(), &skip());
    assert!(result.expect_err("size mismatch").is_malformed());

    let mut archive = TarMaker::new();
    archive.file("ok/a", b"a").long_name_record(b"dangling\0");
    let (result, _) = extract(&archive.finish(), &skip());
    assert!(result.expect_err("dangling extension").is_malformed());
}

// contract: S12
#[test]
fn the_cap_stops_the_stream_at_the_first_byte_past_it() {
    let mut archive = TarMaker::new();
    for i in 0..10 {
        archive.file(&format!("ok/f{i}"), &[7u8; 1024]);
    }
    let bytes = archive.finish();
    for cap in [0u64, 1, 511, 512, 4000, 4096, bytes.len() as u64 - 1] {
        let mut source = Counting {
            inner: Cursor::new(bytes.clone()),
            pulled: 0,
        };
        let config = ReadConfig {
            max_bytes: cap,
            unsafe_members: UnsafeMembers::Skip,
        };
        let err = read_archive(
            &mut source,
            &config,
            &mut support::harness::Recorder::default(),
        )
        .expect_err("over cap");
        assert!(err.is_over_cap(), "cap {cap}: {err}");
        assert!(
            source.pulled <= cap + 1,
            "cap {cap}: pulled {}",
            source.pulled
        );
        assert!(matches!(err, Error::OverCap { limit, .. } if limit == cap));
    }
    let exact = ReadConfig {
        max_bytes: bytes.len() as u64,
        unsafe_members: UnsafeMembers::Skip,
    };
    let summary = read_archive(
        &mut Cursor::new(bytes.clone()),
        &exact,
        &mut support::harness::Recorder::default(),
    )
    .expect("an archive of exactly the cap is fine");
    assert_eq!(summary.stream_bytes, bytes.len() as u64);
}

// contract: S12
#[test]
fn a_three_gib_stream_is_refused_at_the_default_cap_without_storing_it() {
    const GIB: u64 = 1024 * 1024 * 1024;
    let mut source = Counting {
        inner: HugeArchive::new("cache/huge.bin", 3 * GIB),
        pulled: 0,
    };
    let started = std::time::Instant::now();
    let result = pull_teardown(&mut source, &skip(), "/home/user/.hermes", std::io::sink());
    let err = result.expect_err("over the cap");
    assert!(err.is_over_cap(), "{err}");
    assert_eq!(err.member(), Some("cache/huge.bin"));
    assert!(
        source.pulled <= DEFAULT_MAX_BYTES + 1,
        "pulled {}",
        source.pulled
    );
    assert!(
        source.pulled > DEFAULT_MAX_BYTES - 64 * 1024,
        "stopped early at {}",
        source.pulled
    );
    println!(
        "3 GiB stream refused after {} bytes in {:?}",
        source.pulled,
        started.elapsed()
    );
}

#[test]
fn every_truncation_is_an_error_until_the_end_marker_begins() {
    let mut archive = TarMaker::new();
    archive
        .dir("ok")
        .file("ok/a", &[1u8; 700])
        .file(&format!("ok/{}", "l".repeat(150)), b"long")
        .file("ok/b", b"");
    let members = archive.unterminated();
    let full = archive.finish();
    for cut in 0..full.len() {
        let result = read_archive(
            &mut Cursor::new(&full[..cut]),
            &skip(),
            &mut support::harness::Recorder::default(),
        );
        if cut < members.len() + 512 {
            let err = result.expect_err("partial archive");
            assert!(err.is_truncated(), "cut {cut}: {err}");
        } else {
            // One zero block is an end marker (GNU tar accepts a lone zero block too).
            assert!(result.is_ok(), "cut {cut}");
        }
    }
}

#[test]
fn a_partial_teardown_archive_has_no_end_marker() {
    let mut archive = TarMaker::new();
    archive
        .file("skills/a", b"aaaa")
        .file("skills/b", &[2u8; 2000]);
    let bytes = archive.finish();
    let cut = &bytes[..2000];
    let mut out = Vec::new();
    let err = pull_teardown(
        &mut Cursor::new(cut),
        &skip(),
        "/home/user/.hermes",
        &mut out,
    )
    .expect_err("truncated");
    assert!(err.is_truncated());
    assert_eq!(err.member(), Some("skills/b"));
    let reread = read_archive(
        &mut Cursor::new(out),
        &skip(),
        &mut support::harness::Recorder::default(),
    );
    assert!(
        reread
            .expect_err("the abandoned output is not a whole archive")
            .is_truncated()
    );
}

#[test]
fn data_after_the_end_marker_is_malformed_and_zero_padding_is_fine() {
    let mut archive = TarMaker::new();
    archive.file("ok/a", b"a");
    let mut padded = archive.finish();
    padded.extend(std::iter::repeat_n(0u8, 8192));
    read_archive(
        &mut Cursor::new(padded.clone()),
        &skip(),
        &mut support::harness::Recorder::default(),
    )
    .expect("padding");
    padded.extend_from_slice(b"smuggled");
    let err = read_archive(
        &mut Cursor::new(padded),
        &skip(),
        &mut support::harness::Recorder::default(),
    )
    .expect_err("garbage");
    assert!(err.is_malformed());
}

#[test]
fn a_failing_source_is_reported_as_such() {
    let mut archive = TarMaker::new();
    archive.file("ok/a", &[3u8; 3000]);
    let mut source = Failing {
        data: archive.finish(),
        after: 1000,
        position: 0,
    };
    let err = read_archive(
        &mut source,
        &skip(),
        &mut support::harness::Recorder::default(),
    )
    .expect_err("fails");
    assert!(err.is_source_failure(), "{err}");
    assert!(!err.is_archive_unusable());
}

#[test]
fn garbage_is_malformed_and_an_empty_stream_is_truncated() {
    let err = read_archive(
        &mut Cursor::new(vec![0x41u8; 1024]),
        &skip(),
        &mut support::harness::Recorder::default(),
    )
    .expect_err("garbage");
    assert!(err.is_malformed(), "{err}");
    let err = read_archive(
        &mut Cursor::new(Vec::new()),
        &skip(),
        &mut support::harness::Recorder::default(),
    )
    .expect_err("empty");
    assert!(err.is_truncated(), "{err}");
}

#[test]
fn ten_thousand_files_extract_completely() {
    let mut archive = TarMaker::new();
    for i in 0..10_000 {
        archive.file(
            &format!("skills/s{:03}/f{i:05}.md", i % 100),
            format!("body {i}").as_bytes(),
        );
    }
    let (result, files) = extract(&archive.finish(), &skip());
    let summary = result.expect("readable");
    assert_eq!(summary.files, 10_000);
    assert!(summary.rejected.is_empty());
    assert_eq!(files.len(), 10_000);
    let sample = files
        .iter()
        .find(|(p, _)| p == "skills/s042/f04242.md")
        .expect("present");
    assert_eq!(sample.1, b"body 4242");
}

#[test]
fn teardown_archive_names_members_by_absolute_remote_path() {
    let mut archive = TarMaker::new();
    archive
        .dir("./")
        .dir("./skills/")
        .file("./skills/x/SKILL.md", b"skill")
        .raw(b"./bin/run", b'0', b"#!", b"");
    let (summary, out) = pull_teardown(
        &mut Cursor::new(archive.finish()),
        &skip(),
        "/home/user/.hermes",
        Vec::new(),
    )
    .expect("converts");
    assert_eq!((summary.files, summary.directories), (2, 1));
    let mut names = Vec::new();
    let mut tar_out = tar::Archive::new(Cursor::new(out));
    for entry in tar_out.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let mut body = Vec::new();
        entry.read_to_end(&mut body).expect("body");
        let mode = entry.header().mode().expect("mode");
        names.push((entry.path().expect("path").into_owned(), mode, body));
    }
    assert_eq!(
        names,
        vec![
            (PathBuf::from("home/user/.hermes/skills"), 0o755, Vec::new()),
            (
                PathBuf::from("home/user/.hermes/skills/x/SKILL.md"),
                0o644,
                b"skill".to_vec()
            ),
            (
                PathBuf::from("home/user/.hermes/bin/run"),
                0o644,
                b"#!".to_vec()
            ),
        ]
    );
    assert_eq!(
        state_sync::teardown_command("/home/user/.hermes").expect("valid"),
        "tar -C '/home/user/.hermes' -cf - ."
    );
    assert!(
        state_sync::teardown_command("relative")
            .expect_err("invalid")
            .is_invalid_plan()
    );
}
