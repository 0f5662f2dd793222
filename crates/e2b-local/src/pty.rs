//! Pseudo-terminals for `process.Process/Start` with a `pty`: the master side, read and
//! written without blocking a thread, and resized with `TIOCSWINSZ` (the kernel then sends
//! SIGWINCH to the terminal's foreground group, as on a real terminal).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A terminal size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TermSize {
    pub(crate) cols: u16,
    pub(crate) rows: u16,
}

impl TermSize {
    fn winsize(self) -> libc::winsize {
        libc::winsize {
            ws_row: self.rows,
            ws_col: self.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }
    }
}

/// The master side of a terminal whose slave a process holds.
#[derive(Debug)]
pub(crate) struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Opens a terminal of `size`: the master (non-blocking, registered with the runtime) and
/// the slave to give the process as its stdin, stdout and stderr. Both are close-on-exec
/// from the start, so no other command inherits them.
pub(crate) fn open(size: TermSize) -> io::Result<(PtyMaster, OwnedFd)> {
    // SAFETY: plain libc calls; every fd returned is owned right away, and the name buffer
    // outlives its use.
    let (master, slave) = unsafe {
        let master = check(libc::posix_openpt(
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        ))?;
        let master = OwnedFd::from_raw_fd(master);
        check(libc::grantpt(master.as_raw_fd()))?;
        check(libc::unlockpt(master.as_raw_fd()))?;
        let mut name = [0 as libc::c_char; 128];
        let named = libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len());
        if named != 0 {
            return Err(io::Error::from_raw_os_error(named));
        }
        let path = CStr::from_ptr(name.as_ptr());
        let slave = check(libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?;
        (master, OwnedFd::from_raw_fd(slave))
    };
    // SAFETY: an OwnedFd keeps its one fd open, unchanged, until it is dropped with the
    // AsyncFd that owns it.
    let fd = unsafe { AsyncFd::register(master) }.map_err(io::Error::from)?;
    let master = PtyMaster { fd };
    master.resize(size)?;
    Ok((master, slave))
}

impl PtyMaster {
    /// Reads what the process wrote; `Ok(0)` once no process holds the slave any more
    /// (Linux answers `EIO` then).
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let result = self
                .fd
                .async_io(Interest::READABLE, |fd| {
                    // SAFETY: `buf` is valid for `buf.len()` bytes.
                    let n =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    usize::try_from(n).map_err(|_| io::Error::last_os_error())
                })
                .await;
            match result {
                Err(e) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    /// Writes all of `data` as typed input.
    pub(crate) async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let written = self
                .fd
                .async_io(Interest::WRITABLE, |fd| {
                    // SAFETY: `data` is valid for `data.len()` bytes.
                    let n =
                        unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                    usize::try_from(n).map_err(|_| io::Error::last_os_error())
                })
                .await;
            match written {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sets the terminal's size.
    pub(crate) fn resize(&self, size: TermSize) -> io::Result<()> {
        let winsize = size.winsize();
        // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
        check(unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TIOCSWINSZ, &winsize) })?;
        Ok(())
    }
}

/// Makes the calling process (a child between fork and exec whose stdin is the slave) lead a
/// new session with that terminal as its controlling terminal, as a login on a terminal does.
///
/// # Safety
/// Only for a `pre_exec` hook: it calls async-signal-safe functions only.
pub(crate) unsafe fn take_as_controlling_terminal() -> io::Result<()> {
    // SAFETY: async-signal-safe calls on fd 0, which the child owns.
    unsafe {
        check(libc::setsid())?;
        check(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
    }
    Ok(())
}
