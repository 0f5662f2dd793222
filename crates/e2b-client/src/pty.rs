//! Terminals in a sandbox: what starting a PTY takes.

use std::collections::BTreeMap;
use std::time::Duration;

/// A terminal size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtySize {
    /// Columns (`tput cols`).
    pub cols: u16,
    /// Rows (`tput lines`).
    pub rows: u16,
}

/// How to start a process on a pseudo-terminal (envd's `Start` with a `pty`). Start from
/// [`PtyOptions::shell`]; there is no `Default`.
///
/// Its output arrives as [`ProcessEvent::Pty`](crate::ProcessEvent::Pty) chunks (stdout and
/// stderr are one stream on a terminal); type on it with
/// [`Sandbox::send_pty_input`](crate::Sandbox::send_pty_input), resize it with
/// [`Sandbox::resize_pty`](crate::Sandbox::resize_pty), end it with
/// [`Sandbox::kill_process`](crate::Sandbox::kill_process).
#[derive(Clone, Debug)]
pub struct PtyOptions {
    /// The terminal's initial size.
    pub size: PtySize,
    /// The program (envd's `cmd`).
    pub program: String,
    /// Its arguments, each one argv entry.
    pub args: Vec<String>,
    /// Environment variables (they win over the sandbox's).
    pub envs: BTreeMap<String, String>,
    /// Working directory; `None` is envd's default (the user's home).
    pub cwd: Option<String>,
    /// Run as this user (`Authorization: Basic`); `None` is envd's default user.
    pub user: Option<String>,
    /// Process deadline (`Connect-Timeout-Ms`); `None` lets the terminal live until it exits
    /// or is killed.
    pub timeout: Option<Duration>,
    /// How long envd may stay silent before a keepalive event (`Keepalive-Ping-Interval`).
    pub keepalive: Duration,
}

impl PtyOptions {
    /// An interactive login bash (`/bin/bash -i -l`) of `size`, with the environment the
    /// official SDK's `pty.create` sets (`TERM=xterm-256color`, `LANG` and `LC_ALL`
    /// `C.UTF-8`), no deadline and the SDK's 50 s keepalive.
    pub fn shell(size: PtySize) -> PtyOptions {
        let envs = [
            ("TERM", "xterm-256color"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        PtyOptions {
            size,
            program: "/bin/bash".to_owned(),
            args: vec!["-i".to_owned(), "-l".to_owned()],
            envs,
            cwd: None,
            user: None,
            timeout: None,
            keepalive: Duration::from_secs(50),
        }
    }
}
