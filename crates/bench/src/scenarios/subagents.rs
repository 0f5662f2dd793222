//! The subagents scenario (R15): what `subagents: fork` costs a delegated child. Against the
//! same parent scope: a child's first command when it shares the parent's sandbox (one
//! command there), e2b-local's fork as `Backend::fork` makes it (one checkpoint, one create:
//! E2B's fork time as e2b-local models it), and `children` forks made for children, each
//! attached, its base read and its first command run. Then the bring-back of `files` new
//! files from a child, beside `tar` moving the same number of files between the same two
//! sandboxes through the same client (pack, download, upload, unpack). The home holds
//! `home_files` other files from before the fork (a project, dotfiles): the bring-back
//! compares the whole home, as it does for a user.

use agent_sandbox::ChildId;

use super::*;

/// Where the children work: the sandbox user's home on e2b-local.
const DIR: &str = "/home/user/bench-subagents";

/// `children`: forks made at once; `files`: new files (4 KiB each) brought back;
/// `home_files`: files already in the home at the fork (1 KiB each).
pub(super) fn subagents(params: &Value, protocol: &mut Protocol) -> Result<(), BenchError> {
    let children = param_u64(params, "children")?;
    let files = param_u64(params, "files")?;
    let home_files = param_u64(params, "home_files")?;
    let runtime = runtime()?;
    let home = tempfile::tempdir()?;
    let parent = backend(&runtime, SandboxMode::Persistent, home.path())?;
    run_to_end(
        &parent,
        &format!(
            "mkdir -p {DIR} && echo base > {DIR}/base.txt && mkdir -p ~/project && cd ~/project && \
             i=0; while [ $i -lt {home_files} ]; do mkdir -p d$((i / 100)) && \
             head -c 1024 /dev/urandom > d$((i / 100))/f$i; i=$((i+1)); done"
        ),
        BULK_DEADLINE,
    )?;
    let ids: Vec<ChildId> = (0..children)
        .map(|i| ChildId::new(&format!("bench-{i}")))
        .collect::<Result<_, _>>()?;
    let mark = protocol.ready()?;

    let started = Instant::now();
    run_to_end(&parent, "true", COMMAND_DEADLINE)?;
    let shared_first = started.elapsed();

    let started = Instant::now();
    let fork = parent.fork(1, DEFAULT_CHECKPOINT_WAIT)?;
    let raw_fork = started.elapsed();
    parent.discard(&fork)?;

    let started = Instant::now();
    let mut made = Vec::new();
    let mut commands = Duration::ZERO;
    for child in parent.fork_children(&ids, DIR, DEFAULT_CHECKPOINT_WAIT)? {
        let child = child?;
        let command = Instant::now();
        run_to_end(child.backend(), "true", COMMAND_DEADLINE)?;
        commands += command.elapsed();
        made.push(child);
    }
    let fork_first = started.elapsed();
    // Made, attached and its base read: what the fork itself costs the children.
    let ready = fork_first.saturating_sub(commands);

    let first = made.first().ok_or("no child was made")?;
    let write = |dir: &str| {
        format!(
            "mkdir -p {dir} && cd {dir} && i=0; while [ $i -lt {files} ]; do \
             head -c 4096 /dev/urandom > f$i; i=$((i+1)); done"
        )
    };
    run_to_end(first.backend(), &write(DIR), BULK_DEADLINE)?;
    // Both timed moves start with the files just written on disk: neither pays the other's
    // writeback.
    let settle = |backend: &Backend| run_to_end(backend, "sync", BULK_DEADLINE);
    settle(first.backend())?;
    settle(&parent)?;
    let started = Instant::now();
    let back = parent.bring_back(first)?;
    let bring_back = started.elapsed();
    if back.written.len() as u64 != files {
        return Err(format!("{} files came back, not {files}", back.written.len()).into());
    }

    // The same number of new files, moved by tar through the same client.
    let other = format!("{DIR}-tar");
    run_to_end(first.backend(), &write(&other), BULK_DEADLINE)?;
    settle(first.backend())?;
    settle(&parent)?;
    let started = Instant::now();
    run_to_end(
        first.backend(),
        &format!("tar -cf /tmp/bench.tar -C {other} ."),
        BULK_DEADLINE,
    )?;
    let archive = first.backend().read_file("/tmp/bench.tar", 1 << 30)?;
    parent.write_file("/tmp/bench.tar", archive)?;
    run_to_end(
        &parent,
        &format!("mkdir -p {other} && tar -xf /tmp/bench.tar -C {other} && rm /tmp/bench.tar"),
        BULK_DEADLINE,
    )?;
    let tar = started.elapsed();

    let mut figures = Map::new();
    figures.insert("children".into(), children.into());
    figures.insert("files".into(), files.into());
    figures.insert("home_files".into(), home_files.into());
    figures.insert("shared_first_ms".into(), millis(shared_first));
    figures.insert("raw_fork_ms".into(), millis(raw_fork));
    figures.insert(
        "fork_ready_ms_per_child".into(),
        (ready.as_secs_f64() * 1000.0 / children.max(1) as f64).into(),
    );
    figures.insert(
        "fork_first_ms_per_child".into(),
        (fork_first.as_secs_f64() * 1000.0 / children.max(1) as f64).into(),
    );
    figures.insert("bring_back_ms".into(), millis(bring_back));
    figures.insert("tar_ms".into(), millis(tar));
    let result = protocol.result(&mark, figures);
    for child in made {
        parent.end_child(child)?;
    }
    parent.cleanup();
    result
}

fn millis(duration: Duration) -> Value {
    (duration.as_secs_f64() * 1000.0).into()
}
