//! The one place requests are sent: deadlines, retries, error bodies, capped reads.

use std::error::Error as _;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::config::{Config, Limits, RetryPolicy};
use crate::error::{Error, Operation, TransportCause, TransportStage};
use crate::ids::SandboxId;
use crate::redact::clean_text;
use crate::retry::{self, Decision, Idempotency, Outcome};
use crate::secret::{AccessToken, ApiKey, SecretValue};

/// `scheme://host:port` of a request URL: what a person needs to tell which host failed,
/// without the path or any credentials in it.
fn endpoint_of(url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(format!("{}://{host}:{port}", url.scheme()))
}

/// Whether an error in a transport failure's cause chain is the TLS layer's. rustls reports
/// through `io::Error`s (nested: hyper's wraps tokio-rustls'), whose `source()` skips the
/// wrapped error, so each is looked into.
fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = error;
    loop {
        if current.is::<rustls::Error>() {
            return true;
        }
        match current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => current = inner,
            None => return false,
        }
    }
}

/// Error bodies are read only this far; the rest is not needed to explain the failure.
const MAX_ERROR_BODY: usize = 64 << 10;

/// RFC 3986 unreserved only: what `urlencode`/`quote_plus` and the HTTP layer keep.
pub(crate) const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~');

/// What the request talks to, which decides how error bodies read.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// The control-plane REST API, about one sandbox or none.
    Control(Option<SandboxId>),
    /// The envd daemon of one sandbox (through the sandbox proxy).
    Envd(SandboxId),
}

/// Everything an error needs to say what failed, and the secrets it must never say.
#[derive(Clone)]
pub(crate) struct Ctx {
    /// The operation.
    pub(crate) operation: Operation,
    /// Where the request goes.
    pub(crate) target: Target,
    api_key: ApiKey,
    token: Option<AccessToken>,
    /// Further values the request carries (header values of transform rules, a proxy
    /// password): removed from error text like the key.
    secrets: Vec<SecretValue>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("operation", &self.operation)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// A context; `api_key` and `token` are only used to scrub error text.
    pub(crate) fn new(
        operation: Operation,
        target: Target,
        api_key: ApiKey,
        token: Option<AccessToken>,
    ) -> Ctx {
        Ctx {
            operation,
            target,
            api_key,
            token,
            secrets: Vec::new(),
        }
    }

    /// The request `builder` makes, or an error saying why it cannot be made.
    pub(crate) fn build(
        &self,
        builder: reqwest::RequestBuilder,
    ) -> Result<reqwest::Request, Error> {
        builder
            .build()
            .map_err(|error| self.invalid_input(format!("cannot build the request: {error}")))
    }

    /// The same context, also scrubbing `secrets` from error text.
    pub(crate) fn with_secrets(mut self, secrets: Vec<SecretValue>) -> Ctx {
        self.secrets.extend(secrets);
        self
    }

    /// The error for a command run on the caller's behalf that exited non-zero: the end of
    /// its stderr, cleaned of every secret this context knows.
    pub(crate) fn command_failed(
        &self,
        sandbox_id: &SandboxId,
        command: &str,
        exit_code: i32,
        stderr: &[u8],
    ) -> Error {
        let text = String::from_utf8_lossy(stderr);
        let text = text.trim();
        // The end says why; keep it short.
        let start = text.char_indices().rev().nth(1999).map_or(0, |(at, _)| at);
        Error::CommandFailed {
            operation: self.operation,
            sandbox_id: sandbox_id.clone(),
            command: command.to_owned(),
            exit_code,
            message: self.clean(&text[start..]),
        }
    }

    fn sandbox_id(&self) -> Option<SandboxId> {
        match &self.target {
            Target::Control(id) => id.clone(),
            Target::Envd(id) => Some(id.clone()),
        }
    }

    /// Cleans text for an error: known secrets, secret shapes, length.
    pub(crate) fn clean(&self, text: &str) -> String {
        let mut known = vec![self.api_key.expose()];
        if let Some(token) = &self.token {
            known.push(token.expose());
        }
        // A header value is often `<scheme> <credential>`: the credential alone, echoed
        // back, is as secret as the whole.
        for secret in &self.secrets {
            known.push(secret.expose());
            known.extend(secret.expose().split_whitespace());
        }
        clean_text(text, &known)
    }

    /// The server broke the protocol.
    pub(crate) fn protocol(&self, detail: impl fmt::Display) -> Error {
        Error::Protocol {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            detail: self.clean(&detail.to_string()),
        }
    }

    /// A deadline passed.
    pub(crate) fn deadline(&self, deadline: Duration) -> Error {
        Error::DeadlineExceeded {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            deadline,
        }
    }

    /// A body went over its cap.
    pub(crate) fn limit(&self, path: Option<&str>, limit: u64) -> Error {
        Error::LimitExceeded {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            path: path.map(|path| self.clean(path)),
            limit,
        }
    }

    /// The caller's input cannot be sent.
    pub(crate) fn invalid_input(&self, reason: impl fmt::Display) -> Error {
        Error::InvalidInput {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            reason: self.clean(&reason.to_string()),
        }
    }

    /// A connection failure; the URL is reduced to its endpoint (`scheme://host:port`, no
    /// credentials or path), the cause chain flattened and cleaned, and a TLS failure told
    /// apart from a network one.
    pub(crate) fn transport(&self, stage: TransportStage, error: reqwest::Error) -> Error {
        let endpoint = error.url().and_then(endpoint_of);
        let error = error.without_url();
        let mut detail = error.to_string();
        let mut cause = TransportCause::Network;
        let mut source = error.source();
        while let Some(next) = source {
            if is_tls_failure(next) {
                cause = TransportCause::Tls;
            }
            detail.push_str(": ");
            detail.push_str(&next.to_string());
            source = next.source();
        }
        Error::Transport {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            stage,
            cause,
            endpoint: endpoint.map(|endpoint| self.clean(&endpoint)),
            detail: self.clean(&detail),
        }
    }

    /// A connection failure of the blocking path: `endpoint` is `host:port`, shown as
    /// `http://host:port` like the async path's.
    pub(crate) fn transport_io(
        &self,
        stage: TransportStage,
        endpoint: &str,
        error: &std::io::Error,
    ) -> Error {
        Error::Transport {
            operation: self.operation,
            sandbox_id: self.sandbox_id(),
            stage,
            cause: TransportCause::Network,
            endpoint: Some(self.clean(&format!("http://{endpoint}"))),
            detail: self.clean(&error.to_string()),
        }
    }

    /// A stream broke off (`broken`: how) and a health probe then found the sandbox not
    /// running: it was killed or reached its end of life under the stream, as the official
    /// SDK says in that case.
    pub(crate) fn sandbox_ended(&self, broken: &Error) -> Error {
        let Some(sandbox_id) = self.sandbox_id() else {
            return self.protocol(broken.reason());
        };
        Error::SandboxNotRunning {
            operation: self.operation,
            sandbox_id,
            message: self.clean(&format!(
                "it was killed or reached its end of life while the request was in flight; {}",
                broken.reason()
            )),
        }
    }

    /// An error carried in a stream's end frame.
    pub(crate) fn stream_error(&self, code: Option<String>, message: Option<String>) -> Error {
        let sandbox_id = match &self.target {
            Target::Envd(id) => id.clone(),
            Target::Control(_) => return self.protocol("unexpected stream on the control plane"),
        };
        Error::Envd {
            operation: self.operation,
            sandbox_id,
            status: None,
            code: code.map(|code| self.clean(&code)),
            message: self.clean(message.as_deref().unwrap_or("stream failed")),
        }
    }

    /// Builds the error for a non-success response from its status and (start of) body.
    pub(crate) fn response_error(&self, status: u16, body: &[u8]) -> Error {
        let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
        let text = || {
            let raw = String::from_utf8_lossy(body);
            let trimmed = raw.trim();
            if trimmed.is_empty() {
                "(empty body)".to_owned()
            } else {
                trimmed.to_owned()
            }
        };
        let message = parsed
            .as_ref()
            .and_then(|body| body.message.clone())
            .unwrap_or_else(text);
        match &self.target {
            Target::Control(sandbox_id) => Error::Api {
                operation: self.operation,
                sandbox_id: sandbox_id.clone(),
                status,
                code: parsed
                    .and_then(|body| body.error_code)
                    .map(|code| self.clean(&code)),
                message: self.clean(&message),
            },
            Target::Envd(sandbox_id) => {
                // The E2B proxy's way of saying the sandbox is not running; the
                // official SDK recognises it by this phrase too.
                if status == 502 && message.contains("was not found") {
                    return Error::SandboxNotRunning {
                        operation: self.operation,
                        sandbox_id: sandbox_id.clone(),
                        message: self.clean(&message),
                    };
                }
                // A string code is a Connect error code; a number is a plain HTTP error.
                let code = parsed.and_then(|body| match body.code {
                    Some(serde_json::Value::String(code)) => Some(self.clean(&code)),
                    _ => None,
                });
                Error::Envd {
                    operation: self.operation,
                    sandbox_id: sandbox_id.clone(),
                    status: Some(status),
                    code,
                    message: self.clean(&message),
                }
            }
        }
    }
}

/// Any of E2B's error bodies: control plane `{code: int, message, error_code?}`, Connect
/// `{code: "not_found", message}`, proxy `{sandboxId, message, code: 502}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default, alias = "errorCode")]
    error_code: Option<String>,
}

/// Which connection pool to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pool {
    /// HTTP/2 where TLS negotiates it, else HTTP/1.1.
    Default,
    /// Always HTTP/1.1 (downloads: E2B's proxy pads them with empty HTTP/2 frames).
    Http1,
}

/// The HTTP machinery shared by every request of one client, control plane and envd alike.
#[derive(Debug)]
pub(crate) struct Http {
    default: reqwest::Client,
    /// Built on first use: only downloads take it, and building a pool loads and parses the
    /// trust roots (the platform's store and the bundled ones), tens of milliseconds that a
    /// cold start would otherwise pay twice before its first request.
    http1: Arc<OnceLock<reqwest::Client>>,
    /// The blocking path's connections; `None` when a proxy is configured (or set in the
    /// environment, which reqwest follows): that path has none.
    pub(crate) blocking: Option<Arc<crate::connections::Connections>>,
    connect_timeout: Duration,
    /// The configured proxy, if any (pools are shared only between clients with the same).
    proxy: Option<String>,
    retry: RetryPolicy,
    /// Kept to scrub it from every error text, envd's included.
    api_key: ApiKey,
    /// The whole-request deadline.
    pub(crate) deadline: Duration,
    /// Buffering caps.
    pub(crate) limits: Limits,
}

impl Http {
    /// Builds the default pool from the configuration (the HTTP/1.1 pool on first use).
    pub(crate) fn new(config: &Config) -> Result<Http, Error> {
        let connect_timeout = config.request_deadline.min(Duration::from_secs(10));
        let proxy = config.proxy.clone();
        Ok(Http {
            default: build_pool(Pool::Default, connect_timeout, proxy.as_deref())?,
            http1: Arc::new(OnceLock::new()),
            blocking: (proxy.is_none() && !proxy_in_environment())
                .then(|| Arc::new(crate::connections::Connections::new(connect_timeout))),
            connect_timeout,
            proxy,
            retry: config.retry.clone(),
            api_key: config.api_key.clone(),
            deadline: config.request_deadline,
            limits: config.limits.clone(),
        })
    }

    /// An `Http` for `config` on these pools (their connections and parsed trust roots),
    /// when they were built with the connect timeout `config` asks for; else new pools.
    pub(crate) fn sharing(&self, config: &Config) -> Result<Http, Error> {
        let connect_timeout = config.request_deadline.min(Duration::from_secs(10));
        if connect_timeout != self.connect_timeout || config.proxy != self.proxy {
            return Http::new(config);
        }
        Ok(Http {
            default: self.default.clone(),
            http1: Arc::clone(&self.http1),
            blocking: self.blocking.clone(),
            connect_timeout,
            proxy: self.proxy.clone(),
            retry: config.retry.clone(),
            api_key: config.api_key.clone(),
            deadline: config.request_deadline,
            limits: config.limits.clone(),
        })
    }

    /// The same pools and settings with another whole-request deadline.
    pub(crate) fn with_deadline(&self, deadline: Duration) -> Http {
        Http {
            default: self.default.clone(),
            http1: Arc::clone(&self.http1),
            blocking: self.blocking.clone(),
            connect_timeout: self.connect_timeout,
            proxy: self.proxy.clone(),
            retry: self.retry.clone(),
            api_key: self.api_key.clone(),
            deadline,
            limits: self.limits.clone(),
        }
    }

    /// The chosen pool, built now if it is the HTTP/1.1 one's first use.
    fn pool(&self, pool: Pool) -> Result<&reqwest::Client, Error> {
        match pool {
            Pool::Default => Ok(&self.default),
            Pool::Http1 => {
                if let Some(client) = self.http1.get() {
                    return Ok(client);
                }
                let built = build_pool(Pool::Http1, self.connect_timeout, self.proxy.as_deref())?;
                Ok(self.http1.get_or_init(|| built))
            }
        }
    }

    /// The client's API key.
    pub(crate) fn api_key(&self) -> &ApiKey {
        &self.api_key
    }

    /// A request builder on the chosen pool.
    pub(crate) fn request(
        &self,
        pool: Pool,
        method: reqwest::Method,
        url: reqwest::Url,
    ) -> Result<reqwest::RequestBuilder, Error> {
        Ok(self.pool(pool)?.request(method, url))
    }

    /// The deadline for a request starting now.
    pub(crate) fn deadline_from_now(&self) -> Instant {
        Instant::now() + self.deadline
    }

    /// Sends with retries until a 2xx response, a final failure, or the deadline.
    /// A request whose body cannot be cloned (a stream) gets exactly one attempt.
    pub(crate) async fn send(
        &self,
        ctx: &Ctx,
        pool: Pool,
        request: reqwest::Request,
        idempotency: Idempotency,
        deadline: Instant,
    ) -> Result<reqwest::Response, Error> {
        let client = self.pool(pool)?;
        let mut original = Some(request);
        let mut retries_done = 0;
        let started = Instant::now();
        loop {
            let (attempt, replayable) = match original.as_ref().and_then(|r| r.try_clone()) {
                Some(copy) => (copy, true),
                None => match original.take() {
                    Some(only) => (only, false),
                    None => unreachable!("a non-replayable request is sent once"),
                },
            };
            let (outcome, failure) =
                match tokio::time::timeout_at(deadline, client.execute(attempt)).await {
                    Err(_) => return Err(ctx.deadline(self.deadline)),
                    Ok(Ok(response)) if response.status().is_success() => {
                        // The debug trail of every request (HERMES_E2B_LOG=debug in the
                        // plugin): what was asked, what came back, how long it took.
                        tracing::debug!(
                            operation = %ctx.operation,
                            status = response.status().as_u16(),
                            retries = retries_done,
                            elapsed_ms = started.elapsed().as_millis(),
                            "E2B request answered"
                        );
                        return Ok(response);
                    }
                    Ok(Ok(response)) => {
                        let status = response.status().as_u16();
                        let headers = response.headers().clone();
                        let body = read_error_body(response, deadline).await;
                        let failure = ctx.response_error(status, &body);
                        let outcome = Outcome::Status {
                            status,
                            should_retry: retry::should_retry(&headers),
                            retry_after: retry::retry_after(&headers),
                            sandbox_gone: failure.is_sandbox_gone(),
                        };
                        (outcome, failure)
                    }
                    Ok(Err(error)) if error.is_connect() => (
                        Outcome::ConnectFailed,
                        ctx.transport(TransportStage::Connect, error),
                    ),
                    Ok(Err(error)) => (
                        Outcome::ConnectionLost,
                        ctx.transport(TransportStage::Request, error),
                    ),
                };
            let decision = retry::decide(
                &self.retry,
                idempotency,
                retries_done,
                outcome,
                self.retry.jitter.fraction(),
            );
            let wait = match decision {
                Decision::RetryAfter(wait) if replayable => wait,
                _ => return Err(failure),
            };
            if Instant::now() + wait >= deadline {
                // Waiting would outlive the deadline: the real failure says more than
                // "deadline exceeded" would.
                return Err(failure);
            }
            tracing::debug!(
                operation = %ctx.operation,
                retry = retries_done + 1,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error = %failure,
                "retrying E2B request"
            );
            tokio::time::sleep(wait).await;
            retries_done += 1;
        }
    }

    /// Reads a whole body of at most `limit` bytes before `deadline`, checking the cap as bytes
    /// arrive (and against `Content-Length` before reading anything).
    pub(crate) async fn read_capped(
        &self,
        ctx: &Ctx,
        response: reqwest::Response,
        limit: usize,
        deadline: Instant,
    ) -> Result<Bytes, Error> {
        let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
        if response.content_length().is_some_and(|len| len > limit_u64) {
            return Err(ctx.limit(None, limit_u64));
        }
        let mut body = response.bytes_stream();
        let mut out = BytesMut::new();
        loop {
            let next = tokio::time::timeout_at(deadline, body.next())
                .await
                .map_err(|_| ctx.deadline(self.deadline))?;
            match next {
                None => return Ok(out.freeze()),
                Some(Err(error)) => return Err(ctx.transport(TransportStage::Body, error)),
                Some(Ok(chunk)) => {
                    if out.len() + chunk.len() > limit {
                        return Err(ctx.limit(None, limit_u64));
                    }
                    out.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// Reads and decodes a JSON body (capped by `limits.max_json_bytes`).
    pub(crate) async fn read_json<T: DeserializeOwned>(
        &self,
        ctx: &Ctx,
        response: reqwest::Response,
        deadline: Instant,
    ) -> Result<T, Error> {
        let body = self
            .read_capped(ctx, response, self.limits.max_json_bytes, deadline)
            .await?;
        serde_json::from_slice(&body)
            .map_err(|error| ctx.protocol(format!("invalid JSON: {error}")))
    }
}

/// The start of an error body; failures to read it just shorten the message.
async fn read_error_body(response: reqwest::Response, deadline: Instant) -> Vec<u8> {
    let mut body = response.bytes_stream();
    let mut out = Vec::new();
    while out.len() < MAX_ERROR_BODY {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(chunk))) => {
                let room = MAX_ERROR_BODY - out.len();
                out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    out
}

/// One connection pool: no redirects (a redirect could carry X-API-Key to another host; E2B
/// never redirects), the connect timeout, the configured proxy, HTTP/1.1 only for downloads.
/// Whether the environment names a proxy for plain HTTP, which reqwest's pools follow.
fn proxy_in_environment() -> bool {
    ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

fn build_pool(
    pool: Pool,
    connect_timeout: Duration,
    proxy: Option<&str>,
) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("e2b-client-rust/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect_timeout);
    if let Some(proxy) = proxy {
        // The URL may carry credentials: the error names neither it nor them.
        let proxy = reqwest::Proxy::all(proxy).map_err(|_| Error::InvalidConfig {
            reason: "proxy is not a valid proxy URL (http://[user:pass@]host:port)".to_owned(),
        })?;
        builder = builder.proxy(proxy);
    }
    let builder = match pool {
        Pool::Default => builder,
        Pool::Http1 => builder.http1_only(),
    };
    builder.build().map_err(|error| Error::InvalidConfig {
        reason: clean_text(&error.without_url().to_string(), &[]),
    })
}

#[cfg(test)]
mod tests;
