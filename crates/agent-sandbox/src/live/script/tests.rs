//! The scripts run by the host's bash in a temporary `$HOME`: what they write, report and
//! leave behind, without a sandbox.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

struct Run {
    child: Child,
}

/// Runs `script` as envd runs a live process: leading a process group of its own.
fn start(home: &Path, script: &str) -> Run {
    use std::os::unix::process::CommandExt;
    let child = Command::new("/bin/bash")
        .process_group(0)
        .args(["-c", script, "agent-sandbox"])
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    Run { child }
}

impl Run {
    fn write(&mut self, data: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(data).expect("write");
        stdin.flush().expect("flush");
    }

    /// Waits for the end (bounded) and returns stdout and the control lines.
    fn finish(mut self) -> (Vec<u8>, Vec<Control>, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the script did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut out = Vec::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let lines: Vec<String> = err.lines().map(str::to_owned).collect();
        let control = lines.iter().filter_map(|l| Control::parse(l)).collect();
        (out, control, lines)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dir(home: &Path, id: &str) -> std::path::PathBuf {
    home.join(LIVE_DIR).join(id)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "waited 30 s for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pid_of(home: &Path, id: &str) -> u32 {
    std::fs::read_to_string(dir(home, id).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[test]
fn the_runner_feeds_stdin_streams_the_output_and_reports_the_exit() {
    // contract: O9
    let home = tempfile::tempdir().unwrap();
    let mut run = start(
        home.path(),
        &runner(
            "p1",
            "read name; echo \"hello $name\"; echo oops >&2; exit 7",
            LiveShell::Plain,
            Io::Pipes,
            &[],
        ),
    );
    run.write(b"world\n");
    let (out, control, _) = run.finish();
    assert_eq!(out, b"hello world\noops\n");
    let pid = pid_of(home.path(), "p1");
    assert_eq!(control[0], Control::Pid(pid), "{control:?}");
    assert_eq!(control.last(), Some(&Control::Exit(7)));
    assert_eq!(
        std::fs::read(dir(home.path(), "p1").join("log")).unwrap(),
        b"hello world\noops\n"
    );
}

#[test]
fn a_follower_takes_up_from_an_offset_and_stops_the_one_before() {
    // contract: O10
    let home = tempfile::tempdir().unwrap();
    let mut run = start(
        home.path(),
        &runner(
            "p2",
            "echo one; read go; echo two; read go; echo three",
            LiveShell::Plain,
            Io::Pipes,
            &[],
        ),
    );
    let log = dir(home.path(), "p2").join("log");
    wait_for("the first line", || {
        std::fs::read(&log).unwrap_or_default() == b"one\n"
    });
    // The host had read "one\n" (4 bytes) when its stream was cut; a follower takes up there.
    let follower_run = start(home.path(), &follower("p2", 4));
    let first_follower = std::fs::read_to_string(dir(home.path(), "p2").join("follower")).unwrap();
    wait_for("the new follower to be recorded", || {
        std::fs::read_to_string(dir(home.path(), "p2").join("follower")).unwrap() != first_follower
    });
    let first_follower: u32 = first_follower.trim().parse().unwrap();
    wait_for("the follower before to stop", || !alive(first_follower));
    run.write(b"\n");
    wait_for("the second line", || {
        std::fs::read(&log).unwrap_or_default() == b"one\ntwo\n"
    });
    run.write(b"\n");
    // The runner outlives its stopped follower until the command ends (reaped here, as envd
    // reaps it: `tail --pid` takes an unreaped runner for a live one).
    let (runner_out, _, _) = run.finish();
    assert_eq!(
        runner_out, b"one\n",
        "the stopped follower delivered no more"
    );
    let (out, control, _) = follower_run.finish();
    assert_eq!(out, b"two\nthree\n", "from the offset, nothing repeated");
    assert_eq!(control.last(), Some(&Control::Exit(0)));
}

#[test]
fn a_follower_of_an_ended_command_delivers_the_rest_and_its_exit() {
    // contract: O10
    let home = tempfile::tempdir().unwrap();
    let run = start(
        home.path(),
        &runner(
            "p3",
            "printf 'abcdef'; exit 3",
            LiveShell::Plain,
            Io::Pipes,
            &[],
        ),
    );
    let (_, control, _) = run.finish();
    assert_eq!(control.last(), Some(&Control::Exit(3)));
    let (out, control, _) = start(home.path(), &follower("p3", 2)).finish();
    assert_eq!(out, b"cdef");
    assert_eq!(control.last(), Some(&Control::Exit(3)));
}

#[test]
fn a_restarted_sandbox_or_a_missing_directory_is_reported_lost() {
    // contract: O10
    let home = tempfile::tempdir().unwrap();
    let (_, control, _) = start(home.path(), &follower("never", 0)).finish();
    assert_eq!(control, vec![Control::LostGone]);
    let run = start(
        home.path(),
        &runner("p4", "printf 'before'", LiveShell::Plain, Io::Pipes, &[]),
    );
    run.finish();
    std::fs::write(dir(home.path(), "p4").join("boot"), "another boot").unwrap();
    let (out, control, _) = start(home.path(), &follower("p4", 0)).finish();
    assert_eq!(out, b"before", "what is left of the log comes first");
    assert_eq!(control.last(), Some(&Control::LostReboot));
}

#[test]
fn a_kill_ends_the_command_and_everything_carrying_its_tag() {
    // contract: O9
    let home = tempfile::tempdir().unwrap();
    // A child that leaves the process group (its own session) still carries the tag.
    let run = start(
        home.path(),
        &runner(
            "p5",
            "setsid sleep 300 & echo $! > \"$HOME/escaped\"; sleep 300",
            LiveShell::Plain,
            Io::Pipes,
            &[],
        ),
    );
    let d = dir(home.path(), "p5");
    wait_for("the escaped child", || {
        std::fs::read_to_string(home.path().join("escaped")).is_ok_and(|s| !s.trim().is_empty())
    });
    let escaped: u32 = std::fs::read_to_string(home.path().join("escaped"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = pid_of(home.path(), "p5");
    let status = Command::new("/bin/bash")
        .args(["-c", &signal("p5", LiveSignal::Kill)])
        .env("HOME", home.path())
        .status()
        .unwrap();
    assert!(status.success());
    // The runner's own follower went with its group: its stream ends without a report, and
    // the follower the host then starts tells how the command ended.
    let (_, control, _) = run.finish();
    assert_eq!(control, vec![Control::Pid(pid)]);
    let (_, control, _) = start(home.path(), &follower("p5", 0)).finish();
    assert_eq!(
        control.last(),
        Some(&Control::Killed),
        "no exit code: a signal ended it"
    );
    assert!(!alive(pid));
    wait_for("the escaped child to die", || !alive(escaped));
    assert!(!d.join("exit").exists());
}

#[test]
fn an_interrupt_reaches_the_commands_group_only() {
    // contract: O9
    let home = tempfile::tempdir().unwrap();
    let run = start(
        home.path(),
        &runner(
            "p6",
            "trap 'echo interrupted; exit 130' INT; echo ready; while :; do sleep 0.05; done",
            LiveShell::Plain,
            Io::Pipes,
            &[],
        ),
    );
    let log = dir(home.path(), "p6").join("log");
    wait_for("ready", || {
        std::fs::read(&log).unwrap_or_default() == b"ready\n"
    });
    Command::new("/bin/bash")
        .args(["-c", &signal("p6", LiveSignal::Interrupt)])
        .env("HOME", home.path())
        .status()
        .unwrap();
    let (out, control, _) = run.finish();
    assert_eq!(out, b"ready\ninterrupted\n");
    assert_eq!(control.last(), Some(&Control::Exit(130)));
}

#[test]
fn a_terminal_command_sees_a_terminal_of_its_size_and_ctrl_c_interrupts_it() {
    // contract: O9
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: this machine has no util-linux script");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut run = start(
        home.path(),
        &runner(
            "p7",
            "python3 -c 'import sys, os; print(sys.stdin.isatty(), sys.stdout.isatty(), os.get_terminal_size())'; \
             python3 -c 'import time\ntry:\n    print(\"waiting\", flush=True)\n    time.sleep(300)\nexcept KeyboardInterrupt:\n    print(\"after-interrupt\")'; \
             read line; echo \"got $line\"",
            LiveShell::Plain,
            Io::Terminal(TerminalSize {
                rows: 30,
                cols: 120,
            }),
            &[],
        ),
    );
    let log = dir(home.path(), "p7").join("log");
    wait_for("waiting", || {
        String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).contains("waiting")
    });
    run.write(b"\x03");
    wait_for("the interrupted sleep", || {
        String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default())
            .contains("after-interrupt")
    });
    run.write(b"typed\r");
    let (out, control, _) = run.finish();
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("True True os.terminal_size(columns=120, lines=30)"),
        "{text:?}"
    );
    assert!(text.contains("got typed"), "{text:?}");
    assert_eq!(control.last(), Some(&Control::Exit(0)));
}

#[test]
fn finished_directories_are_removed_by_the_next_runner() {
    let home = tempfile::tempdir().unwrap();
    start(
        home.path(),
        &runner("old", "true", LiveShell::Plain, Io::Pipes, &[]),
    )
    .finish();
    assert!(dir(home.path(), "old").exists());
    start(
        home.path(),
        &runner(
            "new",
            "true",
            LiveShell::Plain,
            Io::Pipes,
            &["old".to_owned()],
        ),
    )
    .finish();
    assert!(!dir(home.path(), "old").exists());
    assert!(dir(home.path(), "new").exists());
}

#[test]
fn control_lines_are_parsed_strictly() {
    assert_eq!(Control::parse("pid 12"), Some(Control::Pid(12)));
    assert_eq!(Control::parse("exit -1"), Some(Control::Exit(-1)));
    assert_eq!(Control::parse("exit 130"), Some(Control::Exit(130)));
    assert_eq!(Control::parse("killed"), Some(Control::Killed));
    assert_eq!(Control::parse("lost reboot"), Some(Control::LostReboot));
    for junk in [
        "pid",
        "pid 0",
        "pid x",
        "runner 3",
        "pid 99999999999",
        "exit",
        "exit 1 2",
        "killed now",
        "lost",
        "tail: inotify cannot be used, reverting to polling",
    ] {
        assert_eq!(Control::parse(junk), None, "{junk}");
    }
    assert!(valid_id("proc_0123abc"));
    for bad in ["", "a/b", "..", "a b", "x'y"] {
        assert!(!valid_id(bad), "{bad}");
    }
    assert!(!valid_id(&"a".repeat(65)));
}
