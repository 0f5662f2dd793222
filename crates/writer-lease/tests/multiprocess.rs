//! Real processes contending for one scope, driven through the `scope-lease`
//! binary one command at a time (no sleeps: every step waits for the
//! previous reply).
//!
//! A separate test binary on purpose: spawning a child forks this process, and until the
//! child execs it holds a copy of every file descriptor open in the process, lock files of
//! tests running on other threads included. In one binary with the lock tests, a lock those
//! tests had just released could still look held.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_scope-lease");

/// A guard against a hung child, not a timing assertion.
const REPLY_DEADLINE: Duration = Duration::from_secs(60);

fn scope_hex() -> String {
    "3c".repeat(32)
}

struct Session {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
}

impl Session {
    fn spawn(dir: &Path) -> Session {
        Session::spawn_for(dir, &scope_hex())
    }

    fn spawn_for(dir: &Path, scope: &str) -> Session {
        let mut child = Command::new(BIN)
            .arg("session")
            .arg(dir)
            .arg(scope)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn scope-lease");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Session {
            child,
            stdin,
            replies,
        }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write command");
        self.stdin.flush().expect("flush command");
    }

    fn recv(&mut self) -> String {
        self.replies
            .recv_timeout(REPLY_DEADLINE)
            .expect("the session answers")
    }

    fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.recv()
    }

    /// SIGKILL, then reap: once reaped, the kernel has closed its files.
    fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("reap");
        assert!(!status.success(), "killed, not exited: {status}");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// contract: C1
#[test]
fn racing_processes_elect_exactly_one_writer() {
    const PROCESSES: usize = 8;
    for round in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut sessions: Vec<Session> =
            (0..PROCESSES).map(|_| Session::spawn(dir.path())).collect();
        // Every process is up and waiting on its input...
        for session in &mut sessions {
            assert!(session.ask("pid").parse::<u32>().is_ok());
        }
        // ...then all are told to acquire at once.
        for session in &mut sessions {
            session.send("acquire");
        }
        let replies: Vec<String> = sessions.iter_mut().map(Session::recv).collect();
        let writers = replies.iter().filter(|r| *r == "writer").count();
        let readers = replies.iter().filter(|r| *r == "reader").count();
        assert_eq!(
            (writers, readers),
            (1, PROCESSES - 1),
            "round {round}: {replies:?}"
        );
        // While the writer lives, nobody else gets the role.
        for (session, reply) in sessions.iter_mut().zip(&replies) {
            if reply == "reader" {
                assert_eq!(session.ask("acquire"), "reader");
                assert_eq!(session.ask("status"), "held");
            }
        }
    }
}

// contract: C1, C4, C5
#[test]
fn sigkill_of_the_writer_frees_the_lease_for_a_waiting_reader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut writer = Session::spawn(dir.path());
    let mut reader = Session::spawn(dir.path());
    assert_eq!(writer.ask("acquire"), "writer");
    assert_eq!(writer.ask("begin"), "ok 1");
    assert_eq!(reader.ask("acquire"), "reader");
    assert!(
        reader
            .ask("admit sbx1")
            .starts_with("refused dirty-transition")
    );

    writer.sigkill();

    // The role is free; the crash left the scope dirty, so the new writer
    // must run a full transition before anyone is admitted.
    assert!(
        reader
            .ask("admit sbx1")
            .starts_with("refused dirty-transition")
    );
    assert_eq!(reader.ask("acquire"), "writer");
    let mut other = Session::spawn(dir.path());
    assert!(other.ask("admit sbx1").starts_with("refused "));
    assert_eq!(reader.ask("begin"), "ok 2");
    assert_eq!(reader.ask("push sbx1"), "ok 2");
    let mut third = Session::spawn(dir.path());
    assert_eq!(third.ask("acquire"), "reader");
    assert_eq!(third.ask("admit sbx1"), "admitted 2");
}

// contract: C2, C3, S3
#[test]
fn a_reader_process_is_refused_while_dirty_or_unprepared_and_admitted_after_a_stamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut writer = Session::spawn(dir.path());
    let mut reader = Session::spawn(dir.path());
    assert!(reader.ask("admit sbx1").starts_with("refused unprepared"));
    assert_eq!(writer.ask("acquire"), "writer");
    // Holding the role before its transition began, the writer holds the gate.
    assert!(reader.ask("admit sbx1").starts_with("refused changed"));
    assert_eq!(writer.ask("begin"), "ok 1");
    assert!(
        reader
            .ask("admit sbx1")
            .starts_with("refused dirty-transition")
    );
    assert_eq!(writer.ask("push sbx1"), "ok 1");
    assert_eq!(reader.ask("admit sbx1"), "admitted 1");
    assert!(
        reader
            .ask("admit sbx2")
            .starts_with("refused other-sandbox")
    );
    assert_eq!(writer.ask("sync-fail"), "ok");
    assert!(
        reader
            .ask("admit sbx1")
            .starts_with("refused dirty-failed-sync")
    );
    assert_eq!(writer.ask("sync-ok"), "ok");
    assert_eq!(reader.ask("admit sbx1"), "admitted 1");

    // A clean release keeps the stamp valid for readers.
    assert_eq!(writer.ask("release"), "ok");
    assert_eq!(reader.ask("admit sbx1"), "admitted 1");
    assert_eq!(reader.ask("status"), "free");
}

// contract: I6
// contract: C1
#[test]
fn the_scopes_of_a_directory_are_held_and_freed_one_by_one_across_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = ("3c".repeat(32), "5d".repeat(32));
    let mut writer_a = Session::spawn_for(dir.path(), &a);
    let mut writer_b = Session::spawn_for(dir.path(), &b);
    assert_eq!(writer_a.ask("acquire"), "writer");
    // Another scope's byte of the same lock file is free.
    assert_eq!(writer_b.ask("acquire"), "writer");
    let mut other_a = Session::spawn_for(dir.path(), &a);
    let mut other_b = Session::spawn_for(dir.path(), &b);
    assert_eq!(other_a.ask("acquire"), "reader");
    assert_eq!(other_b.ask("acquire"), "reader");
    // Releasing one scope frees that scope only.
    assert_eq!(writer_a.ask("release"), "ok");
    assert_eq!(other_b.ask("status"), "held");
    assert_eq!(other_a.ask("status"), "free");
    assert_eq!(other_a.ask("acquire"), "writer");
    assert_eq!(other_b.ask("acquire"), "reader");
    writer_b.sigkill();
    assert_eq!(other_b.ask("acquire"), "writer");
}

#[test]
fn the_creation_lock_excludes_other_processes_until_released_or_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Session::spawn(dir.path());
    let mut second = Session::spawn(dir.path());
    assert_eq!(first.ask("create-lock 0"), "locked");
    assert_eq!(second.ask("create-lock 100"), "busy");
    assert_eq!(first.ask("create-release"), "ok");
    assert_eq!(second.ask("create-lock 10000"), "locked");

    assert_eq!(first.ask("create-lock 0"), "busy");
    second.sigkill();
    assert_eq!(first.ask("create-lock 10000"), "locked");
}

#[test]
fn status_reports_the_scope_without_taking_any_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut writer = Session::spawn(dir.path());
    assert_eq!(writer.ask("acquire"), "writer");
    assert_eq!(writer.ask("begin"), "ok 1");
    assert_eq!(writer.ask("push sbx9"), "ok 1");
    let output = Command::new(BIN)
        .arg("status")
        .arg(dir.path())
        .arg(scope_hex())
        .arg("sbx9")
        .output()
        .expect("run status");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    assert_eq!(
        text,
        "writer: held\ndirty: no\ngeneration: 1\nprepared: generation 1 for sandbox sbx9\nadmission: admitted 1\n"
    );
    // The probe did not take the role from the writer.
    assert_eq!(writer.ask("status"), "held");

    let bad = Command::new(BIN)
        .args(["status", "/tmp", "../etc"])
        .output()
        .expect("run status");
    assert_eq!(bad.status.code(), Some(2));
}
