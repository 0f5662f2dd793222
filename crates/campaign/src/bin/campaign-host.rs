//! One host process of the campaign: a persistent-mode `Backend` on the campaign's scope,
//! driven from standard input like a Hermes session.
//!
//! ```text
//! campaign-host <api url> <hermes home> <task id> <push log> [<coordination dir> <term s>]
//! ```
//!
//! With the last two arguments the host stands in for one of several machines sharing the
//! profile: its own coordination directory and `writer_arbitration: sandbox` with a grant of
//! `<term s>` seconds; each push then also uploads `skills/campaign/writer` naming the
//! process and the push, so the campaign can tell whose write landed.
//!
//! Commands, one per line: `attach`, `run <shell command>`, `pause <ms>`, `cleanup`, `quit`.
//! Each answers with one line: `attached <sandbox id> <role>`, `exit <code> <output,
//! escaped>`, `paused`, `cleanup <pull outcome>` or `error <message>`. Events come on their own lines:
//! `phase push` and `phase pull` when a state transfer starts (the campaign may kill the
//! process right then). The push hook uploads `skills/` and `memories/` the way Hermes'
//! sync does, and appends `B <pid>` / `E <pid>` to the push log around each push, so the
//! campaign can prove that two processes never pushed at once.

#![allow(clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox::{
    ApiKey, ApiKeySource, Backend, Config, Endpoints, ErrorChain, HookError, OutputSink,
    OutputStream, PushKind, RunOptions, SandboxMode, Scope, Services, StateHooks, StateTransport,
    WriterArbitration, host_state_files,
};

/// Largest command output kept for the answer line; the campaign's commands print a line.
const OUTPUT_CAP: usize = 4096;

struct Hooks {
    home: PathBuf,
    push_log: PathBuf,
    /// Set in the several-hosts mode: each push also uploads a marker naming it.
    marker: bool,
    pushes: Mutex<u64>,
}

/// Where a push's marker lands in the sandbox (two-host mode).
const MARKER: &str = "skills/campaign/writer";

fn event(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

fn log_push(log: &Path, mark: char) -> std::io::Result<()> {
    // One short O_APPEND write per line: lines of different processes never interleave.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)?;
    file.write_all(format!("{mark} {}\n", std::process::id()).as_bytes())
}

impl StateHooks for Hooks {
    fn push(&self, transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        log_push(&self.push_log, 'B')?;
        event("phase push")?;
        let mut files = host_state_files(
            &self.home,
            &["skills", "memories"],
            transport.remote_hermes_home(),
        );
        if self.marker {
            let mut pushes = self.pushes.lock().unwrap_or_else(PoisonError::into_inner);
            *pushes += 1;
            // Under cache/ (the campaign allows it there), one file per process.
            let local = self
                .home
                .join("cache")
                .join(format!("campaign-marker-{}", std::process::id()));
            std::fs::create_dir_all(self.home.join("cache"))?;
            std::fs::write(
                &local,
                format!("pid {} push {}\n", std::process::id(), *pushes),
            )?;
            let remote = format!("{}/{MARKER}", transport.remote_hermes_home());
            // A recovery may have brought an earlier marker into the home.
            files.retain(|(_, to)| *to != remote);
            files.push((local, remote));
        }
        let pushed = transport.upload_many(files);
        // A failed push has ended too: the role may pass to another process next.
        log_push(&self.push_log, 'E')?;
        pushed?;
        Ok(())
    }

    fn pull(&self, transport: &StateTransport) -> Result<(), HookError> {
        event("phase pull")?;
        let path = self.home.join("cache").join("campaign-pull.tar");
        let mut file = std::fs::File::create(path)?;
        transport.download_state(&mut file)?;
        Ok(())
    }
}

/// Keeps the first [`OUTPUT_CAP`] bytes of stdout and stderr together.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<u8>>>);

impl OutputSink for Collect {
    fn chunk(&mut self, _stream: OutputStream, bytes: &[u8]) -> std::io::Result<()> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let room = OUTPUT_CAP.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        Ok(())
    }
}

fn escape(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (url, home, task, push_log, hosts) = match &args[..] {
        [_, url, home, task, push_log] => (url, home, task, push_log, None),
        [_, url, home, task, push_log, dir, term] => {
            (url, home, task, push_log, Some((dir, term.parse::<u64>()?)))
        }
        _ => {
            return Err(
                "usage: campaign-host <api url> <hermes home> <task id> <push log> \
                 [<coordination dir> <term seconds>]"
                    .into(),
            );
        }
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let mut config = Config::new(ApiKeySource::Key(ApiKey::new(
        "campaign-local-key".to_owned(),
    )));
    config.endpoints = Endpoints::single(url.clone());
    config.mode = SandboxMode::Persistent;
    if let Some((dir, term)) = hosts {
        config.coordination_dir = Some(PathBuf::from(dir));
        config.writer_arbitration = WriterArbitration::Sandbox {
            term: Duration::from_secs(term),
        };
    }
    let hooks = Arc::new(Hooks {
        home: PathBuf::from(home),
        push_log: PathBuf::from(push_log),
        marker: hosts.is_some(),
        pushes: Mutex::new(0),
    });
    let scope = Scope {
        profile_home: PathBuf::from(home),
        task_id: task.clone(),
    };
    let backend = Backend::new(
        config,
        scope,
        Services::new(runtime.handle().clone()),
        hooks,
    )?;
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        let (verb, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let answer = match verb {
            "attach" => match backend.attach() {
                Ok(info) => format!("attached {} {:?}", info.sandbox_id, info.role),
                Err(error) => format!("error {}", ErrorChain(&error)),
            },
            "run" => {
                let sink = Collect::default();
                let options = RunOptions::new(Duration::from_secs(30));
                match backend.run(rest, options, Box::new(sink.clone())) {
                    Ok(command) => match command.wait() {
                        Ok(exit) => {
                            let kept = sink.0.lock().unwrap_or_else(PoisonError::into_inner);
                            format!("exit {} {}", exit.exit_code, escape(&kept))
                        }
                        Err(error) => format!("error {}", ErrorChain(&error)),
                    },
                    Err(error) => format!("error {}", ErrorChain(&error)),
                }
            }
            "pause" => {
                // The campaign spaces a host's commands so another host's grant can lapse.
                std::thread::sleep(Duration::from_millis(rest.parse()?));
                "paused".to_owned()
            }
            "cleanup" => format!("cleanup {:?}", backend.cleanup().pull),
            "quit" => break,
            other => format!("error unknown command {other:?}"),
        };
        event(&answer.replace('\n', " "))?;
    }
    Ok(())
}
