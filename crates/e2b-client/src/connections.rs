//! The connections of [`crate::blocking`]: plain TCP to envd, kept per endpoint between
//! commands. Below `http` (whose `Http` holds them) and `blocking` (which uses them).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// Idle connections kept per endpoint.
const MAX_IDLE_PER_ENDPOINT: usize = 32;
/// How long an idle connection is kept: a server may close one it has not heard from, and
/// one closed under a request that was just sent would fail that request.
const IDLE_LIFETIME: Duration = Duration::from_secs(20);

/// The connections of the blocking path, shared by every sandbox handle of a client.
pub(crate) struct Connections {
    idle: Mutex<HashMap<String, Vec<Idle>>>,
    connect_timeout: Duration,
}

impl fmt::Debug for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connections").finish_non_exhaustive()
    }
}

struct Idle {
    stream: TcpStream,
    since: Instant,
}

impl Connections {
    pub(crate) fn new(connect_timeout: Duration) -> Connections {
        Connections {
            idle: Mutex::new(HashMap::new()),
            connect_timeout,
        }
    }

    /// The most recently used idle connection to `authority` that the server has not closed
    /// (nor sent anything on) meanwhile.
    pub(crate) fn checkout(&self, authority: &str) -> Option<TcpStream> {
        loop {
            let idle = {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                idle.get_mut(authority)?.pop()?
            };
            if idle.since.elapsed() < IDLE_LIFETIME && is_quiet(&idle.stream) {
                return Some(idle.stream);
            }
        }
    }

    pub(crate) fn checkin(&self, authority: &str, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = idle.entry(authority.to_owned()).or_default();
        kept.retain(|idle| idle.since.elapsed() < IDLE_LIFETIME);
        if kept.len() < MAX_IDLE_PER_ENDPOINT {
            kept.push(Idle {
                stream,
                since: Instant::now(),
            });
        }
    }

    pub(crate) fn connect(&self, authority: &str) -> io::Result<TcpStream> {
        let mut last = None;
        for address in authority.to_socket_addrs()? {
            match TcpStream::connect_timeout(&address, self.connect_timeout) {
                Ok(stream) => {
                    // Requests are written whole, in one write: no reason to wait for more.
                    stream.set_nodelay(true)?;
                    stream.set_write_timeout(Some(self.connect_timeout))?;
                    return Ok(stream);
                }
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("the host has no address")))
    }
}

/// Whether an idle connection is still as it was left: nothing to read, not closed.
fn is_quiet(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    let quiet =
        matches!(stream.peek(&mut byte), Err(error) if error.kind() == io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).is_ok() && quiet
}
