//! The invariants checked after every cycle (the pure ones live in the library).

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use campaign::overlapping_pushes;

use crate::state::Campaign;
use crate::{Error, MARKER};

/// Hermes' FileSyncManager's temporary entries (`tempfile` prefixes in `file_sync.py`).
const HERMES_TEMP_PREFIXES: [&str; 2] = ["hermes-sync-push-", "hermes-sync-back-"];

impl Campaign {
    /// Two-host mode: reads the current sandbox's writer record and committed marker.
    pub(crate) fn observe_generations(&mut self) {
        if self.hosts != 2 {
            return;
        }
        let Some(id) = self.sandbox.clone() else {
            return;
        };
        let home = self.server.sandbox_hermes_home(&id);
        let record = home.with_file_name(".hermes.writer").join("record");
        let watch = self.generations.entry(id).or_default();
        let mut found = Vec::new();
        // The script replaces the record by a rename: a reading is whole.
        if let Ok(line) = std::fs::read_to_string(&record) {
            found.extend(watch.record(line.trim_end()));
        }
        // A marker still being written (no newline yet) is read again next time.
        if let Ok(text) = std::fs::read_to_string(home.join(MARKER))
            && text.ends_with('\n')
        {
            found.extend(watch.marker(text.trim_end()));
        }
        for violation in found {
            self.note(format!("violation: {violation}"));
            self.violations.push(violation);
        }
    }

    pub(crate) fn check(&mut self) -> Result<(), Error> {
        self.observe_generations();
        let log = std::fs::read_to_string(&self.push_log).unwrap_or_default();
        if self.hosts == 2 {
            // One host's processes never push at once (C1); across hosts the record fences.
            for machine in 0..2 {
                let pids: HashSet<&str> = self
                    .machine_pids
                    .iter()
                    .filter(|(_, m)| *m == machine)
                    .map(|(pid, _)| pid.as_str())
                    .collect();
                let own: String = log
                    .lines()
                    .filter(|line| line.split(' ').nth(1).is_some_and(|pid| pids.contains(pid)))
                    .map(|line| format!("{line}\n"))
                    .collect();
                self.violations.extend(overlapping_pushes(&own));
            }
        } else {
            self.violations.extend(overlapping_pushes(&log));
        }
        let outside = self.outside_home();
        let host_tmp = self.root.join("host-tmp");
        for path in outside.difference(&self.outside_baseline) {
            // Hermes' FileSyncManager stages its pushes and pulls in the temporary directory
            // (a SIGKILL leaves them; Hermes reclaims a dead process's on its next pull): Hermes'
            // own files, not the plugin's.
            let hermes_temp = self.hermes_python.is_some()
                && path
                    .strip_prefix(&host_tmp)
                    .ok()
                    .and_then(|rel| rel.components().next())
                    .is_some_and(|first| {
                        let name = first.as_os_str().to_string_lossy();
                        HERMES_TEMP_PREFIXES.iter().any(|p| name.starts_with(p))
                    });
            if !hermes_temp {
                self.violations.push(format!(
                    "written outside the Hermes home: {}",
                    path.display()
                ));
            }
        }
        self.outside_baseline = outside;
        if let Ok(entries) = std::fs::read_dir(&self.home) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if !["skills", "memories", "cache"].iter().any(|n| name == *n)
                    && !self.hermes_home_entries.contains(&name)
                {
                    self.violations.push(format!(
                        "unexpected entry in the Hermes home: {}",
                        name.to_string_lossy()
                    ));
                }
            }
        }
        let mut found = HashSet::new();
        contents(&self.home.join("skills"), &mut found);
        contents(&self.home.join("memories"), &mut found);
        contents(&self.home.join("cache").join("e2b-recovered"), &mut found);
        if let Ok(sandboxes) = std::fs::read_dir(self.root.join("state").join("sandboxes")) {
            for sandbox in sandboxes.flatten() {
                let remote = sandbox.path().join("home").join(".hermes");
                contents(&remote.join("skills"), &mut found);
                contents(&remote.join("memories"), &mut found);
            }
        }
        let lost: Vec<Vec<u8>> = self
            .ledger
            .lost(&found)
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        for content in lost {
            self.violations.push(format!(
                "lost ({} bytes): {:?}",
                content.len(),
                String::from_utf8_lossy(&content)
            ));
            self.ledger.reported(&content);
        }
        Ok(())
    }

    /// Everything under the campaign directory but the Hermes home, e2b-local's state and
    /// the campaign's own logs.
    pub(crate) fn outside_home(&self) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        let skip = [
            self.home.clone(),
            self.root.join("state"),
            self.root.join("logs"),
            // The two-host mode's coordination directories (the hosts' cache/e2b).
            self.root.join("coordination-0"),
            self.root.join("coordination-1"),
        ];
        walk(&self.root, &skip, &mut out);
        out
    }
}

/// Every file below `dir`, with its full content (unreadable files are skipped).
pub(crate) fn contents(dir: &Path, out: &mut HashSet<Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => contents(&path, out),
            Ok(t) if t.is_file() => {
                if let Ok(bytes) = std::fs::read(&path) {
                    out.insert(bytes);
                }
            }
            _ => {}
        }
    }
}

fn walk(dir: &Path, skip: &[PathBuf], out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if skip.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&path, skip, out);
        }
        out.insert(path);
    }
}
