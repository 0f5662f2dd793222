//! The activity writer: one thread per process that writes activity records, so that a
//! command's start and end never wait for the file system (a replace on ext4 writes the new
//! file's blocks out before the rename returns: most of a command's client time under load).
//!
//! Each recorder has at most one record queued: a newer one replaces it. The writer lets
//! updates gather for [`GATHER`] before it writes them, so a short command's start and end,
//! and every other scope's updates meanwhile, cost one write each and one wake of the
//! writer, not one per update. A read
//! of a record in this process ([`ScopeFiles::activity`](crate::ScopeFiles::activity)), and
//! a recorder's flush (a session's cleanup) or drop, has that record's queued write made at
//! once and waits for it: a process reads what it wrote, and a session that ended leaves its
//! end on record. A process killed within [`GATHER`] of a command's end may leave the record
//! saying a command runs: the safe side (no other process pauses that sandbox as a leftover,
//! L15). Another process may read a record a
//! few milliseconds old (it is diagnostics, and its gates never read it).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::ScopeActivity;
use crate::error::Error;
use crate::scope::ScopeFiles;

/// One recorder's place in the writer: its files and the failure of its last write.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) files: ScopeFiles,
    /// The record file's path: what a reader waits on.
    path: PathBuf,
    /// The last write's failure, handed to the recorder's next update.
    failed: Mutex<Option<Error>>,
    /// Whether the coordination directory is known to exist (made or checked once, not
    /// per write).
    dir_ready: AtomicBool,
}

impl Slot {
    pub(super) fn new(files: ScopeFiles) -> Slot {
        Slot {
            path: files.path(crate::key::ScopeFile::Activity),
            files,
            failed: Mutex::new(None),
            dir_ready: AtomicBool::new(false),
        }
    }

    /// Writes `record`, making the directory first unless an earlier write made it.
    pub(super) fn write(&self, record: &ScopeActivity) -> Result<(), Error> {
        let written = if self.dir_ready.load(Ordering::Relaxed) {
            self.files.write_activity(record)
        } else {
            self.files
                .make_activity_dir()
                .and_then(|()| self.files.write_activity(record))
        };
        // A failure may be the directory gone since: made (or checked) again next time.
        self.dir_ready.store(written.is_ok(), Ordering::Relaxed);
        written
    }

    pub(super) fn take_failure(&self) -> Option<Error> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// How long the writer lets updates gather before it writes them: how stale another process
/// may find a record.
pub(super) const GATHER: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Queue {
    /// Records waiting, at most one per slot, oldest first.
    pending: Vec<(Arc<Slot>, ScopeActivity)>,
    /// The record files being written now.
    writing: Vec<PathBuf>,
    /// A reader waits: write what is queued now, without gathering.
    urgent: bool,
}

impl Queue {
    fn busy_with(&self, path: &Path) -> bool {
        self.writing.iter().any(|writing| writing == path)
            || self.pending.iter().any(|(slot, _)| slot.path == path)
    }
}

struct Writer {
    /// The process whose thread writes: a child forked after it started has no such thread.
    pid: u32,
    queue: Mutex<Queue>,
    /// Signalled when a record is queued.
    work: Condvar,
    /// Signalled when a write ends.
    written: Condvar,
}

impl Writer {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self) {
        loop {
            let batch = {
                let mut queue = self.lock();
                while queue.pending.is_empty() {
                    queue = self
                        .work
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                let until = Instant::now() + GATHER;
                while !queue.urgent {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    queue = self
                        .work
                        .wait_timeout(queue, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                queue.urgent = false;
                let batch = std::mem::take(&mut queue.pending);
                queue.writing = batch.iter().map(|(slot, _)| slot.path.clone()).collect();
                batch
            };
            for (slot, record) in batch {
                if let Err(error) = slot.write(&record) {
                    *slot.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
                }
            }
            self.lock().writing.clear();
            self.written.notify_all();
        }
    }
}

static WRITER: OnceLock<Option<&'static Writer>> = OnceLock::new();

/// The process's writer, started on first use; `None` when its thread could not start, or
/// in a child forked from the process that started it (records are then written by the
/// caller, as before the writer existed).
fn writer() -> Option<&'static Writer> {
    let writer = *WRITER.get_or_init(|| {
        let writer: &'static Writer = Box::leak(Box::new(Writer {
            pid: std::process::id(),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            written: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("scope-activity".to_owned())
            .spawn(move || writer.run())
            .ok()
            .map(|_| writer)
    });
    writer.filter(|writer| writer.pid == std::process::id())
}

/// Queues `record` as `slot`'s next write (replacing one still queued), or writes it now
/// when the process has no writer.
pub(super) fn queue(slot: &Arc<Slot>, record: ScopeActivity) -> Result<(), Error> {
    let Some(writer) = writer() else {
        return slot.write(&record);
    };
    let mut queue = writer.lock();
    let was_idle = queue.pending.is_empty();
    match queue
        .pending
        .iter_mut()
        .find(|(queued, _)| Arc::ptr_eq(queued, slot))
    {
        Some((_, queued)) => *queued = record,
        None => queue.pending.push((Arc::clone(slot), record)),
    }
    drop(queue);
    // The writer gathers by itself once it has something: only an idle one is woken.
    if was_idle {
        writer.work.notify_one();
    }
    Ok(())
}

/// Waits until no write of the record at `path` is queued or under way in this process.
pub(super) fn wait_for(path: &Path) {
    // A process that never recorded has nothing queued (and starts no thread to read).
    let Some(writer) = WRITER
        .get()
        .copied()
        .flatten()
        .filter(|writer| writer.pid == std::process::id())
    else {
        return;
    };
    let mut queue = writer.lock();
    if queue.busy_with(path) {
        queue.urgent = true;
        writer.work.notify_one();
    }
    while queue.busy_with(path) {
        queue = writer
            .written
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
