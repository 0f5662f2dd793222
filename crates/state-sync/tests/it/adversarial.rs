//! The adversarial corpus against state-sync's adapters: hostile archives extracted into a
//! directory (with a walk of the filesystem proving nothing was materialised outside the
//! target), the refusing policy, and the teardown archive. The reader's own rules, case by
//! case, are capped-tar's adversarial suite.

#![allow(clippy::print_stdout)] // Prints the 3 GiB benchmark figure.

use std::io::{Cursor, Read};
use std::path::PathBuf;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use state_sync::{
    DEFAULT_MAX_BYTES, DirExtractor, Error, ReadConfig, RejectReason, UnsafeMembers, pull_teardown,
    read_archive,
};

use crate::support;
use crate::support::{Counting, Failing, HugeArchive, Node, TarMaker, walk};

/// Files materialised under the target: (relative path, content).
type Files = Vec<(String, Vec<u8>)>;

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
    extract_with_links(archive, config, &[("escape", "../outside")])
}

/// [`extract`], with the target holding `links` (name in the target, symlink target).
fn extract_with_links(
    archive: &[u8],
    config: &ReadConfig,
    links: &[(&str, &str)],
) -> (Result<state_sync::ArchiveSummary, Error>, Files) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("target/ok")).expect("target");
    std::fs::create_dir_all(tmp.path().join("outside")).expect("outside");
    std::fs::write(tmp.path().join("outside/secret"), b"host secret").expect("secret");
    for (name, target) in links {
        std::os::unix::fs::symlink(target, tmp.path().join("target").join(name)).expect("symlink");
    }
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
fn skipped_members_are_named_and_never_materialised_and_nothing_escapes() {
    let mut archive = TarMaker::new();
    archive
        .file("../evil", b"x")
        .file("ok/../../evil", b"x")
        .file("/tmp/evil", b"x")
        .symlink("ok/link", "/etc/passwd")
        .hardlink("ok/hard", "/etc/passwd")
        .raw(b"ok/null", b'3', b"", b"")
        .raw(b"ok/sda", b'4', b"", b"")
        .raw(b"ok/pipe", b'6', b"", b"")
        .raw(b"ok/sparse", b'S', b"", b"")
        .raw(b"ok/vol", b'V', b"", b"")
        .raw(
            &[b"ok/".as_slice(), &[b'n'; 120], b"\0tail"].concat(),
            b'0',
            b"x",
            b"",
        )
        .raw(b"ok/\xff\xfe", b'0', b"x", b"")
        .raw(b"", b'0', b"x", b"")
        .file("ok/dir/", b"x")
        .file("ok/a", b"a")
        .file("ok/a", b"second")
        .file("ok/a/b", b"x")
        .file("ok", b"x");
    // The target already holds a symlink out of it (`escape`); nothing may go through it.
    let (result, files) = extract(&archive.finish(), &skip());
    let summary = result.expect("readable");
    let got = rejected(&summary);
    let reasons: Vec<RejectReason> = got.iter().map(|(_, reason)| *reason).collect();
    assert_eq!(
        reasons,
        [
            RejectReason::ParentTraversal,
            RejectReason::ParentTraversal,
            RejectReason::AbsolutePath,
            RejectReason::Symlink,
            RejectReason::HardLink,
            RejectReason::CharacterDevice,
            RejectReason::BlockDevice,
            RejectReason::Fifo,
            RejectReason::Sparse,
            RejectReason::UnsupportedType(b'V'),
            RejectReason::NulByte,
            RejectReason::NotUtf8,
            RejectReason::EmptyName,
            RejectReason::FileNameEndsWithSlash,
            RejectReason::Duplicate,
            RejectReason::ParentIsFile,
            RejectReason::PathIsDirectory,
        ]
    );
    assert_eq!(got[0].0, "../evil");
    assert!(got[10].0.starts_with("ok/nnn"), "{:?}", got[10].0);
    assert_eq!(got[11].0, "ok/\u{fffd}\u{fffd}");
    assert_eq!(
        files,
        vec![("ok/a".to_owned(), b"a".to_vec())],
        "only the safe member materialised"
    );
    assert_eq!(summary.files, 1);
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

// contract: X5
#[test]
fn relative_symlinks_out_of_the_target_lead_no_member_outside() {
    // Files and directories, existing and dangling targets, from the top and from deeper down:
    // cap-std must refuse each, as these targets are relative, not absolute.
    let cases = [
        ("leak", "../outside/secret", "leak"),
        ("plant", "../outside/planted", "plant"),
        ("ok/leak", "../../outside/secret", "ok/leak"),
        ("up", "../outside", "up/secret"),
        ("up", "../outside", "up/new/file"),
        ("ok/up", "../../outside", "ok/up/new"),
        ("gone", "../outside/absent", "gone/file"),
    ];
    for (link, target, member) in cases {
        let mut archive = TarMaker::new();
        archive.file(member, b"overwritten");
        let (result, files) = extract_with_links(&archive.finish(), &skip(), &[(link, target)]);
        let err = result.expect_err("cap-std refuses to leave the target");
        assert!(err.is_sink_failure(), "{link} -> {target}: {err}");
        assert_eq!(err.member(), Some(member), "{link} -> {target}");
        assert!(files.is_empty(), "{link} -> {target}: {files:?}");
    }
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

#[test]
fn the_teardown_file_command_makes_a_private_archive_and_names_only_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("it's home");
    std::fs::create_dir_all(root.join("skills/x")).expect("mkdir");
    std::fs::write(root.join("skills/x/SKILL.md"), b"skill").expect("write");
    let run = |root: &std::path::Path| {
        let command =
            state_sync::teardown_file_command(root.to_str().expect("utf-8")).expect("valid root");
        std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .output()
            .expect("sh runs")
    };
    // An archive an earlier pull lost track of an hour ago goes; a fresh one (another
    // pull's, still being downloaded) stays.
    let stale = std::path::PathBuf::from(format!(
        "{}stale{}",
        state_sync::TEARDOWN_ARCHIVE_PREFIX,
        std::process::id()
    ));
    let fresh = stale.with_extension("fresh");
    std::fs::write(&stale, b"old").expect("stale archive");
    std::fs::write(&fresh, b"new").expect("fresh archive");
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .expect("open")
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))
        .expect("age it");
    let made = run(&root);
    assert!(made.status.success(), "{made:?}");
    assert!(!stale.exists(), "the stale archive was removed");
    assert!(fresh.exists(), "a fresh archive is left alone");
    std::fs::remove_file(&fresh).expect("cleanup");
    // Two lines: the path, then the archive's size once tar is done.
    let split = made
        .stdout
        .iter()
        .position(|b| *b == b'\n')
        .expect("a first line")
        + 1;
    let path =
        state_sync::teardown_archive_path(&made.stdout[..split]).expect("the documented shape");
    let size = state_sync::teardown_archive_size(&made.stdout[split..]).expect("a size");
    let meta = std::fs::metadata(&path).expect("the archive exists");
    assert_eq!(meta.len(), size, "the size printed is the archive's");
    std::fs::remove_file(&path).expect("cleanup");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "private to the user"
    );
    assert!(
        meta.len() >= 2048,
        "a tar with the file: {} bytes",
        meta.len()
    );
    // No Hermes home: nothing is made and nothing is printed.
    let none = run(&dir.path().join("missing"));
    assert!(none.status.success(), "{none:?}");
    assert!(none.stdout.is_empty(), "{none:?}");
    // A tar that fails half-way (a stand-in first on PATH) fails the command, which
    // prints no size and leaves no partial archive behind.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let fake = bin.join("tar");
    std::fs::write(&fake, "#!/bin/sh\nprintf partial\nexit 2\n").expect("write");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let before = leftovers();
    let failed = std::process::Command::new("sh")
        .arg("-c")
        .arg(state_sync::teardown_file_command(root.to_str().expect("utf-8")).expect("valid"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("sh runs");
    assert!(!failed.status.success(), "{failed:?}");
    assert_eq!(
        failed.stdout.iter().filter(|b| **b == b'\n').count(),
        1,
        "the path only: {failed:?}"
    );
    assert_eq!(leftovers(), before, "no partial archive left in /tmp");

    fn leftovers() -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir("/tmp")
            .expect("/tmp")
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.to_string_lossy()
                    .starts_with(state_sync::TEARDOWN_ARCHIVE_PREFIX)
            })
            .collect();
        found.sort();
        found
    }
}

#[test]
fn the_teardown_archive_path_accepts_only_what_the_command_prints() {
    assert_eq!(
        state_sync::teardown_archive_path(b"/tmp/hermes-e2b-pull.Ab3xYz\n").expect("ok"),
        "/tmp/hermes-e2b-pull.Ab3xYz"
    );
    for hostile in [
        &b""[..],
        &b"/tmp/hermes-e2b-pull.Ab3xYz"[..],
        b"/tmp/hermes-e2b-pull.Ab3xYz\n/home/user/.hermes/.env\n",
        b"/home/user/.hermes/.env\n",
        b"/tmp/hermes-e2b-pull.../../home/user/.env\n",
        b"/tmp/hermes-e2b-pull.abc\n",
        b"/tmp/hermes-e2b-pull.Ab3xYz/x\n",
        b"/tmp/hermes-e2b-pull.Ab3\xffYz\n",
        b"\n",
    ] {
        let error = state_sync::teardown_archive_path(hostile).expect_err("refused");
        assert!(error.is_invalid_plan(), "{error}");
    }
}

#[test]
fn the_teardown_archive_size_accepts_one_number_only() {
    assert_eq!(state_sync::teardown_archive_size(b"10240\n"), Some(10240));
    assert_eq!(
        state_sync::teardown_archive_size(b"   10240\n"),
        Some(10240)
    );
    for hostile in [
        &b""[..],
        b"10240",
        b"\n",
        b"-1\n",
        b"10240\n20480\n",
        b"1e9\n",
        b"99999999999999999999999\n",
    ] {
        assert_eq!(
            state_sync::teardown_archive_size(hostile),
            None,
            "{hostile:?}"
        );
    }
}

#[test]
fn the_teardown_archive_is_written_in_large_records_only_where_tar_takes_the_option() {
    // The archive's size tells the record size: `tar` pads its last record with zeros.
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("home");
    std::fs::create_dir_all(root.join("skills/x")).expect("mkdir");
    std::fs::write(root.join("skills/x/SKILL.md"), b"skill").expect("write");
    let record = u64::from(state_sync::TEARDOWN_BLOCKING_FACTOR) * 512;
    let archive_size = |path_env: Option<String>| {
        let mut command = std::process::Command::new("sh");
        command
            .arg("-c")
            .arg(state_sync::teardown_file_command(root.to_str().expect("utf-8")).expect("valid"));
        if let Some(path) = path_env {
            command.env("PATH", path);
        }
        let made = command.output().expect("sh runs");
        assert!(made.status.success(), "{made:?}");
        let split = made
            .stdout
            .iter()
            .position(|b| *b == b'\n')
            .expect("a line")
            + 1;
        let path = state_sync::teardown_archive_path(&made.stdout[..split]).expect("path");
        let size = state_sync::teardown_archive_size(&made.stdout[split..]).expect("size");
        std::fs::remove_file(&path).expect("cleanup");
        size
    };
    // This host's GNU tar takes the blocking factor.
    let gnu = archive_size(None);
    assert_eq!(gnu % record, 0, "{gnu} bytes: records of {record}");
    // A tar without the option (as busybox's): the command still makes the archive, in
    // that tar's own records.
    let real_tar = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v tar"])
            .output()
            .expect("sh runs")
            .stdout,
    )
    .expect("utf-8");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let shim = bin.join("tar");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\ncase \"$1\" in --version) echo 'tar (BusyBox)' >&2; exit 1 ;; -b) echo 'tar: unrecognized option: b' >&2; exit 1 ;; esac\nexec {} \"$@\"\n",
            real_tar.trim()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let plain = archive_size(Some(format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )));
    assert_eq!(plain % 10240, 0, "{plain} bytes: tar's default records");
    assert_ne!(plain % record, 0, "{plain} bytes: not the large records");
}
