//! The checkpoint, rollback and snapshot scenarios, and the state they push.

use super::*;

/// The state push of a Hermes-like host: `skills/` and `memories/` of the host's home, in one
/// `upload_many` (the SDK peer pushes the same files with one `files.write_files`).
#[derive(Debug)]
struct PushHome(PathBuf);

impl StateHooks for PushHome {
    fn push(&self, transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        let files = host_state_files(
            &self.0,
            &["skills", "memories"],
            transport.remote_hermes_home()?,
        );
        transport.upload_many(files)?;
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}

/// `files` small state files under `home` (skills/ and memories/), as a Hermes home holds;
/// the SDK peer writes the same names and contents.
fn make_state(home: &Path, files: u64) -> Result<(), BenchError> {
    for i in 0..files {
        let rel = if i % 4 == 0 {
            format!("memories/note-{i:03}.md")
        } else {
            format!("skills/skill-{:02}/SKILL.md", i)
        };
        let path = home.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, format!("state file {i}\n").repeat(32))?;
    }
    Ok(())
}

fn manual_checkpoint(label: Option<String>) -> CheckpointRequest {
    CheckpointRequest {
        label,
        reason: CheckpointReason::Manual,
        wait: DEFAULT_CHECKPOINT_WAIT,
    }
}

/// `Backend::checkpoint`, `checkpoints` times, on the scope's attached sandbox (the SDK peer:
/// `create_snapshot` as many times).
pub(super) fn checkpoint(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let checkpoints = param_u64(params, "checkpoints")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let backend = backend(&runtime, SandboxMode::Persistent, home.path())?;
    run_to_end(&backend, "true", COMMAND_DEADLINE)?;
    let mark = protocol.ready()?;
    let started = Instant::now();
    for _ in 0..checkpoints {
        backend.checkpoint(manual_checkpoint(None))?;
    }
    let wall = started.elapsed();
    let mut figures = Map::new();
    figures.insert("ops".into(), checkpoints.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    // Every one of them is listed for the scope: none was a no-op.
    let listed = backend.checkpoints()?.len() as u64;
    if listed != checkpoints {
        return Err(format!("{listed} checkpoints listed after {checkpoints}").into());
    }
    backend.prune_checkpoints(0)?;
    backend.cleanup();
    Ok(())
}

/// `Backend::rollback` to a checkpoint, `rollbacks` times, with the host's state (`files`
/// files) pushed into each new sandbox. The SDK peer does the same steps: read the old
/// sandbox's state, snapshot it (the undo point), create a sandbox from the checkpoint, kill
/// the old one, empty the new one's state roots and push the same state files.
pub(super) fn rollback(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let rollbacks = param_u64(params, "rollbacks")?;
    let files = param_u64(params, "files")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    make_state(home.path(), files)?;
    let hooks = Arc::new(PushHome(home.path().to_path_buf()));
    let backend = backend_with(&runtime, SandboxMode::Persistent, home.path(), hooks)?;
    run_to_end(
        &backend,
        "echo base > /home/user/workspace.txt",
        COMMAND_DEADLINE,
    )?;
    // By its snapshot id, as the SDK peer holds it (a label costs one snapshot list more).
    let base = backend.checkpoint(manual_checkpoint(Some("base".to_owned())))?;
    run_to_end(
        &backend,
        "echo broken > /home/user/workspace.txt",
        COMMAND_DEADLINE,
    )?;
    let before = backend.info().ok_or("not attached")?.sandbox_id;
    let mark = protocol.ready()?;
    let started = Instant::now();
    for _ in 0..rollbacks {
        backend.rollback(
            CheckpointTarget::Named(base.snapshot_id.clone()),
            DEFAULT_CHECKPOINT_WAIT,
        )?;
    }
    let wall = started.elapsed();
    let mut figures = Map::new();
    figures.insert("ops".into(), rollbacks.into());
    figures.insert("wall_s".into(), seconds(wall));
    protocol.result(&mark, figures)?;
    // The workspace is the checkpoint's, the state the host's, in another sandbox.
    let after = backend.info().ok_or("not attached")?.sandbox_id;
    let check = format!(
        "grep -qx base /home/user/workspace.txt && test $(find /home/user/.hermes/skills \
         /home/user/.hermes/memories -type f | wc -l) -eq {files}"
    );
    run_to_end(&backend, &check, COMMAND_DEADLINE)?;
    if after == before {
        return Err(format!("the rollback kept sandbox {before}").into());
    }
    backend.prune_checkpoints(0)?;
    backend.cleanup();
    Ok(())
}

/// Runs a shell command in `sandbox` and returns its stdout; fails on a non-zero exit.
async fn sandbox_sh(sandbox: &e2b_client::Sandbox, command: &str) -> Result<String, BenchError> {
    let options = e2b_client::StartOptions::shell(command.to_owned());
    let output = sandbox.run(options, 1 << 20).await?;
    if output.end.exit_code != 0 {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{command:?} exited with {}: {stderr}", output.end.exit_code).into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The median of a few timings.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// e2b-local's snapshot (`POST /sandboxes/{id}/snapshots` through e2b-client) of a sandbox
/// holding `bytes` in `files` files, against `cp -a` of the same tree in the same sandbox, in
/// turns (`rounds` of each, a `sync` before every timed step so one step's writeback does not
/// land in the next; each copy is removed before the next round). Both copies land on the
/// filesystem of e2b-local's state directory. Also says whether that filesystem reflinks
/// (`cp --reflink=always` of one file), which decides whether either copy is copy-on-write.
pub(super) fn snapshot(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let files = param_u64(params, "files")?;
    let bytes = param_u64(params, "bytes")?;
    let rounds = param_u64(params, "rounds")?.max(1);
    let dirs = 100;
    let per_dir = files.div_ceil(dirs);
    let file_bytes = bytes / (dirs * per_dir);
    let runtime = runtime()?;
    let mut config = e2b_client::Config::from_env(ApiKey::new(env("E2B_API_KEY")?));
    // Copying 1 GiB on a loaded machine can outlast the default per-request deadline.
    config.request_deadline = BULK_DEADLINE;
    let client = e2b_client::Client::new(config)?;
    let mut options = e2b_client::CreateOptions::new("base".to_owned());
    options.timeout = Some(Duration::from_secs(3600));
    let info = runtime.block_on(client.create(options))?;
    let sandbox = client.sandbox(info.envd_access())?;
    // `split` cuts one stream of random bytes into the files of a directory: 100 processes
    // of each instead of one per file.
    let fill = format!(
        "set -e; mkdir -p /home/user/tree; cd /home/user/tree; for d in $(seq -w 0 {last}); do \
         mkdir d$d; head -c {chunk} /dev/urandom | split -b {file_bytes} -a 3 -d - d$d/f; done; \
         find . -type f | wc -l; du -sb . | cut -f1",
        last = dirs - 1,
        chunk = file_bytes * per_dir,
    );
    let made = runtime.block_on(sandbox_sh(&sandbox, &fill))?;
    let reflinks = runtime.block_on(sandbox_sh(
        &sandbox,
        "cd /home/user && if cp --reflink=always tree/d00/f000 .reflink-probe 2>/dev/null; \
         then echo yes; else echo no; fi; rm -f .reflink-probe",
    ))? == "yes";
    let mark = protocol.ready()?;
    let mut snapshot_s = Vec::new();
    let mut cp_s = Vec::new();
    for _ in 0..rounds {
        runtime.block_on(sandbox_sh(&sandbox, "sync"))?;
        let nanos = runtime.block_on(sandbox_sh(
            &sandbox,
            "s=$(date +%s%N); cp -a /home/user/tree /tmp/tree-copy; e=$(date +%s%N); echo $((e - s))",
        ))?;
        cp_s.push(nanos.parse::<f64>()? / 1e9);
        runtime.block_on(sandbox_sh(&sandbox, "rm -rf /tmp/tree-copy; sync"))?;
        let started = Instant::now();
        let taken = runtime.block_on(client.create_snapshot(&info.sandbox_id, None))?;
        snapshot_s.push(started.elapsed().as_secs_f64());
        runtime.block_on(client.delete_snapshot(&taken.snapshot_id))?;
    }
    let (snapshot_median, cp_median) = (median(snapshot_s.clone()), median(cp_s.clone()));
    let mut figures = Map::new();
    figures.insert("ops".into(), rounds.into());
    figures.insert("made".into(), made.into());
    figures.insert("files".into(), (dirs * per_dir).into());
    figures.insert("bytes".into(), (dirs * per_dir * file_bytes).into());
    figures.insert("copy_on_write".into(), reflinks.into());
    figures.insert("snapshot_s".into(), snapshot_s.into());
    figures.insert("cp_s".into(), cp_s.into());
    figures.insert("wall_s".into(), snapshot_median.into());
    figures.insert("cp_wall_s".into(), cp_median.into());
    protocol.result(&mark, figures)?;
    runtime.block_on(client.kill(&info.sandbox_id))?;
    Ok(())
}
