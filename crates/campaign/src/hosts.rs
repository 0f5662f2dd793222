//! The host processes of a cycle: spawned with a script of commands, answered line by line.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::Instant;

use crate::cycle::Campaign;
use crate::{Error, TWO_HOST_TERM};

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
        script: Vec<String>,
        tx: Sender<Msg>,
    ) -> Result<Host, Error> {
        let stderr =
            std::fs::File::create(self.root.join("logs").join(format!("host-{index}.err")))?;
        let mut command = Command::new(&self.host_bin);
        command
            .arg(self.server.url())
            .arg(&self.home)
            .arg("campaign-task")
            .arg(&self.push_log);
        if self.hosts == 2 {
            command
                .arg(self.root.join(format!("coordination-{machine}")))
                .arg(TWO_HOST_TERM.as_secs().to_string());
        }
        let mut child = command
            .env("HOME", self.root.join("host-home"))
            .env("TMPDIR", self.root.join("host-tmp"))
            .env_remove("E2B_API_KEY")
            .current_dir(self.root.join("host-cwd"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
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
        })
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
