//! A port of one sandbox reachable from another ([`PortForward`]): a listening relay in the
//! first, a connecting relay in the second (both live processes running `relay.py`), and
//! two host threads carrying each one's frames to the other. Works whatever the sandboxes'
//! egress policies, on any template with `python3`; a frame is one line, checked on the host
//! before it is passed on.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{LiveEnd, LiveProcess, LiveRead, LiveSignal};
use crate::error::Error;

/// The relay, run with `python3 -c`.
pub(crate) const RELAY: &str = include_str!("relay.py");

/// The longest frame line passed on (a 32 KiB chunk in base64 and its header).
const MAX_FRAME: usize = 48 * 1024;

/// How long a relay may take to say it listens.
const READY_WAIT: Duration = Duration::from_secs(30);

/// A port forward: connections to `127.0.0.1:<port>` in one sandbox reach the same port in
/// another. Made by [`Backend::forward_port`](crate::Backend::forward_port); dropping it (or
/// [`PortForward::stop`]) ends both relays.
pub struct PortForward {
    port: u16,
    listener: LiveProcess,
    connector: LiveProcess,
    pumps: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for PortForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForward")
            .field("port", &self.port)
            .field("from", &self.listener.sandbox_id())
            .field("to", &self.connector.sandbox_id())
            .finish_non_exhaustive()
    }
}

impl PortForward {
    /// The two relays, started: waits for the listening one to listen, then carries frames.
    pub(crate) fn start(
        port: u16,
        listener: LiveProcess,
        connector: LiveProcess,
    ) -> Result<PortForward, Error> {
        let mut pending = Vec::new();
        let ready =
            first_line(&listener, &mut pending).and_then(|line| match line.strip_prefix("L ") {
                Some(listening) if listening == port.to_string() => Ok(()),
                _ => Err(Error::InvalidConfig {
                    reason: format!(
                        "port {port} cannot be forwarded into sandbox {}: {}",
                        listener.sandbox_id(),
                        line.strip_prefix("E ").unwrap_or(&line)
                    ),
                }),
            });
        if let Err(error) = ready {
            let _ = listener.signal(LiveSignal::Kill);
            let _ = connector.signal(LiveSignal::Kill);
            return Err(error);
        }
        let pumps = vec![
            pump(listener.clone(), connector.clone(), pending),
            pump(connector.clone(), listener.clone(), Vec::new()),
        ];
        Ok(PortForward {
            port,
            listener,
            connector,
            pumps,
        })
    }

    /// The port forwarded.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether both relays still run.
    pub fn is_running(&self) -> bool {
        self.listener.end().is_none() && self.connector.end().is_none()
    }

    /// Ends both relays (their open connections close).
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        for relay in [&self.listener, &self.connector] {
            if relay.end().is_none() {
                let _ = relay.signal(LiveSignal::Kill);
            }
        }
        for pump in self.pumps.drain(..) {
            let _ = pump.join();
        }
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.end();
    }
}

/// The first line `relay` writes; what follows it in the same reads is kept in `rest`.
fn first_line(relay: &LiveProcess, rest: &mut Vec<u8>) -> Result<String, Error> {
    let deadline = std::time::Instant::now() + READY_WAIT;
    let mut buffer = Vec::new();
    loop {
        if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(&buffer[..end]).into_owned();
            rest.extend_from_slice(&buffer[end + 1..]);
            return Ok(line);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match relay.read(left.min(Duration::from_secs(1))) {
            LiveRead::Output(bytes) => buffer.extend_from_slice(&bytes),
            LiveRead::Ended(end) => {
                let said = String::from_utf8_lossy(&buffer).trim().to_owned();
                return Ok(format!(
                    "E the relay ended ({}){}",
                    describe(&end),
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {said}")
                    }
                ));
            }
            LiveRead::Pending if left.is_zero() => {
                return Ok("E the relay did not start listening in time".to_owned());
            }
            LiveRead::Pending => {}
        }
    }
}

fn describe(end: &LiveEnd) -> String {
    match end {
        LiveEnd::Exited { code } => format!("exit {code}; is python3 installed?"),
        LiveEnd::Killed => "killed".to_owned(),
        LiveEnd::Lost(reason) => format!("lost: {reason}"),
        LiveEnd::Detached => "no longer followed".to_owned(),
    }
}

/// Carries `from`'s frames to `to` until either ends; the other is then ended too.
fn pump(from: LiveProcess, to: LiveProcess, pending: Vec<u8>) -> JoinHandle<()> {
    let from = Arc::new(from);
    std::thread::spawn(move || {
        let mut buffer = pending;
        loop {
            let mut out = Vec::new();
            let mut start = 0;
            while let Some(end) = buffer[start..].iter().position(|b| *b == b'\n') {
                let line = &buffer[start..start + end];
                if is_frame(line) {
                    out.extend_from_slice(line);
                    out.push(b'\n');
                }
                start += end + 1;
            }
            buffer.drain(..start);
            if buffer.len() > MAX_FRAME {
                // No frame is this long: what the relay printed is not ours to pass on.
                buffer.clear();
            }
            if !out.is_empty() && to.write(&out).is_err() {
                break;
            }
            match from.read(Duration::from_secs(60)) {
                LiveRead::Output(bytes) => buffer.extend_from_slice(&bytes),
                LiveRead::Ended(_) => break,
                LiveRead::Pending => {}
            }
        }
        if to.end().is_none() {
            let _ = to.signal(LiveSignal::Kill);
        }
    })
}

/// Whether `line` is a frame one relay may pass to the other: `O <id>`, `C <id>` or
/// `D <id> <base64>`.
fn is_frame(line: &[u8]) -> bool {
    let id_ok = |id: &[u8]| !id.is_empty() && id.len() <= 20 && id.iter().all(u8::is_ascii_digit);
    match line {
        [b'O' | b'C', b' ', id @ ..] => id_ok(id),
        [b'D', b' ', rest @ ..] => {
            let Some(space) = rest.iter().position(|b| *b == b' ') else {
                return false;
            };
            let (id, data) = (&rest[..space], &rest[space + 1..]);
            id_ok(id)
                && !data.is_empty()
                && data
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_frames_pass() {
        // contract: R16 — nothing but frames crosses from one relay to the other.
        assert!(is_frame(b"O 1"));
        assert!(is_frame(b"C 42"));
        assert!(is_frame(b"D 7 aGVsbG8="));
        for bad in [
            &b"L 8766"[..],
            b"E port taken",
            b"O",
            b"O x",
            b"D 7",
            b"D 7 not base64!",
            b"D  aGk=",
            b"O 1 extra",
            b"",
        ] {
            assert!(!is_frame(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
