//! A process's supervisor: its output pumped to the subscribers until it ends, then the end
//! reported.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio::time::Instant;

use super::{CHUNK, DRAIN_IDLE, EndInfo, Event, PTY_CHUNK, Proc, ProcessTable, sleep_until_opt};
use crate::pty::PtyMaster;

/// Pumps a process's output to its subscribers until it ends, then reports the end.
pub(super) async fn supervise(
    table: Arc<ProcessTable>,
    proc: Arc<Proc>,
    mut child: Child,
    deadline: Option<Instant>,
) {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut tty = proc.tty.clone();
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut tty_buf = vec![0u8; if tty.is_some() { PTY_CHUNK } else { 0 }];
    let mut status = None;
    let mut deadline = deadline;
    let mut deadline_fired = false;
    // The deadline stands still while the sandbox is frozen, as time does for a paused VM.
    let mut life = table.life.subscribe();
    let mut life_open = true;
    let mut frozen_since = life.borrow_and_update().frozen.then(Instant::now);
    loop {
        if status.is_some() && stdout.is_none() && stderr.is_none() && tty.is_none() {
            break;
        }
        tokio::select! {
            result = child.wait(), if status.is_none() => {
                status = Some(result);
            }
            changed = life.changed(), if life_open => match changed {
                Err(_) => life_open = false,
                Ok(()) => {
                    let frozen = life.borrow_and_update().frozen;
                    match frozen_since {
                        None if frozen => frozen_since = Some(Instant::now()),
                        Some(since) if !frozen => {
                            deadline = deadline.map(|at| at + since.elapsed());
                            frozen_since = None;
                        }
                        _ => {}
                    }
                }
            },
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match read {
                Some(n) => proc.broadcast(Event::Stdout(Bytes::copy_from_slice(&out_buf[..n]))).await,
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match read {
                Some(n) => proc.broadcast(Event::Stderr(Bytes::copy_from_slice(&err_buf[..n]))).await,
                None => stderr = None,
            },
            read = read_tty(tty.as_deref(), &mut tty_buf), if tty.is_some() => match read {
                Some(n) => proc.broadcast(Event::Pty(Bytes::copy_from_slice(&tty_buf[..n]))).await,
                None => tty = None,
            },
            () = sleep_until_opt(deadline), if !deadline_fired && status.is_none() && frozen_since.is_none() => {
                deadline_fired = true;
                // envd cancels the command's context: SIGKILL to the process itself.
                if let Ok(pid) = i32::try_from(proc.host_pid) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid, libc::SIGKILL); }
                }
            }
            () = tokio::time::sleep(DRAIN_IDLE), if status.is_some() => break,
        }
    }
    let end = match status {
        Some(Ok(status)) => EndInfo::from_status(status),
        _ => EndInfo {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some("waiting for the process failed".into()),
        },
    };
    proc.stdin.lock().await.take();
    proc.shared().end = Some(end.clone());
    // Out of the running list before anyone hears of the end, so a client that saw it
    // never finds the process still running (a List, a network update).
    table.finish(proc.pid);
    table.log.push(
        crate::sandbox_log::Level::Info,
        format!("process {} exited ({})", proc.pid, end.status),
        &[
            ("pid", proc.pid.to_string()),
            ("exitCode", end.exit_code.to_string()),
        ],
    );
    // Closed before the kill that ended it: the sandbox went, not just the process.
    let event = if table.is_closed() {
        Event::SandboxGone
    } else {
        Event::End(end)
    };
    proc.broadcast(event).await;
    proc.shared().subscribers.clear();
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    let reader = reader.as_mut()?;
    match reader.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn read_tty(tty: Option<&PtyMaster>, buf: &mut [u8]) -> Option<usize> {
    match tty?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}
