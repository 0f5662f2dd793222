//! The crate's one error type, with the operation and sandbox it concerns.

use std::fmt;
use std::time::Duration;

use crate::ids::SandboxId;

/// The E2B operation an error concerns; its `Display` is the phrase used in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `POST /v2/sandboxes`.
    Create,
    /// `GET /v2/sandboxes`.
    List,
    /// `GET /sandboxes/{id}`.
    Get,
    /// `POST /v2/sandboxes/{id}/connect`.
    Connect,
    /// `POST /sandboxes/{id}/timeout`.
    SetTimeout,
    /// `POST /sandboxes/{id}/pause`.
    Pause,
    /// `DELETE /sandboxes/{id}`.
    Kill,
    /// `POST /sandboxes/{id}/snapshots`.
    CreateSnapshot,
    /// `GET /snapshots`.
    ListSnapshots,
    /// `DELETE /templates/{id}` of a snapshot.
    DeleteSnapshot,
    /// `POST /sandboxes/{id}/fork`, the request as a whole.
    Fork,
    /// One fork of a `POST /sandboxes/{id}/fork` that failed to start (the entry's error); the
    /// sandbox named is the source.
    StartFork,
    /// envd `GET /health`.
    Health,
    /// envd `process.Process/Start`.
    StartProcess,
    /// envd `process.Process/Connect`.
    ConnectProcess,
    /// envd `process.Process/SendSignal`.
    SignalProcess,
    /// envd `process.Process/List`.
    ListProcesses,
    /// envd `filesystem.Filesystem/Stat`.
    Stat,
    /// envd `filesystem.Filesystem/MakeDir`.
    MakeDir,
    /// envd `filesystem.Filesystem/ListDir`.
    ListDir,
    /// envd `filesystem.Filesystem/Remove`.
    Remove,
    /// envd `filesystem.Filesystem/Move`.
    Move,
    /// envd `POST /files`.
    Upload,
    /// envd `GET /files`.
    Download,
    /// envd `process.Process/SendInput`.
    SendInput,
    /// envd `process.Process/Update` (a terminal's size).
    ResizePty,
    /// envd `filesystem.Filesystem/WatchDir`.
    WatchDir,
    /// envd `filesystem.Filesystem/CreateWatcher`.
    CreateWatcher,
    /// envd `filesystem.Filesystem/GetWatcherEvents`.
    GetWatcherEvents,
    /// envd `filesystem.Filesystem/RemoveWatcher`.
    RemoveWatcher,
    /// `GET /sandboxes/{id}/metrics`.
    Metrics,
    /// `PUT /sandboxes/{id}/network`.
    UpdateNetwork,
    /// envd `process.Process/StreamInput`.
    StreamInput,
    /// envd `process.Process/CloseStdin`.
    CloseStdin,
    /// A signed `/files` URL (made locally, nothing sent).
    FileUrl,
    /// `POST /secrets`.
    CreateSecret,
    /// `GET /secrets`.
    ListSecrets,
    /// `GET /secrets/{id}`.
    GetSecret,
    /// `POST /secrets/{id}`.
    UpdateSecret,
    /// `DELETE /secrets/{id}`.
    DeleteSecret,
    /// The code interpreter's `POST /execute` (port 49999).
    RunCode,
    /// The code interpreter's `POST /contexts`.
    CreateCodeContext,
    /// The code interpreter's `GET /contexts`.
    ListCodeContexts,
    /// The code interpreter's `POST /contexts/{id}/restart`.
    RestartCodeContext,
    /// The code interpreter's `DELETE /contexts/{id}`.
    RemoveCodeContext,
    /// A git command run in the sandbox ([`Sandbox::git`](crate::Sandbox::git)).
    Git,
    /// `GET /templates/aliases/{alias}`.
    TemplateExists,
    /// `POST /volumes`.
    CreateVolume,
    /// `GET /volumes`.
    ListVolumes,
    /// `GET /volumes/{id}`.
    GetVolume,
    /// `DELETE /volumes/{id}`.
    DeleteVolume,
    /// The volume content API's `GET …/path`.
    VolumeStat,
    /// The volume content API's `GET …/dir`.
    VolumeListDir,
    /// The volume content API's `POST …/dir`.
    VolumeMakeDir,
    /// The volume content API's `PATCH …/path`.
    VolumeUpdateMetadata,
    /// The volume content API's `GET …/file`.
    VolumeRead,
    /// The volume content API's `PUT …/file`.
    VolumeWrite,
    /// The volume content API's `DELETE …/path`.
    VolumeRemove,
    /// A template build as a whole ([`Client::build_template`](crate::Client::build_template)),
    /// and a build that failed.
    BuildTemplate,
    /// `POST /v3/templates`.
    RequestBuild,
    /// `GET /templates/{id}/files/{hash}`.
    TemplateFiles,
    /// The `PUT` of a COPY source's archive to the URL E2B handed out.
    UploadTemplateFiles,
    /// `POST /v2/templates/{id}/builds/{buildID}`.
    StartBuild,
    /// `GET /templates/{id}/builds/{buildID}/status`.
    BuildStatus,
    /// `POST /templates/tags`.
    AssignTemplateTags,
    /// `DELETE /templates/tags`.
    RemoveTemplateTags,
    /// `GET /templates/{id}/tags`.
    TemplateTags,
    /// Reading a Dockerfile into a template
    /// ([`TemplateSpec::from_dockerfile`](crate::TemplateSpec::from_dockerfile); local,
    /// nothing sent).
    ParseDockerfile,
    /// Writing a template as the SDK's JSON or Dockerfile
    /// ([`TemplateSpec::to_json`](crate::TemplateSpec::to_json),
    /// [`TemplateSpec::to_dockerfile`](crate::TemplateSpec::to_dockerfile); local, nothing
    /// sent).
    RenderTemplate,
}

impl Operation {
    /// Whether the operation addresses one sandbox through the control plane, so that a 404
    /// means that sandbox is gone.
    fn targets_one_sandbox(self) -> bool {
        matches!(
            self,
            Operation::Get
                | Operation::Connect
                | Operation::SetTimeout
                | Operation::Pause
                | Operation::Kill
                | Operation::CreateSnapshot
                | Operation::Fork
                | Operation::Metrics
                | Operation::UpdateNetwork
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Deliberately no "timeout" in any phrase: callers must not confuse these with command
        // time-outs.
        f.write_str(match self {
            Operation::Create => "create sandbox",
            Operation::List => "list sandboxes",
            Operation::Get => "get sandbox",
            Operation::Connect => "connect sandbox",
            Operation::SetTimeout => "set sandbox lease",
            Operation::Pause => "pause sandbox",
            Operation::Kill => "kill sandbox",
            Operation::CreateSnapshot => "create snapshot",
            Operation::ListSnapshots => "list snapshots",
            Operation::DeleteSnapshot => "delete snapshot",
            Operation::Fork => "fork sandbox",
            Operation::StartFork => "start forked sandbox",
            Operation::Health => "envd health",
            Operation::StartProcess => "start process",
            Operation::ConnectProcess => "connect to process",
            Operation::SignalProcess => "signal process",
            Operation::ListProcesses => "list processes",
            Operation::Stat => "stat",
            Operation::MakeDir => "make directory",
            Operation::ListDir => "list directory",
            Operation::Remove => "remove",
            Operation::Move => "move",
            Operation::Upload => "upload files",
            Operation::Download => "download file",
            Operation::SendInput => "send process input",
            Operation::ResizePty => "resize terminal",
            Operation::WatchDir => "watch directory",
            Operation::CreateWatcher => "create watcher",
            Operation::GetWatcherEvents => "get watcher events",
            Operation::RemoveWatcher => "remove watcher",
            Operation::Metrics => "get sandbox metrics",
            Operation::UpdateNetwork => "update sandbox network",
            Operation::StreamInput => "stream process input",
            Operation::CloseStdin => "close process stdin",
            Operation::FileUrl => "make file URL",
            Operation::CreateSecret => "create secret",
            Operation::ListSecrets => "list secrets",
            Operation::GetSecret => "get secret",
            Operation::UpdateSecret => "update secret",
            Operation::DeleteSecret => "delete secret",
            Operation::RunCode => "run code",
            Operation::CreateCodeContext => "create code context",
            Operation::ListCodeContexts => "list code contexts",
            Operation::RestartCodeContext => "restart code context",
            Operation::RemoveCodeContext => "remove code context",
            Operation::Git => "git",
            Operation::TemplateExists => "check template",
            Operation::CreateVolume => "create volume",
            Operation::ListVolumes => "list volumes",
            Operation::GetVolume => "get volume",
            Operation::DeleteVolume => "delete volume",
            Operation::VolumeStat => "stat volume path",
            Operation::VolumeListDir => "list volume directory",
            Operation::VolumeMakeDir => "make volume directory",
            Operation::VolumeUpdateMetadata => "update volume path metadata",
            Operation::VolumeRead => "read volume file",
            Operation::VolumeWrite => "write volume file",
            Operation::VolumeRemove => "remove volume path",
            Operation::BuildTemplate => "build template",
            Operation::RequestBuild => "request template build",
            Operation::TemplateFiles => "check template files",
            Operation::UploadTemplateFiles => "upload template files",
            Operation::StartBuild => "start template build",
            Operation::BuildStatus => "get template build status",
            Operation::AssignTemplateTags => "assign template tags",
            Operation::RemoveTemplateTags => "remove template tags",
            Operation::TemplateTags => "list template tags",
            Operation::ParseDockerfile => "parse Dockerfile",
            Operation::RenderTemplate => "render template",
        })
    }
}

/// Where a transport failure happened, which decides whether the request may have reached the
/// server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportStage {
    /// The connection could not be established; the request was not sent.
    Connect,
    /// The connection failed after the request may have been sent.
    Request,
    /// The connection failed while the response body was being read.
    Body,
}

impl fmt::Display for TransportStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportStage::Connect => "could not connect",
            TransportStage::Request => "connection failed during the request",
            TransportStage::Body => "connection failed while reading the response",
        })
    }
}

/// What a transport failure was, as far as the client can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportCause {
    /// The TLS handshake failed: most often a certificate no trusted CA signed (a
    /// TLS-intercepting proxy), so the fix is a CA bundle, not the network.
    Tls,
    /// Anything else: name resolution, a refused or reset connection, an unreachable network.
    Network,
}

/// Every failure of this crate.
///
/// All text fields were cleaned when the error was built: credentials removed (the client's own
/// API key and access tokens by value, anything key-, token- or credential-URL-shaped by
/// pattern, see [`crate::redact`]), "timeout" wording rewritten, length capped. So neither
/// `Display` nor `Debug` can leak a secret, and an infrastructure failure never reads like a
/// command time-out. The exact `Display` wording is not part of the API; decide with the
/// `is_*` predicates and the fields.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot be used (bad URL, empty key).
    #[error("E2B client configuration is invalid: {reason}")]
    #[non_exhaustive]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// The caller's input cannot be sent (for example a path a multipart filename cannot carry).
    #[error("E2B {operation} refused the request{}: {reason}", ForSandbox(.sandbox_id.as_ref()))]
    #[non_exhaustive]
    InvalidInput {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// What is wrong with the input.
        reason: String,
    },

    /// The control-plane API answered with an error status.
    #[error(
        "E2B {operation} failed{}: HTTP {status}{}: {message}",
        ForSandbox(.sandbox_id.as_ref()),
        CodeSuffix(.code.as_deref())
    )]
    #[non_exhaustive]
    Api {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// The HTTP status.
        status: u16,
        /// E2B's semantic `error_code`, when the body had one.
        code: Option<String>,
        /// E2B's message (cleaned), or the start of a non-JSON body.
        message: String,
    },

    /// envd (or the sandbox proxy) answered with an error: a Connect error (`not_found`,
    /// `already_exists`, …), a plain HTTP error, or an error in a stream's end frame.
    #[error(
        "E2B {operation} failed for sandbox {sandbox_id}: {}{}: {message}",
        StatusText(*.status),
        CodeSuffix(.code.as_deref())
    )]
    #[non_exhaustive]
    Envd {
        /// The operation.
        operation: Operation,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The HTTP status; `None` when the error arrived in a stream's end frame.
        status: Option<u16>,
        /// The Connect error code (`not_found`, `deadline_exceeded`, …) when there was one.
        code: Option<String>,
        /// The message (cleaned).
        message: String,
    },

    /// The sandbox proxy reports the sandbox is not running (killed, paused or unknown):
    /// envd's 502 "The sandbox was not found".
    #[error(
        "E2B {operation} failed for sandbox {sandbox_id}: the sandbox is not running ({message})"
    )]
    #[non_exhaustive]
    SandboxNotRunning {
        /// The operation.
        operation: Operation,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The proxy's message (cleaned).
        message: String,
    },

    /// A command the client ran in the sandbox on the caller's behalf (git) exited non-zero.
    #[error(
        "E2B {operation} failed for sandbox {sandbox_id}: `{command}` exited with {exit_code}: {message}"
    )]
    #[non_exhaustive]
    CommandFailed {
        /// The operation.
        operation: Operation,
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The command's name and subcommand (`git push`), never its arguments.
        command: String,
        /// Its exit code.
        exit_code: i32,
        /// The end of its stderr (cleaned: no key, token or credential).
        message: String,
    },

    /// The connection failed.
    #[error(
        "E2B {operation} failed{}: {stage}{}: {detail}",
        ForSandbox(.sandbox_id.as_ref()),
        Endpoint(.endpoint.as_deref())
    )]
    #[non_exhaustive]
    Transport {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// Where it failed; [`TransportStage::Connect`] means the request was never sent.
        stage: TransportStage,
        /// What it was ([`Error::is_tls`]).
        cause: TransportCause,
        /// The endpoint asked, `scheme://host:port` only (no credentials, no path), so a person
        /// sees which host could not be reached.
        endpoint: Option<String>,
        /// The underlying cause (cleaned, URL stripped).
        detail: String,
    },

    /// The request, or a stream that went silent, ran past its deadline.
    #[error(
        "E2B {operation} failed{}: deadline exceeded after {}",
        ForSandbox(.sandbox_id.as_ref()),
        Secs(*.deadline)
    )]
    #[non_exhaustive]
    DeadlineExceeded {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// The deadline that passed (the whole request, or the allowed silence of a stream).
        deadline: Duration,
    },

    /// The server broke the protocol: malformed JSON, a bad frame, an oversized length prefix,
    /// a stream without its end event.
    #[error("E2B {operation} failed{}: protocol error: {detail}", ForSandbox(.sandbox_id.as_ref()))]
    #[non_exhaustive]
    Protocol {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// What was wrong (cleaned).
        detail: String,
    },

    /// A template build ran and failed ([`Error::is_build_failed`]): E2B's reason, and the
    /// phase that failed (`base`, a 1-based step number, `finalize`, …) when E2B named it.
    #[error(
        "E2B {operation} failed: build {} of template {} failed{}: {}",
        .failure.build_id,
        .failure.template_id,
        AtStep(.failure.step.as_deref()),
        .failure.message
    )]
    #[non_exhaustive]
    BuildFailed {
        /// The operation.
        operation: Operation,
        /// Which build failed, where and why (boxed: every `Result` of the crate carries
        /// this enum, which its rarest variant should not make larger).
        failure: Box<BuildFailure>,
    },

    /// A body was larger than the caller's cap (checked while streaming, never after).
    #[error(
        "E2B {operation} failed{}: {} exceeds the {limit}-byte cap",
        ForSandbox(.sandbox_id.as_ref()),
        Subject(.path.as_deref())
    )]
    #[non_exhaustive]
    LimitExceeded {
        /// The operation.
        operation: Operation,
        /// The sandbox, where the operation has one.
        sandbox_id: Option<SandboxId>,
        /// The file, for downloads.
        path: Option<String>,
        /// The cap in bytes.
        limit: u64,
    },
}

/// A failed template build ([`Error::BuildFailed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BuildFailure {
    /// The template's id.
    pub template_id: String,
    /// The build's id.
    pub build_id: String,
    /// The phase that failed, when E2B named it.
    pub step: Option<String>,
    /// E2B's reason (cleaned), or `Build failed` when it gave none.
    pub message: String,
}

impl Error {
    /// The operation that failed (`None` only for [`Error::InvalidConfig`]).
    pub fn operation(&self) -> Option<Operation> {
        match self {
            Error::InvalidConfig { .. } => None,
            Error::InvalidInput { operation, .. }
            | Error::Api { operation, .. }
            | Error::Envd { operation, .. }
            | Error::CommandFailed { operation, .. }
            | Error::SandboxNotRunning { operation, .. }
            | Error::Transport { operation, .. }
            | Error::DeadlineExceeded { operation, .. }
            | Error::Protocol { operation, .. }
            | Error::LimitExceeded { operation, .. }
            | Error::BuildFailed { operation, .. } => Some(*operation),
        }
    }

    /// The sandbox the failed operation concerned, if any.
    pub fn sandbox_id(&self) -> Option<&SandboxId> {
        match self {
            Error::InvalidConfig { .. } | Error::BuildFailed { .. } => None,
            Error::Envd { sandbox_id, .. }
            | Error::SandboxNotRunning { sandbox_id, .. }
            | Error::CommandFailed { sandbox_id, .. } => Some(sandbox_id),
            Error::InvalidInput { sandbox_id, .. }
            | Error::Api { sandbox_id, .. }
            | Error::Transport { sandbox_id, .. }
            | Error::DeadlineExceeded { sandbox_id, .. }
            | Error::Protocol { sandbox_id, .. }
            | Error::LimitExceeded { sandbox_id, .. } => sandbox_id.as_ref(),
        }
    }

    /// The HTTP status of the error response, if there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            Error::Envd { status, .. } => *status,
            Error::SandboxNotRunning { .. } => Some(502),
            _ => None,
        }
    }

    /// The Connect or E2B error code, if the server sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } | Error::Envd { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// The thing asked for does not exist: a sandbox (control-plane 404), a file, directory or
    /// process (Connect `not_found` or HTTP 404 from envd).
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 404,
            Error::Envd { status, code, .. } => {
                code.as_deref() == Some("not_found") || *status == Some(404)
            }
            _ => false,
        }
    }

    /// A command the client ran in the sandbox (git) exited non-zero; [`Error::reason`] has
    /// the end of its stderr.
    pub fn is_command_failed(&self) -> bool {
        matches!(self, Error::CommandFailed { .. })
    }

    /// A git command failed because the remote refused or asked for credentials.
    pub fn is_git_auth_failure(&self) -> bool {
        match self {
            Error::CommandFailed { message, .. } => {
                let message = message.to_lowercase();
                [
                    "authentication failed",
                    "could not read username",
                    "could not read password",
                    "terminal prompts disabled",
                    "invalid username or password",
                    "http basic: access denied",
                ]
                .iter()
                .any(|needle| message.contains(needle))
            }
            _ => false,
        }
    }

    /// The request conflicts with the current state: control-plane 409 (for example pausing a
    /// paused sandbox) or Connect `already_exists` / HTTP 409 from envd.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 409,
            Error::Envd { status, code, .. } => {
                code.as_deref() == Some("already_exists") || *status == Some(409)
            }
            _ => false,
        }
    }

    /// Creating a secret failed because the team has one of that name (HTTP 409 on create).
    pub fn is_name_taken(&self) -> bool {
        matches!(
            self,
            Error::Api {
                operation: Operation::CreateSecret,
                status: 409,
                ..
            }
        )
    }

    /// The request was malformed for the server (control-plane HTTP 400) or refused before
    /// sending ([`Error::InvalidInput`]); [`Error::reason`] names the field.
    pub fn is_invalid_request(&self) -> bool {
        matches!(
            self,
            Error::Api { status: 400, .. } | Error::InvalidInput { .. }
        )
    }

    /// The sandbox itself is gone or not running: a control-plane 404 for an operation on one
    /// sandbox, or envd's 502 "The sandbox was not found".
    pub fn is_sandbox_gone(&self) -> bool {
        match self {
            Error::SandboxNotRunning { .. } => true,
            Error::Api {
                status, operation, ..
            } => *status == 404 && operation.targets_one_sandbox(),
            _ => false,
        }
    }

    /// Trying again later may succeed: a connection failure, a passed deadline, or a
    /// 429/502/503/504 (or Connect `unavailable`/`resource_exhausted`) that is not "sandbox
    /// gone".
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::DeadlineExceeded { .. } => true,
            Error::Api { status, .. } => is_transient_status(*status),
            Error::Envd { status, code, .. } => {
                status.is_some_and(is_transient_status)
                    || matches!(code.as_deref(), Some("unavailable" | "resource_exhausted"))
            }
            _ => false,
        }
    }

    /// A deadline passed: ours ([`Error::DeadlineExceeded`]) or the server's
    /// (`deadline_exceeded` from envd, for example a command's process deadline).
    pub fn is_deadline_exceeded(&self) -> bool {
        match self {
            Error::DeadlineExceeded { .. } => true,
            Error::Envd { code, .. } => code.as_deref() == Some("deadline_exceeded"),
            _ => false,
        }
    }

    /// A body exceeded the caller's cap.
    pub fn is_limit_exceeded(&self) -> bool {
        matches!(self, Error::LimitExceeded { .. })
    }

    /// The credentials were refused (HTTP 401 or Connect `unauthenticated`).
    pub fn is_unauthorized(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 401,
            Error::Envd { status, code, .. } => {
                *status == Some(401) || code.as_deref() == Some("unauthenticated")
            }
            _ => false,
        }
    }

    /// The credentials are valid but not allowed this (HTTP 403 or Connect `permission_denied`):
    /// E2B answers it for a key without access to a template or sandbox.
    pub fn is_forbidden(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 403,
            Error::Envd { status, code, .. } => {
                *status == Some(403) || code.as_deref() == Some("permission_denied")
            }
            _ => false,
        }
    }

    /// E2B refused for a limit: HTTP 429 (on create: the account's concurrently running
    /// sandboxes) or Connect `resource_exhausted`.
    pub fn is_rate_limited(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 429,
            Error::Envd { status, code, .. } => {
                *status == Some(429) || code.as_deref() == Some("resource_exhausted")
            }
            _ => false,
        }
    }

    /// Creating a sandbox failed because its template does not exist (HTTP 404 on create;
    /// E2B's message names the template).
    pub fn is_template_missing(&self) -> bool {
        matches!(
            self,
            Error::Api {
                operation: Operation::Create,
                status: 404,
                ..
            }
        )
    }

    /// A template build ran and failed ([`Error::BuildFailed`]); [`Error::build_step`] names
    /// the phase and [`Error::reason`] has E2B's message.
    pub fn is_build_failed(&self) -> bool {
        matches!(self, Error::BuildFailed { .. })
    }

    /// The phase a failed template build failed in (`base`, a 1-based step number,
    /// `finalize`, …), when E2B named it.
    pub fn build_step(&self) -> Option<&str> {
        match self {
            Error::BuildFailed { failure, .. } => failure.step.as_deref(),
            _ => None,
        }
    }

    /// The TLS handshake failed (for example an untrusted certificate).
    pub fn is_tls(&self) -> bool {
        matches!(
            self,
            Error::Transport {
                cause: TransportCause::Tls,
                ..
            }
        )
    }

    /// The endpoint a transport failure concerned (`scheme://host:port`), if known.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::Transport { endpoint, .. } => endpoint.as_deref(),
            _ => None,
        }
    }

    /// The deadline that passed, for [`Error::DeadlineExceeded`].
    pub fn deadline(&self) -> Option<Duration> {
        match self {
            Error::DeadlineExceeded { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }

    /// This error's text without its leading `E2B <operation> failed[ for sandbox <id>]: `,
    /// for a caller that names the operation and the sandbox itself (so a person reads each
    /// once).
    pub fn reason(&self) -> String {
        let full = self.to_string();
        let Some(operation) = self.operation() else {
            return full;
        };
        let sandbox = ForSandbox(self.sandbox_id()).to_string();
        for verb in ["failed", "refused the request"] {
            if let Some(rest) = full.strip_prefix(&format!("E2B {operation} {verb}{sandbox}: ")) {
                return rest.to_owned();
            }
        }
        full
    }

    /// The connection could not be established, so the request certainly never reached the
    /// server.
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            Error::Transport {
                stage: TransportStage::Connect,
                ..
            }
        )
    }
}

/// Statuses E2B and the official SDK treat as worth retrying.
pub(crate) fn is_transient_status(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// Renders " for sandbox <id>" or nothing.
struct ForSandbox<'a>(Option<&'a SandboxId>);

impl fmt::Display for ForSandbox<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, " for sandbox {id}"),
            None => Ok(()),
        }
    }
}

/// Renders " at step <step>" or nothing.
struct AtStep<'a>(Option<&'a str>);

impl fmt::Display for AtStep<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(step) if !step.is_empty() => write!(f, " at step {step}"),
            _ => Ok(()),
        }
    }
}

/// Renders " (<endpoint>)" or nothing.
struct Endpoint<'a>(Option<&'a str>);

impl fmt::Display for Endpoint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(endpoint) => write!(f, " ({endpoint})"),
            None => Ok(()),
        }
    }
}

/// Renders " (<code>)" or nothing.
struct CodeSuffix<'a>(Option<&'a str>);

impl fmt::Display for CodeSuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(code) => write!(f, " ({code})"),
            None => Ok(()),
        }
    }
}

/// Renders "HTTP <status>" or "stream error".
struct StatusText(Option<u16>);

impl fmt::Display for StatusText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(status) => write!(f, "HTTP {status}"),
            None => f.write_str("stream error"),
        }
    }
}

/// Renders a duration as seconds with millisecond precision.
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0.as_secs_f64())
    }
}

/// Renders the thing that was too large.
struct Subject<'a>(Option<&'a str>);

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "'{path}'"),
            None => f.write_str("the response"),
        }
    }
}
