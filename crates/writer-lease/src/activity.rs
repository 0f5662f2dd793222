//! The scope's activity record: when a process on this host last started and last ended a
//! command in the scope's sandbox. Diagnostics only, like the note: no gate reads it, and
//! two processes that record at once may lose one update (a stale time, never safety).
//!
//! Format (`<key>.activity`, 0600, overwritten in place):
//!
//! ```text
//! hermes-e2b activity v1
//! sandbox: <sandbox id the command ran in>
//! started: <Unix time in milliseconds>
//! ended: <Unix time in milliseconds>
//! check: <FNV-1a 64 of the lines above, 16 hex digits>
//! ```
//!
//! `ended` is absent until the first command ends. A command runs when `started` is later
//! than `ended` (or there is no `ended`) and a process still holds the scope.
//!
//! The record is overwritten in place (a new file per write cost more than the command,
//! `writer.rs`), so a reader may catch a write half done: `check` tells, and the reader reads
//! again. Anything after `check` is an older, longer record's tail. A record without `check`
//! (an older writer's) is taken as it is.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod writer;

use crate::error::Error;
use crate::key::ScopeFile;
use crate::scope::ScopeFiles;

const HEADER: &str = "hermes-e2b activity v1";
/// The check line's start, at the start of a line.
const CHECK: &str = "\ncheck: ";

/// Reads of a record that fails its check (a write half done) before it reads as none.
const READS: usize = 3;

/// FNV-1a, 64 bits: enough to tell a half-written record from a whole one.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

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
        // The check covers the lines above it, without the newline it starts with.
        out.pop();
        let check = fnv1a(out.as_bytes());
        out.push_str(&format!("{CHECK}{check:016x}\n"));
        out.into_bytes()
    }

    /// Lenient: a wrong header, or no sandbox or start, reads as no record; unknown lines
    /// are skipped.
    fn parse(bytes: &[u8]) -> Option<ScopeActivity> {
        let text = match find(bytes, CHECK.as_bytes()) {
            Some(at) => {
                let (record, rest) = bytes.split_at(at);
                let stated = rest[CHECK.len()..].get(..16)?;
                let stated = u64::from_str_radix(std::str::from_utf8(stated).ok()?, 16).ok()?;
                if stated != fnv1a(record) {
                    return None;
                }
                std::str::from_utf8(record).ok()?
            }
            None => std::str::from_utf8(bytes).ok()?,
        };
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
/// is read once, on the first use, and kept in memory after; each start and end is queued to
/// the process's activity writer (a thread), never written on the caller's path: they are on
/// every command's path (`writer.rs`). Another process's updates made meanwhile are
/// overwritten by the next one of this; the record is diagnostics.
#[derive(Debug)]
pub struct ActivityRecorder {
    slot: Arc<writer::Slot>,
    /// What the record holds as this process last wrote or read it; `None` until read.
    known: Mutex<Option<Option<ScopeActivity>>>,
}

impl ActivityRecorder {
    /// Records that a command started in `sandbox_id` at `at` (keeps the last end when it
    /// was in the same sandbox). An error is an earlier write's failure, reported once.
    pub fn command_started(&self, sandbox_id: &str, at: SystemTime) -> Result<(), Error> {
        self.update(|last| ScopeActivity {
            sandbox_id: sandbox_id.to_owned(),
            started: at,
            ended: last
                .filter(|record| record.sandbox_id == sandbox_id)
                .and_then(|record| record.ended),
        })
    }

    /// Records that a command in `sandbox_id` ended at `at`. An error is an earlier write's
    /// failure, reported once.
    pub fn command_ended(&self, sandbox_id: &str, at: SystemTime) -> Result<(), Error> {
        self.update(|last| ScopeActivity {
            sandbox_id: sandbox_id.to_owned(),
            started: last
                .filter(|record| record.sandbox_id == sandbox_id)
                .map_or(at, |record| record.started),
            ended: Some(at),
        })
    }

    /// Waits until what this recorder queued is written; the failure of its last write, if
    /// it failed and no update reported it yet.
    pub fn flush(&self) -> Result<(), Error> {
        writer::wait_for(&self.slot.files.path(ScopeFile::Activity));
        self.slot.take_failure().map_or(Ok(()), Err)
    }

    fn update(
        &self,
        next: impl FnOnce(Option<&ScopeActivity>) -> ScopeActivity,
    ) -> Result<(), Error> {
        let earlier = self.slot.take_failure();
        // Queued under the lock, so two updates racing reach the file in the order they
        // were computed.
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let last = known.get_or_insert_with(|| self.slot.files.activity().ok().flatten());
        let record = next(last.as_ref());
        // Remembered even when the write fails: the next one carries it.
        *last = Some(record.clone());
        writer::queue(&self.slot, record)?;
        earlier.map_or(Ok(()), Err)
    }
}

impl Drop for ActivityRecorder {
    /// The last record this process made reaches the file before the recorder goes (a
    /// session that ends right after its command leaves it ended, not running).
    fn drop(&mut self) {
        writer::wait_for(&self.slot.files.path(ScopeFile::Activity));
    }
}

impl ScopeFiles {
    /// The scope's activity record, if this host wrote one (an unreadable record reads as
    /// none).
    /// Waits first for a write of it this process has queued.
    pub fn activity(&self) -> Result<Option<ScopeActivity>, Error> {
        let path = self.path(ScopeFile::Activity);
        writer::wait_for(&path);
        let mut reads = 0;
        loop {
            reads += 1;
            let bytes = match self.host().read(&path) {
                Ok(bytes) => bytes,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(Error::io("read activity record", &path, error)),
            };
            let record = ScopeActivity::parse(&bytes);
            if record.is_some() || reads == READS {
                return Ok(record);
            }
        }
    }

    /// A recorder of this scope's command starts and ends for one process.
    pub fn activity_recorder(&self) -> ActivityRecorder {
        ActivityRecorder {
            slot: Arc::new(writer::Slot::new(self.clone())),
            known: Mutex::new(None),
        }
    }

    fn make_activity_dir(&self) -> Result<(), Error> {
        self.host()
            .ensure_private_dir(self.dir())
            .map_err(|source| Error::io("create coordination directory", self.dir(), source))
    }

    /// Writes `record` into the coordination directory, which must exist.
    fn write_activity(&self, record: &ScopeActivity) -> Result<(), Error> {
        let path = self.path(ScopeFile::Activity);
        // Per command: no disk sync; a lost update only leaves the record stale.
        self.host()
            .write_in_place(&path, &record.encode())
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

    // contract: I9 (off the command's path)
    #[test]
    fn writes_are_queued_not_made_by_the_caller_and_a_failure_is_told_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The coordination directory cannot be made: its parent is a file.
        let blocker = dir.path().join("not-a-dir");
        std::fs::write(&blocker, "x").expect("write");
        let files = ScopeFiles::new(blocker.join("e2b"), ScopeKey::from_bytes([4; 32]));
        let recorder = files.activity_recorder();
        recorder
            .command_started("sbx1", at(100))
            .expect("queued: the caller does not touch the file system");
        let error = recorder.flush().expect_err("the writer's write failed");
        assert!(
            error.to_string().contains("create coordination directory"),
            "{error}"
        );
        assert!(recorder.flush().is_ok(), "told once");
        recorder.command_ended("sbx1", at(130)).expect("queued");
        writer::wait_for(&files.path(ScopeFile::Activity));
        let error = recorder
            .command_started("sbx1", at(200))
            .expect_err("the next update tells the earlier failure");
        assert!(
            error.to_string().contains("coordination directory"),
            "{error}"
        );
    }

    #[test]
    fn a_process_reads_what_it_queued_and_a_dropped_recorder_leaves_its_last_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([3; 32]));
        let recorder = files.activity_recorder();
        for second in 0..200 {
            recorder
                .command_started("sbx1", at(1000 + 2 * second))
                .expect("start");
            recorder
                .command_ended("sbx1", at(1001 + 2 * second))
                .expect("end");
        }
        recorder.command_started("sbx1", at(5000)).expect("start");
        // Read by another handle of the same scope, as the inventory does.
        let twin = ScopeFiles::new(dir.path().join("e2b"), ScopeKey::from_bytes([3; 32]));
        let record = twin.activity().expect("read").expect("record");
        assert_eq!((record.started, record.ended), (at(5000), Some(at(1399))));
        recorder.command_ended("sbx1", at(5001)).expect("end");
        drop(recorder);
        let path = files.path(ScopeFile::Activity);
        let on_disk = ScopeActivity::parse(&std::fs::read(path).expect("read")).expect("record");
        assert_eq!(
            on_disk.ended,
            Some(at(5001)),
            "written before the recorder went"
        );
    }

    #[test]
    fn a_record_overwritten_in_place_is_read_whole_or_not_at_all() {
        let long = ScopeActivity {
            sandbox_id: "sbx-long-name".to_owned(),
            started: at(1_700_000_000),
            ended: Some(at(1_700_000_100)),
        };
        let short = ScopeActivity {
            sandbox_id: "sbx".to_owned(),
            started: at(1_700_000_200),
            ended: None,
        };
        let (long_bytes, short_bytes) = (long.encode(), short.encode());
        assert!(long_bytes.len() > short_bytes.len());
        assert_eq!(ScopeActivity::parse(&long_bytes), Some(long.clone()));
        // The new record written over the old one, before the length is cut: the old tail
        // after the new check is ignored.
        let mut overwritten = long_bytes.clone();
        overwritten[..short_bytes.len()].copy_from_slice(&short_bytes);
        assert_eq!(ScopeActivity::parse(&overwritten), Some(short.clone()));
        // Half a write: part new, part old, with either check; never a mixed record.
        for cut in 1..short_bytes.len() {
            let mut torn = long_bytes.clone();
            torn[..cut].copy_from_slice(&short_bytes[..cut]);
            let read = ScopeActivity::parse(&torn);
            assert!(
                read.is_none() || read == Some(long.clone()) || read == Some(short.clone()),
                "cut at {cut}: {read:?}"
            );
        }
        // An older writer's record, without a check, is taken as it is.
        assert_eq!(
            ScopeActivity::parse(b"hermes-e2b activity v1\nsandbox: a\nstarted: 1000\n")
                .map(|record| record.started),
            Some(at(1))
        );
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
