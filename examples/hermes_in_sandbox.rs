//! Hermes Agent running inside an E2B sandbox, driven by the native E2B client alone.
//!
//! This is E2B's "run Hermes in a sandbox" flow: create a sandbox from the `hermes` template
//! with the provider key in its environment and deny-all egress, run a headless turn
//! (`hermes chat -Q -q "..."`) whose output streams as it is produced, write files for the
//! agent, continue the same session with a second turn in the same sandbox (`-c`), kill it.
//! Hermes' terminal and file tools then act on the sandbox, never on this machine. A failed
//! turn stops the flow; the sandbox is still killed and the example exits with an error.
//!
//! ```text
//! cargo run --example hermes_in_sandbox                  # embedded e2b-local, stand-in Hermes
//! E2B_API_KEY=e2b_... OPENROUTER_API_KEY=sk-or-... \
//!     HERMES_EXAMPLE_INTERNET=allow cargo run --example hermes_in_sandbox   # the real flow
//! ```
//!
//! Without `E2B_API_KEY` it starts e2b-local in-process with the `hermes` template enabled.
//! e2b-local has no Hermes, so the example writes a small stand-in `hermes` script into the
//! sandbox that answers plausibly from the sandbox's files and records the session, and it
//! says so in its output; no model is called. With `E2B_API_KEY` it uses E2B (honouring
//! `E2B_DOMAIN`, `E2B_API_URL`, `E2B_SANDBOX_URL`) and the template's real Hermes.
//!
//! `OPENROUTER_API_KEY`, when set on the host, is passed into the sandbox's environment and
//! never printed (the model is `HERMES_MODEL`, default `anthropic/claude-sonnet-4.6`).
//! Egress is deny-all by default, which also keeps the real Hermes from reaching its model
//! provider; `HERMES_EXAMPLE_INTERNET=allow` opens it.

#![allow(clippy::print_stdout)]

use std::io::Write as _;
use std::time::Duration;

use agent_sandbox_examples::e2b_client::{
    ApiKey, Client, Config, CreateOptions, KillOutcome, OnTimeout, ProcessEvent, Sandbox,
    SandboxId, StartOptions, UploadFile, redact,
};
use agent_sandbox_examples::e2b_local::{Server, ServerConfig};
use bytes::Bytes;
use futures::StreamExt as _;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The E2B template with the Hermes CLI installed.
const TEMPLATE: &str = "hermes";
/// The provider key passed into the sandbox when the host has it.
const PROVIDER_KEY_VAR: &str = "OPENROUTER_API_KEY";
const DEFAULT_MODEL: &str = "anthropic/claude-sonnet-4.6";
/// The sandbox's lease: both turns fit in it; it is killed at the end anyway.
const LEASE: Duration = Duration::from_secs(900);
/// One Hermes turn may take this long before envd kills it.
const TURN_DEADLINE: Duration = Duration::from_secs(600);

const RUNBOOK: &str = "\
# Checkout incident runbook
- Compare error rates by endpoint and release.
- Check dependency latency before proposing a rollback.
- Write findings to /home/user/reports/incident.md.
";
const FIRST_INCIDENT: &str =
    r#"{"release": "checkout-42", "error_rate": 0.08, "payments_p95_ms": 1700}"#;
const NEXT_INCIDENT: &str = r#"{"release": "checkout-43", "error_rate": 0.11, "errors_by_release": {"checkout-42": 3, "checkout-43": 417}}"#;

/// Where the stand-in goes; `~/.profile` puts its directory on the login shell's PATH, so
/// the commands below are the same ones the real flow runs.
const STAND_IN_PATH: &str = "/home/user/.local/bin/hermes";
const PROFILE_PATH: &str = "/home/user/.profile";
const PROFILE: &str = "export PATH=\"$HOME/.local/bin:$PATH\"\n";

/// A stand-in for the Hermes CLI's `chat` command, for e2b-local only. It answers from the
/// sandbox's files, keeps sessions in `~/.hermes/sessions` (so `-c` continues the latest)
/// and creates the skill a turn asks for in `~/.hermes/skills`. Paths go through `$HOME`,
/// because e2b-local may map `/home/user` to another host directory.
const STAND_IN: &str = r#"#!/bin/bash
# Stand-in for `hermes chat`, written by examples/hermes_in_sandbox.rs for e2b-local.
set -eu
[ "${1:-}" = chat ] || { echo "stand-in hermes: only 'chat' is supported" >&2; exit 2; }
shift
query="" continue_latest=0 skills=""
while [ $# -gt 0 ]; do
  case "$1" in
    -q|--query) query="$2"; shift 2 ;;
    -c|--continue) continue_latest=1; shift ;;
    --skills) skills="$2"; shift 2 ;;
    --provider|--model|--resume) shift 2 ;;
    *) shift ;;
  esac
done
sessions="$HOME/.hermes/sessions"
mkdir -p "$sessions"
if [ "$continue_latest" = 1 ] && [ -f "$sessions/latest" ]; then
  session=$(cat "$sessions/latest")
else
  session="session-$(date +%Y%m%d%H%M%S)-$$"
  echo "$session" > "$sessions/latest"
fi
printf 'user: %s\n' "$query" >> "$sessions/$session.log"
turn=$(grep -c '^user: ' "$sessions/$session.log")
key=absent
[ -n "${OPENROUTER_API_KEY:-}" ] && key=present
echo "[stand-in hermes] session $session, turn $turn, provider key $key"
release_of() { grep -o '"release": *"[^"]*"' "$1" | head -n 1 | sed 's/.*: *"\(.*\)"/\1/'; }
incidents="$HOME/incidents"
newest=$(ls -t "$incidents" 2>/dev/null | head -n 1)
if [ -n "$skills" ]; then
  if [ -f "$HOME/.hermes/skills/$skills/SKILL.md" ]; then
    echo "Loaded skill $skills."
  else
    echo "Skill $skills not found."
  fi
fi
if [ -n "$newest" ]; then
  echo "Newest incident: $newest (release $(release_of "$incidents/$newest"))."
fi
if [ "$turn" -gt 1 ]; then
  echo "Continuing from turn $((turn - 1)): $(sed -n "$((turn - 1))p" "$sessions/$session.log" | cut -c7-)"
fi
case "$query" in
  *"skill named "*)
    name=${query##*skill named }
    name=${name%% *}
    mkdir -p "$HOME/.hermes/skills/$name"
    printf -- '---\nname: %s\ndescription: Triage a checkout incident with the runbook.\n---\n' "$name" \
      > "$HOME/.hermes/skills/$name/SKILL.md"
    echo "Created skill $name from $(grep -c '^- ' "$HOME/runbook.md") runbook steps."
    ;;
esac
mkdir -p "$HOME/reports"
echo "turn $turn: $query" >> "$HOME/reports/incident.md"
echo "Findings written to /home/user/reports/incident.md."
"#;

/// Where the sandbox runs.
enum Target {
    /// E2B itself.
    Cloud,
    /// The embedded e2b-local server, with the `hermes` template enabled.
    Local(Server),
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let (target, config) = match ApiKey::from_env() {
        Some(key) => {
            let config = Config::from_env(key);
            // A URL may carry credentials (user:pass@); the redaction pass removes them.
            println!("target: E2B at {}", redact(&config.api_base_url()));
            (Target::Cloud, config)
        }
        None => {
            let mut server_config = ServerConfig::loopback();
            server_config.templates = vec!["base".to_owned(), TEMPLATE.to_owned()];
            let server = Server::start(server_config).await?;
            println!(
                "target: embedded e2b-local at {} (set E2B_API_KEY to run the real flow on E2B)",
                server.url()
            );
            println!(
                "NOTE: e2b-local has no Hermes. This run uses a STAND-IN `hermes` (a shell script \
                 written into the sandbox) that answers from the sandbox's files and records the \
                 session. No model is called."
            );
            // e2b-local accepts any non-empty key.
            let mut config = Config::new(ApiKey::new("e2b-local".to_owned()));
            config.api_url = Some(server.url());
            config.sandbox_url = Some(server.url());
            (Target::Local(server), config)
        }
    };
    let client = Client::new(config)?;

    let provider_key = std::env::var(PROVIDER_KEY_VAR)
        .ok()
        .filter(|key| !key.is_empty());
    let internet = std::env::var("HERMES_EXAMPLE_INTERNET").is_ok_and(|value| value == "allow");

    let mut options = CreateOptions::new(TEMPLATE.to_owned());
    options.timeout = Some(LEASE);
    options.on_timeout = OnTimeout::Kill;
    options.allow_internet_access = Some(internet);
    options
        .metadata
        .insert("example".to_owned(), "hermes_in_sandbox".to_owned());
    if let Some(key) = &provider_key {
        options
            .env_vars
            .insert(PROVIDER_KEY_VAR.to_owned(), key.clone());
    }
    let info = client.create(options).await?;
    let id = info.sandbox_id.clone();
    let sandbox = client.sandbox(info.envd_access())?;
    println!("created sandbox {id} from template `{TEMPLATE}`");
    match provider_key {
        Some(_) => println!("env: {PROVIDER_KEY_VAR} passed from the host (value not shown)"),
        None => println!("env: no {PROVIDER_KEY_VAR} on the host; Hermes uses its own config"),
    }

    let flow = run_flow(&client, &sandbox, &id, &target, provider_key.is_some()).await;

    // Killed however the flow ended: a sandbox holding a provider key should not linger.
    match client.kill(&id).await? {
        KillOutcome::Killed => println!("killed sandbox {id}"),
        KillOutcome::NotFound => println!("sandbox {id} was already gone"),
    }
    if let Target::Local(server) = target {
        server.shutdown().await?;
    }
    flow
}

async fn run_flow(
    client: &Client,
    sandbox: &Sandbox,
    id: &SandboxId,
    target: &Target,
    has_provider_key: bool,
) -> AnyResult<()> {
    // What E2B itself reports, rather than what was asked for.
    let detail = client.get(id).await?;
    match detail.allow_internet_access {
        Some(false) => println!("egress: deny-all (E2B reports allowInternetAccess=false)"),
        Some(true) => println!("egress: open (HERMES_EXAMPLE_INTERNET=allow)"),
        None => println!("egress: not reported by E2B"),
    }
    if let (Target::Cloud, Some(false)) = (target, detail.allow_internet_access) {
        println!(
            "note: deny-all egress also keeps Hermes from its model provider; \
             HERMES_EXAMPLE_INTERNET=allow opens it"
        );
    }

    if let Target::Local(_) = target {
        install_stand_in(sandbox).await?;
    }

    run(sandbox, "mkdir -p /home/user/incidents").await?;
    sandbox
        .write_files(vec![
            UploadFile::bytes("/home/user/runbook.md".to_owned(), Bytes::from(RUNBOOK)),
            UploadFile::bytes(
                "/home/user/incidents/first.json".to_owned(),
                Bytes::from(FIRST_INCIDENT),
            ),
        ])
        .await?;
    println!("wrote /home/user/runbook.md and /home/user/incidents/first.json");

    let common = hermes_prefix(has_provider_key);
    let first = run(
        sandbox,
        &format!(
            "{common} -q \"Study /home/user/runbook.md, apply it to \
             /home/user/incidents/first.json, and create a reusable skill named incident-triage\""
        ),
    )
    .await?;
    turn_succeeded(1, first)?;

    sandbox
        .write_file("/home/user/incidents/next.json", Bytes::from(NEXT_INCIDENT))
        .await?;
    println!("wrote /home/user/incidents/next.json");

    // The second turn continues the latest session in the same sandbox, so ~/.hermes, the
    // workspace and the skill from the first turn are all there.
    let second = run(
        sandbox,
        &format!(
            "{common} -c --skills incident-triage -q \"Use the incident-triage skill to \
             investigate the newest incident\""
        ),
    )
    .await?;
    turn_succeeded(2, second)?;

    run(sandbox, "ls ~/.hermes/skills").await?;
    Ok(())
}

/// A failed turn ends the flow (the sandbox is still killed) and the example's exit status.
fn turn_succeeded(turn: u32, exit_code: i32) -> AnyResult<()> {
    if exit_code == 0 {
        Ok(())
    } else {
        Err(format!("hermes turn {turn} failed with exit code {exit_code}").into())
    }
}

/// `hermes chat`, headless and quiet, with tools auto-approved (the sandbox is the boundary).
fn hermes_prefix(has_provider_key: bool) -> String {
    let mut prefix = "hermes chat -Q --yolo".to_owned();
    if has_provider_key {
        let model = std::env::var("HERMES_MODEL").unwrap_or_else(|_| DEFAULT_MODEL.to_owned());
        prefix.push_str(&format!(" --provider openrouter --model {model}"));
    }
    prefix
}

async fn install_stand_in(sandbox: &Sandbox) -> AnyResult<()> {
    sandbox
        .write_files(vec![
            UploadFile::bytes(STAND_IN_PATH.to_owned(), Bytes::from(STAND_IN)),
            UploadFile::bytes(PROFILE_PATH.to_owned(), Bytes::from(PROFILE)),
        ])
        .await?;
    // Uploads are not executable.
    let end = run_quietly(sandbox, "chmod +x ~/.local/bin/hermes").await?;
    if end != 0 {
        return Err(format!("installing the stand-in failed with exit code {end}").into());
    }
    println!("installed the stand-in at {STAND_IN_PATH}");
    Ok(())
}

/// Runs a command, printing it and streaming its output as it arrives; returns the exit
/// code.
async fn run(sandbox: &Sandbox, command: &str) -> AnyResult<i32> {
    println!("\n$ {command}");
    let mut options = StartOptions::shell(command.to_owned());
    options.timeout = Some(TURN_DEADLINE);
    let mut events = sandbox.start(options).await?;
    let mut stdout = std::io::stdout();
    let mut exit_code = -1;
    while let Some(event) = events.next().await {
        match event? {
            ProcessEvent::Stdout(chunk) => {
                stdout.write_all(&chunk)?;
                stdout.flush()?;
            }
            ProcessEvent::Stderr(chunk) => eprint!("{}", String::from_utf8_lossy(&chunk)),
            ProcessEvent::End(end) => exit_code = end.exit_code,
            _ => {}
        }
    }
    println!("[exit code {exit_code}]");
    Ok(exit_code)
}

async fn run_quietly(sandbox: &Sandbox, command: &str) -> AnyResult<i32> {
    let output = sandbox
        .run(StartOptions::shell(command.to_owned()), 64 * 1024)
        .await?;
    if !output.stderr.is_empty() {
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(output.end.exit_code)
}
