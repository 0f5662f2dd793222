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

use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_examples::agent_sandbox::{
    ApiKeySource, Backend, CommandExit, Config, Endpoints, ErrorChain, FnSink, NoStateHooks,
    OutputStream, RunOptions, Scope, Services, Termination,
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

/// The scope's task id: one persistent sandbox per MCP server home.
const TASK_ID: &str = "mcp-server";

#[derive(Debug, Deserialize, JsonSchema)]
struct RunCommandArgs {
    /// The shell command, run with bash.
    command: String,
    /// Seconds before the command is killed (default 120, at most 3600).
    timeout_seconds: Option<u64>,
    /// Working directory (default /home/user).
    cwd: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct ReadFileArgs {
    /// Path in the sandbox (absolute, or relative to /home/user).
    path: String,
    /// Refuse files larger than this many bytes (default 1 MiB, at most 8 MiB).
    max_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct WriteFileArgs {
    /// Path in the sandbox (absolute, or relative to /home/user); parents are created.
    path: String,
    /// The file's new content (UTF-8 text); an existing file is replaced.
    content: String,
}

/// The MCP tools over one backend.
#[derive(Clone)]
struct SandboxTools {
    backend: Arc<Backend>,
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

        // The sink runs on a thread the backend owns, so blocking there is fine; a full queue
        // holds the backend back instead of growing memory. That thread is inside the
        // backend's `block_on`, where tokio's `blocking_send` refuses to run, hence the
        // executor-agnostic wait.
        let (sender, mut chunks) = tokio::sync::mpsc::channel::<Vec<u8>>(CHUNK_QUEUE);
        let sink = FnSink(move |_stream: OutputStream, bytes: &[u8]| {
            futures::executor::block_on(sender.send(bytes.to_vec()))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the tool call is gone"))
        });
        let backend = Arc::clone(&self.backend);
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

    #[tool(description = "Read a UTF-8 text file from the sandbox.")]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let cap = args
            .max_bytes
            .unwrap_or(DEFAULT_READ_BYTES)
            .min(MAX_READ_BYTES);
        let backend = Arc::clone(&self.backend);
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
        let backend = Arc::clone(&self.backend);
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
}

#[tool_handler(
    name = "hermes-e2b-sandbox",
    instructions = "One persistent E2B sandbox (a Linux machine, user `user`, home /home/user). \
                    Files and installed packages persist between calls."
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
    };
    let served = serve(tools, signals).await;

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
