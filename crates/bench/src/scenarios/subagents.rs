//! The subagents scenario (R15): what `subagents: fork` costs a delegated child. Against the
//! same parent scope: a child's first command when it shares the parent's sandbox (one
//! command there), e2b-local's fork as `Backend::fork` makes it (one checkpoint, one create:
//! E2B's fork time as e2b-local models it), and `children` forks made for children, each
//! attached, its base read and its first command run. Then the bring-back of `files` new
//! files from a child, beside `tar` moving the same number of files between the same two
//! sandboxes through the same client (pack, download, upload, unpack): five rounds, each
//! with a fresh child, the two alternating which goes first; the medians. The home holds
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

    for child in made {
        parent.end_child(child)?;
    }
    let write = |dir: &str| {
        format!(
            "mkdir -p {dir} && cd {dir} && i=0; while [ $i -lt {files} ]; do \
             head -c 4096 /dev/urandom > f$i; i=$((i+1)); done"
        )
    };
    // Both timed moves start with the files just written on disk: neither pays the other's
    // writeback. Rounds (the machine's noise is as large as the figures), each with a fresh
    // child (a bring-back is once per child), the sides alternating which goes first; the
    // figures are the medians.
    let settle = |backend: &Backend| run_to_end(backend, "sync", BULK_DEADLINE);
    let mut bring_backs = Vec::new();
    let mut tars = Vec::new();
    for round in 0..ROUNDS {
        let id = ChildId::new(&format!("bench-round-{round}"))?;
        let child = parent
            .fork_children(&[id], DIR, DEFAULT_CHECKPOINT_WAIT)?
            .pop()
            .ok_or("no child was made")??;
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                let dir = format!("{DIR}/round-{round}");
                run_to_end(child.backend(), &write(&dir), BULK_DEADLINE)?;
                settle(child.backend())?;
                settle(&parent)?;
                let started = Instant::now();
                let back = parent.bring_back(&child)?;
                bring_backs.push(started.elapsed());
                if back.written.len() as u64 != files {
                    return Err(
                        format!("{} files came back, not {files}", back.written.len()).into(),
                    );
                }
                continue;
            }
            // The same number of new files, moved by tar through the same client.
            let other = format!("{DIR}-tar-{round}");
            run_to_end(child.backend(), &write(&other), BULK_DEADLINE)?;
            settle(child.backend())?;
            settle(&parent)?;
            let started = Instant::now();
            run_to_end(
                child.backend(),
                &format!("tar -cf /tmp/bench.tar -C {other} ."),
                BULK_DEADLINE,
            )?;
            let archive = child.backend().read_file("/tmp/bench.tar", 1 << 30)?;
            parent.write_file("/tmp/bench.tar", archive)?;
            run_to_end(
                &parent,
                &format!(
                    "mkdir -p {other} && tar -xf /tmp/bench.tar -C {other} && rm /tmp/bench.tar"
                ),
                BULK_DEADLINE,
            )?;
            tars.push(started.elapsed());
            // Moved behind the bring-back's back, into both sandboxes: out of its comparison
            // when it comes second.
            run_to_end(child.backend(), &format!("rm -rf {other}"), BULK_DEADLINE)?;
            run_to_end(&parent, &format!("rm -rf {other}"), BULK_DEADLINE)?;
        }
        parent.end_child(child)?;
    }
    let bring_back = median(&mut bring_backs);
    let tar = median(&mut tars);

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
    parent.cleanup();
    result
}

/// The timed rounds of the bring-back and of its tar peer.
const ROUNDS: usize = 5;

fn median(values: &mut [Duration]) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn millis(duration: Duration) -> Value {
    (duration.as_secs_f64() * 1000.0).into()
}
