//! The server's live tools: one Python kernel whose state survives from call to call, and the
//! background processes it started, each read by a thread of its own into a bounded buffer
//! that `read_process` empties.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_sandbox_examples::agent_sandbox::{
    Backend, CellHost, Error, Kernel, KernelOptions, LiveEnd, LiveOptions, LiveProcess, LiveRead,
    LiveSignal, Shell, TerminalSize,
};

/// Unread output kept per process; past it, the oldest bytes are dropped (and counted).
const UNREAD_CAP: usize = 1024 * 1024;

/// The terminal a `start_process` with `terminal: true` gets.
const TERMINAL: TerminalSize = TerminalSize {
    rows: 30,
    cols: 120,
};

/// What a background process has produced since its last read.
#[derive(Default)]
struct Unread {
    bytes: Vec<u8>,
    dropped: u64,
    end: Option<LiveEnd>,
}

/// A process's unread output, and the condition its readers wait on.
type Shared = Arc<(Mutex<Unread>, std::sync::Condvar)>;

struct Tracked {
    process: LiveProcess,
    unread: Shared,
}

/// What `read_process` answers.
pub(crate) struct Reading {
    pub(crate) output: String,
    pub(crate) dropped: u64,
    pub(crate) end: Option<LiveEnd>,
}

/// The kernel and the processes of one sandbox.
#[derive(Default)]
pub(crate) struct LiveTools {
    kernel: Mutex<Option<Arc<Kernel>>>,
    processes: Mutex<BTreeMap<String, Tracked>>,
    next: AtomicU64,
}

/// A cell's calls: this server offers none (its tools are MCP's, not the cell's).
struct NoCalls;

impl CellHost for NoCalls {
    fn call(&mut self, name: &str, _args: &str) -> Result<String, String> {
        Err(format!("{name}: this server answers no calls from cells"))
    }

    fn interrupted(&mut self) -> bool {
        false
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LiveTools {
    /// Runs `code` in the kernel (started on first use, or afresh after `reset` or a lost
    /// kernel); blocking.
    pub(crate) fn run_python(
        &self,
        backend: &Backend,
        code: &str,
        timeout: Duration,
        reset: bool,
    ) -> Result<(agent_sandbox_examples::agent_sandbox::CellOutcome, bool), Error> {
        let mut fresh = false;
        let kernel = {
            let mut kernel = lock(&self.kernel);
            if (reset || kernel.as_ref().is_some_and(|k| k.is_ended()))
                && let Some(old) = kernel.take()
            {
                let _ = old.kill();
            }
            if kernel.is_none() {
                *kernel = Some(Arc::new(
                    backend.start_kernel(KernelOptions::new("python3"))?,
                ));
                fresh = true;
            }
            Arc::clone(kernel.as_ref().expect("set just above"))
        };
        match kernel.run_cell(code, timeout, &mut NoCalls) {
            Ok(outcome) => Ok((outcome, fresh)),
            // Gone with its sandbox before the cell reached it: a fresh kernel runs it.
            Err(error) if error.is_live_process_lost() => {
                lock(&self.kernel).take();
                self.run_python(backend, code, timeout, false)
                    .map(|(outcome, _)| (outcome, true))
            }
            Err(error) => Err(error),
        }
    }

    /// Starts `command` in the background; its id.
    pub(crate) fn start(
        &self,
        backend: &Backend,
        command: &str,
        terminal: bool,
    ) -> Result<(String, u32), Error> {
        let id = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let options = if terminal {
            LiveOptions::terminal(Shell::Login, TERMINAL)
        } else {
            LiveOptions::pipes(Shell::Login)
        };
        let process = backend.start_live(&id, command, options)?;
        let pid = process.sandbox_pid();
        let unread = Arc::new((Mutex::new(Unread::default()), std::sync::Condvar::new()));
        let reader = process.clone();
        let buffer = Arc::clone(&unread);
        std::thread::spawn(move || {
            loop {
                match reader.read(Duration::from_secs(60)) {
                    LiveRead::Output(bytes) => {
                        let mut unread = lock(&buffer.0);
                        unread.bytes.extend_from_slice(&bytes);
                        if unread.bytes.len() > UNREAD_CAP {
                            let over = unread.bytes.len() - UNREAD_CAP;
                            unread.bytes.drain(..over);
                            unread.dropped += over as u64;
                        }
                        buffer.1.notify_all();
                    }
                    LiveRead::Ended(end) => {
                        lock(&buffer.0).end = Some(end);
                        buffer.1.notify_all();
                        return;
                    }
                    _ => {}
                }
            }
        });
        lock(&self.processes).insert(id.clone(), Tracked { process, unread });
        Ok((id, pid))
    }

    fn tracked(&self, id: &str) -> Result<(LiveProcess, Shared), String> {
        let processes = lock(&self.processes);
        processes
            .get(id)
            .map(|tracked| (tracked.process.clone(), Arc::clone(&tracked.unread)))
            .ok_or_else(|| {
                format!(
                    "no background process {id} (started: {:?})",
                    processes.keys().collect::<Vec<_>>()
                )
            })
    }

    /// What `id` produced since the last read, waiting up to `wait` for something.
    pub(crate) fn read(&self, id: &str, wait: Duration) -> Result<Reading, String> {
        let (_, unread) = self.tracked(id)?;
        let deadline = Instant::now() + wait;
        let mut state = lock(&unread.0);
        while state.bytes.is_empty() && state.end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = unread
                .1
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let bytes = std::mem::take(&mut state.bytes);
        Ok(Reading {
            output: String::from_utf8_lossy(&bytes).into_owned(),
            dropped: std::mem::take(&mut state.dropped),
            end: state.end.clone(),
        })
    }

    /// Writes `data` to `id`'s stdin, then closes it when asked.
    pub(crate) fn write(&self, id: &str, data: &[u8], close: bool) -> Result<(), String> {
        let (process, _) = self.tracked(id)?;
        if !data.is_empty() {
            process.write(data).map_err(|error| error.to_string())?;
        }
        if close {
            process.close_stdin().map_err(|error| error.to_string())?;
        }
        Ok(())
    }

    /// Sends `signal` to `id`.
    pub(crate) fn signal(&self, id: &str, signal: LiveSignal) -> Result<(), String> {
        let (process, _) = self.tracked(id)?;
        process.signal(signal).map_err(|error| error.to_string())
    }
}

/// How a process ended, in words and fields.
pub(crate) fn end_json(end: &Option<LiveEnd>) -> serde_json::Value {
    match end {
        None => serde_json::json!({"status": "running"}),
        Some(LiveEnd::Exited { code }) => {
            serde_json::json!({"status": "exited", "exit_code": code})
        }
        Some(LiveEnd::Killed) => serde_json::json!({"status": "killed"}),
        Some(LiveEnd::Lost(reason)) => {
            serde_json::json!({"status": "lost", "reason": reason.to_string()})
        }
        Some(_) => serde_json::json!({"status": "not followed"}),
    }
}
