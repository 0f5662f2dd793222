//! One sandbox's envd: processes over Connect streams, filesystem RPCs, `/files`, health.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::ENVD_PORT;
use crate::error::{Error, Operation};
use crate::framing::{GoneProbe, ServerStream, encode_envelope};
use crate::http::{Ctx, Http, Pool, Target};
use crate::ids::SandboxId;
use crate::json;
use crate::process::ProcessStream;
use crate::redact::redact;
use crate::retry::Idempotency;
use crate::secret::AccessToken;

// One file per envd service; each adds its methods to `Sandbox` and keeps its messages.
mod code;
mod filesystem;
mod git;
mod input;
mod mcp;
mod processes;
mod terminal;
mod transfer;
mod urls;
mod watching;

pub use git::Git;
pub use input::InputStream;
pub use mcp::MCP_PORT;
pub use urls::FileUrl;

/// What reaching one sandbox's envd takes.
#[derive(Clone, Debug)]
pub struct EnvdAccess {
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// Its envd access token, if it has one.
    pub access_token: Option<AccessToken>,
    /// Its domain, if E2B named one.
    pub domain: Option<String>,
    /// Its traffic access token, for a sandbox created with public traffic off: the code
    /// interpreter's requests carry it (`E2B-Traffic-Access-Token`).
    pub traffic_access_token: Option<AccessToken>,
}

/// A connected sandbox's envd surface: processes, filesystem and file transfer.
///
/// Every request carries `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` and, when the sandbox has
/// one, `X-Access-Token`. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    http: Arc<Http>,
    id: SandboxId,
    base: String,
    /// The sandbox's own envd address, for URLs that carry no header (signed file URLs).
    direct: String,
    /// The code interpreter's base URL (port 49999, addressed as `base` is).
    code_base: String,
    /// `<port>-<id>.<domain>` with this domain is a port's host ([`Sandbox::host`]).
    domain: String,
    token: Option<AccessToken>,
    token_header: Option<HeaderValue>,
    traffic_header: Option<HeaderValue>,
    user: Option<String>,
    /// Where the blocking path reaches envd, when `base` is plain HTTP.
    route: Option<Arc<crate::blocking::Route>>,
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

/// Where a sandbox's requests go, decided by the client's [`Config`](crate::Config).
pub(crate) struct SandboxUrls {
    pub(crate) envd: String,
    pub(crate) direct: String,
    pub(crate) code: String,
    pub(crate) domain: String,
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
    pub(crate) fn new(
        http: Arc<Http>,
        access: EnvdAccess,
        urls: SandboxUrls,
    ) -> Result<Sandbox, Error> {
        // The control plane handed out these tokens, so its connect is what failed.
        let header = |token: &Option<AccessToken>, what: &str| match token {
            None => Ok(None),
            Some(token) => {
                let mut value = HeaderValue::from_str(token.expose()).map_err(|_| {
                    let ctx = Ctx::new(
                        Operation::Connect,
                        Target::Control(Some(access.sandbox_id.clone())),
                        http.api_key().clone(),
                        None,
                    );
                    ctx.protocol(format!("the {what} is not a valid header value"))
                })?;
                value.set_sensitive(true);
                Ok(Some(value))
            }
        };
        let token_header = header(&access.access_token, "envd access token")?;
        let traffic_header = header(&access.traffic_access_token, "traffic access token")?;
        Ok(Sandbox {
            http,
            id: access.sandbox_id,
            base: urls.envd.trim_end_matches('/').to_owned(),
            direct: urls.direct.trim_end_matches('/').to_owned(),
            code_base: urls.code.trim_end_matches('/').to_owned(),
            domain: urls.domain,
            token: access.access_token,
            route: crate::blocking::Route::of(urls.envd.trim_end_matches('/')).map(Arc::new),
            token_header,
            traffic_header,
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
    /// `Authorization: Basic` / `username=`); commands use
    /// [`StartOptions::user`](crate::StartOptions::user).
    pub fn with_user(&self, user: String) -> Sandbox {
        Sandbox {
            user: Some(user),
            ..self.clone()
        }
    }

    /// The same sandbox whose calls each get `deadline` (retries and, for a stream, each
    /// silent gap included) instead of the client's
    /// [`request_deadline`](crate::Config::request_deadline), as the official SDK's
    /// per-call `request_timeout`; the connections are shared.
    pub fn with_request_deadline(&self, deadline: Duration) -> Sandbox {
        Sandbox {
            http: Arc::new(self.http.with_deadline(deadline)),
            ..self.clone()
        }
    }

    fn ctx(&self, operation: Operation) -> Ctx {
        Ctx::new(
            operation,
            Target::Envd(self.id.clone()),
            self.http.api_key().clone(),
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
        self.request_to_port(ctx, pool, method, (&self.base, ENVD_PORT), path_and_query)
    }

    /// A request to `port` of the sandbox at `base`: its `E2b-Sandbox-*` headers and the
    /// envd access token.
    fn request_to_port(
        &self,
        ctx: &Ctx,
        pool: Pool,
        method: Method,
        (base, port): (&str, u16),
        path_and_query: &str,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let url = reqwest::Url::parse(&format!("{base}{path_and_query}"))
            .map_err(|error| ctx.invalid_input(format!("bad URL: {error}")))?;
        let mut builder = self
            .http
            .request(pool, method, url)?
            .header("E2b-Sandbox-Id", self.id.as_str())
            .header("E2b-Sandbox-Port", port.to_string());
        if let Some(token) = &self.token_header {
            builder = builder.header("X-Access-Token", token.clone());
        }
        Ok(builder)
    }

    /// The headers of [`Sandbox::request_to_port`] for envd, for the blocking path (which
    /// also sends reqwest's user agent, so the two paths look alike to a server).
    fn routing_headers(&self, ctx: &Ctx) -> Result<Vec<(&'static str, HeaderValue)>, Error> {
        let id = HeaderValue::from_str(self.id.as_str())
            .map_err(|_| ctx.invalid_input("the sandbox id cannot be sent in a header"))?;
        let mut headers = vec![
            (
                "User-Agent",
                HeaderValue::from_static(concat!("e2b-client-rust/", env!("CARGO_PKG_VERSION"))),
            ),
            ("E2b-Sandbox-Id", id),
            ("E2b-Sandbox-Port", HeaderValue::from(ENVD_PORT)),
        ];
        if let Some(token) = &self.token_header {
            headers.push(("X-Access-Token", token.clone()));
        }
        Ok(headers)
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

    /// A unary Connect call with the JSON codec.
    async fn rpc<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        operation: Operation,
        method: &str,
        message: &Req,
        idempotency: Idempotency,
    ) -> Result<Resp, Error> {
        let ctx = self.ctx(operation);
        let http = &self.http;
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
        let request = ctx.build(builder)?;
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
        let reader = self
            .open_stream(
                operation,
                method,
                message,
                user,
                process_deadline,
                keepalive,
            )
            .await?;
        ProcessStream::open(reader).await
    }

    /// Sends a server-streaming Connect request, checks the answer is a stream and returns
    /// its reader: silence allowed for two keepalive intervals (or the request deadline if
    /// longer), and a body that breaks off checked against `/health`.
    async fn open_stream<Req: Serialize>(
        &self,
        operation: Operation,
        method: &str,
        message: &Req,
        user: Option<&str>,
        process_deadline: Option<Duration>,
        keepalive: Duration,
    ) -> Result<ServerStream, Error> {
        let ctx = self.ctx(operation);
        let http = &self.http;
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
        let request = ctx.build(builder)?;
        let deadline = http.deadline_from_now();
        // Start is not idempotent: a retry after the request may have arrived could run the
        // command twice. Connect to a pid, or a watch, is harmless to repeat.
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
        Ok(ServerStream::new(
            ctx,
            response.bytes_stream(),
            http.limits.max_frame_bytes,
            idle,
            Some(self.gone_probe()),
        ))
    }

    /// Whether the sandbox is gone, asked once a stream broke off: only a proxy's "not
    /// running" answer counts, since a failing probe proves nothing.
    pub(crate) fn gone_probe(&self) -> GoneProbe {
        let sandbox = self.clone();
        Box::new(move || {
            Box::pin(async move { matches!(sandbox.health().await, Ok(Health::NotRunning)) })
        })
    }

    /// Checks envd (`GET /health`): [`Health::NotRunning`] when the proxy says the sandbox is
    /// not running, an error for anything else unexpected.
    pub async fn health(&self) -> Result<Health, Error> {
        let ctx = self.ctx(Operation::Health);
        let http = &self.http;
        let request = ctx.build(self.request(&ctx, Pool::Default, Method::GET, "/health")?)?;
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
}

/// Milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
