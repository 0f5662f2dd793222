//! The socket of the connection a request came on, so that a streamed answer can end in a
//! reset: what a client sees on E2B when a sandbox dies under an open envd stream (its
//! SDK tells a reset apart from a clean end and then probes whether the sandbox is gone).

use std::os::fd::RawFd;

/// The accepted socket of one connection (its descriptor, not owned).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnSocket(RawFd);

impl ConnSocket {
    /// The socket of a connection the server accepted (its listener names it).
    pub(crate) fn new(fd: RawFd) -> ConnSocket {
        ConnSocket(fd)
    }

    /// Makes the connection's coming close a reset (`SO_LINGER` 0). Only to be called while
    /// the connection is open, from the answer it is sending (so the descriptor is still
    /// this connection's).
    pub(crate) fn reset_on_close(self) {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a plain setsockopt on a descriptor the caller keeps open, with a pointer to
        // a live `linger` of the size given.
        let result = unsafe {
            libc::setsockopt(
                self.0,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).unwrap_or(0),
            )
        };
        if result != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "setting SO_LINGER failed");
        }
    }
}
