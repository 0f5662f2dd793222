//! The adversarial corpus: archives a hostile sandbox could send, each with its exact outcome.

use std::io::Cursor;

use capped_tar::{Error, MAX_NAME_BYTES, RejectReason};

use crate::support::harness::Recorder;
use crate::support::{Counting, Failing, TarMaker};

/// One corpus case: label, archive, expected rejections.
type Case = (&'static str, TarMaker, Vec<(&'static str, RejectReason)>);

/// The cap most cases read under: 2 GiB, far above anything they build.
const CAP: u64 = 2 * 1024 * 1024 * 1024;

/// Reads `archive` under [`CAP`] into a fresh recorder.
fn read(archive: &[u8]) -> (Result<capped_tar::Summary, Error>, Recorder) {
    let mut recorder = Recorder::default();
    let result = capped_tar::read(&mut Cursor::new(archive), CAP, &mut recorder);
    (result, recorder)
}

/// The accepted files: (name, content).
fn files(recorder: &Recorder) -> Vec<(String, Vec<u8>)> {
    recorder
        .members
        .iter()
        .filter_map(|(name, data)| data.clone().map(|d| (name.clone(), d)))
        .collect()
}

// contract: X5
#[test]
fn each_unsafe_member_is_rejected_and_named_and_only_safe_members_are_handed_on() {
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
    ];
    for (label, archive, expected) in cases {
        let (result, recorder) = read(&archive.finish());
        let summary = result.unwrap_or_else(|e| panic!("{label}: {e}"));
        let got = recorder.rejected.clone();
        assert_eq!(summary.rejected, got.len() as u64, "{label}");
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
            files(&recorder),
            vec![("ok/a".to_owned(), b"a".to_vec())],
            "{label}: only the safe member handed on"
        );
        assert_eq!(summary.files, 1, "{label}");
    }
}

#[test]
fn a_long_name_over_the_limit_costs_only_that_member() {
    let long = "ok/".to_owned() + &"n".repeat(MAX_NAME_BYTES as usize + 10);
    let mut archive = TarMaker::new();
    archive
        .raw(long.as_bytes(), b'0', b"x", b"")
        .file("ok/a", b"a");
    let (result, recorder) = read(&archive.finish());
    result.expect("readable");
    assert_eq!(recorder.rejected.len(), 1);
    assert_eq!(recorder.rejected[0].1, RejectReason::NameTooLong);
    assert_eq!(files(&recorder), vec![("ok/a".to_owned(), b"a".to_vec())]);
}

#[test]
fn pax_names_are_honoured_and_pax_sizes_must_agree() {
    let mut archive = TarMaker::new();
    archive
        .pax(&[("path", b"ok/from-pax")])
        .file("ok/header-name", b"p");
    let (result, recorder) = read(&archive.finish());
    result.expect("readable");
    assert_eq!(
        files(&recorder),
        vec![("ok/from-pax".to_owned(), b"p".to_vec())]
    );

    let mut archive = TarMaker::new();
    archive
        .pax(&[("path", b"../escape")])
        .file("ok/innocent", b"p");
    let (result, recorder) = read(&archive.finish());
    result.expect("readable");
    assert_eq!(
        recorder.rejected,
        vec![("../escape".to_owned(), RejectReason::ParentTraversal)]
    );
    assert!(files(&recorder).is_empty());

    let mut archive = TarMaker::new();
    archive.pax(&[("size", b"99")]).file("ok/a", b"a");
    let (result, _) = read(&archive.finish());
    assert!(result.expect_err("size mismatch").is_malformed());

    let mut archive = TarMaker::new();
    archive.file("ok/a", b"a").long_name_record(b"dangling\0");
    let (result, _) = read(&archive.finish());
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
        let err =
            capped_tar::read(&mut source, cap, &mut Recorder::default()).expect_err("over cap");
        assert!(err.is_over_cap(), "cap {cap}: {err}");
        assert!(
            source.pulled <= cap + 1,
            "cap {cap}: pulled {}",
            source.pulled
        );
        assert!(matches!(err, Error::OverCap { limit, .. } if limit == cap));
    }
    let summary = capped_tar::read(
        &mut Cursor::new(bytes.clone()),
        bytes.len() as u64,
        &mut Recorder::default(),
    )
    .expect("an archive of exactly the cap is fine");
    assert_eq!(summary.stream_bytes, bytes.len() as u64);
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
        let (result, _) = read(&full[..cut]);
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
fn data_after_the_end_marker_is_malformed_and_zero_padding_is_fine() {
    let mut archive = TarMaker::new();
    archive.file("ok/a", b"a");
    let mut padded = archive.finish();
    padded.extend(std::iter::repeat_n(0u8, 8192));
    read(&padded).0.expect("padding");
    padded.extend_from_slice(b"smuggled");
    let err = read(&padded).0.expect_err("garbage");
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
    let err = capped_tar::read(&mut source, CAP, &mut Recorder::default()).expect_err("fails");
    assert!(err.is_source_failure(), "{err}");
    assert!(!err.is_over_cap() && !err.is_truncated() && !err.is_malformed());
}

#[test]
fn garbage_is_malformed_and_an_empty_stream_is_truncated() {
    let err = read(&[0x41u8; 1024]).0.expect_err("garbage");
    assert!(err.is_malformed(), "{err}");
    let err = read(&[]).0.expect_err("empty");
    assert!(err.is_truncated(), "{err}");
}
