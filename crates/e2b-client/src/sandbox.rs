//! One sandbox's envd: processes over Connect streams, filesystem RPCs, `/files`, health.

use std::fmt;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use reqwest::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::ENVD_PORT;
use crate::control::{Client, EnvdAccess, UNRESERVED};
use crate::error::{Error, Operation};
use crate::files::{
    Download, EntryInfo, MakeDirOutcome, UploadFile, WrittenFile, multipart,
    multipart_filename_problem,
};
use crate::framing::encode_envelope;
use crate::http::{Ctx, Pool, Target};
use crate::ids::SandboxId;
use crate::json;
use crate::process::{
    CommandOutput, ProcessInfo, ProcessStream, Signal, SignalOutcome, StartOptions,
};
use crate::redact::redact;
use crate::retry::Idempotency;
use crate::secret::AccessToken;

/// A connected sandbox's envd surface: processes, filesystem and file transfer.
///
/// Every request carries `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and, when the sandbox has
/// one, `X-Access-Token`. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    client: Client,
    id: SandboxId,
    base: String,
    token: Option<AccessToken>,
    token_header: Option<HeaderValue>,
    user: Option<String>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("envd_url", &redact(&self.base))
            .field("has_access_token", &self.token.is_some())
            .field("user", &self.user)
            .finish()
    }
}

/// Whether envd answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// envd answered `/health`.
    Running,
    /// The proxy says the sandbox is not running (502 "The sandbox was not found").
    NotRunning,
}

impl Sandbox {
    pub(crate) fn new(client: Client, access: EnvdAccess, base: String) -> Result<Sandbox, Error> {
        let token_header = match &access.access_token {
            None => None,
            Some(token) => {
                let mut value = HeaderValue::from_str(token.expose()).map_err(|_| {
                    client
                        .ctx(Operation::Connect, Some(&access.sandbox_id))
                        .protocol("the envd access token is not a valid header value")
                })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Sandbox {
            client,
            id: access.sandbox_id,
            base: base.trim_end_matches('/').to_owned(),
            token: access.access_token,
            token_header,
            user: None,
        })
    }

    /// The sandbox id.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The envd base URL requests go to.
    pub fn envd_url(&self) -> &str {
        &self.base
    }

    /// The same sandbox, with filesystem calls and `/files` made as `user` (envd's
    /// `Authorization: Basic` / `username=`); commands use [`StartOptions::user`].
    pub fn with_user(&self, user: String) -> Sandbox {
        Sandbox {
            user: Some(user),
            ..self.clone()
        }
    }

    fn ctx(&self, operation: Operation) -> Ctx {
        Ctx::new(
            operation,
            Target::Envd(self.id.clone()),
            self.client.api_key().clone(),
            self.token.clone(),
        )
    }

    fn request(
        &self,
        ctx: &Ctx,
        pool: Pool,
        method: Method,
        path_and_query: &str,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let url = reqwest::Url::parse(&format!("{}{path_and_query}", self.base))
            .map_err(|error| ctx.invalid_input(format!("bad URL: {error}")))?;
        let mut builder = self
            .client
            .http()
            .request(pool, method, url)
            .header("E2b-Sandbox-Id", self.id.as_str())
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        if let Some(token) = &self.token_header {
            builder = builder.header("X-Access-Token", token.clone());
        }
        Ok(builder)
    }

    fn basic_auth(ctx: &Ctx, user: &str) -> Result<HeaderValue, Error> {
        if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
            return Err(
                ctx.invalid_input("the user name is empty or has ':' or control characters")
            );
        }
        let mut value = HeaderValue::from_str(&format!(
            "Basic {}",
            json::encode_bytes(format!("{user}:").as_bytes())
        ))
        .map_err(|_| ctx.invalid_input("the user name cannot be sent in a header"))?;
        value.set_sensitive(true);
        Ok(value)
    }

    fn build(ctx: &Ctx, builder: reqwest::RequestBuilder) -> Result<reqwest::Request, Error> {
        builder
            .build()
            .map_err(|error| ctx.invalid_input(format!("cannot build the request: {error}")))
    }

    /// A unary Connect call with the JSON codec.
    async fn rpc<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        operation: Operation,
        method: &str,
        message: &Req,
        idempotency: Idempotency,
    ) -> Result<Resp, Error> {
        let ctx = self.ctx(operation);
        let http = self.client.http();
        let body = serde_json::to_vec(message)
            .map_err(|error| ctx.invalid_input(format!("cannot encode the message: {error}")))?;
        let mut builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/{method}"))?
            .header(CONTENT_TYPE, "application/json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Timeout-Ms", millis(http.deadline).to_string())
            .body(body);
        if let Some(user) = &self.user {
            builder = builder.header(AUTHORIZATION, Self::basic_auth(&ctx, user)?);
        }
        let request = Self::build(&ctx, builder)?;
        let deadline = http.deadline_from_now();
        let response = http
            .send(&ctx, Pool::Default, request, idempotency, deadline)
            .await?;
        http.read_json(&ctx, response, deadline).await
    }

    /// A server-streaming Connect call for the process service.
    async fn process_stream<Req: Serialize>(
        &self,
        operation: Operation,
        method: &str,
        message: &Req,
        user: Option<&str>,
        process_deadline: Option<Duration>,
        keepalive: Duration,
    ) -> Result<ProcessStream, Error> {
        let ctx = self.ctx(operation);
        let http = self.client.http();
        let payload = serde_json::to_vec(message)
            .map_err(|error| ctx.invalid_input(format!("cannot encode the message: {error}")))?;
        let mut builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/{method}"))?
            .header(CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Accept-Encoding", "identity")
            .header("Connect-Content-Encoding", "identity")
            .header(
                "Keepalive-Ping-Interval",
                keepalive.as_secs().max(1).to_string(),
            )
            .body(encode_envelope(&payload));
        if let Some(limit) = process_deadline {
            builder = builder.header("Connect-Timeout-Ms", millis(limit).max(1).to_string());
        }
        if let Some(user) = user {
            builder = builder.header(AUTHORIZATION, Self::basic_auth(&ctx, user)?);
        }
        let request = Self::build(&ctx, builder)?;
        let deadline = http.deadline_from_now();
        // Start is not idempotent: a retry after the request may have arrived could run the
        // command twice. Connect to a pid is harmless to repeat.
        let idempotency = match operation {
            Operation::StartProcess => Idempotency::NotIdempotent,
            _ => Idempotency::Idempotent,
        };
        let response = http
            .send(&ctx, Pool::Default, request, idempotency, deadline)
            .await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("application/connect+json") {
            return Err(ctx.protocol(format!(
                "expected application/connect+json, got '{content_type}'"
            )));
        }
        // Silence is allowed for two keepalive intervals (or the request deadline if longer).
        let idle = http.deadline.max(keepalive.saturating_mul(2));
        ProcessStream::open(
            ctx,
            response.bytes_stream(),
            http.limits.max_frame_bytes,
            idle,
        )
        .await
    }

    /// Checks envd (`GET /health`): [`Health::NotRunning`] when the proxy says the sandbox is
    /// not running, an error for anything else unexpected.
    pub async fn health(&self) -> Result<Health, Error> {
        let ctx = self.ctx(Operation::Health);
        let http = self.client.http();
        let request = Self::build(
            &ctx,
            self.request(&ctx, Pool::Default, Method::GET, "/health")?,
        )?;
        let deadline = http.deadline_from_now();
        match http
            .send(
                &ctx,
                Pool::Default,
                request,
                Idempotency::Idempotent,
                deadline,
            )
            .await
        {
            Ok(_) => Ok(Health::Running),
            Err(error) if error.is_sandbox_gone() => Ok(Health::NotRunning),
            Err(error) => Err(error),
        }
    }

    /// Starts the options' program with its arguments (`process.Process/Start`) and returns its
    /// event stream once envd reports the process started (so the pid is known). Never retried
    /// once the request may have reached envd: only a connection that could not be established
    /// is tried again.
    pub async fn start(&self, options: StartOptions) -> Result<ProcessStream, Error> {
        let message = StartRequest::new(&options);
        self.process_stream(
            Operation::StartProcess,
            "process.Process/Start",
            &message,
            options.user.as_deref(),
            options.timeout,
            options.keepalive,
        )
        .await
    }

    /// Starts a command and collects its output, failing if stdout plus stderr exceed
    /// `output_limit` bytes.
    pub async fn run(
        &self,
        options: StartOptions,
        output_limit: u64,
    ) -> Result<CommandOutput, Error> {
        self.start(options)
            .await?
            .collect_output(output_limit)
            .await
    }

    /// Re-attaches to a process by pid (`process.Process/Connect`): `Start`, then its output
    /// from now on, then `End` (a finished process gives `Start` and its retained `End`). An
    /// unknown pid is an error with [`Error::is_not_found`].
    pub async fn connect_process(&self, pid: u32) -> Result<ProcessStream, Error> {
        let message = SelectorRequest {
            process: PidSelector { pid },
        };
        self.process_stream(
            Operation::ConnectProcess,
            "process.Process/Connect",
            &message,
            None,
            None,
            Duration::from_secs(50),
        )
        .await
    }

    /// Sends a signal to one pid (`process.Process/SendSignal`); other processes are untouched.
    /// An unknown pid is [`SignalOutcome::NotFound`].
    pub async fn send_signal(&self, pid: u32, signal: Signal) -> Result<SignalOutcome, Error> {
        let message = SignalRequest {
            process: PidSelector { pid },
            signal: signal.wire_name(),
        };
        match self
            .rpc::<_, serde::de::IgnoredAny>(
                Operation::SignalProcess,
                "process.Process/SendSignal",
                &message,
                Idempotency::Idempotent,
            )
            .await
        {
            Ok(_) => Ok(SignalOutcome::Delivered),
            Err(error) if error.is_not_found() => Ok(SignalOutcome::NotFound),
            Err(error) => Err(error),
        }
    }

    /// `SIGKILL` to one pid.
    pub async fn kill_process(&self, pid: u32) -> Result<SignalOutcome, Error> {
        self.send_signal(pid, Signal::Kill).await
    }

    /// The processes envd knows (`process.Process/List`).
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>, Error> {
        let reply: ListProcessesReply = self
            .rpc(
                Operation::ListProcesses,
                "process.Process/List",
                &Empty {},
                Idempotency::Idempotent,
            )
            .await?;
        Ok(reply.processes)
    }

    /// Describes one path (`filesystem.Filesystem/Stat`); a missing path is an error with
    /// [`Error::is_not_found`].
    pub async fn stat(&self, path: &str) -> Result<EntryInfo, Error> {
        let reply: EntryReply = self
            .rpc(
                Operation::Stat,
                "filesystem.Filesystem/Stat",
                &PathRequest { path },
                Idempotency::Idempotent,
            )
            .await?;
        Ok(reply.entry)
    }

    /// Creates a directory and its parents (`filesystem.Filesystem/MakeDir`).
    pub async fn make_dir(&self, path: &str) -> Result<MakeDirOutcome, Error> {
        match self
            .rpc::<_, EntryReply>(
                Operation::MakeDir,
                "filesystem.Filesystem/MakeDir",
                &PathRequest { path },
                Idempotency::Idempotent,
            )
            .await
        {
            Ok(reply) => Ok(MakeDirOutcome::Created(reply.entry)),
            Err(error) if error.is_conflict() => Ok(MakeDirOutcome::AlreadyExists),
            Err(error) => Err(error),
        }
    }

    /// Lists a directory (`filesystem.Filesystem/ListDir`) to `depth` levels (0 means 1).
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<EntryInfo>, Error> {
        let reply: ListDirReply = self
            .rpc(
                Operation::ListDir,
                "filesystem.Filesystem/ListDir",
                &ListDirRequest { path, depth },
                Idempotency::Idempotent,
            )
            .await?;
        Ok(reply.entries)
    }

    /// Removes a file or a directory tree (`filesystem.Filesystem/Remove`); removing what is not
    /// there succeeds, as in envd.
    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::Remove,
            "filesystem.Filesystem/Remove",
            &PathRequest { path },
            Idempotency::Idempotent,
        )
        .await?;
        Ok(())
    }

    /// Moves or renames (`filesystem.Filesystem/Move`). Not retried once sent: a second move
    /// would fail on the missing source.
    pub async fn move_path(&self, source: &str, destination: &str) -> Result<EntryInfo, Error> {
        let reply: EntryReply = self
            .rpc(
                Operation::Move,
                "filesystem.Filesystem/Move",
                &MoveRequest {
                    source,
                    destination,
                },
                Idempotency::NotIdempotent,
            )
            .await?;
        Ok(reply.entry)
    }

    /// Uploads many files in one `multipart/form-data` request to `/files`, each part's filename
    /// being its destination path; envd creates parent directories and overwrites files.
    /// Retried like any idempotent request when every file is in memory; sent once when any is
    /// a stream.
    pub async fn write_files(&self, files: Vec<UploadFile>) -> Result<Vec<WrittenFile>, Error> {
        let ctx = self.ctx(Operation::Upload);
        if files.is_empty() {
            return Ok(Vec::new());
        }
        for file in &files {
            if let Some(problem) = multipart_filename_problem(&file.path) {
                return Err(ctx.invalid_input(format!("cannot upload '{}': {problem}", file.path)));
            }
        }
        let expected = files.len();
        let body = multipart(files);
        let query = self.user_query(None);
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, body.content_type)
            .body(body.body);
        let written = self.send_upload(&ctx, builder).await?;
        if written.len() != expected {
            return Err(ctx.protocol(format!(
                "uploaded {expected} files but the server reported {}",
                written.len()
            )));
        }
        Ok(written)
    }

    /// Uploads one file from memory as `application/octet-stream` to `/files?path=…`.
    pub async fn write_file(&self, path: &str, data: Bytes) -> Result<WrittenFile, Error> {
        self.write_octets(path, reqwest::Body::from(data)).await
    }

    /// Streams one file as `application/octet-stream` to `/files?path=…`, never holding it whole;
    /// sent once (a stream cannot be replayed).
    pub async fn write_file_stream(
        &self,
        path: &str,
        data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    ) -> Result<WrittenFile, Error> {
        self.write_octets(path, reqwest::Body::wrap_stream(data))
            .await
    }

    async fn write_octets(&self, path: &str, body: reqwest::Body) -> Result<WrittenFile, Error> {
        let ctx = self.ctx(Operation::Upload);
        if path.is_empty() {
            return Err(ctx.invalid_input("the path is empty"));
        }
        let query = self.user_query(Some(path));
        let builder = self
            .request(&ctx, Pool::Default, Method::POST, &format!("/files{query}"))?
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(body);
        let mut written = self.send_upload(&ctx, builder).await?;
        match written.len() {
            1 => Ok(written.remove(0)),
            n => Err(ctx.protocol(format!("uploaded 1 file but the server reported {n}"))),
        }
    }

    async fn send_upload(
        &self,
        ctx: &Ctx,
        builder: reqwest::RequestBuilder,
    ) -> Result<Vec<WrittenFile>, Error> {
        let http = self.client.http();
        let request = Self::build(ctx, builder)?;
        let deadline = http.deadline_from_now();
        let response = http
            .send(
                ctx,
                Pool::Default,
                request,
                Idempotency::Idempotent,
                deadline,
            )
            .await?;
        http.read_json(ctx, response, deadline).await
    }

    /// Downloads a file (`GET /files?path=…`) as a byte stream refused the moment it exceeds
    /// `limit` bytes. Uses HTTP/1.1 like the official SDK (E2B's proxy pads downloads with empty
    /// HTTP/2 frames). A missing file is an error with [`Error::is_not_found`].
    pub async fn read_file_stream(&self, path: &str, limit: u64) -> Result<Download, Error> {
        let ctx = self.ctx(Operation::Download);
        let http = self.client.http();
        let query = self.user_query(Some(path));
        let builder = self
            .request(&ctx, Pool::Http1, Method::GET, &format!("/files{query}"))?
            .header(ACCEPT_ENCODING, "identity");
        let request = Self::build(&ctx, builder)?;
        let deadline = http.deadline_from_now();
        let response = http
            .send(
                &ctx,
                Pool::Http1,
                request,
                Idempotency::Idempotent,
                deadline,
            )
            .await?;
        let content_length = response.content_length();
        if content_length.is_some_and(|len| len > limit) {
            return Err(ctx.limit(Some(path), limit));
        }
        Ok(Download::new(
            ctx,
            path.to_owned(),
            response.bytes_stream(),
            content_length,
            limit,
            http.deadline,
        ))
    }

    /// Downloads a whole file into memory, capped at `limit` bytes.
    pub async fn read_file(&self, path: &str, limit: u64) -> Result<Bytes, Error> {
        self.read_file_stream(path, limit).await?.bytes().await
    }

    /// `?path=…&username=…` as the official SDK encodes them (or empty).
    fn user_query(&self, path: Option<&str>) -> String {
        let mut parts = Vec::new();
        if let Some(path) = path {
            parts.push(format!("path={}", utf8_percent_encode(path, UNRESERVED)));
        }
        if let Some(user) = &self.user {
            parts.push(format!(
                "username={}",
                utf8_percent_encode(user, UNRESERVED)
            ));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("?{}", parts.join("&"))
        }
    }
}

/// Milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct StartRequest<'a> {
    process: ProcessConfigOut<'a>,
    stdin: bool,
}

impl StartRequest<'_> {
    fn new(options: &StartOptions) -> StartRequest<'_> {
        StartRequest {
            process: ProcessConfigOut {
                cmd: &options.program,
                args: &options.args,
                envs: &options.envs,
                cwd: options.cwd.as_deref(),
            },
            stdin: false,
        }
    }
}

#[derive(Serialize)]
struct ProcessConfigOut<'a> {
    cmd: &'a str,
    args: &'a [String],
    envs: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<&'a str>,
}

#[derive(Serialize)]
struct PidSelector {
    pid: u32,
}

#[derive(Serialize)]
struct SelectorRequest {
    process: PidSelector,
}

#[derive(Serialize)]
struct SignalRequest {
    process: PidSelector,
    signal: &'static str,
}

#[derive(Serialize)]
struct PathRequest<'a> {
    path: &'a str,
}

#[derive(Serialize)]
struct ListDirRequest<'a> {
    path: &'a str,
    depth: u32,
}

#[derive(Serialize)]
struct MoveRequest<'a> {
    source: &'a str,
    destination: &'a str,
}

#[derive(Deserialize)]
struct EntryReply {
    entry: EntryInfo,
}

#[derive(Deserialize)]
struct ListDirReply {
    #[serde(default, deserialize_with = "json::null_default")]
    entries: Vec<EntryInfo>,
}

#[derive(Deserialize)]
struct ListProcessesReply {
    #[serde(default, deserialize_with = "json::null_default")]
    processes: Vec<ProcessInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_request_matches_the_wire_capture() {
        // e2b-wire 3.4: the body the official SDK sends for run("echo hello", envs={"A":"b"}, cwd=…).
        let mut options = StartOptions::shell("echo hello".to_owned());
        options.envs = std::collections::BTreeMap::from([("A".to_owned(), "b".to_owned())]);
        options.cwd = Some("/home/user".to_owned());
        assert_eq!(
            serde_json::to_string(&StartRequest::new(&options)).expect("json"),
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello"],"envs":{"A":"b"},"cwd":"/home/user"},"stdin":false}"#
        );
        // An argv goes out as it is: no shell, no quoting, no re-splitting.
        let options = StartOptions::exec(
            "/bin/bash".to_owned(),
            vec!["-c".to_owned(), "echo 'a b' \"$X\"".to_owned()],
        );
        assert_eq!(
            serde_json::to_string(&StartRequest::new(&options)).expect("json"),
            r#"{"process":{"cmd":"/bin/bash","args":["-c","echo 'a b' \"$X\""],"envs":{}},"stdin":false}"#
        );
        let signal = SignalRequest {
            process: PidSelector { pid: 1001 },
            signal: Signal::Kill.wire_name(),
        };
        assert_eq!(
            serde_json::to_string(&signal).expect("json"),
            r#"{"process":{"pid":1001},"signal":"SIGNAL_SIGKILL"}"#
        );
    }
}
