//! envd's process service for terminals: start on a PTY, type, resize.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::process::ProcessStream;
use crate::pty::{PtyOptions, PtySize};
use crate::retry::Idempotency;

impl Sandbox {
    /// Starts the options' program on a new pseudo-terminal (`process.Process/Start` with a
    /// `pty`) and returns its event stream once envd reports the process started. Output
    /// comes as [`ProcessEvent::Pty`](crate::ProcessEvent::Pty) chunks, read frame by frame
    /// like any process stream (memory stays bounded however long the terminal lives);
    /// dropping the stream leaves the terminal running ([`Sandbox::connect_process`]
    /// re-attaches). Never retried once the request may have reached envd.
    pub async fn start_pty(&self, options: PtyOptions) -> Result<ProcessStream, Error> {
        let message = PtyStartRequest {
            process: PtyProcessConfig {
                cmd: &options.program,
                args: &options.args,
                envs: &options.envs,
                cwd: options.cwd.as_deref(),
            },
            pty: PtyMessage::new(options.size),
        };
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

    /// Types `data` on the terminal of process `pid` (`process.Process/SendInput` with `pty`
    /// input). Not retried once sent, so nothing is typed twice. An unknown pid is an error
    /// with [`Error::is_not_found`]; a process without a terminal is refused by envd.
    pub async fn send_pty_input(&self, pid: u32, data: &[u8]) -> Result<(), Error> {
        let message = InputRequest {
            process: Pid { pid },
            input: PtyInput {
                pty: STANDARD.encode(data),
            },
        };
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::SendInput,
            "process.Process/SendInput",
            &message,
            Idempotency::NotIdempotent,
        )
        .await
        .map(drop)
    }

    /// Resizes the terminal of process `pid` (`process.Process/Update`): the program sees the
    /// new size (`stty size`) and its foreground group gets `SIGWINCH`.
    pub async fn resize_pty(&self, pid: u32, size: PtySize) -> Result<(), Error> {
        let message = UpdateRequest {
            process: Pid { pid },
            pty: PtyMessage::new(size),
        };
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::ResizePty,
            "process.Process/Update",
            &message,
            Idempotency::Idempotent,
        )
        .await
        .map(drop)
    }
}

#[derive(Serialize)]
struct PtyStartRequest<'a> {
    process: PtyProcessConfig<'a>,
    pty: PtyMessage,
}

#[derive(Serialize)]
struct PtyProcessConfig<'a> {
    cmd: &'a str,
    args: &'a [String],
    envs: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<&'a str>,
}

#[derive(Serialize)]
struct PtyMessage {
    size: SizeMessage,
}

impl PtyMessage {
    fn new(size: PtySize) -> PtyMessage {
        PtyMessage {
            size: SizeMessage {
                cols: size.cols,
                rows: size.rows,
            },
        }
    }
}

#[derive(Serialize)]
struct SizeMessage {
    cols: u16,
    rows: u16,
}

#[derive(Serialize)]
struct Pid {
    pid: u32,
}

#[derive(Serialize)]
struct PtyInput {
    pty: String,
}

#[derive(Serialize)]
struct InputRequest {
    process: Pid,
    input: PtyInput,
}

#[derive(Serialize)]
struct UpdateRequest {
    process: Pid,
    pty: PtyMessage,
}
