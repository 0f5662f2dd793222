//! The writers' lock of a coordination directory (Linux): one file, `writers.lock`, with one byte
//! per scope that the scope's writer holds locked (a POSIX record lock; open-file-description
//! locks on Linux) for its whole session.
//!
//! Why one file and not one per scope: a lock lives in an open file, and a gateway process
//! holds the writer role of every session it serves. One lock file per scope cost it one
//! descriptor per idle session, and a few hundred sessions meet the usual limit of 1024. Here
//! a process holds one descriptor per directory however many scopes it writes.
//!
//! Record locks do not exclude their own holder (an open file description, or the whole
//! process on systems without OFD locks), so the process's holders are also kept in a set
//! beside the file: a second session of the same scope in the process finds the byte held
//! there, whatever the system would say. Every lock call on the file is made under that
//! set's mutex, so two threads never interleave an acquire and a release of one byte.
//!
//! The file is opened once per process and directory and closed when the last hold on it
//! ends; it is never opened a second time meanwhile (where locks belong to the process,
//! closing any descriptor of the file would drop them all).

use std::collections::{HashMap, HashSet};
use std::fs::{File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::host::Host;
use crate::key::ScopeKey;

/// The writers' lock file's name in the coordination directory.
pub(crate) const FILE_NAME: &str = "writers.lock";

/// The writers' lock files this process has open, by canonical path.
static OPEN: Mutex<Option<HashMap<PathBuf, Weak<WritersFile>>>> = Mutex::new(None);

/// One directory's writers' lock file, open in this process.
#[derive(Debug)]
pub(crate) struct WritersFile {
    file: File,
    /// The bytes this process holds locked (the scopes it is writer of).
    held: Mutex<HashSet<u64>>,
}

/// The byte a scope's writer locks: from its key, below `i64::MAX` (an `off_t`).
pub(crate) fn byte_of(key: ScopeKey) -> u64 {
    let bytes = key.as_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(first) >> 2
}

impl WritersFile {
    /// The directory's writers' lock file, opened (and created, 0600) unless this process
    /// has it open already. `dir` is resolved (links followed): one name per file, however
    /// the directory was spelled, so it is opened once.
    pub(crate) fn open(host: &dyn Host, dir: &Path) -> io::Result<Arc<WritersFile>> {
        let path = dir.join(FILE_NAME);
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        let open = open.get_or_insert_with(HashMap::new);
        if let Some(file) = open.get(&path).and_then(Weak::upgrade) {
            return Ok(file);
        }
        let file = Arc::new(WritersFile {
            file: host.open_lock_file(&path)?,
            held: Mutex::new(HashSet::new()),
        });
        // Closed files' entries go when the map would grow, so it stays as small as the
        // number of directories in use.
        if open.len() == open.capacity() {
            open.retain(|_, file| file.strong_count() > 0);
        }
        open.insert(path, Arc::downgrade(&file));
        Ok(file)
    }

    /// Locks `byte` for this process unless anyone holds it (this process included).
    pub(crate) fn try_hold(
        self: &Arc<Self>,
        host: Arc<dyn Host>,
        byte: u64,
    ) -> Result<Option<ByteHold>, TryLockError> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains(&byte) {
            return Ok(None);
        }
        match host.try_lock_byte(&self.file, byte) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(error) => return Err(error),
        }
        held.insert(byte);
        Ok(Some(ByteHold {
            file: Arc::clone(self),
            host,
            byte,
        }))
    }

    /// Whether anyone holds `byte` (this process included), without locking it.
    pub(crate) fn is_held(&self, host: &dyn Host, byte: u64) -> Result<bool, TryLockError> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains(&byte) {
            return Ok(true);
        }
        host.byte_locked_elsewhere(&self.file, byte)
    }
}

/// A scope's byte of the writers' lock, held until dropped (and by the operating system
/// until the process ends, however it ends).
#[derive(Debug)]
pub(crate) struct ByteHold {
    file: Arc<WritersFile>,
    host: Arc<dyn Host>,
    byte: u64,
}

impl Drop for ByteHold {
    fn drop(&mut self) {
        let mut held = self
            .file
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // An unlock that fails leaves the byte locked until the file closes with the last
        // hold; this process may take it again meanwhile (its own lock), others may not.
        let _ = self.host.unlock_byte(&self.file.file, self.byte);
        held.remove(&self.byte);
    }
}
