//! The scope's activity record: when a process on this host last started and last ended a
//! command in the scope's sandbox. Diagnostics only, like the note: no gate reads it, and
//! two processes that record at once may lose one update (a stale time, never safety).
//!
//! Format (`<key>.activity`, 0600, replaced atomically):
//!
//! ```text
//! hermes-e2b activity v1
//! sandbox: <sandbox id the command ran in>
//! started: <Unix time in milliseconds>
//! ended: <Unix time in milliseconds>
//! ```
//!
//! `ended` is absent until the first command ends. A command runs when `started` is later
//! than `ended` (or there is no `ended`) and a process still holds the scope.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;
use crate::key::ScopeFile;
use crate::scope::ScopeFiles;

const HEADER: &str = "hermes-e2b activity v1";

/// What the activity record says: the sandbox, and when its last command started and ended
/// on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeActivity {
    /// The sandbox the commands ran in.
    pub sandbox_id: String,
    /// When the latest command started.
    pub started: SystemTime,
    /// When the latest command ended, if one did.
    pub ended: Option<SystemTime>,
}

impl ScopeActivity {
    /// Whether the record says a command is running (started after the last end). Whether
    /// the process that started it still lives is the reader's to check.
    pub fn command_running(&self) -> bool {
        self.ended.is_none_or(|ended| self.started > ended)
    }

    /// The later of the last start and the last end: when the sandbox was last used.
    pub fn last_used(&self) -> SystemTime {
        self.ended
            .map_or(self.started, |ended| ended.max(self.started))
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "{HEADER}\nsandbox: {}\nstarted: {}\n",
            self.sandbox_id,
            millis(self.started)
        );
        if let Some(ended) = self.ended {
            out.push_str(&format!("ended: {}\n", millis(ended)));
        }
        out.into_bytes()
    }

    /// Lenient: a wrong header, or no sandbox or start, reads as no record; unknown lines
    /// are skipped.
    fn parse(bytes: &[u8]) -> Option<ScopeActivity> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let (mut sandbox_id, mut started, mut ended) = (None, None, None);
        for line in lines {
            match line.split_once(": ") {
                Some(("sandbox", id)) if !id.trim().is_empty() => {
                    sandbox_id = Some(id.trim().to_owned());
                }
                Some(("started", at)) => started = time(at),
                Some(("ended", at)) => ended = time(at),
                _ => {}
            }
        }
        Some(ScopeActivity {
            sandbox_id: sandbox_id?,
            started: started?,
            ended,
        })
    }
}

fn millis(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn time(text: &str) -> Option<SystemTime> {
    let millis: u64 = text.trim().parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// Records one process's command starts and ends in the scope's activity record. The record
/// is read once, on the first use, and kept in memory after: each start and end is one
/// write and no read (they are on every command's path). Another process's updates made
/// meanwhile are overwritten by the next one of this; the record is diagnostics.
#[derive(Debug)]
pub struct ActivityRecorder {
    files: ScopeFiles,
    /// What the record holds as this process last wrote or read it; `None` until read.
    known: Mutex<Option<Option<ScopeActivity>>>,
}

impl ActivityRecorder {
    /// Records that a command started in `sandbox_id` at `at` (keeps the last end when it
    /// was in the same sandbox).
    pub fn command_started(&self, sandbox_id: &str, at: SystemTime) -> Result<(), Error> {
        self.update(|last| ScopeActivity {
            sandbox_id: sandbox_id.to_owned(),
            started: at,
            ended: last
                .filter(|record| record.sandbox_id == sandbox_id)
                .and_then(|record| record.ended),
        })
    }

    /// Records that a command in `sandbox_id` ended at `at`.
    pub fn command_ended(&self, sandbox_id: &str, at: SystemTime) -> Result<(), Error> {
        self.update(|last| ScopeActivity {
            sandbox_id: sandbox_id.to_owned(),
            started: last
                .filter(|record| record.sandbox_id == sandbox_id)
                .map_or(at, |record| record.started),
            ended: Some(at),
        })
    }

    fn update(
        &self,
        next: impl FnOnce(Option<&ScopeActivity>) -> ScopeActivity,
    ) -> Result<(), Error> {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let last = known.get_or_insert_with(|| self.files.activity().ok().flatten());
        let record = next(last.as_ref());
        // Remembered even when the write fails: the next one carries it.
        *last = Some(record.clone());
        self.files.write_activity(&record)
    }
}

impl ScopeFiles {
    /// The scope's activity record, if this host wrote one (an unreadable record reads as
    /// none).
    pub fn activity(&self) -> Result<Option<ScopeActivity>, Error> {
        let path = self.path(ScopeFile::Activity);
        match self.host().read(&path) {
            Ok(bytes) => Ok(ScopeActivity::parse(&bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(Error::io("read activity record", &path, error)),
        }
    }

    /// A recorder of this scope's command starts and ends for one process.
    pub fn activity_recorder(&self) -> ActivityRecorder {
        ActivityRecorder {
            files: self.clone(),
            known: Mutex::new(None),
        }
    }

    fn write_activity(&self, record: &ScopeActivity) -> Result<(), Error> {
        self.host()
            .ensure_private_dir(self.dir())
            .map_err(|source| Error::io("create coordination directory", self.dir(), source))?;
        let path = self.path(ScopeFile::Activity);
        // Per command: no disk sync; a lost update only leaves the record stale.
        self.host()
            .write_replace(&path, &record.encode())
            .map_err(|source| Error::io("write activity record", &path, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ScopeKey;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    // contract: I9
    #[test]
    fn starts_and_ends_round_trip_and_say_whether_a_command_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([5; 32]));
        assert_eq!(files.activity().expect("read"), None);

        let recorder = files.activity_recorder();
        recorder.command_started("sbx1", at(100)).expect("start");
        let record = files.activity().expect("read").expect("record");
        assert!(record.command_running());
        assert_eq!(record.last_used(), at(100));

        recorder.command_ended("sbx1", at(130)).expect("end");
        let record = files.activity().expect("read").expect("record");
        assert!(!record.command_running());
        assert_eq!((record.started, record.ended), (at(100), Some(at(130))));
        assert_eq!(record.last_used(), at(130));

        recorder.command_started("sbx1", at(200)).expect("start");
        let record = files.activity().expect("read").expect("record");
        assert!(record.command_running(), "a start after the last end runs");
        assert_eq!(record.ended, Some(at(130)));

        // A command in another sandbox (a replacement) starts a fresh record.
        recorder.command_started("sbx2", at(300)).expect("start");
        let record = files.activity().expect("read").expect("record");
        assert_eq!((record.sandbox_id.as_str(), record.ended), ("sbx2", None));
    }

    #[test]
    fn a_recorder_reads_the_record_once_then_writes_from_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([7; 32]));
        // An earlier process's record: its last end is kept by this process's first start.
        files
            .activity_recorder()
            .command_ended("sbx1", at(50))
            .expect("end");
        let recorder = files.activity_recorder();
        recorder.command_started("sbx1", at(100)).expect("start");
        assert_eq!(
            files.activity().expect("read").expect("record").ended,
            Some(at(50))
        );
        // Changed behind its back: not read again, the next write comes from memory.
        std::fs::write(
            files.path(ScopeFile::Activity),
            "hermes-e2b activity v1\nsandbox: sbx1\nstarted: 999000\n",
        )
        .expect("write");
        recorder.command_ended("sbx1", at(130)).expect("end");
        let record = files.activity().expect("read").expect("record");
        assert_eq!((record.started, record.ended), (at(100), Some(at(130))));
    }

    #[test]
    fn a_record_it_cannot_read_is_no_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([6; 32]));
        std::fs::create_dir_all(files.dir()).expect("dir");
        let path = files.path(ScopeFile::Activity);
        for text in [
            "something else\nsandbox: a\nstarted: 1\n",
            "hermes-e2b activity v1\nstarted: 1\n",
            "hermes-e2b activity v1\nsandbox: a\nstarted: soon\n",
        ] {
            std::fs::write(&path, text).expect("write");
            assert_eq!(files.activity().expect("read"), None, "{text:?}");
        }
        std::fs::write(
            &path,
            "hermes-e2b activity v1\nsandbox: a\nstarted: 1500\nfuture: x\n",
        )
        .expect("write");
        let record = files.activity().expect("read").expect("record");
        assert_eq!(record.started, UNIX_EPOCH + Duration::from_millis(1500));
    }
}
