//! Directory watches over inotify, reporting what envd reports (its fsnotify backend): a
//! create, write, remove, rename or chmod, named relative to the watched directory, for its
//! direct entries or, recursively, for every directory below it (new ones included).
//!
//! Memory is bounded by the kernel: events are read only as fast as the consumer takes
//! them; when the kernel's queue overflows meanwhile the watch fails ([`WatchError`]) instead
//! of silently losing events.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// What happened to an entry (envd's `EventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FsEventKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

impl FsEventKind {
    /// The proto3 JSON name.
    pub(crate) fn wire_name(self) -> &'static str {
        match self {
            FsEventKind::Create => "EVENT_TYPE_CREATE",
            FsEventKind::Write => "EVENT_TYPE_WRITE",
            FsEventKind::Remove => "EVENT_TYPE_REMOVE",
            FsEventKind::Rename => "EVENT_TYPE_RENAME",
            FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
        }
    }

    /// Whether the entry still exists after such an event (so it can be described).
    pub(crate) fn leaves_entry(self) -> bool {
        matches!(
            self,
            FsEventKind::Create | FsEventKind::Write | FsEventKind::Chmod
        )
    }
}

/// One event: the entry's path relative to the watched directory (`.` for the directory
/// itself) and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FsEvent {
    pub(crate) name: String,
    pub(crate) kind: FsEventKind,
}

/// Why a watch stopped.
#[derive(Debug)]
pub(crate) enum WatchError {
    /// More events happened than the kernel could queue while nobody read them.
    Overflow,
    Io(io::Error),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchError::Overflow => f.write_str("watcher error: event queue overflow"),
            WatchError::Io(e) => write!(f, "watcher error: {e}"),
        }
    }
}

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MOVE_SELF;

/// A watch on one directory (and its subdirectories when recursive).
#[derive(Debug)]
pub(crate) struct DirWatch {
    fd: AsyncFd<OwnedFd>,
    root: PathBuf,
    recursive: bool,
    /// Each watch descriptor's directory, relative to the root (empty for the root).
    dirs: HashMap<i32, PathBuf>,
    pending: VecDeque<FsEvent>,
    buf: Vec<u8>,
}

impl DirWatch {
    /// Starts watching `root` (an existing directory on the host). Inside a Tokio runtime.
    pub(crate) fn new(root: &Path, recursive: bool) -> io::Result<DirWatch> {
        // SAFETY: inotify_init1 has no memory-safety preconditions; the fd is owned at once.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the OwnedFd keeps its one fd open until the AsyncFd owning it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
            .map_err(io::Error::from)?;
        let mut watch = DirWatch {
            fd,
            root: root.to_owned(),
            recursive,
            dirs: HashMap::new(),
            pending: VecDeque::new(),
            buf: vec![0u8; 64 * 1024],
        };
        watch.add(PathBuf::new())?;
        Ok(watch)
    }

    /// Watches the directory `rel` (relative to the root) and, when recursive, those below.
    fn add(&mut self, rel: PathBuf) -> io::Result<()> {
        let host = self.root.join(&rel);
        let path = CString::new(host.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: a valid NUL-terminated path and our inotify fd.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.fd.as_raw_fd(),
                path.as_ptr(),
                MASK | libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW,
            )
        };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.dirs.insert(wd, rel.clone());
        if self.recursive {
            for entry in std::fs::read_dir(&host)?.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    // A directory that vanished meanwhile is simply not watched.
                    let _ = self.add(rel.join(entry.file_name()));
                }
            }
        }
        Ok(())
    }

    /// The next event, waiting for one.
    pub(crate) async fn next(&mut self) -> Result<FsEvent, WatchError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            let buf = &mut self.buf;
            let n = self
                .fd
                .async_io(Interest::READABLE, |fd| {
                    // SAFETY: `buf` is valid for `buf.len()` bytes.
                    let n =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    usize::try_from(n).map_err(|_| io::Error::last_os_error())
                })
                .await
                .map_err(WatchError::Io)?;
            self.parse(n)?;
        }
    }

    /// Turns `n` bytes of `inotify_event` records into pending events.
    fn parse(&mut self, n: usize) -> Result<(), WatchError> {
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut offset = 0;
        while offset + HEADER <= n {
            let field = |at: usize| {
                let bytes = &self.buf[offset + at..offset + at + 4];
                [bytes[0], bytes[1], bytes[2], bytes[3]]
            };
            let wd = i32::from_ne_bytes(field(0));
            let mask = u32::from_ne_bytes(field(4));
            let len = u32::from_ne_bytes(field(12)) as usize;
            let name_bytes = &self.buf[offset + HEADER..(offset + HEADER + len).min(n)];
            let name_end = name_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(name_bytes.len());
            let name = OsStr::from_bytes(&name_bytes[..name_end]).to_owned();
            offset += HEADER + len;
            if mask & libc::IN_Q_OVERFLOW != 0 {
                return Err(WatchError::Overflow);
            }
            if mask & libc::IN_IGNORED != 0 {
                self.dirs.remove(&wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&wd).cloned() else {
                continue;
            };
            let is_root = dir.as_os_str().is_empty();
            let self_event = mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0;
            // A subdirectory's own removal or move is reported by its parent already.
            if self_event && !is_root {
                continue;
            }
            let rel = if name.is_empty() {
                dir.clone()
            } else {
                dir.join(&name)
            };
            let shown = if rel.as_os_str().is_empty() {
                ".".to_owned()
            } else {
                rel.to_string_lossy().into_owned()
            };
            // fsnotify's order for one inotify event.
            let kinds = [
                (libc::IN_CREATE | libc::IN_MOVED_TO, FsEventKind::Create),
                (
                    libc::IN_MOVE_SELF | libc::IN_MOVED_FROM,
                    FsEventKind::Rename,
                ),
                (libc::IN_ATTRIB, FsEventKind::Chmod),
                (libc::IN_MODIFY, FsEventKind::Write),
                (libc::IN_DELETE | libc::IN_DELETE_SELF, FsEventKind::Remove),
            ];
            for (bits, kind) in kinds {
                if mask & bits != 0 {
                    self.pending.push_back(FsEvent {
                        name: shown.clone(),
                        kind,
                    });
                }
            }
            let new_dir =
                mask & libc::IN_ISDIR != 0 && mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0;
            if self.recursive && new_dir {
                // Gone again already: nothing to watch.
                let _ = self.add(rel);
            }
        }
        Ok(())
    }
}
