//! Running the workspace's examples as the user would: the built binary, as a child process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The E2B variables a developer may have set; the example tests clear them so the examples
/// take their embedded e2b-local path and never leave loopback.
pub(crate) const E2B_VARIABLES: [&str; 4] = [
    "E2B_API_KEY",
    "E2B_DOMAIN",
    "E2B_API_URL",
    "E2B_SANDBOX_URL",
];

/// Builds `examples/<name>.rs` (a no-op when it is fresh) into the target directory this test
/// runs from, and returns the binary's path: `<target>/<profile>/examples/<name>`.
pub(crate) fn example_binary(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // <target>/<profile>/deps/<test>-<hash>
    let profile_dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps");
    let target_dir = profile_dir
        .parent()
        .expect("the profile directory has a parent");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--offline",
            "--quiet",
            "--workspace",
            "--example",
            name,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::null());
    if profile_dir.file_name().is_some_and(|dir| dir == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo runs");
    assert!(
        status.success(),
        "cargo build --example {name} failed: {status}"
    );
    let binary = profile_dir.join("examples").join(name);
    assert!(binary.is_file(), "{} was not built", binary.display());
    binary
}
