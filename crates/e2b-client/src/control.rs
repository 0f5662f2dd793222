//! The control plane: create, list, get, connect, set the lease, pause, kill.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, TryStreamExt, stream};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Deserializer, Serialize};
use tokio::time::Instant;

use crate::config::Config;
use crate::error::{Error, Operation};
use crate::http::{Ctx, Http, Pool, Target, UNRESERVED};
use crate::ids::SandboxId;
use crate::json;
use crate::redact::redact;
use crate::retry::Idempotency;
use crate::sandbox::{EnvdAccess, Sandbox};
use crate::secret::AccessToken;

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
        Ok(Client {
            inner: Arc::new(Inner {
                http: Arc::new(Http::new(&config)?),
                api_base,
                api_key_header,
                config,
            }),
        })
    }

    /// Creates a sandbox (`POST /v2/sandboxes`). Not retried once the request may have reached
    /// E2B, so a lost response never makes two sandboxes; find it by metadata instead.
    pub async fn create(&self, options: CreateOptions) -> Result<SandboxInfo, Error> {
        let ctx = self.ctx(Operation::Create, None);
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
            secure: options.secure,
            allow_internet_access: options.allow_internet_access,
            metadata: &options.metadata,
            env_vars: &options.env_vars,
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                "/v2/sandboxes",
                Some(&body),
                Idempotency::NotIdempotent,
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
        let client = self.clone();
        let base_query = list_query_string(&query);
        let pages = stream::try_unfold(PageState::First, move |state| {
            let client = client.clone();
            let base_query = base_query.clone();
            async move {
                let token = match state {
                    PageState::Done => return Ok(None),
                    PageState::First => None,
                    PageState::Next(token) => Some(token),
                };
                let (items, next) = client.list_page(&base_query, token.as_deref()).await?;
                let next_state = match next {
                    Some(next) if Some(&next) == token.as_ref() => {
                        let ctx = client.ctx(Operation::List, None);
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

    async fn list_page(
        &self,
        base_query: &str,
        token: Option<&str>,
    ) -> Result<(Vec<ListedSandbox>, Option<String>), Error> {
        let ctx = self.ctx(Operation::List, None);
        let mut query = base_query.to_owned();
        if let Some(token) = token {
            if !query.is_empty() {
                query.push('&');
            }
            query.push_str("nextToken=");
            query.extend(utf8_percent_encode(token, UNRESERVED));
        }
        let path = if query.is_empty() {
            "/v2/sandboxes".to_owned()
        } else {
            format!("/v2/sandboxes?{query}")
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
        let items: Vec<ListedSandbox> = self.inner.http.read_json(&ctx, response, deadline).await?;
        Ok((items, next))
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
        let ctx = self.ctx(Operation::Connect, Some(sandbox_id));
        let path = format!("/v2/sandboxes/{sandbox_id}/connect");
        let body = TimeoutBody {
            timeout: whole_secs(timeout),
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
        let ctx = self.ctx(Operation::Pause, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}/pause");
        let body = serde_json::Map::new();
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
        Sandbox::new(Arc::clone(&self.inner.http), access, base)
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
        let url = reqwest::Url::parse(&format!("{}{path_and_query}", self.inner.api_base))
            .map_err(|error| ctx.invalid_input(format!("bad URL: {error}")))?;
        let mut builder = self
            .inner
            .http
            .request(Pool::Default, method, url)
            .header("X-API-Key", self.inner.api_key_header.clone());
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body)
                .map_err(|error| ctx.invalid_input(format!("cannot encode the body: {error}")))?;
            builder = builder.header(CONTENT_TYPE, "application/json").body(bytes);
        }
        let request = builder
            .build()
            .map_err(|error| ctx.invalid_input(format!("cannot build the request: {error}")))?;
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
    parts.join("&")
}

/// E2B's double-encoded metadata filter, as the official SDK produces it: each key and value
/// through Python's `quote` (keeps `/`), the pairs through `urlencode` (`k=v&k2=v2`, keeps only
/// unreserved characters), then the whole string percent-encoded once more as a query value.
/// `{"scope": "a b/c"}` becomes `scope%3Da%252520b%252Fc` (e2b-wire 1.3).
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
    #[serde(skip_serializing_if = "Option::is_none")]
    secure: Option<bool>,
    // E2B spells this one field in snake_case.
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_internet_access: Option<bool>,
    metadata: &'a BTreeMap<String, String>,
    #[serde(rename = "envVars")]
    env_vars: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct TimeoutBody {
    timeout: u64,
}

/// What to create. Start from [`CreateOptions::new`]; there is no `Default`.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Template name or id (`base`).
    pub template: String,
    /// The first lease; `None` leaves it to E2B (300 s on the v2 route).
    pub timeout: Option<Duration>,
    /// What happens when the lease runs out.
    pub on_timeout: OnTimeout,
    /// Metadata to find the sandbox by later.
    pub metadata: BTreeMap<String, String>,
    /// Environment variables for every process in the sandbox.
    pub env_vars: BTreeMap<String, String>,
    /// `Some(false)` puts the sandbox behind deny-all egress; `None` leaves E2B's default.
    pub allow_internet_access: Option<bool>,
    /// Sent as `secure` when set. On the v2 route E2B always issues an envd access token, so
    /// `Some(true)` is what you get anyway; E2B ignores the field there.
    pub secure: Option<bool>,
}

impl CreateOptions {
    /// A sandbox from `template` with E2B's defaults for everything else.
    pub fn new(template: String) -> CreateOptions {
        CreateOptions {
            template,
            timeout: None,
            on_timeout: OnTimeout::ServerDefault,
            metadata: BTreeMap::new(),
            env_vars: BTreeMap::new(),
            allow_internet_access: None,
            secure: None,
        }
    }
}

/// What E2B does with a sandbox whose lease ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// Whatever E2B does when not told (it kills).
    ServerDefault,
    /// Kill it (`autoPause: false`).
    Kill,
    /// Pause it (`autoPause: true`), with or without memory.
    Pause(PauseMemory),
}

/// Whether a pause keeps memory (processes survive) or only the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseMemory {
    /// Memory snapshot: running processes resume (`autoPauseMemory: true`).
    Keep,
    /// Filesystem only: resume cold-boots, processes are gone (`autoPauseMemory: false`).
    Discard,
}

/// Which states [`Client::list`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    /// Running sandboxes only.
    Running,
    /// Paused sandboxes only.
    Paused,
    /// Both.
    Any,
}

/// A list filter. Start from [`ListQuery::all`].
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Every pair must match exactly.
    pub metadata: BTreeMap<String, String>,
    /// Which states.
    pub state: StateFilter,
    /// Page size (E2B: 1 to 100, default 100).
    pub limit: Option<u32>,
}

impl ListQuery {
    /// Every sandbox, running or paused, in E2B's page size.
    pub fn all() -> ListQuery {
        ListQuery {
            metadata: BTreeMap::new(),
            state: StateFilter::Any,
            limit: None,
        }
    }
}

/// A sandbox as create and connect return it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The id.
    #[serde(rename = "sandboxID", alias = "sandboxId", alias = "sandbox_id")]
    pub sandbox_id: SandboxId,
    /// The template id.
    #[serde(
        rename = "templateID",
        alias = "templateId",
        alias = "template_id",
        default
    )]
    pub template_id: String,
    /// The template alias, when it has one.
    #[serde(default)]
    pub alias: Option<String>,
    /// E2B's client id (legacy).
    #[serde(rename = "clientID", alias = "clientId", alias = "client_id", default)]
    pub client_id: String,
    /// envd's version.
    #[serde(rename = "envdVersion", alias = "envd_version", default)]
    pub envd_version: String,
    /// The token envd requires in `X-Access-Token`, if any.
    #[serde(
        rename = "envdAccessToken",
        alias = "envd_access_token",
        default,
        deserialize_with = "json::opt_token"
    )]
    pub envd_access_token: Option<AccessToken>,
    /// The token for user-port traffic, if any.
    #[serde(
        rename = "trafficAccessToken",
        alias = "traffic_access_token",
        default,
        deserialize_with = "json::opt_token"
    )]
    pub traffic_access_token: Option<AccessToken>,
    /// The sandbox's domain when it differs from the client's.
    #[serde(default)]
    pub domain: Option<String>,
}

impl SandboxInfo {
    /// What [`Client::sandbox`] needs to reach this sandbox's envd.
    pub fn envd_access(&self) -> EnvdAccess {
        EnvdAccess {
            sandbox_id: self.sandbox_id.clone(),
            access_token: self.envd_access_token.clone(),
            domain: self.domain.clone(),
        }
    }
}

/// A sandbox's state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SandboxState {
    /// Running.
    Running,
    /// Paused (a snapshot exists).
    Paused,
    /// A state this client does not know, as sent.
    Other(String),
}

impl<'de> Deserialize<'de> for SandboxState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SandboxState, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(match raw.as_str() {
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            _ => SandboxState::Other(raw),
        })
    }
}

/// A sandbox as list returns it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct ListedSandbox {
    /// The id.
    #[serde(rename = "sandboxID", alias = "sandboxId", alias = "sandbox_id")]
    pub sandbox_id: SandboxId,
    /// The template id.
    #[serde(
        rename = "templateID",
        alias = "templateId",
        alias = "template_id",
        default
    )]
    pub template_id: String,
    /// The template alias, when it has one.
    #[serde(default)]
    pub alias: Option<String>,
    /// E2B's client id (legacy).
    #[serde(rename = "clientID", alias = "clientId", alias = "client_id", default)]
    pub client_id: String,
    /// When it started.
    #[serde(
        rename = "startedAt",
        alias = "started_at",
        deserialize_with = "json::rfc3339"
    )]
    pub started_at: time::OffsetDateTime,
    /// When the lease ends (running) or when it paused (paused).
    #[serde(rename = "endAt", alias = "end_at", deserialize_with = "json::rfc3339")]
    pub end_at: time::OffsetDateTime,
    /// vCPUs.
    #[serde(
        rename = "cpuCount",
        alias = "cpu_count",
        default,
        deserialize_with = "json::int"
    )]
    pub cpu_count: u32,
    /// Memory in MiB.
    #[serde(
        rename = "memoryMB",
        alias = "memory_mb",
        default,
        deserialize_with = "json::int"
    )]
    pub memory_mb: u64,
    /// Disk in MiB.
    #[serde(
        rename = "diskSizeMB",
        alias = "disk_size_mb",
        default,
        deserialize_with = "json::int"
    )]
    pub disk_size_mb: u64,
    /// Running or paused.
    pub state: SandboxState,
    /// envd's version.
    #[serde(rename = "envdVersion", alias = "envd_version", default)]
    pub envd_version: String,
    /// The metadata given at creation.
    #[serde(default, deserialize_with = "json::null_default")]
    pub metadata: BTreeMap<String, String>,
}

/// One sandbox in detail, as get returns it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct SandboxDetail {
    /// Everything list also reports.
    #[serde(flatten)]
    pub summary: ListedSandbox,
    /// The token envd requires, if any.
    #[serde(
        rename = "envdAccessToken",
        alias = "envd_access_token",
        default,
        deserialize_with = "json::opt_token"
    )]
    pub envd_access_token: Option<AccessToken>,
    /// Whether outbound internet is allowed, when E2B says.
    #[serde(
        rename = "allowInternetAccess",
        alias = "allow_internet_access",
        default
    )]
    pub allow_internet_access: Option<bool>,
    /// The sandbox's domain when it differs from the client's.
    #[serde(default)]
    pub domain: Option<String>,
    /// What happens at lease end, when E2B says.
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
}

impl SandboxDetail {
    /// What [`Client::sandbox`] needs to reach this sandbox's envd.
    pub fn envd_access(&self) -> EnvdAccess {
        EnvdAccess {
            sandbox_id: self.summary.sandbox_id.clone(),
            access_token: self.envd_access_token.clone(),
            domain: self.domain.clone(),
        }
    }
}

/// A sandbox's lease-end behaviour as E2B reports it.
#[derive(Clone, Debug, Deserialize)]
#[non_exhaustive]
pub struct Lifecycle {
    /// `"pause"` or `"kill"`.
    #[serde(rename = "onTimeout", alias = "on_timeout", default)]
    pub on_timeout: String,
    /// Whether traffic resumes it automatically.
    #[serde(rename = "autoResume", alias = "auto_resume", default)]
    pub auto_resume: bool,
}

/// The result of [`Client::connect`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Connected {
    /// The sandbox, with its current envd token and domain.
    pub sandbox: SandboxInfo,
    /// Whether it was already running (200) or has been resumed (201).
    pub state: ConnectState,
}

/// Whether connect found the sandbox running or resumed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectState {
    /// It was running (HTTP 200); the lease was extended if that made it longer.
    Running,
    /// It was paused and has been resumed (HTTP 201).
    Resumed,
}

/// The result of [`Client::pause`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseOutcome {
    /// Paused now (HTTP 204).
    Paused,
    /// HTTP 409: already paused (or in another state transition).
    AlreadyPaused,
}

/// The result of [`Client::kill`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillOutcome {
    /// Killed now (HTTP 204).
    Killed,
    /// HTTP 404: no such sandbox (already gone).
    NotFound,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_matches_the_wire_capture() {
        let one: BTreeMap<String, String> = [("scope".to_owned(), "a b/c".to_owned())].into();
        assert_eq!(metadata_filter(&one), "scope%3Da%252520b%252Fc");
        let query = ListQuery {
            metadata: one,
            state: StateFilter::Any,
            limit: Some(50),
        };
        // e2b-wire 1.3: GET /v2/sandboxes?metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50
        assert_eq!(
            list_query_string(&query),
            "metadata=scope%3Da%252520b%252Fc&state=running%2Cpaused&limit=50"
        );
    }

    #[test]
    fn metadata_filter_separators_and_unicode() {
        let map: BTreeMap<String, String> = [
            ("hermes.scope".to_owned(), "ab12".to_owned()),
            ("k=&".to_owned(), "v?#é".to_owned()),
        ]
        .into();
        // quote("k=&") = k%3D%26, urlencode -> k%253D%2526, query -> k%25253D%252526.
        // quote("v?#é") = v%3F%23%C3%A9 -> v%253F%2523%25C3%25A9 -> v%25253F%252523%2525C3%2525A9.
        assert_eq!(
            metadata_filter(&map),
            "hermes.scope%3Dab12%26k%25253D%252526%3Dv%25253F%252523%2525C3%2525A9"
        );
    }

    /// Decodes the filter the way E2B's server does (e2b-wire 1.3) and checks it round-trips.
    #[test]
    fn metadata_filter_round_trips_through_the_server_decoding() {
        fn unescape(text: &str) -> String {
            percent_encoding::percent_decode_str(&text.replace('+', " "))
                .decode_utf8()
                .expect("utf-8")
                .into_owned()
        }
        let map: BTreeMap<String, String> = [
            ("scope".to_owned(), "a b/c+d%e".to_owned()),
            ("x y".to_owned(), "&=?".to_owned()),
        ]
        .into();
        // The query layer decodes once, then the server unescapes, splits, unescapes again.
        let as_received = unescape(&metadata_filter(&map));
        let once = unescape(&as_received);
        let mut decoded = BTreeMap::new();
        for pair in once.split('&') {
            let parts: Vec<&str> = pair.split('=').collect();
            assert_eq!(parts.len(), 2, "{pair}");
            decoded.insert(unescape(parts[0]), unescape(parts[1]));
        }
        assert_eq!(decoded, map);
    }

    #[test]
    fn state_filters() {
        let mut query = ListQuery::all();
        assert_eq!(list_query_string(&query), "state=running%2Cpaused");
        query.state = StateFilter::Paused;
        assert_eq!(list_query_string(&query), "state=paused");
    }

    #[test]
    fn create_body_for_each_lifecycle() {
        let metadata = BTreeMap::from([("scope".to_owned(), "x".to_owned())]);
        let envs = BTreeMap::new();
        let body = |auto_pause, auto_pause_memory| NewSandbox {
            template_id: "base",
            timeout: Some(120),
            auto_pause,
            auto_pause_memory,
            secure: None,
            allow_internet_access: Some(false),
            metadata: &metadata,
            env_vars: &envs,
        };
        assert_eq!(
            serde_json::to_string(&body(Some(true), Some(false))).expect("json"),
            r#"{"templateID":"base","timeout":120,"autoPause":true,"autoPauseMemory":false,"allow_internet_access":false,"metadata":{"scope":"x"},"envVars":{}}"#
        );
        assert_eq!(
            serde_json::to_string(&body(Some(false), None)).expect("json"),
            r#"{"templateID":"base","timeout":120,"autoPause":false,"allow_internet_access":false,"metadata":{"scope":"x"},"envVars":{}}"#
        );
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_secs(Duration::from_millis(1500)), 2);
        assert_eq!(whole_secs(Duration::from_secs(30)), 30);
        assert_eq!(whole_secs(Duration::ZERO), 0);
    }

    #[test]
    fn decodes_sandbox_shapes() {
        let info: SandboxInfo = serde_json::from_str(
            r#"{"templateID":"rki5","alias":"base","sandboxID":"ikk8xw53nne4bytcdg87t",
                "clientID":"6532622b","envdVersion":"0.6.13","envdAccessToken":"tok",
                "trafficAccessToken":null,"domain":null,"someNewField":[1,2]}"#,
        )
        .expect("camelCase");
        assert_eq!(info.sandbox_id.as_str(), "ikk8xw53nne4bytcdg87t");
        assert_eq!(
            info.envd_access_token.as_ref().map(AccessToken::expose),
            Some("tok")
        );
        assert!(info.traffic_access_token.is_none() && info.domain.is_none());
        let snake: SandboxInfo = serde_json::from_str(
            r#"{"sandbox_id":"abc","template_id":"t","envd_version":"0.6.13","envd_access_token":""}"#,
        )
        .expect("snake_case");
        assert_eq!(snake.template_id, "t");
        assert!(snake.envd_access_token.is_none());
        assert!(serde_json::from_str::<SandboxInfo>(r#"{"sandboxID":"../x"}"#).is_err());

        let detail: SandboxDetail = serde_json::from_str(
            r#"{"templateID":"base","alias":"base","sandboxID":"ikk8","clientID":"6532622b",
                "startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:05:00Z","cpuCount":2,
                "memoryMB":"512","diskSizeMB":1024,"metadata":{"scope":"s"},"state":"running",
                "envdVersion":"0.6.13","envdAccessToken":"tok","allowInternetAccess":false,
                "domain":null,"lifecycle":{"autoResume":false,"onTimeout":"pause"}}"#,
        )
        .expect("detail");
        assert_eq!(detail.summary.memory_mb, 512);
        assert_eq!(detail.summary.state, SandboxState::Running);
        assert_eq!(
            (detail.summary.end_at - detail.summary.started_at).whole_seconds(),
            300
        );
        assert_eq!(
            detail.lifecycle.as_ref().map(|l| l.on_timeout.as_str()),
            Some("pause")
        );
        assert_eq!(detail.allow_internet_access, Some(false));
        let access = detail.envd_access();
        assert_eq!(access.sandbox_id.as_str(), "ikk8");

        let listed: Vec<ListedSandbox> = serde_json::from_str(
            r#"[{"sandbox_id":"a1","started_at":"2026-01-01T00:00:00Z","end_at":"2026-01-01T00:00:00Z",
                 "state":"snapshotting","metadata":null,"cpu_count":"4"}]"#,
        )
        .expect("listed");
        assert_eq!(
            listed[0].state,
            SandboxState::Other("snapshotting".to_owned())
        );
        assert_eq!(listed[0].cpu_count, 4);
        assert!(listed[0].metadata.is_empty());
    }
}
