//! The code interpreter's state (what [`crate::interpreter`] serves): every sandbox's
//! contexts, one boot at a time, and each context's kernel, a process of the sandbox whose
//! lines are read and checked here.
//!
//! The kernel writes the code-interpreter wire objects itself; what it writes is checked
//! here (one JSON object with a known `type` per line, of bounded size) before it is
//! passed on, since the sandbox's code can write anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::process_table::{Event, Proc, ProcessTable};

/// The longest line a kernel may write (a result carrying a large image is one line).
const MAX_LINE: usize = 64 * 1024 * 1024;

/// The types of the objects a kernel writes, as the service passes them on.
const PASSED_ON: &[&str] = &[
    "stdout",
    "stderr",
    "result",
    "error",
    "number_of_executions",
];

/// Every sandbox's contexts.
#[derive(Debug, Default)]
pub(crate) struct Interpreters {
    by_sandbox: Mutex<HashMap<String, Arc<Contexts>>>,
}

impl Interpreters {
    /// The contexts of the sandbox's current boot (a new boot starts with none, as a
    /// rebooted VM's Jupyter does); forgets those of sandboxes that are gone.
    pub(crate) fn of(&self, sandbox_id: &str, boot: &Arc<ProcessTable>) -> Arc<Contexts> {
        let mut map = self
            .by_sandbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, contexts| !contexts.boot.is_closed());
        let fresh = || {
            Arc::new(Contexts {
                boot: Arc::clone(boot),
                list: tokio::sync::Mutex::new(Vec::new()),
            })
        };
        let entry = map.entry(sandbox_id.to_owned()).or_insert_with(fresh);
        if !Arc::ptr_eq(&entry.boot, boot) {
            *entry = fresh();
        }
        Arc::clone(entry)
    }
}

/// One boot of one sandbox's contexts.
#[derive(Debug)]
pub(crate) struct Contexts {
    boot: Arc<ProcessTable>,
    /// In creation order (the SDK's tests take the last as the newest).
    pub(crate) list: tokio::sync::Mutex<Vec<Arc<Context>>>,
}

impl Contexts {
    pub(crate) async fn find(&self, id: &str) -> Option<Arc<Context>> {
        self.list.lock().await.iter().find(|c| c.id == id).cloned()
    }
}

/// One context: its language, working directory and kernel.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) id: String,
    pub(crate) language: String,
    pub(crate) cwd: String,
    /// The language's default context (the one `language=` runs in).
    pub(crate) default: bool,
    /// Held for a cell's whole run: a context runs one cell at a time.
    pub(crate) kernel: Arc<tokio::sync::Mutex<Option<Kernel>>>,
    /// The kernel's process, to end it without waiting for a running cell.
    process: Mutex<Option<Arc<Proc>>>,
}

impl Context {
    pub(crate) fn new(id: String, language: String, cwd: String, default: bool) -> Context {
        Context {
            id,
            language,
            cwd,
            default,
            kernel: Arc::new(tokio::sync::Mutex::new(None)),
            process: Mutex::new(None),
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"id": self.id, "language": self.language, "cwd": self.cwd})
    }

    /// Records the kernel just started for this context.
    pub(crate) fn started(&self, kernel: &Kernel) {
        *self.process.lock().unwrap_or_else(PoisonError::into_inner) = Some(kernel.process());
    }

    /// Kills the kernel now: a running cell ends with `ContextRestarting`.
    pub(crate) fn kill_kernel(&self) {
        let process = self
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(process) = process {
            signal(&process, libc::SIGKILL);
        }
    }
}

/// What a kernel said, or that it went.
#[derive(Debug)]
pub(crate) enum Said {
    /// One wire object, checked, without its newline.
    Object(Bytes),
    /// The end of the cell.
    End,
    /// The kernel is gone: `sandbox_gone` when its sandbox died or paused under it.
    Gone { sandbox_gone: bool },
}

/// A running kernel.
#[derive(Debug)]
pub(crate) struct Kernel {
    proc: Arc<Proc>,
    said: mpsc::Receiver<Said>,
}

impl Kernel {
    /// Takes over a kernel process just started (its stdin a pipe), once it wrote its
    /// first line: `Err` with what it wrote instead when that was not its ready line.
    pub(crate) async fn attach(
        proc: Arc<Proc>,
        events: mpsc::Receiver<Event>,
        sandbox_id: &str,
    ) -> Result<Kernel, String> {
        let (tx, mut said) = mpsc::channel(16);
        tokio::spawn(pump(events, tx, sandbox_id.to_owned()));
        match said.recv().await {
            Some(Said::Object(line)) if is_ready(&line) => Ok(Kernel { proc, said }),
            Some(Said::Gone { .. }) | None => Err("it exited as it started".to_owned()),
            Some(other) => Err(format!(
                "it started with {other:?} instead of its ready line"
            )),
        }
    }

    /// Its process.
    pub(crate) fn process(&self) -> Arc<Proc> {
        Arc::clone(&self.proc)
    }

    /// True while its process runs.
    pub(crate) fn alive(&self) -> bool {
        self.proc.end().is_none()
    }

    /// Sends one cell.
    pub(crate) async fn send(&self, request: &serde_json::Value) -> Result<(), String> {
        let mut line = request.to_string();
        line.push('\n');
        let mut stdin = self.proc.stdin.lock().await;
        let pipe = stdin.as_mut().ok_or("the kernel's stdin is closed")?;
        pipe.write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to the kernel failed: {e}"))
    }

    /// The kernel's next word.
    pub(crate) async fn next(&mut self) -> Said {
        self.said.recv().await.unwrap_or(Said::Gone {
            sandbox_gone: false,
        })
    }

    /// Interrupts the running cell (SIGINT, as Jupyter's interrupt).
    pub(crate) fn interrupt(&self) {
        signal(&self.proc, libc::SIGINT);
    }

    /// Ends the kernel.
    pub(crate) fn kill(&self) {
        signal(&self.proc, libc::SIGKILL);
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.kill();
    }
}

fn signal(proc: &Proc, signal: i32) {
    if proc.end().is_some() {
        return;
    }
    if let Ok(pid) = i32::try_from(proc.host_pid) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our running child.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn is_ready(line: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(line)
        .is_ok_and(|v| v.get("type").and_then(|t| t.as_str()) == Some("ready"))
}

/// Splits the kernel's stdout into lines and checks each; logs its stderr (the kernel's
/// own failures).
async fn pump(mut events: mpsc::Receiver<Event>, said: mpsc::Sender<Said>, sandbox_id: String) {
    let mut buffer = BytesMut::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Stdout(bytes) => {
                buffer.extend_from_slice(&bytes);
                while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                    let line = buffer.split_to(at + 1).freeze().slice(..at);
                    if said.send(check(line, &sandbox_id)).await.is_err() {
                        return;
                    }
                }
                if buffer.len() > MAX_LINE {
                    tracing::warn!(
                        %sandbox_id,
                        "a code-interpreter kernel wrote an over-long line"
                    );
                    let _ = said
                        .send(Said::Gone {
                            sandbox_gone: false,
                        })
                        .await;
                    return;
                }
            }
            Event::Stderr(bytes) => {
                tracing::debug!(
                    %sandbox_id,
                    stderr = %String::from_utf8_lossy(&bytes),
                    "code-interpreter kernel"
                );
            }
            Event::Pty(_) => {}
            Event::End(_) => {
                let _ = said
                    .send(Said::Gone {
                        sandbox_gone: false,
                    })
                    .await;
                return;
            }
            Event::SandboxGone => {
                let _ = said.send(Said::Gone { sandbox_gone: true }).await;
                return;
            }
        }
    }
    let _ = said.send(Said::Gone { sandbox_gone: true }).await;
}

/// One line of the kernel, as what it says: an object of a known type passes, the end
/// ends, anything else is dropped (and logged).
fn check(line: Bytes, sandbox_id: &str) -> Said {
    let kind = serde_json::from_slice::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
    match kind.as_deref() {
        Some("end_of_execution") => Said::End,
        Some(kind) if PASSED_ON.contains(&kind) || kind == "ready" => Said::Object(line),
        _ => {
            tracing::warn!(
                %sandbox_id,
                "a code-interpreter kernel wrote a line that is not one of its objects"
            );
            Said::Object(Bytes::from_static(b""))
        }
    }
}
