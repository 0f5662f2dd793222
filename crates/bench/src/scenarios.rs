//! The scenarios: each sets up, reports `ready`, runs the measured part on `go`, prints its
//! figures and tears down on `done`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agent_sandbox::{
    ApiKey, ApiKeySource, Backend, CheckpointReason, CheckpointRequest, CheckpointTarget, Config,
    DEFAULT_CHECKPOINT_WAIT, DiscardSink, Endpoints, FnSink, HookError, NoStateHooks, OutputStream,
    PushKind, RoleKind, RunOptions, SandboxMode, Scope, Services, Shell, StateHooks,
    StateTransport, host_state_files,
};
use serde_json::{Map, Value, json};

use crate::{BenchError, Protocol};

mod checkpoints;
mod quiet;
mod scale;
mod subagents;
use checkpoints::{checkpoint, rollback, snapshot};
use quiet::quiet;
use scale::scale;
use subagents::subagents;

/// A command's deadline in the steady-state scenarios (the lease covers it plus the grace).
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);
/// The deadline of the bulk commands (1 GiB of output, 500 MiB of state).
const BULK_DEADLINE: Duration = Duration::from_secs(900);
/// The task id of every scenario's scope.
const TASK: &str = "bench";

/// Runs `scenario` with `params`.
pub(crate) fn run(
    scenario: &str,
    params: &Value,
    protocol: &mut Protocol,
) -> Result<(), BenchError> {
    match scenario {
        "steady" => steady(params, protocol),
        "upload" => upload(params, protocol),
        "stream" => stream(params, protocol),
        "pull" => pull(params, protocol),
        "recovery" => recovery_ours(params, protocol),
        "recovery-tar" => recovery_tar(params, protocol),
        "cold" => cold(params, protocol),
        "load" => load(params, protocol),
        "checkpoint" => checkpoint(params, protocol),
        "rollback" => rollback(params, protocol),
        "snapshot" => snapshot(params, protocol),
        "scale" => scale(params, protocol),
        "quiet" => quiet(params, protocol),
        "subagents" => subagents(params, protocol),
        other => Err(format!("unknown scenario {other:?}").into()),
    }
}

fn param_u64(params: &Value, key: &str) -> Result<u64, BenchError> {
    params
        .get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("parameter {key:?} must be a whole number").into())
}

fn param_str<'a>(params: &'a Value, key: &str) -> Result<&'a str, BenchError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("parameter {key:?} must be text").into())
}

fn env(name: &str) -> Result<String, BenchError> {
    std::env::var(name).map_err(|_| format!("{name} is not set").into())
}

/// One runtime per scenario process, as a framework binding would hold it.
fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// A backend on e2b-local for the scope `<home>` / [`TASK`].
fn backend(
    runtime: &tokio::runtime::Runtime,
    mode: SandboxMode,
    home: &Path,
) -> Result<Backend, BenchError> {
    backend_with(runtime, mode, home, Arc::new(NoStateHooks))
}

/// [`backend`] with these state hooks.
fn backend_with(
    runtime: &tokio::runtime::Runtime,
    mode: SandboxMode,
    home: &Path,
    hooks: Arc<dyn StateHooks>,
) -> Result<Backend, BenchError> {
    backend_configured(runtime, mode, home, hooks, |_| {})
}

/// [`backend_with`], its configuration changed by `configure` first.
fn backend_configured(
    runtime: &tokio::runtime::Runtime,
    mode: SandboxMode,
    home: &Path,
    hooks: Arc<dyn StateHooks>,
    configure: impl FnOnce(&mut Config),
) -> Result<Backend, BenchError> {
    let mut config = Config::new(ApiKeySource::Key(ApiKey::new(env("E2B_API_KEY")?)));
    config.endpoints = Endpoints::single(env("E2B_API_URL")?);
    config.mode = mode;
    configure(&mut config);
    let scope = Scope {
        profile_home: home.to_path_buf(),
        task_id: TASK.to_owned(),
    };
    Ok(Backend::new(
        config,
        scope,
        Services::new(runtime.handle().clone()),
        hooks,
    )?)
}

/// Runs `command` to its end, discarding output; fails on a non-zero exit.
fn run_to_end(backend: &Backend, command: &str, deadline: Duration) -> Result<(), BenchError> {
    let exit = backend
        .run(command, RunOptions::new(deadline), Box::new(DiscardSink))?
        .wait()
        .map_err(|error| error.to_string())?;
    if exit.exit_code != 0 {
        return Err(format!("{command:?} exited with {}", exit.exit_code).into());
    }
    Ok(())
}

fn mode_named(name: &str) -> Result<SandboxMode, BenchError> {
    match name {
        "persistent" | "reader" => Ok(SandboxMode::Persistent),
        "ephemeral" => Ok(SandboxMode::Ephemeral {
            lifetime: Duration::from_secs(300),
        }),
        other => Err(format!("unknown mode {other:?}").into()),
    }
}

fn seconds(elapsed: Duration) -> Value {
    Value::from(elapsed.as_secs_f64())
}

/// `true`, `commands` times, on a warmed-up backend: a persistent writer, a reader (a second
/// backend on the writer's scope) or an ephemeral owner.
fn steady(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let mode = param_str(params, "mode")?;
    let commands = param_u64(params, "commands")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let writer = backend(&runtime, mode_named(mode)?, home.path())?;
    run_to_end(&writer, "true", COMMAND_DEADLINE)?;
    let reader = if mode == "reader" {
        let reader = backend(&runtime, SandboxMode::Persistent, home.path())?;
        let info = reader.attach()?;
        if info.role != RoleKind::Reader {
            return Err(format!("the second session is {:?}, not a reader", info.role).into());
        }
        run_to_end(&reader, "true", COMMAND_DEADLINE)?;
        Some(reader)
    } else {
        None
    };
    let measured = reader.as_ref().unwrap_or(&writer);
    // The SDK's `commands.run` starts `/bin/bash -l -c`: the same login shell here, so both
    // sides ask the server for the same process.
    let mut options = RunOptions::new(COMMAND_DEADLINE);
    options.shell = Shell::Login;
    let mark = protocol.ready()?;
    let started = Instant::now();
    for _ in 0..commands {
        let exit = measured
            .run("true", options.clone(), Box::new(DiscardSink))?
            .wait()
            .map_err(|error| error.to_string())?;
        if exit.exit_code != 0 {
            return Err(format!("`true` exited with {}", exit.exit_code).into());
        }
    }
    let wall = started.elapsed();
    let mut figures = Map::new();
    figures.insert("ops".into(), commands.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    if let Some(reader) = reader {
        reader.cleanup();
    }
    writer.cleanup();
    Ok(())
}

/// Writes `files` files of `file_bytes` bytes in nested directories under `root`; returns
/// Hermes' `(host path, remote path)` pairs.
fn make_tree(
    root: &Path,
    files: u64,
    file_bytes: u64,
) -> Result<Vec<(PathBuf, String)>, BenchError> {
    let mut pairs = Vec::new();
    let body: Vec<u8> = (0..file_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    for i in 0..files {
        let rel = format!(
            "skills/group-{:02}/skill-{:03}/file-{i:05}.md",
            i % 20,
            i % 200
        );
        let path = root.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &body)?;
        pairs.push((path, format!("/home/user/.hermes/{rel}")));
    }
    Ok(pairs)
}

/// `StateTransport::upload_many` of a tree of small files.
fn upload(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let files = param_u64(params, "files")?;
    let file_bytes = param_u64(params, "file_bytes")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let tree = tempfile::tempdir()?;
    let pairs = make_tree(tree.path(), files, file_bytes)?;
    let backend = backend(&runtime, SandboxMode::Persistent, home.path())?;
    backend.attach()?;
    let transport = backend.transport()?;
    let mark = protocol.ready()?;
    let started = Instant::now();
    let sent = transport.upload_many(pairs)?;
    let wall = started.elapsed();
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("files".into(), sent.into());
    figures.insert("bytes".into(), (files * file_bytes).into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    // The files arrived: one of them is checked, so a benchmark cannot pass on an upload
    // that silently did nothing.
    let probe = "/home/user/.hermes/skills/group-00/skill-000/file-00000.md";
    let read = backend.read_file(probe, file_bytes + 1)?;
    if read.len() as u64 != file_bytes {
        return Err(format!("{probe} has {} bytes, not {file_bytes}", read.len()).into());
    }
    backend.cleanup();
    Ok(())
}

/// `Backend::run` of a command printing `bytes` bytes, into a sink that only counts.
fn stream(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let bytes = param_u64(params, "bytes")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let backend = backend(&runtime, SandboxMode::Persistent, home.path())?;
    run_to_end(&backend, "true", COMMAND_DEADLINE)?;
    let counted = Arc::new(AtomicU64::new(0));
    let sink_count = Arc::clone(&counted);
    let sink = FnSink(move |_stream: OutputStream, chunk: &[u8]| {
        sink_count.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(())
    });
    let mark = protocol.ready()?;
    let started = Instant::now();
    let exit = backend
        .run(
            &format!("head -c {bytes} /dev/zero"),
            RunOptions::new(BULK_DEADLINE),
            Box::new(sink),
        )?
        .wait()
        .map_err(|error| error.to_string())?;
    let wall = started.elapsed();
    let received = counted.load(Ordering::Relaxed);
    if exit.exit_code != 0 || received != bytes {
        return Err(format!(
            "received {received} of {bytes} bytes, exit {}",
            exit.exit_code
        )
        .into());
    }
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("bytes".into(), received.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    backend.cleanup();
    Ok(())
}

/// Counts what is written to it.
#[derive(Debug)]
struct CountingWriter(u64);

impl Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `StateTransport::download_state` of at least `bytes` of state (made by the orchestrator's
/// `fill` command, the same for the SDK peer) into a counting writer.
fn pull(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let bytes = param_u64(params, "bytes")?;
    let fill = param_str(params, "fill")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let backend = backend(&runtime, SandboxMode::Persistent, home.path())?;
    run_to_end(&backend, fill, BULK_DEADLINE)?;
    let transport = backend.transport()?;
    let mut dest = CountingWriter(0);
    let mark = protocol.ready()?;
    let started = Instant::now();
    let summary = transport.download_state(&mut dest)?;
    let wall = started.elapsed();
    if dest.0 < bytes {
        return Err(format!("the pulled archive has {} bytes, less than {bytes}", dest.0).into());
    }
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("bytes".into(), dest.0.into());
    figures.insert("summary".into(), format!("{summary:?}").into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    backend.cleanup();
    Ok(())
}

/// A snapshot archive of `files` small files (skills/ and memories/, as the sandbox's
/// snapshot command writes it), made with the system `tar` from a tree in `work`.
fn snapshot_archive(work: &Path, files: u64) -> Result<PathBuf, BenchError> {
    let tree = work.join("tree");
    for i in 0..files {
        let rel = if i % 10 == 0 {
            format!("memories/note-{i:05}.md")
        } else {
            format!(
                "skills/group-{:02}/skill-{:03}/file-{i:05}.md",
                i % 20,
                i % 400
            )
        };
        let path = tree.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, format!("file {i}\n").repeat(16))?;
    }
    let archive = work.join("snapshot.tar");
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&tree)
        .arg("-cf")
        .arg(&archive)
        .args(["skills", "memories"])
        .status()?;
    if !status.success() {
        return Err(format!("tar -c of the snapshot tree failed: {status}").into());
    }
    Ok(archive)
}

/// `recovery::recover` of a `files`-file snapshot into an empty Hermes home.
fn recovery_ours(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let files = param_u64(params, "files")?;
    let work = tempfile::tempdir()?;
    let archive = snapshot_archive(work.path(), files)?;
    let home = work.path().join("home");
    std::fs::create_dir(&home)?;
    let config = recovery::RecoveryConfig {
        hermes_home: home.clone(),
        sandbox_id: "benchsandbox".to_owned(),
        host_only: Vec::new(),
        max_snapshot_bytes: recovery::DEFAULT_MAX_SNAPSHOT_BYTES,
        push_base: None,
    };
    let mut source = std::fs::File::open(&archive)?;
    let mark = protocol.ready()?;
    let started = Instant::now();
    let report = recovery::recover(&config, &mut source)?;
    let wall = started.elapsed();
    let restored = report.files.len();
    if (restored as u64) < files {
        return Err(format!("recovery reported {restored} of {files} files").into());
    }
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("files".into(), restored.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)
}

/// The peer of [`recovery_ours`]: `tar -x` of the same archive into an empty directory (then
/// `sync -f` of it with `sync: true`).
fn recovery_tar(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let files = param_u64(params, "files")?;
    let work = tempfile::tempdir()?;
    let archive = snapshot_archive(work.path(), files)?;
    let home = work.path().join("home");
    std::fs::create_dir(&home)?;
    let mark = protocol.ready()?;
    let started = Instant::now();
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&home)
        .arg("-xf")
        .arg(&archive)
        .status()?;
    if !status.success() {
        return Err(format!("tar -x failed: {status}").into());
    }
    // Recovery makes every file durable before it takes its name; `sync: true` asks the same
    // of tar's output (one syncfs of the filesystem), for a like-for-like figure.
    if params.get("sync").and_then(Value::as_bool) == Some(true) {
        let status = std::process::Command::new("sync")
            .arg("-f")
            .arg(&home)
            .status()?;
        if !status.success() {
            return Err(format!("sync -f failed: {status}").into());
        }
    }
    let wall = started.elapsed();
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("files".into(), files.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)
}

/// The cold path of a persistent scope in `home`: `step` `create` finds nothing and creates;
/// `resume` finds the (paused) sandbox and resumes it. Either way: the first command.
fn cold(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let home = PathBuf::from(param_str(params, "home")?);
    let runtime = runtime()?;
    let backend = backend(&runtime, SandboxMode::Persistent, &home)?;
    let mark = protocol.ready()?;
    let started = Instant::now();
    run_to_end(&backend, "true", COMMAND_DEADLINE)?;
    let wall = started.elapsed();
    let info = backend.info().ok_or("not attached after a command")?;
    let mut figures = Map::new();
    figures.insert("ops".into(), 1.into());
    figures.insert("wall_s".into(), seconds(wall));
    figures.insert("sandbox_id".into(), info.sandbox_id.into());
    figures.insert("resumed".into(), info.resumed.into());
    protocol.result(&mark, figures)?;
    // Persistent: release locally, leave the sandbox to its lease (the orchestrator pauses it).
    backend.finalize();
    Ok(())
}

/// e2b-local under load: `sessions` sandboxes, each running `commands` commands, all at once.
fn load(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let sessions = param_u64(params, "sessions")?;
    let commands = param_u64(params, "commands")?;
    let runtime = runtime()?;
    let config = e2b_client::Config::from_env(ApiKey::new(env("E2B_API_KEY")?));
    let client = e2b_client::Client::new(config)?;
    let mut sandboxes = Vec::new();
    for _ in 0..sessions {
        let mut options = e2b_client::CreateOptions::new("base".to_owned());
        options.timeout = Some(Duration::from_secs(900));
        let info = runtime.block_on(client.create(options))?;
        sandboxes.push(client.sandbox(info.envd_access())?);
    }
    let mark = protocol.ready()?;
    let started = Instant::now();
    let tasks: Vec<_> = sandboxes
        .iter()
        .cloned()
        .map(|sandbox| {
            runtime.spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = Vec::new();
                for _ in 0..commands {
                    let begun = Instant::now();
                    let options = e2b_client::StartOptions::shell("true".to_owned());
                    match sandbox.run(options, 1024).await {
                        Ok(output) if output.end.exit_code == 0 => {
                            latencies.push(begun.elapsed().as_secs_f64());
                        }
                        Ok(output) => errors.push(format!("exit {}", output.end.exit_code)),
                        Err(error) => errors.push(error.to_string()),
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    for task in tasks {
        let (mut l, mut e) = runtime.block_on(task)?;
        latencies.append(&mut l);
        errors.append(&mut e);
    }
    let wall = started.elapsed();
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| -> Value {
        if latencies.is_empty() {
            return Value::Null;
        }
        let index = ((latencies.len() - 1) as f64 * q).round() as usize;
        Value::from(latencies[index])
    };
    let mut figures = Map::new();
    figures.insert("ops".into(), (sessions * commands).into());
    figures.insert("completed".into(), latencies.len().into());
    figures.insert("errors".into(), errors.len().into());
    figures.insert(
        "first_errors".into(),
        json!(errors.iter().take(3).collect::<Vec<_>>()),
    );
    figures.insert("p50_s".into(), quantile(0.50));
    figures.insert("p99_s".into(), quantile(0.99));
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    for sandbox in &sandboxes {
        // Best effort: the orchestrator stops the server after the run anyway.
        let _ = runtime.block_on(client.kill(sandbox.id()));
    }
    Ok(())
}
