//! The quiet scenario: what a chat that goes quiet costs (L17). One persistent scope with
//! `pause_after_idle` set runs one command whose deadline asks a long lease (as a Hermes
//! terminal call with a 600 s timeout does), then is left alone, or polled as Hermes polls
//! a background process; the figure is how long its sandbox runs after the command (E2B
//! bills running time), read from E2B's own state, beside what the lease alone would have
//! left it running.

use e2b_client::{SandboxId, SandboxState};

use super::*;

/// How often E2B's state is read while waiting for the pause: the figure's precision.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// `quiet_ms`: the `pause_after_idle` setting; `deadline_s`: the command's deadline;
/// `poll_ms` (0: none): a watcher's poll (`Purpose::Watch`, as Hermes' background-process
/// poller's commands are classified) this often while the chat is quiet.
pub(super) fn quiet(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let quiet = Duration::from_millis(param_u64(params, "quiet_ms")?);
    let deadline = Duration::from_secs(param_u64(params, "deadline_s")?);
    let poll = Duration::from_millis(param_u64(params, "poll_ms")?);
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let backend = backend_configured(
        &runtime,
        SandboxMode::Persistent,
        home.path(),
        Arc::new(NoStateHooks),
        |config| config.pause_after_idle = Some(quiet),
    )?;
    let client = e2b_client::Client::new(e2b_client::Config::from_env(ApiKey::new(env(
        "E2B_API_KEY",
    )?)))?;
    // Attached before the measured part: the figure is the quiet time, not the create.
    run_to_end(&backend, "true", COMMAND_DEADLINE)?;
    let sandbox_id = backend
        .info()
        .and_then(|info| SandboxId::parse(info.sandbox_id))
        .ok_or("the scope is not attached after its first command")?;
    let mark = protocol.ready()?;

    run_to_end(&backend, "true", deadline)?;
    let last_command = Instant::now();
    let detail = runtime.block_on(client.get(&sandbox_id))?;
    // What the lease alone leaves: the sandbox would run until E2B's `endAt`.
    let lease_left = std::time::SystemTime::from(detail.summary.end_at)
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
        .as_secs_f64();
    let give_up = last_command + quiet + Duration::from_secs(60);
    let mut polls = 0u64;
    let mut next_poll = last_command + poll;
    let running = loop {
        let now = Instant::now();
        if now > give_up {
            return Err(format!(
                "sandbox {sandbox_id} still running {:?} after its last command",
                now - last_command
            )
            .into());
        }
        if !poll.is_zero() && now >= next_poll {
            watch_poll(&backend)?;
            polls += 1;
            next_poll = Instant::now() + poll;
        }
        let state = runtime.block_on(client.get(&sandbox_id))?.summary.state;
        if state == SandboxState::Paused {
            break last_command.elapsed();
        }
        std::thread::sleep(LOOK_EVERY);
    };
    let mut figures = Map::new();
    figures.insert("setting_s".into(), seconds(quiet));
    figures.insert("deadline_s".into(), seconds(deadline));
    figures.insert("running_after_last_s".into(), seconds(running));
    figures.insert("lease_left_s".into(), lease_left.into());
    figures.insert("polls".into(), polls.into());
    figures.insert("precision_s".into(), seconds(LOOK_EVERY));
    protocol.result(&mark, figures)
}

/// One poll as Hermes' background-process poller makes it: a watcher's command, answered on
/// the host once the sandbox is paused.
fn watch_poll(backend: &Backend) -> Result<(), BenchError> {
    let mut options = RunOptions::new(COMMAND_DEADLINE);
    options.purpose = agent_sandbox::Purpose::Watch;
    options.answer_while_paused = Some((&b"0\n"[..]).into());
    backend
        .run("kill -0 1; echo $?", options, Box::new(DiscardSink))?
        .wait()
        .map_err(|error| error.to_string())?;
    Ok(())
}
