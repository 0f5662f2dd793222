//! `scope-lease`: inspect a scope's coordination files, or drive a session.
//!
//! ```text
//! scope-lease status  <dir> <scope-hex> [sandbox-id]
//! scope-lease session <dir> <scope-hex>
//! ```
//!
//! `status` prints who holds the writer role, the dirty marker, the
//! generation and the prepared stamp (and, given a sandbox id, whether a
//! reader would be admitted). `session` reads one command per line from
//! standard input and answers each with one line, so a person in two
//! terminals, or a test spawning real processes, can play concurrent
//! sessions: `acquire`, `begin`, `push <sandbox>`, `sync-ok`, `sync-fail`,
//! `admit <sandbox>`, `release`, `status`, `create-lock <timeout-ms>`,
//! `create-release`, `pid`. It exits at end of input.

#![allow(clippy::print_stdout)]

use std::io::{self, BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use writer_lease::{
    Admission, CreationAccess, CreationGuard, DirtyReason, Refusal, Role, ScopeFiles, ScopeKey,
    WriterLease, WriterStatus,
};

const USAGE: &str = "usage: scope-lease status <dir> <scope-hex> [sandbox-id]\n       scope-lease session <dir> <scope-hex>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [cmd, dir, key, rest @ ..] => key
            .parse::<ScopeKey>()
            .map(|key| (cmd.as_str(), ScopeFiles::new(PathBuf::from(dir), key), rest)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (command, files, rest) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("scope-lease: {error}");
            return ExitCode::from(2);
        }
    };
    let result = match (command, rest) {
        ("status", []) => status(&files, None),
        ("status", [sandbox]) => status(&files, Some(sandbox)),
        ("session", []) => session(&files),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("scope-lease: {error}");
            ExitCode::FAILURE
        }
    }
}

fn status(files: &ScopeFiles, sandbox: Option<&String>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    let writer = match files.writer_status() {
        Ok(WriterStatus::Held) => "held".to_owned(),
        Ok(WriterStatus::Free) => "free".to_owned(),
        Ok(WriterStatus::Unknown(degradation)) => format!("unknown: {degradation}"),
        Err(error) => format!("unreadable ({})", chain(&error)),
    };
    writeln!(out, "writer: {writer}")?;
    match files.dirty() {
        Ok(None) => writeln!(out, "dirty: no")?,
        Ok(Some(marker)) => writeln!(out, "dirty: yes ({})", marker.reason)?,
        Err(error) => writeln!(out, "dirty: unreadable ({})", chain(&error))?,
    }
    match files.generation() {
        Ok(generation) => writeln!(out, "generation: {generation}")?,
        Err(error) => writeln!(out, "generation: unreadable ({})", chain(&error))?,
    }
    match files.prepared() {
        Ok(None) => writeln!(out, "prepared: no")?,
        Ok(Some(stamp)) => writeln!(
            out,
            "prepared: generation {} for sandbox {}",
            stamp.generation, stamp.sandbox_id
        )?,
        Err(error) => writeln!(out, "prepared: unreadable ({})", chain(&error))?,
    }
    if let Some(sandbox) = sandbox {
        writeln!(
            out,
            "admission: {}",
            admission_line(files.admission(sandbox))
        )?;
    }
    Ok(())
}

fn admission_line(admission: Admission) -> String {
    match admission {
        Admission::Admitted { generation } => format!("admitted {generation}"),
        Admission::Refused(refusal) => {
            let token = match &refusal {
                Refusal::Dirty(marker) => match marker.reason {
                    DirtyReason::Transition => "dirty-transition",
                    DirtyReason::FailedSync => "dirty-failed-sync",
                    _ => "dirty-unknown",
                },
                Refusal::Unprepared => "unprepared",
                Refusal::OtherSandbox => "other-sandbox",
                Refusal::Changed => "changed",
                _ => "unreadable",
            };
            format!("refused {token} ({refusal})")
        }
    }
}

#[derive(Default)]
struct Session {
    writer: Option<WriterLease>,
    creation: Option<CreationGuard>,
}

fn session(files: &ScopeFiles) -> io::Result<()> {
    let mut state = Session::default();
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            [] => continue,
            ["pid"] => std::process::id().to_string(),
            ["acquire"] => acquire(files, &mut state),
            ["begin"] => with_writer(&mut state, |w| {
                w.begin_transition().map(|g| format!("ok {g}"))
            }),
            ["push", sandbox] => with_writer(&mut state, |w| {
                w.complete_push(sandbox)
                    .map(|s| format!("ok {}", s.generation))
            }),
            ["sync-ok"] => with_writer(&mut state, |w| {
                w.record_sync_success().map(|()| "ok".into())
            }),
            ["sync-fail"] => with_writer(&mut state, |w| {
                w.record_sync_failure().map(|()| "ok".into())
            }),
            ["admit", sandbox] => admission_line(files.admission(sandbox)),
            ["release"] => {
                state.writer = None;
                "ok".to_owned()
            }
            ["status"] => match files.writer_status() {
                Ok(WriterStatus::Held) => "held".to_owned(),
                Ok(WriterStatus::Free) => "free".to_owned(),
                Ok(WriterStatus::Unknown(_)) => "unknown".to_owned(),
                Err(error) => format!("error {}", chain(&error)),
            },
            ["create-lock", millis] => match millis.parse::<u64>() {
                Ok(millis) => match files.creation_lock_within(Duration::from_millis(millis)) {
                    Ok(CreationAccess::Locked(guard)) => {
                        state.creation = Some(guard);
                        "locked".to_owned()
                    }
                    Ok(CreationAccess::Busy) => "busy".to_owned(),
                    Ok(CreationAccess::Unprotected(d)) => format!("unprotected {d}"),
                    Err(error) => format!("error {}", chain(&error)),
                },
                Err(_) => "error create-lock takes milliseconds".to_owned(),
            },
            ["create-release"] => {
                state.creation = None;
                "ok".to_owned()
            }
            _ => format!("error unknown command: {line}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}

fn acquire(files: &ScopeFiles, state: &mut Session) -> String {
    if state.writer.is_some() {
        return "writer".to_owned();
    }
    match files.try_acquire_writer() {
        Ok(Role::Writer(lease)) => {
            let reply = match lease.degradation() {
                None => "writer".to_owned(),
                Some(degradation) => format!("writer-unprotected {degradation}"),
            };
            state.writer = Some(lease);
            reply
        }
        Ok(Role::Reader) => "reader".to_owned(),
        Err(error) => format!("error {}", chain(&error)),
    }
}

fn with_writer(
    state: &mut Session,
    step: impl FnOnce(&mut WriterLease) -> Result<String, writer_lease::Error>,
) -> String {
    match state.writer.as_mut() {
        None => "error not the writer".to_owned(),
        Some(writer) => step(writer).unwrap_or_else(|error| format!("error {}", chain(&error))),
    }
}

/// An error and its causes, joined by `": "`: each error's message names only its own step.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
