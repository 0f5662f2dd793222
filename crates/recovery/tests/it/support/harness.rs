//! The checks the fuzz target runs on every input; the test suite replays the saved corpus
//! through the same function.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use recovery::{Outcome, RecoveryConfig, recover};

/// A host Hermes home with some state, a credential and a decoy outside the home.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let home = tmp.path().join("home");
        for (path, body) in [
            ("skills/a/SKILL.md", "host a"),
            ("skills/b", "host file b"),
            ("memories/MEMORY.md", "host memory"),
            ("skills/acme/token.json", "host credential"),
            (".env", "E2B_API_KEY=host"),
        ] {
            std::fs::create_dir_all(home.join(path).parent().expect("parent")).expect("mkdir");
            std::fs::write(home.join(path), body).expect("write");
        }
        std::fs::create_dir_all(tmp.path().join("outside")).expect("outside");
        std::fs::write(tmp.path().join("outside/secret"), "outside").expect("decoy");
        Self { tmp }
    }

    pub fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    pub fn config(&self) -> RecoveryConfig {
        RecoveryConfig {
            hermes_home: self.home(),
            sandbox_id: "sbxfuzz".to_owned(),
            host_only: vec![
                PathBuf::from("skills/acme/token.json"),
                PathBuf::from(".env"),
            ],
            max_snapshot_bytes: 1 << 20,
            push_base: None,
        }
    }
}

/// Files (not directories) under `root`, by relative path.
pub fn files(root: &Path) -> BTreeMap<PathBuf, super::Node> {
    super::walk(root)
        .into_iter()
        .filter(|(_, node)| !matches!(node, super::Node::Dir))
        .collect()
}

/// Runs recovery on `data` and checks every promise that does not depend on what `data` is.
pub fn check_recovery(data: &[u8]) {
    let fixture = Fixture::new();
    let before = files(fixture.tmp.path());
    let result = recover(&fixture.config(), &mut Cursor::new(data));
    let after = files(fixture.tmp.path());

    // Host files are never modified or removed, inside or outside the home.
    for (path, node) in &before {
        assert_eq!(after.get(path), Some(node), "{path:?} changed");
    }
    // No temp file is left behind, whatever happened.
    for path in after.keys() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(
            !name.starts_with(".e2b-recovery-"),
            "leftover temp {path:?}"
        );
    }
    // Anything new is inside the home, in a recoverable root or the quarantine tree.
    let mut accounted: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    if let Ok(report) = &result {
        for file in &report.files {
            match &file.outcome {
                Outcome::Restored => _ = accounted.insert(PathBuf::from("home").join(&file.member)),
                Outcome::Quarantined { at, .. } => {
                    _ = accounted.insert(PathBuf::from("home").join(at))
                }
                Outcome::Unchanged | Outcome::Superseded | Outcome::Skipped { .. } => {}
            }
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        let in_roots = path.starts_with("home/skills") || path.starts_with("home/memories");
        let in_quarantine = path.starts_with("home/cache/e2b-recovered/sbxfuzz");
        assert!(in_roots || in_quarantine, "unexpected write {path:?}");
        if result.is_ok() {
            assert!(
                accounted.contains(path),
                "{path:?} written but not reported"
            );
        }
    }
    if let Ok(report) = &result {
        for path in &accounted {
            assert!(after.contains_key(path), "{path:?} reported but missing");
        }
        // Credentials are never written from sandbox data.
        assert!(
            !report
                .files
                .iter()
                .any(|f| f.member == "skills/acme/token.json" && f.outcome == Outcome::Restored)
        );
    }
}
