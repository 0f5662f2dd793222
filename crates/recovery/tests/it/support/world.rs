//! A Hermes home next to decoys, and a recovery runner that checks the invariants every run
//! keeps.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use recovery::{Error, Outcome, PushBase, RecoveryConfig, RecoveryReport, recover};

use super::{Node, walk};

pub const ID: &str = "sbx42";

/// A temp directory holding `home/` (the Hermes home) and `outside/` (decoys).
pub struct World {
    pub tmp: tempfile::TempDir,
    pub host_only: Vec<PathBuf>,
    pub cap: u64,
    /// The push base handed to recovery.
    pub base: Option<PushBase>,
}

impl World {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("home")).expect("home");
        std::fs::create_dir_all(tmp.path().join("outside")).expect("outside");
        std::fs::write(tmp.path().join("outside/secret"), "outside secret").expect("decoy");
        Self {
            tmp,
            host_only: vec![PathBuf::from(".env"), PathBuf::from("config.yaml")],
            cap: recovery::DEFAULT_MAX_SNAPSHOT_BYTES,
            base: None,
        }
    }

    pub fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    pub fn host(&self, rel: &str, body: &str) -> &Self {
        let path = self.home().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, body).expect("write");
        self
    }

    pub fn read(&self, rel: impl AsRef<Path>) -> String {
        std::fs::read_to_string(self.home().join(rel)).expect("readable")
    }

    /// Runs recovery and checks the invariants every run keeps: no host file changed, nothing
    /// outside the home changed, no temp file left, every new file accounted for by the report.
    pub fn recover(&self, snapshot: &[u8]) -> Result<RecoveryReport, Error> {
        self.recover_from(&mut Cursor::new(snapshot))
    }

    pub fn recover_from(&self, snapshot: &mut dyn std::io::Read) -> Result<RecoveryReport, Error> {
        let before = walk(self.tmp.path());
        let config = RecoveryConfig {
            hermes_home: self.home(),
            sandbox_id: ID.to_owned(),
            host_only: self.host_only.clone(),
            max_snapshot_bytes: self.cap,
            push_base: self.base.clone(),
        };
        let result = recover(&config, snapshot);
        let after = walk(self.tmp.path());
        for (path, node) in &before {
            if !matches!(node, Node::Dir) {
                assert_eq!(after.get(path), Some(node), "host entry {path:?} changed");
            }
        }
        let mut reported: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
        if let Ok(report) = &result {
            for file in &report.files {
                match &file.outcome {
                    Outcome::Restored => _ = reported.insert(Path::new("home").join(&file.member)),
                    Outcome::Quarantined { at, .. } => {
                        _ = reported.insert(Path::new("home").join(at))
                    }
                    _ => {}
                }
            }
        }
        for (path, node) in &after {
            if before.contains_key(path) {
                continue;
            }
            assert!(
                path.starts_with("home"),
                "written outside the home: {path:?}"
            );
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            assert!(!name.starts_with(".e2b-recovery-"), "temp left: {path:?}");
            if matches!(node, Node::File(_)) && result.is_ok() {
                assert!(reported.contains(path), "unreported write {path:?}");
            }
        }
        result
    }
}

impl World {
    /// The decoy directory next to the home.
    pub fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    /// Makes `rel` (inside the home) a symlink to `target`.
    pub fn symlink(&self, rel: &str, target: &Path) {
        let link = self.home().join(rel);
        std::fs::create_dir_all(link.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, link).expect("symlink");
    }
}
