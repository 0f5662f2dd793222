//! The code interpreter's types: what a cell produces (output, rich results, its error),
//! the options of a run, contexts, and the reader of a cell's streamed output.
//!
//! The service is the one E2B's `code-interpreter` template runs on port 49999 (Jupyter
//! behind a small HTTP API): `POST /execute` answers with one JSON object per line as the
//! cell runs, ended by `{"type": "end_of_execution"}`.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::time::Instant;

use crate::error::{Error, TransportStage};
use crate::framing::GoneProbe;
use crate::http::Ctx;

/// How long a cell may run when the caller does not say (the official SDK's default).
pub const DEFAULT_CODE_TIMEOUT: Duration = Duration::from_secs(300);

/// A language the code interpreter runs, by the names its service takes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodeLanguage {
    /// Python (the default context's language).
    Python,
    /// JavaScript.
    JavaScript,
    /// TypeScript.
    TypeScript,
    /// R.
    R,
    /// Java.
    Java,
    /// Bash.
    Bash,
    /// Any other kernel the sandbox's service has, by its name.
    Other(String),
}

impl CodeLanguage {
    /// The name the service takes.
    pub fn as_str(&self) -> &str {
        match self {
            CodeLanguage::Python => "python",
            CodeLanguage::JavaScript => "javascript",
            CodeLanguage::TypeScript => "typescript",
            CodeLanguage::R => "r",
            CodeLanguage::Java => "java",
            CodeLanguage::Bash => "bash",
            CodeLanguage::Other(name) => name,
        }
    }
}

/// Where a cell runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeTarget {
    /// The default Python context.
    DefaultContext,
    /// The default context of a language (created by the service on first use).
    Language(CodeLanguage),
    /// A context made with [`Sandbox::create_code_context`](crate::Sandbox::create_code_context),
    /// by its id.
    Context(String),
}

/// How to run a cell. Start from [`RunCodeOptions::default_context`],
/// [`RunCodeOptions::language`] or [`RunCodeOptions::context`]; there is no `Default`.
#[derive(Clone, Debug)]
pub struct RunCodeOptions {
    /// Where the cell runs.
    pub target: CodeTarget,
    /// Environment variables for this cell only (the sandbox's apply to every cell).
    pub envs: BTreeMap<String, String>,
    /// How long the cell may run: past it the client closes the connection (the service then
    /// interrupts the cell) and the run fails with a deadline error. `None`: no limit.
    pub timeout: Option<Duration>,
}

impl RunCodeOptions {
    /// In the default Python context, no extra variables, [`DEFAULT_CODE_TIMEOUT`].
    pub fn default_context() -> RunCodeOptions {
        RunCodeOptions::in_target(CodeTarget::DefaultContext)
    }

    /// In the default context of `language`, otherwise as [`RunCodeOptions::default_context`].
    pub fn language(language: CodeLanguage) -> RunCodeOptions {
        RunCodeOptions::in_target(CodeTarget::Language(language))
    }

    /// In the context `id`, otherwise as [`RunCodeOptions::default_context`].
    pub fn context(id: String) -> RunCodeOptions {
        RunCodeOptions::in_target(CodeTarget::Context(id))
    }

    fn in_target(target: CodeTarget) -> RunCodeOptions {
        RunCodeOptions {
            target,
            envs: BTreeMap::new(),
            timeout: Some(DEFAULT_CODE_TIMEOUT),
        }
    }
}

/// A context: its own kernel, state and working directory.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct CodeContext {
    /// Its id, for [`CodeTarget::Context`].
    pub id: String,
    /// Its language.
    pub language: String,
    /// Its working directory.
    pub cwd: String,
}

/// Whether [`Sandbox::remove_code_context`](crate::Sandbox::remove_code_context) removed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoveContextOutcome {
    /// The context and its kernel are gone.
    Removed,
    /// There was no such context.
    NotFound,
}

/// One piece of a cell's output, in the order the cell produced it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CodeOutput {
    /// The cell's number in its context (every cell counts, failed ones too).
    ExecutionCount(u64),
    /// Text the cell wrote to stdout.
    Stdout(OutputMessage),
    /// Text the cell wrote to stderr.
    Stderr(OutputMessage),
    /// A result: the value of the cell's last expression, or something it displayed.
    Result(Box<CodeResult>),
    /// The error the cell ended with.
    Error(ExecutionError),
}

/// Text a cell wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutputMessage {
    /// The text, as one write (or several close together) delivered it.
    pub text: String,
    /// When the service read it (RFC 3339), when it says.
    pub timestamp: Option<String>,
}

/// What a cell showed: one object in every format it has.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[non_exhaustive]
pub struct CodeResult {
    /// The value of the cell's last expression (else something it displayed).
    #[serde(default)]
    pub is_main_result: bool,
    /// `text/plain` (a string's quotes removed, as the service does).
    #[serde(default)]
    pub text: Option<String>,
    /// `text/html`.
    #[serde(default)]
    pub html: Option<String>,
    /// `text/markdown`.
    #[serde(default)]
    pub markdown: Option<String>,
    /// `image/svg+xml`.
    #[serde(default)]
    pub svg: Option<String>,
    /// `image/png`, base64.
    #[serde(default)]
    pub png: Option<String>,
    /// `image/jpeg`, base64.
    #[serde(default)]
    pub jpeg: Option<String>,
    /// `application/pdf`, base64.
    #[serde(default)]
    pub pdf: Option<String>,
    /// `text/latex`.
    #[serde(default)]
    pub latex: Option<String>,
    /// `application/json`.
    #[serde(default)]
    pub json: Option<serde_json::Value>,
    /// `application/javascript`.
    #[serde(default)]
    pub javascript: Option<String>,
    /// A table's columns (`e2b/data`, for a pandas DataFrame).
    #[serde(default)]
    pub data: Option<serde_json::Value>,
    /// A chart's data (`e2b/chart`, for a matplotlib figure on E2B's template).
    #[serde(default)]
    pub chart: Option<serde_json::Value>,
    /// Every other MIME type the object had.
    #[serde(default)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl CodeResult {
    /// The formats it has, in the official SDK's order, then the extra MIME types.
    pub fn formats(&self) -> Vec<&str> {
        let named = [
            ("text", self.text.is_some()),
            ("html", self.html.is_some()),
            ("markdown", self.markdown.is_some()),
            ("svg", self.svg.is_some()),
            ("png", self.png.is_some()),
            ("jpeg", self.jpeg.is_some()),
            ("pdf", self.pdf.is_some()),
            ("latex", self.latex.is_some()),
            ("json", self.json.is_some()),
            ("javascript", self.javascript.is_some()),
            ("data", self.data.is_some()),
            ("chart", self.chart.is_some()),
        ];
        named
            .iter()
            .filter(|(_, present)| *present)
            .map(|(name, _)| *name)
            .chain(self.extra.keys().map(String::as_str))
            .collect()
    }
}

/// The error a cell ended with.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct ExecutionError {
    /// The exception's name (`NameError`; `ContextRestarting` when the kernel died).
    #[serde(default)]
    pub name: String,
    /// Its message.
    #[serde(default)]
    pub value: String,
    /// The traceback, as the kernel printed it.
    #[serde(default)]
    pub traceback: String,
}

/// A whole cell: everything it produced.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Execution {
    /// Its results, in order (displayed ones and the main one).
    pub results: Vec<CodeResult>,
    /// What it wrote to stdout, piece by piece.
    pub stdout: Vec<String>,
    /// What it wrote to stderr, piece by piece.
    pub stderr: Vec<String>,
    /// The error it ended with, if any.
    pub error: Option<ExecutionError>,
    /// Its number in its context.
    pub execution_count: Option<u64>,
}

impl Execution {
    /// The main result's text (the value of the cell's last expression), if any.
    pub fn text(&self) -> Option<&str> {
        self.results
            .iter()
            .find(|r| r.is_main_result)
            .and_then(|r| r.text.as_deref())
    }

    /// Adds one piece of output.
    pub fn push(&mut self, output: CodeOutput) {
        match output {
            CodeOutput::ExecutionCount(count) => self.execution_count = Some(count),
            CodeOutput::Stdout(message) => self.stdout.push(message.text),
            CodeOutput::Stderr(message) => self.stderr.push(message.text),
            CodeOutput::Result(result) => self.results.push(*result),
            CodeOutput::Error(error) => self.error = Some(error),
        }
    }
}

/// One line of the stream, by its `type`.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Stdout(Text),
    Stderr(Text),
    Result(Box<CodeResult>),
    Error(ExecutionError),
    NumberOfExecutions {
        execution_count: u64,
    },
    EndOfExecution,
    Keepalive,
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct Text {
    #[serde(default)]
    text: String,
    #[serde(default)]
    timestamp: Option<serde_json::Value>,
}

impl Text {
    fn message(self) -> OutputMessage {
        OutputMessage {
            text: self.text,
            timestamp: match self.timestamp {
                Some(serde_json::Value::String(at)) => Some(at),
                Some(serde_json::Value::Number(at)) => Some(at.to_string()),
                _ => None,
            },
        }
    }
}

/// A running cell's output, read as it arrives ([`CodeRun::next`]) or all at once
/// ([`CodeRun::finish`]). Dropping it closes the connection, which interrupts the cell.
pub struct CodeRun {
    ctx: Ctx,
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buffer: BytesMut,
    max_line: usize,
    /// The run's deadline and the timeout it came from.
    deadline: Option<(Instant, Duration)>,
    idle: Duration,
    probe: Option<GoneProbe>,
    ended: bool,
}

impl std::fmt::Debug for CodeRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeRun")
            .field("operation", &self.ctx.operation)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl CodeRun {
    pub(crate) fn new(
        ctx: Ctx,
        body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
        max_line: usize,
        timeout: Option<Duration>,
        idle: Duration,
        probe: GoneProbe,
    ) -> CodeRun {
        CodeRun {
            ctx,
            body: Box::pin(body),
            buffer: BytesMut::new(),
            max_line,
            deadline: timeout.map(|timeout| (Instant::now() + timeout, timeout)),
            idle,
            probe: Some(probe),
            ended: false,
        }
    }

    /// The next piece of output; `None` once the cell ended. Fails when the run's timeout
    /// passes, the service stays silent too long (it writes a keepalive every few seconds),
    /// a line is not one of the service's objects or is over the cap, or the stream breaks
    /// off ([`Error::is_sandbox_gone`] when the sandbox turns out to be gone).
    pub async fn next(&mut self) -> Result<Option<CodeOutput>, Error> {
        loop {
            if self.ended {
                return Ok(None);
            }
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(at + 1);
                if let Some(output) = self.parse(&line[..at])? {
                    return Ok(Some(output));
                }
                continue;
            }
            if self.buffer.len() > self.max_line {
                return Err(self.ctx.limit(None, self.max_line as u64));
            }
            let wait = match self.deadline {
                Some((deadline, _)) => deadline.min(Instant::now() + self.idle),
                None => Instant::now() + self.idle,
            };
            match tokio::time::timeout_at(wait, self.body.next()).await {
                Err(_) => {
                    return Err(match self.deadline {
                        Some((deadline, timeout)) if Instant::now() >= deadline => {
                            self.ctx.deadline(timeout)
                        }
                        _ => self.ctx.deadline(self.idle),
                    });
                }
                Ok(Some(Ok(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Some(Err(error))) => {
                    let broken = self.ctx.transport(TransportStage::Body, error);
                    return Err(self.lost(broken).await);
                }
                Ok(None) => {
                    let short = self
                        .ctx
                        .protocol("the output ended before the cell's end_of_execution");
                    return Err(self.lost(short).await);
                }
            }
        }
    }

    /// Reads the rest of the cell's output into one [`Execution`].
    pub async fn finish(mut self) -> Result<Execution, Error> {
        let mut execution = Execution::default();
        while let Some(output) = self.next().await? {
            execution.push(output);
        }
        Ok(execution)
    }

    fn parse(&mut self, line: &[u8]) -> Result<Option<CodeOutput>, Error> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let line: Line = serde_json::from_slice(line)
            .map_err(|error| self.ctx.protocol(format!("invalid output line: {error}")))?;
        Ok(match line {
            Line::Stdout(text) => Some(CodeOutput::Stdout(text.message())),
            Line::Stderr(text) => Some(CodeOutput::Stderr(text.message())),
            Line::Result(result) => Some(CodeOutput::Result(result)),
            Line::Error(error) => Some(CodeOutput::Error(error)),
            Line::NumberOfExecutions { execution_count } => {
                Some(CodeOutput::ExecutionCount(execution_count))
            }
            Line::EndOfExecution => {
                self.ended = true;
                None
            }
            // Newer services may say more; what this client does not know is skipped.
            Line::Keepalive | Line::Unknown => None,
        })
    }

    async fn lost(&mut self, broken: Error) -> Error {
        crate::framing::lost(&self.ctx, &mut self.probe, broken).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Operation;
    use crate::http::Target;
    use crate::ids::SandboxId;
    use crate::secret::ApiKey;

    /// A run over `chunks` (then the end of the body); `gone` is what the probe finds.
    fn run_over(chunks: Vec<&'static [u8]>, max_line: usize, gone: bool) -> CodeRun {
        let id = SandboxId::parse("isb0codeinterp0".to_owned()).expect("an id");
        let ctx = Ctx::new(
            Operation::RunCode,
            Target::Envd(id),
            ApiKey::new("e2b_test_key".to_owned()),
            None,
        );
        let body = futures::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok::<_, reqwest::Error>(Bytes::from_static(chunk))),
        );
        let probe: GoneProbe = Box::new(move || Box::pin(async move { gone }));
        CodeRun::new(ctx, body, max_line, None, Duration::from_secs(5), probe)
    }

    #[tokio::test]
    async fn lines_split_anywhere_are_read_whole_and_keepalives_and_unknown_types_skipped() {
        let mut run = run_over(
            vec![
                b"{\"type\": \"number_of_executions\", \"execution_count\": 7}\n{\"type\": \"std",
                b"out\", \"text\": \"a\\n\", \"timestamp\": \"t\"}\n{\"type\": \"keepalive\"}\n",
                b"{\"type\": \"something_new\", \"x\": 1}\n",
                b"{\"type\": \"error\", \"name\": \"E\", \"value\": \"v\", \"traceback\": \"tb\"}\n",
                b"{\"type\": \"end_of_execution\"}\n",
            ],
            1024,
            false,
        );
        let mut collected = Execution::default();
        let mut pieces = 0;
        while let Some(output) = run.next().await.expect("output") {
            collected.push(output);
            pieces += 1;
        }
        assert_eq!(pieces, 3, "{collected:?}");
        assert_eq!(collected.execution_count, Some(7));
        assert_eq!(collected.stdout, ["a\n"]);
        assert_eq!(collected.error.map(|e| e.name).as_deref(), Some("E"));
        assert!(run.next().await.expect("ended").is_none());
    }

    #[tokio::test]
    async fn an_over_long_line_a_foreign_line_and_a_short_stream_are_errors_naming_the_run() {
        let mut long = run_over(
            vec![b"{\"type\": \"stdout\", \"text\": \"0123456789"],
            8,
            false,
        );
        let error = long.next().await.expect_err("over the cap");
        assert!(error.is_limit_exceeded(), "{error}");

        let mut foreign = run_over(vec![b"<html>oops</html>\n"], 1024, false);
        let error = foreign.next().await.expect_err("not an object");
        assert!(error.to_string().contains("run code"), "{error}");
        assert!(error.to_string().contains("isb0codeinterp0"), "{error}");

        let mut short = run_over(vec![b"{\"type\": \"keepalive\"}\n"], 1024, false);
        let error = short.next().await.expect_err("no end");
        assert!(error.to_string().contains("end_of_execution"), "{error}");
        assert!(!error.is_sandbox_gone());

        let mut killed = run_over(vec![b"{\"type\": \"keepalive\"}\n"], 1024, true);
        let error = killed.next().await.expect_err("no end");
        assert!(error.is_sandbox_gone(), "{error}");
    }

    #[test]
    fn a_result_lists_its_formats_in_the_sdks_order_then_the_extra_ones() {
        let result: CodeResult = serde_json::from_str(
            r#"{"type":"result","is_main_result":true,"latex":"$x$","text":"x",
                "extra":{"application/x-custom":"c"}}"#,
        )
        .expect("a result");
        assert_eq!(result.formats(), ["text", "latex", "application/x-custom"]);
        assert!(result.is_main_result);
    }

    #[test]
    fn an_execution_gathers_its_output_and_its_main_results_text() {
        let mut execution = Execution::default();
        execution.push(CodeOutput::ExecutionCount(3));
        execution.push(CodeOutput::Stdout(OutputMessage {
            text: "hi\n".into(),
            timestamp: None,
        }));
        execution.push(CodeOutput::Result(Box::new(CodeResult {
            html: Some("<b>shown</b>".into()),
            ..CodeResult::default()
        })));
        execution.push(CodeOutput::Result(Box::new(CodeResult {
            is_main_result: true,
            text: Some("42".into()),
            ..CodeResult::default()
        })));
        assert_eq!(execution.text(), Some("42"));
        assert_eq!(execution.stdout, ["hi\n"]);
        assert_eq!(execution.execution_count, Some(3));
        assert_eq!(execution.results.len(), 2);
    }
}
