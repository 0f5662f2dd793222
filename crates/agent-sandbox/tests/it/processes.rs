//! Two backends in two processes on one scope: roles, hand-off, a writer killed mid-push.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use agent_sandbox::{RoleKind, SandboxMode};

use crate::support::{RecordingHooks, World, ok};

struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Session {
    fn start(world: &World, hang_in_push: bool) -> Session {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-session"));
        command
            .arg(&world.url)
            .arg(world.home.path())
            .arg("default")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if hang_in_push {
            command.env("SANDBOX_SESSION_HANG_IN_PUSH", "1");
        }
        let mut child = command.spawn().expect("session starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Session {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("send");
        self.stdin.flush().expect("flush");
    }

    fn read(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read");
        assert!(!line.is_empty(), "the session exited");
        line.trim_end().to_owned()
    }

    fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.read()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn one_writer_one_reader_across_processes_and_hand_off_when_the_writer_exits() {
    // contract: C1, C2, C4
    let world = World::new();
    let mut writer = Session::start(&world, false);
    let attached = writer.ask("attach");
    let parts: Vec<&str> = attached.split(' ').collect();
    assert_eq!(parts[0], "attached", "{attached}");
    assert_eq!(parts[2], "Writer", "{attached}");
    let id = parts[1].to_owned();

    let hooks = RecordingHooks::new(world.home.path());
    let reader = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let info = reader.attach().expect("reader");
    assert_eq!(info.role, RoleKind::Reader);
    assert_eq!(info.sandbox_id, id);
    assert_eq!(ok(&reader, "echo admitted"), "admitted\n");
    assert!(writer.ask("run echo hi").starts_with("exit 0"));

    // The writer process exits without cleanup; the OS releases its lock.
    writer.send("quit");
    let status = writer.child.wait().expect("writer exits");
    assert!(status.success());
    ok(&reader, "true");
    assert_eq!(reader.info().unwrap().role, RoleKind::Writer);
    assert_eq!(hooks.calls()[0], "push:Initial");
}

#[test]
fn a_writer_killed_mid_push_leaves_the_scope_dirty_and_the_next_bring_up_recovers() {
    // contract: C3, C4, S5
    let world = World::new();
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/a")).unwrap();
    std::fs::create_dir_all(home.join("skills/b")).unwrap();
    std::fs::write(home.join("skills/a/SKILL.md"), "a").unwrap();
    std::fs::write(home.join("skills/b/SKILL.md"), "b").unwrap();

    // A first session leaves agent-authored state in the sandbox and crashes (no pull).
    let first = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    ok(
        &first,
        "mkdir -p /home/user/.hermes/memories && printf agent > /home/user/.hermes/memories/MEMORY.md",
    );
    let id = first.info().unwrap().sandbox_id;
    first.finalize();

    // The next writer is SIGKILLed in the middle of its push.
    let mut victim = Session::start(&world, true);
    victim.send("attach");
    assert_eq!(victim.read(), "pushing");
    let files = world.scope_files(&first);
    assert!(
        files.dirty().unwrap().is_some(),
        "dirty during the transition"
    );
    assert!(
        files.prepared().unwrap().is_none(),
        "the old stamp was invalidated"
    );
    victim.child.kill().expect("SIGKILL");
    victim.child.wait().expect("reaped");
    // The victim's recovery may have restored the memory already; make the host lack it so
    // the next bring-up must recover it again.
    std::fs::remove_dir_all(home.join("memories")).ok();

    // Readers would be refused now; the next session becomes writer and recovers.
    let hooks = RecordingHooks::new(home);
    let next = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let info = next.attach().expect("bring-up after the crash");
    assert_eq!(info.role, RoleKind::Writer);
    assert_eq!(info.sandbox_id, id);
    assert!(files.dirty().unwrap().is_none());
    assert_eq!(files.prepared().unwrap().expect("stamped").sandbox_id, id);
    // Nothing was lost: the sandbox-authored memory is on the host, both skills in the sandbox.
    assert_eq!(
        std::fs::read_to_string(home.join("memories/MEMORY.md")).unwrap(),
        "agent"
    );
    assert_eq!(
        ok(
            &next,
            "cat /home/user/.hermes/skills/a/SKILL.md /home/user/.hermes/skills/b/SKILL.md"
        ),
        "ab"
    );
}
