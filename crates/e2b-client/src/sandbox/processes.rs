//! envd's process service (`process.Process`): start, re-attach, signal, list.

use std::time::Duration;

use http::HeaderValue;
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

    /// Whether [`Sandbox::start_blocking`] can reach this sandbox: its envd is plain HTTP
    /// (e2b-local, or a self-hosted E2B without TLS) and no proxy is configured, nor named in
    /// the environment (`HTTP_PROXY`, `ALL_PROXY`).
    pub fn can_start_blocking(&self) -> bool {
        self.route.is_some() && self.http.blocking.is_some()
    }

    /// [`Sandbox::start`] on the calling thread: the request goes out on a connection of
    /// the calling thread's own (from a pool the client's handles share), and the returned
    /// stream is read from its socket by whoever calls
    /// [`next_event`](crate::blocking::BlockingProcessStream::next_event). No async runtime
    /// is involved, so a command crosses no threads; it blocks, so never call it on a
    /// runtime's thread. Sent once: never retried once the request may have reached envd.
    /// An error with [`Error::is_connect`] left nothing sent.
    ///
    /// Only where [`Sandbox::can_start_blocking`]; elsewhere an error with
    /// [`Error::is_invalid_request`].
    ///
    /// ```no_run
    /// # fn demo(sandbox: &e2b_client::Sandbox) -> Result<(), e2b_client::Error> {
    /// use e2b_client::blocking::Next;
    /// use e2b_client::{ProcessEvent, StartOptions};
    ///
    /// let mut stream = sandbox.start_blocking(StartOptions::shell("echo hi".to_owned()))?;
    /// loop {
    ///     match stream.next_event(None)? {
    ///         Next::Event(ProcessEvent::Stdout(bytes)) => print!("{}", String::from_utf8_lossy(&bytes)),
    ///         Next::Event(ProcessEvent::End(end)) => {
    ///             println!("exit {}", end.exit_code);
    ///             break;
    ///         }
    ///         _ => {}
    ///     }
    /// }
    /// stream.finish(e2b_client::END_DRAIN_LIMIT); // the connection serves the next command
    /// # Ok(()) }
    /// ```
    pub fn start_blocking(
        &self,
        options: StartOptions,
    ) -> Result<crate::blocking::BlockingProcessStream, Error> {
        let ctx = self.ctx(Operation::StartProcess);
        let (Some(route), Some(connections)) = (&self.route, &self.http.blocking) else {
            return Err(
                ctx.invalid_input("the blocking start needs envd over plain HTTP without a proxy")
            );
        };
        let payload = serde_json::to_vec(&StartRequest::new(&options))
            .map_err(|error| ctx.invalid_input(format!("cannot encode the message: {error}")))?;
        let body = crate::framing::encode_envelope(&payload);
        let number = |value: u64| {
            HeaderValue::from_str(&value.to_string()).expect("digits are a header value")
        };
        let mut headers = vec![
            (
                "Content-Type",
                HeaderValue::from_static("application/connect+json"),
            ),
            ("Connect-Protocol-Version", HeaderValue::from_static("1")),
            (
                "Connect-Accept-Encoding",
                HeaderValue::from_static("identity"),
            ),
            (
                "Connect-Content-Encoding",
                HeaderValue::from_static("identity"),
            ),
            (
                "Keepalive-Ping-Interval",
                number(options.keepalive.as_secs().max(1)),
            ),
        ];
        if let Some(limit) = options.timeout {
            let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
            headers.push(("Connect-Timeout-Ms", number(millis)));
        }
        if let Some(user) = options.user.as_deref() {
            headers.push(("Authorization", Self::basic_auth(&ctx, user)?));
        }
        let started = std::time::Instant::now();
        let request = crate::blocking::Request {
            ctx: ctx.clone(),
            route,
            connections,
            method: "POST",
            path: "/process.Process/Start",
            routing: self.routing_headers(&ctx)?,
            headers,
            body: &body,
            limit: self.http.deadline,
            deadline: started + self.http.deadline,
        };
        // Silence is allowed for two keepalive intervals (or the request deadline if longer),
        // as on the async path.
        let idle = self.http.deadline.max(options.keepalive.saturating_mul(2));
        crate::blocking::start(&request, idle, self.http.limits.max_frame_bytes)
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
