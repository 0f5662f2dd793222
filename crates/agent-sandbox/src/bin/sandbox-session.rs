//! Drives one backend session from standard input, for multi-process tests and debugging.
//!
//! ```text
//! sandbox-session <api url> <profile home> <task id>
//! ```
//!
//! Commands, one per line: `attach`, `run <shell command>`, `pause <ms>`, `cleanup`,
//! `finalize`, `quit`. Each answers with one line: `attached <sandbox id> <role>`,
//! `exit <code> <output bytes>`, `paused`, `cleanup <pull outcome>`, `finalized`, or
//! `error <message>` (the driver is `agent_sandbox::line_driver`, shared with the
//! campaign). The state hooks push `<profile home>/skills` and pull into
//! `<profile home>/cache/session-pull.tar`. With `SANDBOX_SESSION_HANG_IN_PUSH=1` the first
//! initial push uploads one file, prints `pushing` and then never returns (for tests that
//! kill a writer mid-push).
//!
//! Standing in for another machine (writer arbitration tests): `SANDBOX_SESSION_WRITER_TERM=<s>`
//! turns on `writer_arbitration: sandbox` with that grant term, `SANDBOX_SESSION_COORDINATION_DIR`
//! gives the host coordination directory (host lock, host id), and
//! `SANDBOX_SESSION_PUSH_FROM` the directory whose `skills` the hooks push (default: the
//! profile home).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_sandbox::line_driver::{LineDriver, RunOutput, emit};
use agent_sandbox::{
    ApiKeySource, Backend, Config, Endpoints, HookError, PushKind, SandboxMode, Scope, Services,
    StateHooks, StateTransport, WriterArbitration, host_state_files,
};
use e2b_client::ApiKey;

struct SessionHooks {
    home: PathBuf,
    push_from: PathBuf,
    hang_in_push: AtomicBool,
}

impl StateHooks for SessionHooks {
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        let mut files = host_state_files(
            &self.push_from,
            &["skills"],
            transport.remote_hermes_home()?,
        );
        if kind == PushKind::Initial && self.hang_in_push.swap(false, Ordering::SeqCst) {
            files.truncate(1);
            transport.upload_many(files)?;
            emit("pushing")?;
            loop {
                std::thread::park();
            }
        }
        transport.upload_many(files)?;
        Ok(())
    }

    fn pull(&self, transport: &StateTransport) -> Result<(), HookError> {
        let path = self.home.join("cache").join("session-pull.tar");
        let mut file = std::fs::File::create(path)?;
        transport.download_state(&mut file)?;
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, home, task] = &args[..] else {
        return Err("usage: sandbox-session <api url> <profile home> <task id>".into());
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let mut config = Config::new(ApiKeySource::Key(ApiKey::new(
        "session-local-key".to_owned(),
    )));
    config.endpoints = Endpoints::single(url.clone());
    config.mode = SandboxMode::Persistent;
    if let Ok(term) = std::env::var("SANDBOX_SESSION_WRITER_TERM") {
        config.writer_arbitration = WriterArbitration::Sandbox {
            term: Duration::from_secs(term.parse()?),
        };
    }
    config.coordination_dir =
        std::env::var_os("SANDBOX_SESSION_COORDINATION_DIR").map(PathBuf::from);
    let hooks = Arc::new(SessionHooks {
        home: PathBuf::from(home),
        push_from: std::env::var_os("SANDBOX_SESSION_PUSH_FROM")
            .map_or_else(|| PathBuf::from(home), PathBuf::from),
        hang_in_push: AtomicBool::new(
            std::env::var("SANDBOX_SESSION_HANG_IN_PUSH").is_ok_and(|v| v == "1"),
        ),
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
        run_timeout: Duration::from_secs(120),
        output: RunOutput::Count,
    };
    driver.serve(&backend, std::io::stdin().lock())?;
    Ok(())
}
