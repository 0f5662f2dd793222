//! Drives one backend session from standard input, for multi-process tests and debugging.
//!
//! ```text
//! sandbox-session <api url> <profile home> <task id>
//! ```
//!
//! Commands, one per line: `attach`, `run <shell command>`, `cleanup`, `finalize`, `quit`.
//! Each answers with one line: `attached <sandbox id> <role>`, `exit <code> <output bytes>`,
//! `cleanup <pull outcome>`, `finalized`, or `error <message>`. The state hooks push
//! `<profile home>/skills` and pull into `<profile home>/cache/session-pull.tar`. With
//! `SANDBOX_SESSION_HANG_IN_PUSH=1` the first initial push uploads one file, prints `pushing`
//! and then never returns (for tests that kill a writer mid-push).
//!
//! Standing in for another machine (writer arbitration tests): `SANDBOX_SESSION_WRITER_TERM=<s>`
//! turns on `writer_arbitration: sandbox` with that grant term, `SANDBOX_SESSION_COORDINATION_DIR`
//! gives the host coordination directory (host lock, host id), and
//! `SANDBOX_SESSION_PUSH_FROM` the directory whose `skills` the hooks push (default: the
//! profile home).

#![allow(clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_sandbox::{
    ApiKeySource, Backend, Config, DiscardSink, Endpoints, ErrorChain, HookError, PushKind,
    RunOptions, SandboxMode, Scope, Services, StateHooks, StateTransport, WriterArbitration,
    host_state_files,
};
use e2b_client::ApiKey;

struct SessionHooks {
    home: PathBuf,
    push_from: PathBuf,
    hang_in_push: AtomicBool,
}

impl StateHooks for SessionHooks {
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError> {
        let mut files =
            host_state_files(&self.push_from, &["skills"], transport.remote_hermes_home());
        if kind == PushKind::Initial && self.hang_in_push.swap(false, Ordering::SeqCst) {
            files.truncate(1);
            transport.upload_many(files)?;
            println!("pushing");
            std::io::stdout().flush()?;
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
                let options = RunOptions::new(Duration::from_secs(120));
                match backend.run(rest, options, Box::new(DiscardSink)) {
                    Ok(command) => match command.wait() {
                        Ok(exit) => format!("exit {} {}", exit.exit_code, exit.forwarded_bytes),
                        Err(error) => format!("error {}", ErrorChain(&error)),
                    },
                    Err(error) => format!("error {}", ErrorChain(&error)),
                }
            }
            "cleanup" => format!("cleanup {:?}", backend.cleanup().pull),
            "finalize" => {
                backend.finalize();
                "finalized".to_owned()
            }
            "quit" => break,
            other => format!("error unknown command {other:?}"),
        };
        println!("{}", answer.replace('\n', " "));
        std::io::stdout().flush()?;
    }
    Ok(())
}
