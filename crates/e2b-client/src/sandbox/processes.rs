//! envd's process service (`process.Process`): start, re-attach, signal, list.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::json;
use crate::process::{
    CommandOutput, ProcessInfo, ProcessStdin, ProcessStream, Signal, SignalOutcome, StartOptions,
};
use crate::retry::Idempotency;

impl Sandbox {
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

    /// Closes the stdin of a process started with [`ProcessStdin::Open`]
    /// (`process.Process/CloseStdin`): it reads end of file. An unknown pid is an error with
    /// [`Error::is_not_found`].
    pub async fn close_stdin(&self, pid: u32) -> Result<(), Error> {
        let message = SelectorRequest {
            process: PidSelector { pid },
        };
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::CloseStdin,
            "process.Process/CloseStdin",
            &message,
            Idempotency::Idempotent,
        )
        .await
        .map(|_| ())
    }

    /// Writes `data` to the stdin of process `pid`, started with [`ProcessStdin::Open`], in one
    /// call (`process.Process/SendInput`): the official SDK's `send_stdin`. One request per
    /// call, never retried once sent (nothing is written twice); for a long input, or many
    /// small ones in a row, [`Sandbox::stream_input`] carries them on one request. An unknown
    /// pid is an error with [`Error::is_not_found`]; a process whose stdin is closed, or that
    /// runs on a terminal, is refused by envd.
    pub async fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<(), Error> {
        let message = StdinInputRequest {
            process: PidSelector { pid },
            input: StdinInput {
                stdin: json::encode_bytes(data),
            },
        };
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::SendInput,
            "process.Process/SendInput",
            &message,
            Idempotency::NotIdempotent,
        )
        .await
        .map(|_| ())
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
            stdin: options.stdin == ProcessStdin::Open,
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
struct StdinInput {
    stdin: String,
}

#[derive(Serialize)]
struct StdinInputRequest {
    process: PidSelector,
    input: StdinInput,
}

#[derive(Serialize)]
struct SignalRequest {
    process: PidSelector,
    signal: &'static str,
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
        // The body the official Python SDK sends on the wire for run("echo hello", envs={"A":"b"}, cwd=…).
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
