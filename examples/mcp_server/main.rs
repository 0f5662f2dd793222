//! An MCP server that gives any MCP-speaking agent framework one persistent E2B sandbox.
//!
//! It speaks MCP over standard input and output (rmcp, the official Rust SDK) and exposes
//! three tools backed by an [`agent_sandbox::Backend`]:
//!
//! - `run_command`: runs a shell command in the sandbox. Each output chunk is sent as an MCP
//!   progress notification while the command runs (when the call carries a progress token);
//!   the result holds the exit code and the output, bounded to its first and last 32 KiB.
//! - `read_file`: reads a UTF-8 text file (1 MiB by default, 8 MiB at most).
//! - `write_file`: writes a text file, creating its parent directories.
//! - `checkpoint`, `list_checkpoints`, `rollback`: the sandbox's history. A checkpoint is an
//!   E2B snapshot of the whole machine (files and installed packages); a rollback replaces
//!   the sandbox by one made from a checkpoint, after checkpointing the state it replaces,
//!   so every rollback can itself be undone.
//! - `run_python`: runs Python in a kernel that lives in the sandbox between calls, so
//!   variables, imports and loaded data survive from call to call (`reset` starts afresh).
//! - `start_process`, `read_process`, `write_process`, `signal_process`: background processes
//!   (a server, a build, a REPL, an installer that asks questions): started with their stdin
//!   open, optionally on a terminal; their output is read as it comes (what arrived since the
//!   last read), their stdin written, and they are interrupted or killed with what they
//!   started.
//! - `fork`, `adopt`, `discard`: best-of-N. `fork` makes N branches of the current state;
//!   `run_command`, `read_file` and `write_file` take a `branch` number to work in one;
//!   `adopt` makes a branch the sandbox (killing the other branches); `discard` kills them
//!   all. One fork is open at a time: the server keeps it between calls, which is what makes
//!   it fit MCP (a tool call carries numbers, the server holds the sandboxes they name).
//!
//! ```text
//! cargo run --example mcp_server                     # embedded e2b-local, nothing to set up
//! E2B_API_KEY=e2b_... cargo run --example mcp_server # E2B itself
//! ```
//!
//! Without `E2B_API_KEY` it starts e2b-local in-process on a loopback port and the sandbox
//! lives as long as the server. With it, the sandbox is E2B's, found again by metadata on
//! the next start (its scope lives in `HERMES_E2B_MCP_HOME`, default `~/.hermes-e2b/mcp`),
//! and `E2B_DOMAIN`, `E2B_API_URL` and `E2B_SANDBOX_URL` are honoured like the E2B SDK does.
//! When the client closes standard input (or on SIGINT/SIGTERM) the backend's cleanup runs:
//! it waits for running commands and leaves the persistent sandbox to its lease (E2B pauses
//! it). Diagnostics go to standard error; standard output carries only MCP messages.

mod live;

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_examples::agent_sandbox::{
    ApiKeySource, Backend, Checkpoint, CheckpointReason, CheckpointRequest, CheckpointTarget,
    CommandExit, Config, DEFAULT_CHECKPOINT_WAIT, Endpoints, ErrorChain, FnSink, Fork, LiveSignal,
    NoStateHooks, OutputStream, RunOptions, Scope, Services, Termination, utc,
};
use agent_sandbox_examples::e2b_client::{self, ApiKey};
use agent_sandbox_examples::e2b_local::Server;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt as _, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Output kept from the start of a command.
const OUTPUT_HEAD: usize = 32 * 1024;
/// Output kept from the end of a command (where errors usually are).
const OUTPUT_TAIL: usize = 32 * 1024;
/// Largest piece of output carried by one progress notification.
const PROGRESS_MESSAGE_MAX: usize = 8 * 1024;
/// Chunks waiting to be forwarded; when full, the backend stops reading from E2B.
const CHUNK_QUEUE: usize = 64;
const DEFAULT_COMMAND_SECONDS: u64 = 120;
const MAX_COMMAND_SECONDS: u64 = 3600;
const DEFAULT_READ_BYTES: u64 = 1024 * 1024;
const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;

/// The longest a `read_process` waits for output.
const MAX_READ_WAIT_SECONDS: u64 = 60;

/// The scope's task id: one persistent sandbox per MCP server home.
const TASK_ID: &str = "mcp-server";
/// The most branches one `fork` call makes here (each is a whole sandbox).
const MAX_FORK_BRANCHES: u32 = 8;

#[derive(Debug, Deserialize, JsonSchema)]
struct RunCommandArgs {
    /// The shell command, run with bash.
    command: String,
    /// Seconds before the command is killed (default 120, at most 3600).
    timeout_seconds: Option<u64>,
    /// Working directory (default /home/user).
    cwd: Option<String>,
    /// Run it in this branch of the open fork instead of the sandbox.
    branch: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ReadFileArgs {
    /// Path in the sandbox (absolute, or relative to /home/user).
    path: String,
    /// Refuse files larger than this many bytes (default 1 MiB, at most 8 MiB).
    max_bytes: Option<u64>,
    /// Read it in this branch of the open fork instead of the sandbox.
    branch: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct WriteFileArgs {
    /// Path in the sandbox (absolute, or relative to /home/user); parents are created.
    path: String,
    /// The file's new content (UTF-8 text); an existing file is replaced.
    content: String,
    /// Write it in this branch of the open fork instead of the sandbox.
    branch: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct CheckpointArgs {
    /// A name for it (lowercase letters, digits and `-`); named checkpoints are kept.
    label: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct RollbackArgs {
    /// The checkpoint's label or snapshot id; the latest checkpoint when absent.
    checkpoint: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ForkArgs {
    /// How many branches (1 to 8).
    count: u32,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct AdoptArgs {
    /// The branch number `fork` gave.
    branch: usize,
}

/// The open fork: its branches and a backend for each started one.
#[derive(Debug, Deserialize, JsonSchema)]
struct RunPythonArgs {
    /// Python code; its `print` output is the result. State persists between calls.
    code: String,
    /// Seconds the code may run (default 120, at most 3600); past it, the kernel is killed
    /// and its state lost.
    timeout_seconds: Option<u64>,
    /// Start from a fresh kernel.
    reset: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct StartProcessArgs {
    /// The shell command (bash, login shell) to run in the background.
    command: String,
    /// Run it on a terminal (30 rows, 120 columns): for REPLs and programs that want one.
    terminal: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ReadProcessArgs {
    /// The id `start_process` gave.
    id: String,
    /// Seconds to wait for output when there is none yet (default 0, at most 60).
    wait_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct WriteProcessArgs {
    /// The id `start_process` gave.
    id: String,
    /// Text for its stdin, sent as is (add "\n" to press Enter; "\u0003" is Ctrl-C on a
    /// terminal).
    data: String,
    /// Close its stdin afterwards (end of file).
    close_stdin: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct SignalProcessArgs {
    /// The id `start_process` gave.
    id: String,
    /// `interrupt` (Ctrl-C to its group), `terminate` or `kill` (it and what it started).
    signal: String,
}

struct OpenFork {
    fork: Fork,
    branches: BTreeMap<usize, Arc<Backend>>,
}

/// The MCP tools over one backend.
#[derive(Clone)]
struct SandboxTools {
    backend: Arc<Backend>,
    fork: Arc<Mutex<Option<OpenFork>>>,
    live: Arc<live::LiveTools>,
}

impl SandboxTools {
    /// The backend a call with this `branch` argument works in.
    fn target(&self, branch: Option<usize>) -> Result<Arc<Backend>, String> {
        let Some(index) = branch else {
            return Ok(Arc::clone(&self.backend));
        };
        let open = self.fork.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(open) = open.as_ref() else {
            return Err(format!("there is no open fork, so no branch {index}"));
        };
        open.branches.get(&index).cloned().ok_or_else(|| {
            format!(
                "the open fork has no started branch {index} (started: {:?})",
                open.branches.keys().collect::<Vec<_>>()
            )
        })
    }

    fn no_open_fork(&self, tool: &str) -> Result<(), String> {
        let open = self.fork.lock().unwrap_or_else(PoisonError::into_inner);
        match open.as_ref() {
            None => Ok(()),
            Some(_) => Err(format!(
                "{tool} refused: a fork is open; adopt one of its branches or discard them first"
            )),
        }
    }
}

#[tool_router]
impl SandboxTools {
    #[tool(
        description = "Run a shell command in the sandbox. Output is streamed as progress \
                       notifications; the result has the exit code and the output (first and \
                       last 32 KiB)."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommandArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let seconds = args
            .timeout_seconds
            .unwrap_or(DEFAULT_COMMAND_SECONDS)
            .clamp(1, MAX_COMMAND_SECONDS);
        let mut options = RunOptions::new(Duration::from_secs(seconds));
        options.cwd = args.cwd;
        let backend = match self.target(args.branch) {
            Ok(backend) => backend,
            Err(message) => return Ok(tool_error(message)),
        };

        // The sink runs on a thread the backend owns, so blocking there is fine; a full queue
        // holds the backend back instead of growing memory. That thread is inside the
        // backend's `block_on`, where tokio's `blocking_send` refuses to run, hence the
        // executor-agnostic wait.
        let (sender, mut chunks) = tokio::sync::mpsc::channel::<Vec<u8>>(CHUNK_QUEUE);
        let sink = FnSink(move |_stream: OutputStream, bytes: &[u8]| {
            futures::executor::block_on(sender.send(bytes.to_vec()))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the tool call is gone"))
        });
        let command = args.command;
        let started = blocking(move || backend.run(&command, options, Box::new(sink))).await?;
        let running = match started {
            Ok(running) => running,
            Err(error) => {
                return Ok(tool_error(format!(
                    "the command did not start: {}",
                    ErrorChain(&error)
                )));
            }
        };

        let progress = context.meta.get_progress_token();
        let mut output = BoundedOutput::new(OUTPUT_HEAD, OUTPUT_TAIL);
        let mut killed = false;
        loop {
            tokio::select! {
                chunk = chunks.recv() => {
                    let Some(chunk) = chunk else { break };
                    output.push(&chunk);
                    if let Some(token) = &progress {
                        notify_chunk(&context, token, output.total(), &chunk).await;
                    }
                }
                // A cancelled call kills the command; its remaining output is still drained.
                () = context.ct.cancelled(), if !killed => {
                    killed = true;
                    running.kill();
                }
            }
        }
        match blocking(move || running.wait()).await? {
            Ok(exit) => Ok(command_result(&exit, &output)),
            Err(error) => Ok(tool_error(format!(
                "the command was lost: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(
        description = "Run Python in the sandbox's kernel: variables, imports and data persist \
                       from call to call. The result has what it printed, what it wrote to \
                       stderr and any traceback."
    )]
    async fn run_python(
        &self,
        Parameters(args): Parameters<RunPythonArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let seconds = args
            .timeout_seconds
            .unwrap_or(DEFAULT_COMMAND_SECONDS)
            .clamp(1, MAX_COMMAND_SECONDS);
        let (backend, live) = (Arc::clone(&self.backend), Arc::clone(&self.live));
        let reset = args.reset.unwrap_or(false);
        let ran = blocking(move || {
            live.run_python(&backend, &args.code, Duration::from_secs(seconds), reset)
        })
        .await?;
        let (outcome, fresh) = match ran {
            Ok(ran) => ran,
            Err(error) => {
                return Ok(tool_error(format!(
                    "the kernel could not run it: {}",
                    ErrorChain(&error)
                )));
            }
        };
        let status = match &outcome.status {
            agent_sandbox_examples::agent_sandbox::CellStatus::Ok => "ok",
            agent_sandbox_examples::agent_sandbox::CellStatus::Error => "error",
            agent_sandbox_examples::agent_sandbox::CellStatus::Exit => "exit",
            agent_sandbox_examples::agent_sandbox::CellStatus::Timeout => "timeout",
            _ => "ended",
        };
        let mut text = format!("{}{}", outcome.stdout, outcome.raw);
        if !outcome.stderr.is_empty() || !outcome.traceback.is_empty() {
            text.push_str(&format!(
                "--- stderr ---\n{}{}",
                outcome.stderr, outcome.traceback
            ));
        }
        if matches!(status, "timeout" | "ended") {
            text.push_str("[the kernel ended: its state is lost; the next call starts afresh]");
        }
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(json!({
            "status": status,
            "stdout": outcome.stdout,
            "stderr": outcome.stderr,
            "traceback": outcome.traceback,
            "execution_count": outcome.execution_count,
            "fresh_kernel": fresh,
        }));
        if status != "ok" {
            result.is_error = Some(true);
        }
        Ok(result)
    }

    #[tool(
        description = "Start a command in the background (a server, a build, a REPL) with its \
                       stdin open; returns its id. Read its output with read_process, answer \
                       it with write_process."
    )]
    async fn start_process(
        &self,
        Parameters(args): Parameters<StartProcessArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let (backend, live) = (Arc::clone(&self.backend), Arc::clone(&self.live));
        let terminal = args.terminal.unwrap_or(false);
        match blocking(move || live.start(&backend, &args.command, terminal)).await? {
            Ok((id, pid)) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
                    "started {id} (pid {pid} in the sandbox)"
                ))]);
                result.structured_content = Some(json!({"id": id, "pid": pid}));
                Ok(result)
            }
            Err(error) => Ok(tool_error(format!(
                "the process did not start: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(
        description = "What a background process wrote since the last read (waiting up to \
                       wait_seconds for something), and whether it is still running."
    )]
    async fn read_process(
        &self,
        Parameters(args): Parameters<ReadProcessArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait = Duration::from_secs(args.wait_seconds.unwrap_or(0).min(MAX_READ_WAIT_SECONDS));
        let live = Arc::clone(&self.live);
        let id = args.id;
        match blocking(move || live.read(&id, wait)).await? {
            Ok(reading) => {
                let mut structured = live::end_json(&reading.end);
                structured["output"] = json!(reading.output);
                structured["dropped_bytes"] = json!(reading.dropped);
                let mut text = reading.output;
                text.push_str(&format!(
                    "[{}]",
                    structured["status"].as_str().unwrap_or("?")
                ));
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(structured);
                Ok(result)
            }
            Err(message) => Ok(tool_error(message)),
        }
    }

    #[tool(
        description = "Write to a background process's stdin (answer a prompt, type in a REPL)."
    )]
    async fn write_process(
        &self,
        Parameters(args): Parameters<WriteProcessArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let live = Arc::clone(&self.live);
        let close = args.close_stdin.unwrap_or(false);
        let (id, size) = (args.id.clone(), args.data.len());
        match blocking(move || live.write(&args.id, args.data.as_bytes(), close)).await? {
            Ok(()) => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "wrote {size} bytes to {id}{}",
                if close { " and closed its stdin" } else { "" }
            ))])),
            Err(message) => Ok(tool_error(message)),
        }
    }

    #[tool(
        description = "Interrupt, terminate or kill a background process (kill: with what it started)."
    )]
    async fn signal_process(
        &self,
        Parameters(args): Parameters<SignalProcessArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let signal = match args.signal.as_str() {
            "interrupt" => LiveSignal::Interrupt,
            "terminate" => LiveSignal::Terminate,
            "kill" => LiveSignal::Kill,
            other => {
                return Ok(tool_error(format!(
                    "signal must be interrupt, terminate or kill, not {other:?}"
                )));
            }
        };
        let live = Arc::clone(&self.live);
        let id = args.id.clone();
        match blocking(move || live.signal(&args.id, signal)).await? {
            Ok(()) => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "sent {} to {id}",
                args.signal
            ))])),
            Err(message) => Ok(tool_error(message)),
        }
    }

    #[tool(description = "Read a UTF-8 text file from the sandbox.")]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cap = args
            .max_bytes
            .unwrap_or(DEFAULT_READ_BYTES)
            .min(MAX_READ_BYTES);
        let backend = match self.target(args.branch) {
            Ok(backend) => backend,
            Err(message) => return Ok(tool_error(message)),
        };
        let path = args.path;
        let shown = path.clone();
        match blocking(move || backend.read_file(&path, cap)).await? {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Ok(CallToolResult::success(vec![ContentBlock::text(text)])),
                Err(error) => Ok(tool_error(format!(
                    "{shown} is not UTF-8 text ({} bytes)",
                    error.as_bytes().len()
                ))),
            },
            Err(error) => Ok(tool_error(format!(
                "could not read {shown}: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(description = "Write a UTF-8 text file in the sandbox, creating parent directories.")]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = match self.target(args.branch) {
            Ok(backend) => backend,
            Err(message) => return Ok(tool_error(message)),
        };
        let path = args.path;
        let shown = path.clone();
        let size = args.content.len();
        match blocking(move || backend.write_file(&path, args.content.into_bytes())).await? {
            Ok(()) => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "wrote {size} bytes to {shown}"
            ))])),
            Err(error) => Ok(tool_error(format!(
                "could not write {shown}: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(
        description = "Checkpoint the sandbox: an E2B snapshot of its files and installed \
                       packages, to roll back to later. Waits for running commands first."
    )]
    async fn checkpoint(
        &self,
        Parameters(args): Parameters<CheckpointArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        let request = CheckpointRequest {
            label: args.label,
            reason: CheckpointReason::Agent,
            wait: DEFAULT_CHECKPOINT_WAIT,
        };
        match blocking(move || backend.checkpoint(request)).await? {
            Ok(checkpoint) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
                    "checkpoint {} ({}) of sandbox {}",
                    checkpoint.display_name(),
                    checkpoint.snapshot_id,
                    checkpoint.source_sandbox
                ))]);
                result.structured_content = Some(checkpoint_json(&checkpoint));
                Ok(result)
            }
            Err(error) => Ok(tool_error(format!(
                "no checkpoint taken: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(description = "List the sandbox's checkpoints, newest first.")]
    async fn list_checkpoints(&self) -> Result<CallToolResult, ErrorData> {
        let backend = Arc::clone(&self.backend);
        match blocking(move || backend.checkpoints()).await? {
            Ok(checkpoints) => {
                let text = if checkpoints.is_empty() {
                    "no checkpoints".to_owned()
                } else {
                    checkpoints
                        .iter()
                        .map(|c| {
                            format!(
                                "{}  {}  {}  {}",
                                utc(c.taken_at),
                                c.reason.as_str(),
                                c.display_name(),
                                c.snapshot_id
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(json!({
                    "checkpoints": checkpoints.iter().map(checkpoint_json).collect::<Vec<_>>()
                }));
                Ok(result)
            }
            Err(error) => Ok(tool_error(format!(
                "could not list checkpoints: {}",
                ErrorChain(&error)
            ))),
        }
    }

    #[tool(
        description = "Roll the sandbox back to a checkpoint (by label or snapshot id; the \
                       latest when absent). The current state is checkpointed first, so the \
                       result names a checkpoint that undoes the rollback."
    )]
    async fn rollback(
        &self,
        Parameters(args): Parameters<RollbackArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Err(message) = self.no_open_fork("rollback") {
            return Ok(tool_error(message));
        }
        let target = match args.checkpoint {
            Some(name) => CheckpointTarget::Named(name),
            None => CheckpointTarget::Latest,
        };
        let backend = Arc::clone(&self.backend);
        match blocking(move || backend.rollback(target, DEFAULT_CHECKPOINT_WAIT)).await? {
            Ok(report) => {
                let mut text = format!(
                    "rolled back to {} ({}): sandbox {} replaces {}; undo with checkpoint {}",
                    report.restored.display_name(),
                    report.restored.snapshot_id,
                    report.sandbox_id,
                    report.retired_sandbox,
                    report.undo.snapshot_id
                );
                for warning in &report.warnings {
                    text.push_str(&format!("\nwarning: {warning}"));
                }
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(json!({
                    "restored": checkpoint_json(&report.restored),
                    "undo": checkpoint_json(&report.undo),
                    "sandbox_id": report.sandbox_id,
                    "retired_sandbox": report.retired_sandbox,
                    "warnings": report.warnings,
                }));
                Ok(result)
            }
            Err(error) => Ok(tool_error(format!("no rollback: {}", ErrorChain(&error)))),
        }
    }

    #[tool(
        description = "Fork the sandbox into N branches (1 to 8), each a copy of its current \
                       state. Use a branch with the `branch` argument of run_command, \
                       read_file and write_file; then adopt one or discard them all."
    )]
    async fn fork(
        &self,
        Parameters(args): Parameters<ForkArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Err(message) = self.no_open_fork("fork") {
            return Ok(tool_error(message));
        }
        if !(1..=MAX_FORK_BRANCHES).contains(&args.count) {
            return Ok(tool_error(format!(
                "a fork here makes 1 to {MAX_FORK_BRANCHES} branches, not {}",
                args.count
            )));
        }
        let backend = Arc::clone(&self.backend);
        let forked = blocking(move || {
            let fork = backend.fork(args.count, DEFAULT_CHECKPOINT_WAIT)?;
            let mut branches = BTreeMap::new();
            for branch in fork.started() {
                branches.insert(branch.index, Arc::new(backend.branch(branch)?));
            }
            Ok::<_, agent_sandbox_examples::agent_sandbox::Error>(OpenFork { fork, branches })
        })
        .await?;
        let open = match forked {
            Ok(open) => open,
            Err(error) => {
                return Ok(tool_error(format!("no fork: {}", ErrorChain(&error))));
            }
        };
        let branches: Vec<_> = open
            .fork
            .branches
            .iter()
            .enumerate()
            .map(|(index, branch)| match branch {
                Ok(branch) => json!({"branch": index, "sandbox_id": branch.sandbox_id.as_str()}),
                Err(error) => json!({"branch": index, "error": ErrorChain(error).to_string()}),
            })
            .collect();
        let text = format!(
            "forked sandbox {} into {} branches ({} started) from checkpoint {}",
            open.fork.parent,
            open.fork.branches.len(),
            open.branches.len(),
            open.fork.checkpoint.snapshot_id
        );
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(json!({
            "parent": open.fork.parent,
            "checkpoint": checkpoint_json(&open.fork.checkpoint),
            "branches": branches,
        }));
        *self.fork.lock().unwrap_or_else(PoisonError::into_inner) = Some(open);
        Ok(result)
    }

    #[tool(
        description = "Make a branch of the open fork the sandbox from now on; the other \
                       branches and the previous sandbox (checkpointed first) are killed."
    )]
    async fn adopt(
        &self,
        Parameters(args): Parameters<AdoptArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let Some(open) = self
            .fork
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Ok(tool_error("there is no open fork to adopt from".to_owned()));
        };
        let Some(chosen) = open
            .fork
            .started()
            .find(|b| b.index == args.branch)
            .cloned()
        else {
            let message = format!("the open fork has no started branch {}", args.branch);
            *self.fork.lock().unwrap_or_else(PoisonError::into_inner) = Some(open);
            return Ok(tool_error(message));
        };
        let backend = Arc::clone(&self.backend);
        let (open, adopted) = blocking(move || {
            let adopted = backend.adopt(&open.fork, &chosen, DEFAULT_CHECKPOINT_WAIT);
            (open, adopted)
        })
        .await?;
        match adopted {
            Ok(report) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
                    "adopted branch {} (sandbox {}); sandbox {} retired, undo with checkpoint {}",
                    args.branch, report.sandbox_id, report.retired_sandbox, report.undo.snapshot_id
                ))]);
                result.structured_content = Some(json!({
                    "sandbox_id": report.sandbox_id,
                    "retired_sandbox": report.retired_sandbox,
                    "undo": checkpoint_json(&report.undo),
                    "warnings": report.warnings,
                }));
                Ok(result)
            }
            Err(error) => {
                // Nothing changed: the fork stays open for another try or a discard.
                *self.fork.lock().unwrap_or_else(PoisonError::into_inner) = Some(open);
                Ok(tool_error(format!("no adoption: {}", ErrorChain(&error))))
            }
        }
    }

    #[tool(description = "Kill every branch of the open fork; the sandbox stays as it is.")]
    async fn discard(&self) -> Result<CallToolResult, ErrorData> {
        let Some(open) = self
            .fork
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Ok(tool_error("there is no open fork to discard".to_owned()));
        };
        let backend = Arc::clone(&self.backend);
        match blocking(move || backend.discard(&open.fork)).await? {
            Ok(discarded) => {
                let mut text = format!("killed {} branches", discarded.killed.len());
                for (id, why) in &discarded.failed {
                    text.push_str(&format!("\ncould not kill {id}: {why}"));
                }
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(json!({
                    "killed": discarded.killed,
                    "failed": discarded.failed.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                }));
                Ok(result)
            }
            Err(error) => Ok(tool_error(format!("no discard: {}", ErrorChain(&error)))),
        }
    }
}

#[tool_handler(
    name = "hermes-e2b-sandbox",
    instructions = "One persistent E2B sandbox (a Linux machine, user `user`, home /home/user). \
                    Files and installed packages persist between calls. Checkpoint before a \
                    risky step and roll back after a failure; fork to try several approaches \
                    at once, then adopt the branch that worked. Python run with run_python \
                    keeps its state between calls; background processes keep running and take \
                    input."
)]
impl ServerHandler for SandboxTools {}

/// Runs a backend call on the blocking pool: the backend's methods block the calling thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ErrorData> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| ErrorData::internal_error(format!("sandbox worker failed: {error}"), None))
}

/// One progress notification per output chunk. A client that went away is not an error for
/// the command: the result still carries the output.
async fn notify_chunk(
    context: &RequestContext<RoleServer>,
    token: &ProgressToken,
    total: u64,
    chunk: &[u8],
) {
    let shown = &chunk[..chunk.len().min(PROGRESS_MESSAGE_MAX)];
    let message = String::from_utf8_lossy(shown).into_owned();
    let param = ProgressNotificationParam::new(token.clone(), total as f64).with_message(message);
    if let Err(error) = context.peer.notify_progress(param).await {
        eprintln!("mcp_server: progress notification not sent: {error}");
    }
}

/// A checkpoint as structured tool output.
fn checkpoint_json(checkpoint: &Checkpoint) -> serde_json::Value {
    json!({
        "snapshot_id": checkpoint.snapshot_id,
        "name": checkpoint.display_name(),
        "label": checkpoint.label,
        "reason": checkpoint.reason.as_str(),
        "taken_at": utc(checkpoint.taken_at),
        "source_sandbox": checkpoint.source_sandbox,
    })
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// The tool result of a finished command: text for the model, structured fields for code.
fn command_result(exit: &CommandExit, output: &BoundedOutput) -> CallToolResult {
    let text = output.text();
    let termination = match exit.termination {
        Termination::Exited => "exited",
        Termination::Killed => "killed",
        Termination::DeadlineExceeded => "deadline_exceeded",
    };
    let mut shown = text.clone();
    if !shown.is_empty() && !shown.ends_with('\n') {
        shown.push('\n');
    }
    shown.push_str(&format!("[exit code {}, {termination}]", exit.exit_code));
    let mut result = CallToolResult::success(vec![ContentBlock::text(shown)]);
    result.structured_content = Some(json!({
        "exit_code": exit.exit_code,
        "termination": termination,
        "output": text,
        "output_bytes": output.total(),
        "omitted_bytes": output.omitted(),
    }));
    if exit.termination != Termination::Exited {
        result.is_error = Some(true);
    }
    result
}

/// A command's output with bounded memory: the first `head` and the last `tail` bytes.
#[derive(Debug)]
struct BoundedOutput {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl BoundedOutput {
    fn new(head_cap: usize, tail_cap: usize) -> BoundedOutput {
        BoundedOutput {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap,
            total: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        let room = self.head_cap - self.head.len();
        let taken = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..taken]);
        bytes = &bytes[taken..];
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            bytes = &bytes[bytes.len() - self.tail_cap..];
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    fn total(&self) -> u64 {
        self.total
    }

    fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted() > 0 {
            text.push_str(&format!("\n[... {} bytes omitted ...]\n", self.omitted()));
        }
        let (first, second) = self.tail.as_slices();
        let tail: Vec<u8> = [first, second].concat();
        text.push_str(&String::from_utf8_lossy(&tail));
        text
    }
}

/// Where the sandbox comes from.
enum Target {
    /// E2B itself (E2B_API_KEY is set).
    Cloud { home: PathBuf },
    /// The embedded e2b-local server, with a scratch scope directory.
    Local {
        server: Server,
        home: tempfile::TempDir,
    },
}

impl Target {
    fn home(&self) -> PathBuf {
        match self {
            Target::Cloud { home } => home.clone(),
            Target::Local { home, .. } => home.path().to_path_buf(),
        }
    }
}

async fn choose_target() -> AnyResult<(Target, Config)> {
    match ApiKey::from_env() {
        Some(key) => {
            // The same endpoint rules as e2b-client (and the E2B SDK).
            let client = e2b_client::Config::from_env(key.clone());
            let mut config = Config::new(ApiKeySource::Key(key));
            config.endpoints = Endpoints {
                domain: Some(client.domain),
                api_url: client.api_url,
                sandbox_url: client.sandbox_url,
            };
            let home = match std::env::var_os("HERMES_E2B_MCP_HOME") {
                Some(home) => PathBuf::from(home),
                None => std::env::home_dir()
                    .ok_or("HOME is not set; set HERMES_E2B_MCP_HOME")?
                    .join(".hermes-e2b")
                    .join("mcp"),
            };
            std::fs::create_dir_all(&home)?;
            // A URL may carry credentials (user:pass@); the redaction pass removes them.
            let api = config.endpoints.api_url.as_deref().map(e2b_client::redact);
            eprintln!(
                "mcp_server: sandbox on E2B ({}), scope {}",
                api.as_deref().unwrap_or("public cloud"),
                home.display()
            );
            Ok((Target::Cloud { home }, config))
        }
        None => {
            let server = Server::start_loopback().await?;
            // e2b-local accepts any non-empty key.
            let mut config = Config::new(ApiKeySource::Key(ApiKey::new("e2b-local".to_owned())));
            config.endpoints = Endpoints::single(server.url());
            eprintln!(
                "mcp_server: sandbox on the embedded e2b-local at {} (set E2B_API_KEY to use E2B)",
                server.url()
            );
            let home = tempfile::tempdir()?;
            Ok((Target::Local { server, home }, config))
        }
    }
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let signals = Signals::listen()?;
    let (target, config) = choose_target().await?;
    let scope = Scope {
        profile_home: target.home(),
        task_id: TASK_ID.to_owned(),
    };
    let services = Services::new(tokio::runtime::Handle::current());
    let backend = Arc::new(Backend::new(
        config,
        scope,
        services,
        Arc::new(NoStateHooks),
    )?);

    let tools = SandboxTools {
        backend: Arc::clone(&backend),
        fork: Arc::new(Mutex::new(None)),
        live: Arc::default(),
    };
    let open_fork = Arc::clone(&tools.fork);
    let served = serve(tools, signals).await;

    // Branches nobody adopted are not the scope's: kill them rather than leave them to
    // their lease.
    let open = open_fork
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(open) = open {
        let backend = Arc::clone(&backend);
        let discarded = tokio::task::spawn_blocking(move || backend.discard(&open.fork)).await?;
        match discarded {
            Ok(discarded) => eprintln!(
                "mcp_server: discarded the open fork's {} branches",
                discarded.killed.len()
            ),
            Err(error) => eprintln!(
                "mcp_server: the open fork was not discarded: {}",
                ErrorChain(&error)
            ),
        }
    }

    // Cleanup runs however serving ended: it waits for running commands, then leaves the
    // persistent sandbox to its lease.
    let report = tokio::task::spawn_blocking(move || backend.cleanup()).await?;
    eprintln!(
        "mcp_server: cleanup done for sandbox {} (pull: {:?}, sandbox: {:?})",
        report.sandbox_id.as_deref().unwrap_or("none"),
        report.pull,
        report.sandbox
    );
    if let Target::Local { server, home } = target {
        server.shutdown().await?;
        drop(home);
    }
    served?;
    // A read of standard input that is still pending (after a signal) cannot be cancelled
    // and would hold the runtime's shutdown; everything is cleaned up, so leave now.
    std::process::exit(0)
}

/// Serves MCP on standard input and output until the client disconnects or a signal comes.
async fn serve(tools: SandboxTools, mut signals: Signals) -> AnyResult<()> {
    let service = tokio::select! {
        service = tools.serve(rmcp::transport::stdio()) => service?,
        () = signals.recv() => {
            eprintln!("mcp_server: signal received before the session started");
            return Ok(());
        }
    };
    let cancel = service.cancellation_token();
    let watcher = tokio::spawn(async move {
        signals.recv().await;
        eprintln!("mcp_server: signal received, shutting down");
        cancel.cancel();
    });
    let reason = service.waiting().await;
    watcher.abort();
    eprintln!("mcp_server: MCP session ended ({reason:?})");
    Ok(())
}

/// SIGINT and SIGTERM, listened for from the start so that neither can kill the process
/// before the cleanup runs.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    fn listen() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BoundedOutput;

    #[test]
    fn bounded_output_keeps_head_and_tail() {
        let mut output = BoundedOutput::new(4, 3);
        output.push(b"ab");
        output.push(b"cdefg");
        output.push(b"hij");
        assert_eq!(output.total(), 10);
        assert_eq!(output.omitted(), 3);
        assert_eq!(output.text(), "abcd\n[... 3 bytes omitted ...]\nhij");
    }

    #[test]
    fn bounded_output_small_is_whole() {
        let mut output = BoundedOutput::new(4, 3);
        output.push(b"abc");
        output.push(b"def");
        assert_eq!(output.omitted(), 0);
        assert_eq!(output.text(), "abcdef");
    }
}
