//! The session kernel against e2b-local: state across cells, calls to the host on the cell's
//! own stream, one request per cell, and what a timed-out, exited or lost kernel says.

use std::time::Duration;

use agent_sandbox::{CellHost, CellStatus, KernelOptions};

use crate::support::{World, ok};

/// A host that answers `echo` with its arguments and refuses anything else, counting calls.
#[derive(Default)]
struct Host {
    calls: Vec<(String, String)>,
    interrupt_after: Option<usize>,
    asked: usize,
}

impl CellHost for Host {
    fn call(&mut self, name: &str, args: &str) -> Result<String, String> {
        self.calls.push((name.to_owned(), args.to_owned()));
        match name {
            "echo" => Ok(format!("echoed {args}")),
            other => Err(format!("{other} is not allowed")),
        }
    }

    fn interrupted(&mut self) -> bool {
        self.asked += 1;
        self.interrupt_after.is_some_and(|after| self.asked > after)
    }
}

fn cell(kernel: &agent_sandbox::Kernel, code: &str) -> agent_sandbox::CellOutcome {
    kernel
        .run_cell(code, Duration::from_secs(30), &mut Host::default())
        .expect("the cell runs")
}

#[test]
fn cells_share_one_namespace_and_report_output_errors_and_counts() {
    // contract: O8
    let world = World::new();
    let backend = world.persistent();
    let kernel = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    let first = cell(&kernel, "x = 41\nprint('first')");
    assert_eq!(first.status, CellStatus::Ok);
    assert_eq!(first.stdout, "first\n");
    assert_eq!(first.execution_count, 1);
    let second = cell(
        &kernel,
        "import sys, subprocess\nx += 1\nprint(x)\nprint('warn', file=sys.stderr)\nsubprocess.run(['echo', 'from a subprocess'])",
    );
    assert_eq!(second.status, CellStatus::Ok);
    assert_eq!(second.stdout, "42\n");
    assert_eq!(second.stderr, "warn\n");
    assert_eq!(
        second.raw, "from a subprocess\n",
        "descriptor-level output is the cell's"
    );
    assert_eq!(second.execution_count, 2);
    let failing = cell(&kernel, "1 / 0");
    assert_eq!(failing.status, CellStatus::Error);
    assert!(
        failing.traceback.contains("ZeroDivisionError"),
        "{}",
        failing.traceback
    );
    // A cell's stdin is not the protocol's: input() sees end of file.
    let reading = cell(
        &kernel,
        "try:\n    input()\nexcept EOFError:\n    print('eof')",
    );
    assert_eq!(reading.stdout, "eof\n");
    let clipped = backend
        .start_kernel({
            let mut options = KernelOptions::new("python3");
            options.stdout_cap = 10;
            options
        })
        .expect("starts");
    let long = cell(&clipped, "print('a' * 100)");
    assert_eq!(long.stdout, "a".repeat(10));
    assert!(long.stdout_clipped);
}

#[test]
fn a_cells_calls_reach_its_host_on_its_own_stream_and_cost_one_request_each() {
    // contract: O8
    let world = World::new();
    let backend = world.persistent();
    let mut options = KernelOptions::new("python3");
    options.modules.insert(
        "tools".to_owned(),
        "import agent_sandbox_kernel\ndef echo(**args):\n    return agent_sandbox_kernel.call('echo', args)\n"
            .to_owned(),
    );
    let kernel = backend.start_kernel(options).expect("starts");
    // A cell without calls: one request (the cell), however long it runs.
    let before = world.server().requests();
    let slow = cell(&kernel, "import time\ntime.sleep(1.5)\nprint('slept')");
    assert_eq!(slow.stdout, "slept\n");
    assert_eq!(
        world.server().requests().since(&before).total(),
        1,
        "the cell is one request; nothing polls"
    );
    let mut host = Host::default();
    let before = world.server().requests();
    let outcome = kernel
        .run_cell(
            "from tools import echo\nprint(echo(a=1))\nimport agent_sandbox_kernel\ntry:\n    agent_sandbox_kernel.call('rm', {})\nexcept RuntimeError as e:\n    print('refused:', e)",
            Duration::from_secs(30),
            &mut host,
        )
        .expect("runs");
    assert_eq!(
        outcome.stdout,
        "echoed {\"a\":1}\nrefused: rm is not allowed\n"
    );
    assert_eq!(outcome.calls, 1, "the refused call is not counted");
    assert_eq!(host.calls.len(), 2);
    assert_eq!(
        world.server().requests().since(&before).total(),
        3,
        "the cell and one answer per call"
    );
}

#[test]
fn another_process_of_the_sandbox_cannot_make_the_host_run_a_call() {
    // contract: O8
    let world = World::new();
    let backend = world.persistent();
    let kernel = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    cell(&kernel, "print('warm')");
    // Another process writes a call frame, marker and all (it can read the log), into the
    // kernel's output while a cell runs; without the key it is only output.
    let mut host = Host::default();
    let outcome = kernel
        .run_cell(
            "import glob, subprocess, time\n\
                 log = glob.glob('/home/user/.cache/agent-sandbox/live/*/log')[0]\n\
                 marker = open(log).read().split('\\n')[1].split(' ')[0]\n\
                 body = '{\"seq\":3,\"call\":1,\"cell\":2,\"name\":\"echo\",\"args\":{}}'\n\
                 forged = '\\n%s %d %s\\n%s' % (marker, len(body), '0' * 64, body)\n\
                 subprocess.run(['sh', '-c', 'printf %s \"$1\" >> \"$2\"', 'x', forged, log], check=True)\n\
                 time.sleep(0.5)\n\
                 print('done')",
            Duration::from_secs(30),
            &mut host,
        )
        .expect("runs");
    assert_eq!(outcome.stdout, "done\n");
    assert!(host.calls.is_empty(), "{:?}", host.calls);
    assert!(outcome.raw.contains("\"name\":\"echo\""), "{}", outcome.raw);
}

#[test]
fn a_cell_past_its_time_kills_the_kernel_and_the_next_kernel_starts_fresh() {
    // contract: O8
    let world = World::new();
    let backend = world.persistent();
    let kernel = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    cell(&kernel, "x = 1");
    let outcome = kernel
        .run_cell(
            "import time\ntime.sleep(300)",
            Duration::from_secs(1),
            &mut Host::default(),
        )
        .expect("runs");
    assert_eq!(outcome.status, CellStatus::Timeout);
    assert!(kernel.is_ended());
    let error = kernel
        .run_cell("print(x)", Duration::from_secs(5), &mut Host::default())
        .expect_err("the kernel is gone");
    assert!(error.is_live_process_lost(), "{error:?}");
    // Nothing of it is left running in the sandbox.
    assert_eq!(
        ok(&backend, "pgrep -f '[a]gent-sandbox-kernel' | wc -l"),
        "0\n"
    );
    let interrupted = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    let outcome = interrupted
        .run_cell(
            "import time\ntime.sleep(300)",
            Duration::from_secs(60),
            &mut Host {
                interrupt_after: Some(5),
                ..Host::default()
            },
        )
        .expect("runs");
    assert_eq!(outcome.status, CellStatus::Interrupted);
    assert!(interrupted.is_ended());
}

#[test]
fn sys_exit_ends_the_kernel_and_a_missing_interpreter_is_named() {
    // contract: O8
    let world = World::new();
    let backend = world.persistent();
    let kernel = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    let outcome = cell(&kernel, "print('bye')\nraise SystemExit(0)");
    assert_eq!(outcome.status, CellStatus::Exit);
    assert_eq!(outcome.stdout, "bye\n");
    assert!(kernel.is_ended());
    let error = backend
        .start_kernel(KernelOptions::new("python3-that-is-not-there"))
        .expect_err("no interpreter");
    assert!(error.is_kernel_unavailable(), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("start a session kernel") && text.contains("not found"),
        "{text}"
    );
}

#[test]
fn a_kernel_survives_a_pause_that_keeps_memory_and_is_lost_with_one_that_does_not() {
    // contract: O10
    let world = World::new();
    let backend = world.persistent();
    let kernel = backend
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    cell(&kernel, "x = 'kept'");
    let id = backend.info().unwrap().sandbox_id;
    world.server().faults().pause_sandbox(&id).expect("paused");
    // The cell resumes the sandbox (a use); the kernel was frozen, not ended.
    let outcome = cell(&kernel, "print(x)");
    assert_eq!(outcome.stdout, "kept\n");

    let other = world.persistent_task("fresh-boot");
    let lost = other
        .start_kernel(KernelOptions::new("python3"))
        .expect("starts");
    cell(&lost, "x = 1");
    crate::live::pause_without_memory(&world, &other.info().unwrap().sandbox_id);
    let error = lost
        .run_cell("print(x)", Duration::from_secs(30), &mut Host::default())
        .expect_err("its state went with the restart");
    assert!(error.is_live_process_lost(), "{error:?}");
}
