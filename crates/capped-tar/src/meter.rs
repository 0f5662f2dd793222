//! The byte meter under the tar parser: counts every byte pulled from the source, fails the
//! read that would take the first byte past the cap, and remembers what really went wrong so
//! that an error surfacing from the parser can be reported as what it is.

use std::cell::{Cell, RefCell};
use std::io::{self, Read};

use crate::error::Error;

/// What happened underneath the tar parser; shared by the metered stream and the reader.
pub(crate) struct MeterState {
    limit: u64,
    read: Cell<u64>,
    exceeded: Cell<bool>,
    eof: Cell<bool>,
    failure: RefCell<Option<io::Error>>,
}

impl MeterState {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            read: Cell::new(0),
            exceeded: Cell::new(false),
            eof: Cell::new(false),
            failure: RefCell::new(None),
        }
    }

    /// Bytes pulled from the source so far, headers and padding included.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.read.get()
    }

    /// Whether the source has reported its end.
    pub(crate) fn at_eof(&self) -> bool {
        self.eof.get()
    }

    /// Whether the stream underneath went over the cap, ended or failed.
    pub(crate) fn in_trouble(&self) -> bool {
        self.exceeded.get() || self.eof.get() || self.failure.borrow().is_some()
    }

    /// Turns an error surfacing from the tar parser into what really happened.
    pub(crate) fn classify(&self, error: &io::Error, member: Option<String>) -> Error {
        if self.exceeded.get() {
            return Error::OverCap {
                limit: self.limit,
                member,
            };
        }
        if let Some(source) = self.failure.borrow_mut().take() {
            return Error::Source { source };
        }
        if self.eof.get() {
            return Error::Truncated { member };
        }
        Error::Malformed {
            member,
            detail: error.to_string(),
        }
    }
}

/// The stream as the tar parser sees it: every byte is counted as it is pulled, and the byte
/// past the cap fails the read.
pub(crate) struct Meter<'a> {
    pub(crate) inner: &'a mut dyn Read,
    pub(crate) state: &'a MeterState,
}

impl Read for Meter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let state = self.state;
        if state.exceeded.get() || state.failure.borrow().is_some() {
            return Err(io::Error::other("archive stream already failed"));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        // Ask for at most one byte past the cap, so the stream is never read further than that.
        let allowed = state.limit - state.read.get();
        let window =
            usize::try_from(allowed.saturating_add(1)).map_or(buf.len(), |w| w.min(buf.len()));
        loop {
            match self.inner.read(&mut buf[..window]) {
                Ok(0) => {
                    state.eof.set(true);
                    return Ok(0);
                }
                Ok(n) => {
                    let total = state.read.get() + n as u64;
                    state.read.set(total.min(state.limit.saturating_add(1)));
                    if total > state.limit {
                        state.exceeded.set(true);
                        return Err(io::Error::other("archive stream over its cap"));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    *state.failure.borrow_mut() = Some(e);
                    return Err(io::Error::other("archive stream failed"));
                }
            }
        }
    }
}

/// A member's content as handed to the visitor: counts what was read, so a short member is
/// caught after the visitor is done.
pub(crate) struct Counted<'a> {
    pub(crate) inner: &'a mut dyn Read,
    pub(crate) count: u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}
