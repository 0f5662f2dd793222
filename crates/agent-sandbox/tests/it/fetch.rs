//! Files to the host (`Backend::fetch_file`, `Backend::realpath`): what Hermes' gateway uses
//! to deliver a `MEDIA:` file the agent made in the sandbox.

use std::fs;
use std::path::Path;

use agent_sandbox::{Backend, ErrorChain};

use crate::support::{World, ok};

/// Deterministic content with every byte value, `len` bytes.
fn content(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + i / 251) % 256).unwrap())
        .collect()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn sandbox_id(backend: &Backend) -> String {
    backend.info().expect("attached").sandbox_id
}

#[test]
fn a_file_arrives_byte_exact_and_one_byte_over_the_cap_leaves_nothing_behind() {
    // contract: X8
    let world = World::new();
    let backend = world.persistent();
    let len = (3 << 20) + 7;
    let data = content(len);
    backend
        .write_file("/home/user/out/report.bin", data.clone())
        .expect("write");
    let host = tempfile::tempdir().expect("host dir");
    let destination = host.path().join("report.bin");

    let written = backend
        .fetch_file("/home/user/out/report.bin", &destination, len as u64)
        .expect("a file of exactly the cap is delivered");
    assert_eq!(written, len as u64);
    assert!(fs::read(&destination).unwrap() == data, "byte-exact");
    assert_eq!(names(host.path()), ["report.bin"], "no temp file is left");

    // One byte past the cap: refused, the destination is untouched and no temp file remains.
    let other = host.path().join("other.bin");
    let error = backend
        .fetch_file("/home/user/out/report.bin", &other, len as u64 - 1)
        .expect_err("over the cap");
    assert!(error.is_over_fetch_cap(), "{error}");
    let text = ErrorChain(&error).to_string();
    assert!(text.contains("fetch file"), "{text}");
    assert!(text.contains(&sandbox_id(&backend)), "{text}");
    assert!(text.contains("/home/user/out/report.bin"), "{text}");
    assert_eq!(names(host.path()), ["report.bin"]);

    // A failure never touches what the destination held.
    fs::write(&other, b"old").unwrap();
    let error = backend
        .fetch_file("/home/user/out/report.bin", &other, 1)
        .expect_err("over the cap");
    assert!(error.is_over_fetch_cap(), "{error}");
    assert_eq!(fs::read(&other).unwrap(), b"old");
    assert_eq!(names(host.path()), ["other.bin", "report.bin"]);

    // An empty file is a file.
    ok(&backend, ": > /home/user/out/empty");
    let empty = host.path().join("empty");
    assert_eq!(
        backend
            .fetch_file("/home/user/out/empty", &empty, 0)
            .unwrap(),
        0
    );
    assert_eq!(fs::read(&empty).unwrap(), b"");
}

#[test]
fn what_is_no_regular_file_is_refused_and_a_link_to_one_is_followed() {
    // contract: X8
    let world = World::new();
    let backend = world.persistent();
    ok(
        &backend,
        "mkdir -p /home/user/out/dir && printf linked > /home/user/out/target \
         && ln -s target /home/user/out/link && mkfifo /home/user/out/fifo",
    );
    let host = tempfile::tempdir().expect("host dir");
    let destination = host.path().join("file");
    for path in [
        "/home/user/out/missing",
        "/home/user/out/dir",
        "/home/user/out/fifo",
        "/home/user/nowhere/x",
    ] {
        let error = backend
            .fetch_file(path, &destination, 1 << 20)
            .expect_err(path);
        assert!(
            error.is_file_refused() && !error.is_over_fetch_cap(),
            "{path}: {error}"
        );
        let text = error.to_string();
        assert!(text.contains("missing or not a regular file"), "{text}");
        assert!(
            text.contains(path) && text.contains(&sandbox_id(&backend)),
            "{text}"
        );
        assert!(
            names(host.path()).is_empty(),
            "{path}: nothing is left behind"
        );
    }
    // The fifo's download may still wait for a writer in the server: give it one (bounded,
    // in case it does not).
    ok(&backend, "timeout 2 sh -c ': > /home/user/out/fifo'; true");

    let written = backend
        .fetch_file("/home/user/out/link", &destination, 1 << 20)
        .expect("a link to a regular file is followed");
    assert_eq!(written, 6);
    assert_eq!(fs::read(&destination).unwrap(), b"linked");

    // A relative path is refused before anything is asked.
    let error = backend
        .fetch_file("out/link", &host.path().join("x"), 1 << 20)
        .expect_err("relative");
    assert!(error.is_file_refused(), "{error}");
    assert!(error.to_string().contains("not absolute"), "{error}");
    assert_eq!(error.sandbox_id(), Some(sandbox_id(&backend).as_str()));
}

#[test]
fn realpath_has_readlink_f_semantics() {
    // contract: X8
    let world = World::new();
    let backend = world.persistent();
    ok(
        &backend,
        "mkdir -p /home/user/data /home/user/out && printf x > /home/user/data/real.bin \
         && ln -s ../data/real.bin /home/user/out/link && ln -s link /home/user/out/link2 \
         && ln -s /home/user/data /home/user/out/datadir \
         && ln -s loop-b /home/user/out/loop-a && ln -s loop-a /home/user/out/loop-b \
         && printf q > \"/home/user/out/a b'c\"",
    );
    let resolved = |path: &str| backend.realpath(path).expect(path);
    let real = Some("/home/user/data/real.bin".to_owned());
    assert_eq!(resolved("/home/user/out/link2"), real, "a chain of links");
    assert_eq!(resolved("/home/user/out/../data/real.bin"), real, "..");
    assert_eq!(
        resolved("/home/user/out/datadir/real.bin"),
        real,
        "a linked directory"
    );
    assert_eq!(resolved("/home/user//data/./real.bin"), real, "// and .");
    assert_eq!(
        resolved("/home/user/out/a b'c"),
        Some("/home/user/out/a b'c".to_owned()),
        "quotes and spaces are no shell syntax"
    );
    // readlink -f: a missing last component resolves, a missing directory on the way does not.
    assert_eq!(
        resolved("/home/user/data/missing"),
        Some("/home/user/data/missing".to_owned())
    );
    assert_eq!(resolved("/home/user/nowhere/x"), None);
    assert_eq!(resolved("/home/user/out/loop-a"), None, "a link loop");
    let error = backend.realpath("out/link").expect_err("relative");
    assert!(error.is_file_refused(), "{error}");
    assert!(
        error.to_string().contains("resolve sandbox path"),
        "{error}"
    );
}

#[test]
fn a_transfer_cut_or_capped_midway_leaves_nothing_behind() {
    // contract: X8 — without a Content-Length (a cut body is sent chunked) the cap is checked
    // while the bytes arrive, and a failure after the temp file was written removes it.
    let world = World::new();
    let backend = world.persistent();
    let len = 2 << 20;
    let data = content(len);
    backend
        .write_file("/home/user/out/big.bin", data.clone())
        .expect("write");
    let host = tempfile::tempdir().expect("host dir");
    let destination = host.path().join("big.bin");
    let files_only = |after_bytes: u64| {
        let mut rule = e2b_local::DropRule::new(1, after_bytes);
        rule.path_prefix = Some("/files".to_owned());
        rule
    };
    let faults = world.server().faults();

    // Cut after 1 MiB: a transfer error, the half-written temp file is gone.
    faults.drop_streams(files_only(1 << 20));
    let error = backend
        .fetch_file("/home/user/out/big.bin", &destination, 4 << 20)
        .expect_err("cut");
    assert!(!error.is_file_refused(), "{error}");
    assert!(error.to_string().contains("fetch file"), "{error}");
    assert!(names(host.path()).is_empty(), "{:?}", names(host.path()));

    // Whole but unsized: one byte short of the cap fails at the first byte past it.
    faults.drop_streams(files_only(u64::MAX));
    let error = backend
        .fetch_file("/home/user/out/big.bin", &destination, len as u64 - 1)
        .expect_err("over the cap");
    assert!(error.is_over_fetch_cap(), "{error}");
    assert!(names(host.path()).is_empty(), "{:?}", names(host.path()));

    // Whole, unsized, within the cap: byte-exact.
    faults.drop_streams(files_only(u64::MAX));
    let written = backend
        .fetch_file("/home/user/out/big.bin", &destination, len as u64)
        .expect("unsized but whole");
    assert_eq!(written, len as u64);
    assert!(fs::read(&destination).unwrap() == data, "byte-exact");
    assert_eq!(names(host.path()), ["big.bin"]);
}
