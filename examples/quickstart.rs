//! The main job on the embedded default: an E2B sandbox on this machine.
//!
//! Starts e2b-local in-process on a free loopback port and shows, in two parts:
//!
//! 1. The native E2B client on its own: create a sandbox, stream a command's output as it
//!    is produced, write and read files, pause it, and resume it with its files intact.
//! 2. The agent backend (`agent-sandbox`) on a persistent scope across a restart: a first
//!    `Backend` creates the scope's sandbox and a command writes a skill file into the
//!    sandbox's `~/.hermes/skills/`; the lease runs out and E2B pauses the sandbox; a new
//!    `Backend` on the same scope finds it again by metadata, resumes it, and its writer
//!    bring-up recovers the skill file onto the host's Hermes home.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! The same code talks to E2B itself when pointed at it with a real API key; this example
//! always uses the local server. `tests/it/quickstart.rs` runs it and checks what it prints.

#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use agent_sandbox_examples::agent_sandbox::{
    self, ApiKeySource, Backend, ChannelSink, Endpoints, HookError, KillOutcomeReport, Origin,
    PushKind, RoleKind, RunOptions, SandboxMode, Scope, Services, StateHooks, StateTransport,
};
use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, ConnectState, CreateOptions, OnTimeout, PauseMemory, PauseOutcome,
    ProcessEvent, SandboxId, StartOptions, UploadFile,
};
use agent_sandbox_examples::e2b_local::Server;
use bytes::Bytes;
use futures::StreamExt as _;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The local server accepts any non-empty key; a real one would come from E2B_API_KEY.
const LOCAL_KEY: &str = "quickstart-local-key";

/// The skill the first session writes inside the sandbox, relative to the Hermes home.
const SKILL: &str = "skills/quickstart/SKILL.md";

fn main() -> Result<()> {
    run(&mut std::io::stdout())
}

/// Runs both parts, writing what happens to `out`.
pub(crate) fn run(out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let server = runtime.block_on(Server::start_loopback())?;
    writeln!(out, "e2b-local listening on {}", server.url())?;

    let mut config = Config::new(ApiKey::new(LOCAL_KEY.to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    let client = Client::new(config)?;

    writeln!(out, "\n== Part 1: the E2B client ==")?;
    runtime.block_on(client_tour(&client, out))?;

    writeln!(out, "\n== Part 2: a persistent Backend across a restart ==")?;
    // Backend methods block: they run here, on a plain thread, driving the runtime's handle.
    backend_restart(&runtime, &server, &client, out)?;

    runtime.block_on(server.shutdown())?;
    Ok(())
}

/// Part 1: create, stream, write and read files, pause, resume, kill.
async fn client_tour(client: &Client, out: &mut dyn Write) -> Result<()> {
    // Persistent-style lifecycle: when the lease runs out the sandbox pauses, keeping files.
    let mut options = CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(300));
    options.on_timeout = OnTimeout::Pause(PauseMemory::Discard);
    options
        .metadata
        .insert("example".to_owned(), "quickstart".to_owned());
    let info = client.create(options).await?;
    let id = info.sandbox_id.clone();
    writeln!(out, "created sandbox {id}")?;

    let sandbox = client.sandbox(info.envd_access())?;

    // Output is delivered chunk by chunk while the command is still running.
    let command = "for i in 1 2 3; do echo line $i; sleep 0.3; done; whoami; pwd";
    writeln!(out, "\n$ {command}")?;
    let started = Instant::now();
    let mut events = sandbox
        .start(StartOptions::shell(command.to_owned()))
        .await?;
    while let Some(event) = events.next().await {
        match event? {
            ProcessEvent::Start { pid } => writeln!(out, "  [started, pid {pid}]")?,
            ProcessEvent::Stdout(chunk) => {
                let at = started.elapsed().as_millis();
                for line in String::from_utf8_lossy(&chunk).lines() {
                    writeln!(out, "  [+{at:>4} ms] {line}")?;
                }
                out.flush()?;
            }
            ProcessEvent::Stderr(chunk) => eprint!("{}", String::from_utf8_lossy(&chunk)),
            ProcessEvent::End(end) => writeln!(out, "  [exit code {}]", end.exit_code)?,
            _ => {}
        }
    }

    // Many files in one request; parent directories are created.
    let written = sandbox
        .write_files(vec![
            UploadFile::bytes(
                "/home/user/project/notes.md".to_owned(),
                Bytes::from_static(b"# notes\nkept across pause and resume\n"),
            ),
            UploadFile::bytes(
                "/home/user/project/src/main.py".to_owned(),
                Bytes::from_static(b"print('hello from the sandbox')\n"),
            ),
        ])
        .await?;
    writeln!(out, "\nwrote {} files:", written.len())?;
    for file in &written {
        writeln!(out, "  {}", file.path)?;
    }
    let notes = sandbox
        .read_file("/home/user/project/notes.md", 1 << 20)
        .await?;
    writeln!(out, "read back notes.md:\n{}", indent(&notes))?;

    // Pause, then resume by connecting: the files are still there.
    match client.pause(&id).await? {
        PauseOutcome::Paused => writeln!(out, "\npaused {id}")?,
        PauseOutcome::AlreadyPaused => writeln!(out, "\n{id} was already paused")?,
    }
    let state = client.get(&id).await?.summary.state;
    writeln!(out, "state after pause: {state:?}")?;

    let connected = client.connect(&id, Duration::from_secs(300)).await?;
    let how = match connected.state {
        ConnectState::Resumed => "resumed",
        ConnectState::Running => "was still running",
    };
    writeln!(out, "connect: {how}")?;
    // A resume can hand out a new envd token or domain, so use the returned access.
    let sandbox = client.sandbox(connected.sandbox.envd_access())?;
    let output = sandbox
        .start(StartOptions::shell(
            "cat /home/user/project/notes.md && python3 /home/user/project/src/main.py 2>/dev/null || true"
                .to_owned(),
        ))
        .await?
        .collect_output(1 << 20)
        .await?;
    writeln!(out, "after resume:\n{}", indent(&output.stdout))?;

    client.kill(&id).await?;
    writeln!(out, "\nkilled {id}")?;
    Ok(())
}

/// Part 2: two Backends, one after the other, on one persistent scope.
fn backend_restart(
    runtime: &tokio::runtime::Runtime,
    server: &Server,
    client: &Client,
    out: &mut dyn Write,
) -> Result<()> {
    // The profile's Hermes home on the host (Hermes: ~/.hermes).
    let home = tempfile::tempdir()?;
    let host_skill = home.path().join(SKILL);
    writeln!(out, "host Hermes home: {}", home.path().display())?;

    // Session 1: first use finds no sandbox for this scope and creates it as the writer.
    let hooks = SkillHooks::new(home.path());
    let first = backend(runtime, server, home.path(), hooks)?;
    let command = format!(
        "mkdir -p ~/.hermes/skills/quickstart && echo '# quickstart skill: written in the sandbox' > ~/.hermes/{SKILL} && echo written"
    );
    let output = run_command(&first, &command)?;
    let info = first.info().ok_or("session 1 is not attached")?;
    let id = info.sandbox_id;
    writeln!(
        out,
        "\nsession 1: first use {} sandbox {id} as the {}",
        origin(info.origin),
        role(info.role)
    )?;
    writeln!(out, "session 1: $ {command}\n{}", indent(output.as_bytes()))?;
    // The process dies without its cleanup (a crash): the finalizer lets the writer role go
    // and pulls nothing, so the skill exists only in the sandbox. (A cleanup would have
    // recovered it onto the host before leaving.)
    first.finalize();
    writeln!(
        out,
        "session 1: ended without its cleanup (a crash): the writer role is released, nothing pulled"
    )?;
    writeln!(out, "host has {SKILL}: {}", host_skill.exists())?;

    // Nobody uses the sandbox: its lease runs out (on the server's clock) and E2B pauses it.
    server.clock().advance(Duration::from_secs(3600));
    let sandbox_id = SandboxId::parse(id.clone()).ok_or("invalid sandbox id")?;
    let state = runtime.block_on(client.get(&sandbox_id))?.summary.state;
    writeln!(
        out,
        "\nan hour later, the lease has run out: {id} is {state:?}"
    )?;

    // Session 2, the restart: a new Backend on the same scope.
    let hooks = SkillHooks::new(home.path());
    let second = backend(runtime, server, home.path(), Arc::clone(&hooks))?;
    let info = second.attach()?;
    let resumed = if info.resumed { ", resumed" } else { "" };
    writeln!(
        out,
        "\nsession 2: attached to {} ({}{resumed}) as the {}",
        info.sandbox_id,
        origin(info.origin),
        role(info.role)
    )?;
    let recovered = match hooks.seen_at_initial_push() {
        Some(true) => "recovered",
        Some(false) => "NOT recovered",
        None => "no bring-up ran",
    };
    writeln!(
        out,
        "session 2: bring-up {recovered} {SKILL} onto the host:"
    )?;
    writeln!(out, "  {}", host_skill.display())?;
    let on_host = std::fs::read(&host_skill).unwrap_or_default();
    writeln!(out, "  {}", indent(&on_host).trim_start())?;
    let output = run_command(&second, &format!("cat ~/.hermes/{SKILL}"))?;
    writeln!(
        out,
        "session 2: $ cat ~/.hermes/{SKILL}\n{}",
        indent(output.as_bytes())
    )?;
    let report = second.cleanup();
    writeln!(out, "session 2: cleanup: {}", fate(&report.sandbox))?;
    Ok(())
}

/// A persistent Backend for the profile at `home`, on the local server.
fn backend(
    runtime: &tokio::runtime::Runtime,
    server: &Server,
    home: &Path,
    hooks: Arc<SkillHooks>,
) -> Result<Backend> {
    let mut config =
        agent_sandbox::Config::new(ApiKeySource::Key(ApiKey::new(LOCAL_KEY.to_owned())));
    config.endpoints = Endpoints::single(server.url());
    config.mode = SandboxMode::Persistent;
    let scope = Scope {
        profile_home: home.to_path_buf(),
        // Hermes' CLI task key; every Backend on this (home, task) shares one sandbox.
        task_id: "default".to_owned(),
    };
    Ok(Backend::new(
        config,
        scope,
        Services::new(runtime.handle().clone()),
        hooks,
    )?)
}

/// Runs `command` to completion; its output arrives through a channel, chunk by chunk.
fn run_command(backend: &Backend, command: &str) -> Result<String> {
    let (tx, rx) = mpsc::channel();
    let running = backend.run(
        command,
        RunOptions::new(Duration::from_secs(60)),
        Box::new(ChannelSink::unbounded(tx)),
    )?;
    let exit = running.wait()?;
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    if exit.exit_code != 0 {
        return Err(format!("`{command}` exited with {}", exit.exit_code).into());
    }
    Ok(String::from_utf8_lossy(&output).into_owned())
}

/// State hooks as an agent framework would write them: the initial push uploads the host's
/// skills. They pull nothing back at cleanup, so the skill written in session 1 exists only
/// in the sandbox and session 2 can get it only through resume recovery, which the backend
/// runs before the initial push.
struct SkillHooks {
    home: PathBuf,
    /// Whether the skill was on the host when the initial push ran (after recovery).
    seen_at_push: Mutex<Option<bool>>,
}

impl SkillHooks {
    fn new(home: &Path) -> Arc<SkillHooks> {
        Arc::new(SkillHooks {
            home: home.to_path_buf(),
            seen_at_push: Mutex::new(None),
        })
    }

    fn seen_at_initial_push(&self) -> Option<bool> {
        *self
            .seen_at_push
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl StateHooks for SkillHooks {
    fn push(
        &self,
        transport: &StateTransport,
        kind: PushKind,
    ) -> std::result::Result<(), HookError> {
        if kind != PushKind::Initial {
            return Ok(());
        }
        let skill = self.home.join(SKILL);
        *self
            .seen_at_push
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(skill.exists());
        if skill.exists() {
            transport.upload_many(vec![(skill, format!("/home/user/.hermes/{SKILL}"))])?;
        }
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> std::result::Result<(), HookError> {
        Ok(())
    }
}

fn origin(origin: Origin) -> &'static str {
    match origin {
        Origin::Created => "created",
        Origin::Adopted { .. } => "found by metadata",
        Origin::Connected => "connected to",
        Origin::Restored => "restored from a checkpoint into",
    }
}

fn role(role: RoleKind) -> &'static str {
    match role {
        RoleKind::Writer => "writer",
        RoleKind::Reader => "reader",
        RoleKind::Owner => "owner",
        RoleKind::Probe => "probe",
        RoleKind::External => "external user",
    }
}

fn fate(fate: &KillOutcomeReport) -> String {
    match fate {
        // A persistent sandbox is never paused or killed by the backend: E2B pauses it when
        // its lease runs out.
        KillOutcomeReport::LeftRunning => {
            "sandbox left running until its lease runs out".to_owned()
        }
        other => format!("{other:?}"),
    }
}

/// Command output, indented for display.
fn indent(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}
