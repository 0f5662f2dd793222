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
//! Commands, one per line: `attach`, `run <shell command>`, `pause <ms>`, `cleanup`,
//! `finalize`, `quit` (the driver is `agent_sandbox::line_driver`, shared with
//! `sandbox-session`). Each answers with one line: `attached <sandbox id> <role>`, `exit <code>
//! <output, escaped>`, `paused`, `cleanup <pull outcome>`, `finalized` or `error <message>`.
//! Events come on their own lines:
//! `phase push` and `phase pull` when a state transfer starts (the campaign may kill the
//! process right then). The push hook uploads `skills/` and `memories/` the way Hermes'
//! sync does, and appends `B <pid>` / `E <pid>` to the push log around each push, so the
//! campaign can prove that two processes never pushed at once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox::line_driver::{LineDriver, RunOutput, emit};
use agent_sandbox::{
    ApiKey, ApiKeySource, Backend, Config, Endpoints, HookError, PushKind, SandboxMode, Scope,
    Services, StateHooks, StateTransport, WriterArbitration, host_state_files,
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

fn log_push(log: &Path, mark: char) -> std::io::Result<()> {
    // One short O_APPEND write per line: lines of different processes never interleave.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)?;
    file.write_all(format!("{mark} {}\n", std::process::id()).as_bytes())
}

impl Hooks {
    fn push_files(&self, transport: &StateTransport) -> Result<(), HookError> {
        let mut files = host_state_files(
            &self.home,
            &["skills", "memories"],
            transport.remote_hermes_home()?,
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
            let remote = format!("{}/{MARKER}", transport.remote_hermes_home()?);
            // A recovery may have brought an earlier marker into the home.
            files.retain(|(_, to)| *to != remote);
            files.push((local, remote));
        }
        transport.upload_many(files)?;
        Ok(())
    }
}

impl StateHooks for Hooks {
    fn push(&self, transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        log_push(&self.push_log, 'B')?;
        emit("phase push")?;
        let pushed = self.push_files(transport);
        // A failed push has ended too (an unknown home, a refused upload): the role may pass
        // to another process next.
        log_push(&self.push_log, 'E')?;
        pushed
    }

    fn pull(&self, transport: &StateTransport) -> Result<(), HookError> {
        emit("phase pull")?;
        let path = self.home.join("cache").join("campaign-pull.tar");
        let mut file = std::fs::File::create(path)?;
        transport.download_state(&mut file)?;
        Ok(())
    }
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
    let driver = LineDriver {
        run_timeout: Duration::from_secs(30),
        output: RunOutput::Capture(OUTPUT_CAP),
    };
    driver.serve(&backend, std::io::stdin().lock())?;
    Ok(())
}
