//! The control plane: create, list, get, connect, set the lease, pause, kill; snapshots and
//! forks in [`snapshots`]; E2B Secrets in [`secrets`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, TryStreamExt, stream};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::config::{CODE_INTERPRETER_PORT, Config};
use crate::error::{Error, Operation};
use crate::http::{Ctx, Http, Pool, Target, UNRESERVED};
use crate::ids::SandboxId;
use crate::redact::redact;
use crate::retry::Idempotency;
use crate::sandbox::{EnvdAccess, Sandbox, SandboxUrls};

mod answers;
mod metrics;
mod network;
mod options;
mod secrets;
mod snapshots;
mod templates;
mod volumes;

pub use self::answers::{
    ConnectState, Connected, KillOutcome, Lifecycle, ListedSandbox, PauseOutcome, SandboxDetail,
    SandboxInfo, SandboxState,
};
pub use self::metrics::SandboxMetric;
pub use self::network::{
    ALL_TRAFFIC, EgressProxy, EgressRules, HeaderTransform, NetworkConfig, NetworkUpdate,
    TransformRules,
};
pub use self::options::{
    CreateOptions, IamToken, ListOrder, ListQuery, OnResume, OnTimeout, PauseMemory, StateFilter,
    identity_token_placeholder,
};
pub use self::secrets::{
    MAX_SECRET_NAME, NewSecret, SecretInfo, SecretQuery, SecretUpdate, canonical_secret_name,
    secret_placeholder,
};
pub use self::snapshots::{DeleteOutcome, ForkOptions, SnapshotInfo, SnapshotQuery};

/// Python's `quote(s)` keeps letters, digits, `_.-~` and `/`.
const PY_QUOTE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~')
    .remove(b'/');

/// A handle to E2B. Cheap to clone; clones share connection pools.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Shared with every [`Sandbox`] made from this client.
    http: Arc<Http>,
    api_base: String,
    api_key_header: HeaderValue,
    /// `Config::api_headers`, checked once.
    api_headers: reqwest::header::HeaderMap,
    config: Config,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("api_base", &redact(&self.inner.api_base))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the given configuration. Fails on an empty key or an unusable URL.
    pub fn new(config: Config) -> Result<Client, Error> {
        Client::build(config, None)
    }

    /// A client for `config` on this client's connection pools: its open connections and its
    /// parsed trust roots are shared (requests carry their own key and deadline), so many
    /// clients of one process, for one key or several, cost one pool. New pools when the
    /// connect timeout `config` implies differs.
    pub fn sharing_pools(&self, config: Config) -> Result<Client, Error> {
        Client::build(config, Some(&self.inner.http))
    }

    fn build(config: Config, pools: Option<&Http>) -> Result<Client, Error> {
        if config.api_key.is_empty() {
            return Err(Error::InvalidConfig {
                reason: "the API key is empty".to_owned(),
            });
        }
        let api_base = config.api_base_url().trim_end_matches('/').to_owned();
        check_base_url("api_url", &api_base)?;
        if let Some(url) = &config.sandbox_url {
            check_base_url("sandbox_url", url)?;
        }
        let mut api_key_header =
            HeaderValue::from_str(config.api_key.expose()).map_err(|_| Error::InvalidConfig {
                reason: "the API key contains characters a header cannot carry".to_owned(),
            })?;
        api_key_header.set_sensitive(true);
        let mut api_headers = reqwest::header::HeaderMap::new();
        for (name, value) in &config.api_headers {
            let refused = || Error::InvalidConfig {
                reason: format!("api_headers: '{name}' is not a header this client may send"),
            };
            let header =
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| refused())?;
            if header == "x-api-key" {
                return Err(refused());
            }
            let mut value = HeaderValue::from_str(value).map_err(|_| refused())?;
            // Gateway credentials travel here: never shown.
            value.set_sensitive(true);
            api_headers.insert(header, value);
        }
        Ok(Client {
            inner: Arc::new(Inner {
                http: Arc::new(match pools {
                    Some(pools) => pools.sharing(&config)?,
                    None => Http::new(&config)?,
                }),
                api_base,
                api_key_header,
                api_headers,
                config,
            }),
        })
    }

    /// The same client whose calls each get `deadline` instead of the configured
    /// [`request_deadline`](Config::request_deadline) (the official SDK's per-call
    /// `request_timeout`), on the same connections; sandboxes made from it inherit it.
    pub fn with_request_deadline(&self, deadline: Duration) -> Client {
        let mut config = self.inner.config.clone();
        config.request_deadline = deadline;
        Client {
            inner: Arc::new(Inner {
                http: Arc::new(self.inner.http.with_deadline(deadline)),
                api_base: self.inner.api_base.clone(),
                api_key_header: self.inner.api_key_header.clone(),
                api_headers: self.inner.api_headers.clone(),
                config,
            }),
        }
    }

    /// Creates a sandbox (`POST /v2/sandboxes`). Without an
    /// [`idempotency_key`](CreateOptions::idempotency_key) it is not retried once the request
    /// may have reached E2B, so a lost response never makes two sandboxes (find it by metadata
    /// instead); with one it is retried like any idempotent call, E2B answering a repeat with
    /// the sandbox the key's first create made.
    pub async fn create(&self, options: CreateOptions) -> Result<SandboxInfo, Error> {
        let ctx = self.ctx(Operation::Create, None).with_secrets(
            options
                .network
                .as_ref()
                .map(NetworkConfig::secrets)
                .unwrap_or_default(),
        );
        let (auto_pause, auto_pause_memory) = match options.on_timeout {
            OnTimeout::ServerDefault => (None, None),
            OnTimeout::Kill => (Some(false), None),
            OnTimeout::Pause(PauseMemory::Keep) => (Some(true), Some(true)),
            OnTimeout::Pause(PauseMemory::Discard) => (Some(true), Some(false)),
        };
        let body = NewSandbox {
            template_id: &options.template,
            timeout: options.timeout.map(whole_secs),
            auto_pause,
            auto_pause_memory,
            auto_resume: options
                .auto_resume
                .map(|enabled| AutoResumeWire { enabled }),
            secure: options.secure,
            allow_internet_access: options.allow_internet_access,
            network: options.network.as_ref().map(network::NetworkWire::from),
            metadata: &options.metadata,
            env_vars: &options.env_vars,
            volume_mounts: &options.volume_mounts,
            mcp: options.mcp.as_ref(),
            iam: (!options.iam_tokens.is_empty()).then_some(IamWire {
                tokens: &options.iam_tokens,
            }),
        };
        for name in options.iam_tokens.keys() {
            identity_token_placeholder(name).map_err(|reason| ctx.invalid_input(reason))?;
        }
        let (idempotency, header) = match &options.idempotency_key {
            None => (Idempotency::NotIdempotent, None),
            Some(key) => {
                let value = HeaderValue::from_str(key).map_err(|_| {
                    ctx.invalid_input("the idempotency key cannot be sent in a header")
                })?;
                (Idempotency::Idempotent, Some(("Idempotency-Key", value)))
            }
        };
        let (response, deadline) = self
            .send_json_with(
                &ctx,
                Method::POST,
                "/v2/sandboxes",
                Some(&body),
                idempotency,
                header,
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Lists sandboxes (`GET /v2/sandboxes`) as a stream of items, fetching the next page
    /// (following `X-Next-Token`) only when the previous one is consumed.
    pub fn list(
        &self,
        query: ListQuery,
    ) -> impl Stream<Item = Result<ListedSandbox, Error>> + Send + 'static {
        let start = query.next_token.clone();
        self.paged_from(
            Operation::List,
            "/v2/sandboxes",
            list_query_string(&query),
            start,
        )
    }

    /// Items of a paged GET, one page at a time: the next page (`nextToken` from the previous
    /// answer's `X-Next-Token`) is fetched only when the previous one is consumed, and a server
    /// that repeats a token is a protocol error rather than an endless loop.
    pub(crate) fn paged<T: DeserializeOwned + Send + 'static>(
        &self,
        operation: Operation,
        path: &'static str,
        base_query: String,
    ) -> impl Stream<Item = Result<T, Error>> + Send + 'static {
        self.paged_from(operation, path, base_query, None)
    }

    /// [`Client::paged`] from the page `start` names (a token an earlier listing handed out),
    /// or from the first page.
    pub(crate) fn paged_from<T: DeserializeOwned + Send + 'static>(
        &self,
        operation: Operation,
        path: &'static str,
        base_query: String,
        start: Option<String>,
    ) -> impl Stream<Item = Result<T, Error>> + Send + 'static {
        let client = self.clone();
        let first = match start {
            Some(token) => PageState::Next(token),
            None => PageState::First,
        };
        let pages = stream::try_unfold(first, move |state| {
            let client = client.clone();
            let base_query = base_query.clone();
            async move {
                let token = match state {
                    PageState::Done => return Ok(None),
                    PageState::First => None,
                    PageState::Next(token) => Some(token),
                };
                let (items, next) = client
                    .get_page::<T>(operation, path, &base_query, token.as_deref())
                    .await?;
                let next_state = match next {
                    Some(next) if Some(&next) == token.as_ref() => {
                        let ctx = client.ctx(operation, None);
                        return Err(ctx.protocol("the server repeated the same page token"));
                    }
                    Some(next) => PageState::Next(next),
                    None => PageState::Done,
                };
                Ok(Some((items, next_state)))
            }
        });
        pages
            .map_ok(|items| stream::iter(items.into_iter().map(Ok)))
            .try_flatten()
    }

    async fn get_page<T: DeserializeOwned>(
        &self,
        operation: Operation,
        path: &str,
        base_query: &str,
        token: Option<&str>,
    ) -> Result<(Vec<T>, Option<String>), Error> {
        let ctx = self.ctx(operation, None);
        let mut query = base_query.to_owned();
        if let Some(token) = token {
            if !query.is_empty() {
                query.push('&');
            }
            query.push_str("nextToken=");
            query.extend(utf8_percent_encode(token, UNRESERVED));
        }
        let path = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        };
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        let next = response
            .headers()
            .get("x-next-token")
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(str::to_owned);
        let items: Vec<T> = self.inner.http.read_json(&ctx, response, deadline).await?;
        Ok((items, next))
    }

    /// How many sandboxes are running on the account (`GET /v2/sandboxes?state=running&limit=1`,
    /// E2B's `X-Total-Running` header): one cheap authenticated request that creates nothing,
    /// so it also tells whether the key and the endpoint work. `None` when the server did not
    /// send the header.
    pub async fn count_running(&self) -> Result<Option<u64>, Error> {
        let ctx = self.ctx(Operation::List, None);
        let (response, deadline) = self
            .send_json::<()>(
                &ctx,
                Method::GET,
                "/v2/sandboxes?state=running&limit=1",
                None,
                Idempotency::Idempotent,
            )
            .await?;
        let running = response
            .headers()
            .get("x-total-running")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok());
        // The one-item page itself is not needed; reading it keeps the connection reusable.
        let _: Vec<serde_json::Value> = self.inner.http.read_json(&ctx, response, deadline).await?;
        Ok(running)
    }

    /// Reads one sandbox (`GET /sandboxes/{id}`). A 404 is an error with
    /// [`Error::is_not_found`] and [`Error::is_sandbox_gone`].
    pub async fn get(&self, sandbox_id: &SandboxId) -> Result<SandboxDetail, Error> {
        let ctx = self.ctx(Operation::Get, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}");
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Connects (`POST /v2/sandboxes/{id}/connect`): extends the lease to at least `timeout`
    /// from now (never shortens it) and resumes a paused sandbox. The answer carries the
    /// current envd token and domain, which may change on resume.
    pub async fn connect(
        &self,
        sandbox_id: &SandboxId,
        timeout: Duration,
    ) -> Result<Connected, Error> {
        self.connect_with(sandbox_id, timeout, OnResume::Restore)
            .await
    }

    /// [`Client::connect`], choosing how a paused sandbox comes back: with its memory
    /// ([`OnResume::Restore`], E2B's default) or cold-booted from its files
    /// ([`OnResume::Reboot`]: no process survives; `memory: false`), the SDK's `on_resume`.
    pub async fn connect_with(
        &self,
        sandbox_id: &SandboxId,
        timeout: Duration,
        on_resume: OnResume,
    ) -> Result<Connected, Error> {
        let ctx = self.ctx(Operation::Connect, Some(sandbox_id));
        let path = format!("/v2/sandboxes/{sandbox_id}/connect");
        let body = ConnectBody {
            timeout: whole_secs(timeout),
            memory: match on_resume {
                OnResume::Restore => None,
                OnResume::Reboot => Some(false),
            },
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::Idempotent,
            )
            .await?;
        let state = if response.status().as_u16() == 201 {
            ConnectState::Resumed
        } else {
            ConnectState::Running
        };
        let sandbox = self.inner.http.read_json(&ctx, response, deadline).await?;
        Ok(Connected { sandbox, state })
    }

    /// Sets the lease to exactly `timeout` from now (`POST /sandboxes/{id}/timeout`); unlike
    /// [`Client::connect`] this may shorten it. Only a running sandbox has a lease: 404 otherwise.
    pub async fn set_timeout(
        &self,
        sandbox_id: &SandboxId,
        timeout: Duration,
    ) -> Result<(), Error> {
        let ctx = self.ctx(Operation::SetTimeout, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}/timeout");
        let body = TimeoutBody {
            timeout: whole_secs(timeout),
        };
        self.send_json(
            &ctx,
            Method::POST,
            &path,
            Some(&body),
            Idempotency::Idempotent,
        )
        .await?;
        Ok(())
    }

    /// Pauses a running sandbox (`POST /sandboxes/{id}/pause`), keeping its memory as E2B's
    /// default does. A 409 is [`PauseOutcome::AlreadyPaused`]; a 404 is an error.
    pub async fn pause(&self, sandbox_id: &SandboxId) -> Result<PauseOutcome, Error> {
        self.pause_with(sandbox_id, PauseMemory::Keep).await
    }

    /// [`Client::pause`], choosing what the pause keeps: memory and files
    /// ([`PauseMemory::Keep`]) or the files only ([`PauseMemory::Discard`]: `memory: false`,
    /// the SDK's `mode="filesystem"`; the resume then cold-boots).
    pub async fn pause_with(
        &self,
        sandbox_id: &SandboxId,
        memory: PauseMemory,
    ) -> Result<PauseOutcome, Error> {
        let ctx = self.ctx(Operation::Pause, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}/pause");
        let mut body = serde_json::Map::new();
        if memory == PauseMemory::Discard {
            body.insert("memory".to_owned(), serde_json::Value::Bool(false));
        }
        match self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::Idempotent,
            )
            .await
        {
            Ok(_) => Ok(PauseOutcome::Paused),
            Err(error) if error.is_conflict() => Ok(PauseOutcome::AlreadyPaused),
            Err(error) => Err(error),
        }
    }

    /// Kills a sandbox, running or paused (`DELETE /sandboxes/{id}`). A 404 is
    /// [`KillOutcome::NotFound`].
    pub async fn kill(&self, sandbox_id: &SandboxId) -> Result<KillOutcome, Error> {
        let ctx = self.ctx(Operation::Kill, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}");
        match self
            .send_json::<()>(&ctx, Method::DELETE, &path, None, Idempotency::Idempotent)
            .await
        {
            Ok(_) => Ok(KillOutcome::Killed),
            Err(error) if error.is_not_found() => Ok(KillOutcome::NotFound),
            Err(error) => Err(error),
        }
    }

    /// A handle on one sandbox's envd (processes, filesystem, files), addressed as the official
    /// SDK does (see [`Config::envd_base_url`]).
    pub fn sandbox(&self, access: EnvdAccess) -> Result<Sandbox, Error> {
        let base = self
            .inner
            .config
            .envd_base_url(&access.sandbox_id, access.domain.as_deref());
        check_base_url("sandbox_url", &base)?;
        let direct = self
            .inner
            .config
            .envd_direct_url(&access.sandbox_id, access.domain.as_deref());
        check_base_url("sandbox_url", &direct)?;
        let config = &self.inner.config;
        let domain = access.domain.as_deref();
        let code = config.port_base_url(&access.sandbox_id, domain, CODE_INTERPRETER_PORT);
        check_base_url("sandbox_url", &code)?;
        let host = config.sandbox_host(&access.sandbox_id, domain, CODE_INTERPRETER_PORT);
        let domain = host
            .split_once('.')
            .map_or_else(String::new, |(_, domain)| domain.to_owned());
        let urls = SandboxUrls {
            envd: base,
            direct,
            code,
            domain,
        };
        Sandbox::new(Arc::clone(&self.inner.http), access, urls)
    }

    /// A context for errors of `operation`.
    pub(crate) fn ctx(&self, operation: Operation, sandbox_id: Option<&SandboxId>) -> Ctx {
        Ctx::new(
            operation,
            Target::Control(sandbox_id.cloned()),
            self.inner.http.api_key().clone(),
            None,
        )
    }

    async fn send_json<B: Serialize>(
        &self,
        ctx: &Ctx,
        method: Method,
        path_and_query: &str,
        body: Option<&B>,
        idempotency: Idempotency,
    ) -> Result<(reqwest::Response, Instant), Error> {
        self.send_json_with(ctx, method, path_and_query, body, idempotency, None)
            .await
    }

    /// [`Client::send_json`] with one more header.
    async fn send_json_with<B: Serialize>(
        &self,
        ctx: &Ctx,
        method: Method,
        path_and_query: &str,
        body: Option<&B>,
        idempotency: Idempotency,
        header: Option<(&'static str, HeaderValue)>,
    ) -> Result<(reqwest::Response, Instant), Error> {
        let url = reqwest::Url::parse(&format!("{}{path_and_query}", self.inner.api_base))
            .map_err(|error| ctx.invalid_input(format!("bad URL: {error}")))?;
        let mut builder = self
            .inner
            .http
            .request(Pool::Default, method, url)?
            .headers(self.inner.api_headers.clone())
            .header("X-API-Key", self.inner.api_key_header.clone());
        if let Some((name, value)) = header {
            builder = builder.header(name, value);
        }
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body)
                .map_err(|error| ctx.invalid_input(format!("cannot encode the body: {error}")))?;
            builder = builder.header(CONTENT_TYPE, "application/json").body(bytes);
        }
        let request = ctx.build(builder)?;
        // One deadline for sending, retrying and reading the answer.
        let deadline = self.inner.http.deadline_from_now();
        let response = self
            .inner
            .http
            .send(ctx, Pool::Default, request, idempotency, deadline)
            .await?;
        Ok((response, deadline))
    }
}

/// An http(s) URL with a host, or an error naming the setting.
fn check_base_url(setting: &str, url: &str) -> Result<(), Error> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => {
            Ok(())
        }
        _ => Err(Error::InvalidConfig {
            reason: format!("{setting} is not an http(s) URL: {}", redact(url)),
        }),
    }
}

/// Seconds for the API, rounding any fraction up (a lease is never silently shortened).
fn whole_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

enum PageState {
    First,
    Next(String),
    Done,
}

/// Builds the list query (without the page token), encoded exactly as the official SDK sends it.
fn list_query_string(query: &ListQuery) -> String {
    let mut parts = Vec::new();
    if !query.metadata.is_empty() {
        parts.push(format!("metadata={}", metadata_filter(&query.metadata)));
    }
    let states = match query.state {
        StateFilter::Running => "running",
        StateFilter::Paused => "paused",
        StateFilter::Any => "running,paused",
    };
    parts.push(format!("state={}", utf8_percent_encode(states, UNRESERVED)));
    if let Some(limit) = query.limit {
        parts.push(format!("limit={limit}"));
    }
    match query.order {
        None => {}
        Some(ListOrder::OldestFirst) => parts.push("order=asc".to_owned()),
        Some(ListOrder::NewestFirst) => parts.push("order=desc".to_owned()),
    }
    if let Some(after) = query.started_after
        && let Ok(text) = after.format(&time::format_description::well_known::Rfc3339)
    {
        parts.push(format!(
            "startedAfter={}",
            utf8_percent_encode(&text, UNRESERVED)
        ));
    }
    if let Some(template) = &query.template {
        parts.push(format!(
            "template={}",
            utf8_percent_encode(template, UNRESERVED)
        ));
    }
    parts.join("&")
}

/// E2B's double-encoded metadata filter, as the official SDK produces it: each key and value
/// through Python's `quote` (keeps `/`), the pairs through `urlencode` (`k=v&k2=v2`, keeps only
/// unreserved characters), then the whole string percent-encoded once more as a query value.
/// `{"scope": "a b/c"}` becomes `scope%3Da%252520b%252Fc`, as the official SDK double-encodes it.
pub(crate) fn metadata_filter(metadata: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = metadata
        .iter()
        .map(|(key, value)| {
            let key = utf8_percent_encode(key, PY_QUOTE).to_string();
            let value = utf8_percent_encode(value, PY_QUOTE).to_string();
            format!(
                "{}={}",
                utf8_percent_encode(&key, UNRESERVED),
                utf8_percent_encode(&value, UNRESERVED)
            )
        })
        .collect();
    utf8_percent_encode(&pairs.join("&"), UNRESERVED).to_string()
}

#[derive(Serialize)]
struct NewSandbox<'a> {
    #[serde(rename = "templateID")]
    template_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<u64>,
    #[serde(rename = "autoPause", skip_serializing_if = "Option::is_none")]
    auto_pause: Option<bool>,
    #[serde(rename = "autoPauseMemory", skip_serializing_if = "Option::is_none")]
    auto_pause_memory: Option<bool>,
    #[serde(rename = "autoResume", skip_serializing_if = "Option::is_none")]
    auto_resume: Option<AutoResumeWire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secure: Option<bool>,
    // E2B spells this one field in snake_case.
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<network::NetworkWire>,
    metadata: &'a BTreeMap<String, String>,
    #[serde(rename = "envVars")]
    env_vars: &'a BTreeMap<String, String>,
    #[serde(rename = "volumeMounts", skip_serializing_if = "<[_]>::is_empty")]
    volume_mounts: &'a [crate::VolumeMountInfo],
    #[serde(skip_serializing_if = "Option::is_none")]
    iam: Option<IamWire<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

#[derive(Serialize)]
struct IamWire<'a> {
    tokens: &'a BTreeMap<String, IamToken>,
}

#[derive(Serialize)]
struct AutoResumeWire {
    enabled: bool,
}

#[derive(Serialize)]
struct ConnectBody {
    timeout: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<bool>,
}

#[derive(Serialize)]
struct TimeoutBody {
    timeout: u64,
}

#[cfg(test)]
mod tests;
