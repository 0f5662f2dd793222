//! The control plane (E2B's REST API, v1 and v2); `/_e2b_local/` goes on to `admin`
//! once the API key is checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::App;
use crate::clock::rfc3339;
use crate::parse::{parse_body, query_pairs, query_unescape};
use crate::reply::{ApiError, json_response};
use crate::snapshots::Reference;
use crate::store::{
    CLIENT_ID, CreateParams, Cursor, ListQuery, MAX_TIMEOUT_SECS, Record, SbState, parse_sandbox_id,
};
use crate::token::EnvdToken;

mod logs;
mod network;
mod secrets;
mod snapshots;
mod templates;

/// The envd version reported: the current real one, so the SDK enables every feature.
pub(crate) const ENVD_VERSION: &str = "0.6.13";

/// Largest control-plane request body accepted.
const MAX_BODY: usize = 1024 * 1024;

/// Which generation of the API a route belongs to (defaults differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ApiVersion {
    V1,
    V2,
}

/// Serves one control-plane request.
pub(crate) async fn handle(app: Arc<App>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if method == Method::GET && segments == ["health"] {
        return (StatusCode::OK, "Health check successful").into_response();
    }
    // Public, as an issuer's are: relying parties verify workload tokens with them.
    if method == Method::GET && segments == [".well-known", "jwks.json"] {
        return json_response(StatusCode::OK, &app.identity.jwks());
    }
    if method == Method::GET && segments == [".well-known", "openid-configuration"] {
        return json_response(StatusCode::OK, &app.identity.discovery());
    }
    // An upload link carries a token of its own: clients send no API key there.
    if let (&Method::PUT, ["_e2b_local", crate::builds::UPLOAD_ROUTE, hash]) =
        (&method, segments.as_slice())
    {
        let hash = (*hash).to_owned();
        return templates::upload(app, &hash, &query, request).await;
    }
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok());
    let accepted = app.key_accepted(key);
    if !accepted {
        return ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API key").into_response();
    }
    let idempotency_key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(e) => {
            return ApiError::bad_request(format!("reading request body: {e}")).into_response();
        }
    };
    if let Some(response) = crate::metrics::route(&app, &method, &segments, &query).await {
        return response;
    }
    if let Some(route) = unsupported_route(&method, &segments) {
        return ApiError::not_supported(&format!("{method} {route}")).into_response();
    }
    let result = if copies_files(&method, &segments) {
        // Snapshots, forks and creates from a snapshot copy whole sandboxes: off the
        // async workers, so other requests keep being served meanwhile.
        let worker = tokio::task::spawn_blocking(move || {
            route_path(
                &app,
                &method,
                &path,
                &query,
                &body,
                idempotency_key.as_deref(),
            )
        });
        match worker.await {
            Ok(result) => result,
            Err(error) => Err(ApiError::internal(format!("request task failed: {error}"))),
        }
    } else {
        route_path(
            &app,
            &method,
            &path,
            &query,
            &body,
            idempotency_key.as_deref(),
        )
    };
    match result {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Whether a request may copy a sandbox's files (and so may take a while).
fn copies_files(method: &Method, segments: &[&str]) -> bool {
    matches!(
        (method, segments),
        (&Method::POST, ["sandboxes"] | ["v2", "sandboxes"])
            | (&Method::POST, ["sandboxes", _, "snapshots" | "fork"])
            | (&Method::DELETE, ["templates", _])
    )
}

/// Routes a request by its path (split into segments here, so a blocking worker can own
/// the path it routes).
fn route_path(
    app: &Arc<App>,
    method: &Method,
    path: &str,
    query: &str,
    body: &Bytes,
    idempotency_key: Option<&str>,
) -> Result<Response, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let request = RestRequest {
        segments: &segments,
        query,
        body,
        idempotency_key,
    };
    route(app, method, &request)
}

/// What a control-plane route reads of its request.
struct RestRequest<'a> {
    segments: &'a [&'a str],
    query: &'a str,
    body: &'a Bytes,
    /// The `Idempotency-Key` header (create honours it).
    idempotency_key: Option<&'a str>,
}

fn route(app: &Arc<App>, method: &Method, request: &RestRequest<'_>) -> Result<Response, ApiError> {
    use ApiVersion::{V1, V2};
    let RestRequest {
        segments,
        query,
        body,
        idempotency_key,
    } = *request;
    match (method.clone(), segments) {
        (Method::POST, ["v3", "templates"]) => templates::request(app, body),
        (Method::GET, ["templates", id, "files", hash]) => templates::file_link(app, id, hash),
        (Method::POST, ["v2", "templates", id, "builds", build]) => {
            templates::start(app, id, build, body)
        }
        (Method::GET, ["templates", id, "builds", build, "status"]) => {
            templates::status(app, id, build, query)
        }
        (Method::POST, ["templates", "tags"]) => templates::assign_tags(app, body),
        (Method::DELETE, ["templates", "tags"]) => templates::remove_tags(app, body),
        (Method::GET, ["templates", id, "tags"]) => templates::tags(app, id),
        (Method::POST, ["sandboxes"]) => create_once(app, V1, body, idempotency_key),
        (Method::POST, ["v2", "sandboxes"]) => create_once(app, V2, body, idempotency_key),
        (Method::GET, ["sandboxes"]) => list(app, V1, query),
        (Method::GET, ["v2", "sandboxes"]) => list(app, V2, query),
        (Method::GET, ["sandboxes", id]) => {
            let record = app.store.get(&parse_sandbox_id(id)?)?;
            Ok(json_response(StatusCode::OK, &detail_json(&record)))
        }
        (Method::DELETE, ["sandboxes", id]) => {
            app.store.kill(&parse_sandbox_id(id)?)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Method::POST, ["sandboxes", id, "connect"]) => connect(app, V1, id, body),
        (Method::POST, ["v2", "sandboxes", id, "connect"]) => connect(app, V2, id, body),
        (Method::POST, ["sandboxes", id, "resume"]) => resume(app, id, body),
        (Method::POST, ["sandboxes", id, "timeout"]) => {
            let id = parse_sandbox_id(id)?;
            let req: TimeoutBody = parse_body(body)?;
            let timeout = req
                .timeout
                .ok_or_else(|| ApiError::bad_request("timeout is required"))?;
            // "Negative → 0": the sandbox expires immediately.
            app.store
                .set_timeout(&id, timeout.clamp(0, MAX_TIMEOUT_SECS))?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Method::POST, ["sandboxes", id, "refreshes"]) => {
            let id = parse_sandbox_id(id)?;
            let req: RefreshBody = parse_body(body)?;
            let duration = req.duration.unwrap_or(15).clamp(15, 3600);
            let record = app.store.get(&id)?;
            if record.state != SbState::Running {
                return Err(ApiError::sandbox_not_found(&id));
            }
            app.store.connect(&id, duration, true)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Method::POST, ["sandboxes", id, "pause"]) => {
            let id = parse_sandbox_id(id)?;
            let req: PauseBody = parse_body(body)?;
            // E2B's `SandboxPauseRequest`: only `memory: false` drops the memory.
            app.store.pause(&id, req.memory.unwrap_or(true))?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Method::POST, ["sandboxes", id, "snapshots"]) => snapshots::create(app, id, body),
        (Method::POST, ["sandboxes", id, "fork"]) => snapshots::fork(app, id, body),
        (Method::PUT, ["sandboxes", id, "network"]) => network::update(app, id, body),
        (Method::GET, ["sandboxes", id, "logs"]) => logs::v1(app, id, query),
        (Method::GET, ["v2", "sandboxes", id, "logs"]) => logs::v2(app, id, query),
        (Method::GET, ["snapshots"]) => snapshots::list(app, query),
        (Method::DELETE, ["templates", id]) => snapshots::delete(app, id),
        (Method::GET, ["templates", "aliases", alias]) => snapshots::alias(app, alias),
        (Method::GET, ["secrets"]) => secrets::list(app, query),
        (Method::POST, ["secrets"]) => secrets::create(app, body),
        (Method::GET, ["secrets", selector]) => secrets::get(app, selector),
        (Method::POST, ["secrets", selector]) => secrets::update(app, selector, body),
        (Method::DELETE, ["secrets", selector]) => secrets::delete(app, selector),
        (Method::GET, ["volumes"]) => Ok(json_response(StatusCode::OK, &app.volumes.list())),
        (Method::POST, ["volumes"]) => {
            let req: NewVolume = parse_body(body)?;
            let name = req
                .name
                .ok_or_else(|| ApiError::bad_request("name is required"))?;
            Ok(json_response(
                StatusCode::CREATED,
                &app.volumes.create(&name)?,
            ))
        }
        (Method::GET, ["volumes", id]) => Ok(json_response(StatusCode::OK, &app.volumes.get(id)?)),
        (Method::DELETE, ["volumes", id]) => {
            app.volumes.delete(id)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (_, ["_e2b_local", rest @ ..]) => crate::admin::route(app, method, rest, body),
        (_, ["secrets"] | ["volumes"]) => Ok(method_not_allowed("GET, POST")),
        (_, ["volumes", _]) => Ok(method_not_allowed("GET, DELETE")),
        (_, ["secrets", _]) => Ok(method_not_allowed("GET, POST, DELETE")),
        (_, ["snapshots"]) => Ok(method_not_allowed("GET")),
        (_, ["sandboxes"] | ["v2", "sandboxes"]) => Ok(method_not_allowed("GET, POST")),
        (_, ["sandboxes", _]) => Ok(method_not_allowed("GET, DELETE")),
        (
            _,
            [
                "sandboxes",
                _,
                "connect" | "resume" | "timeout" | "refreshes" | "pause" | "snapshots" | "fork",
            ],
        )
        | (_, ["v2", "sandboxes", _, "connect"]) => Ok(method_not_allowed("POST")),
        (_, ["sandboxes", _, "network"]) => Ok(method_not_allowed("PUT")),
        (_, ["sandboxes", _, "logs"] | ["v2", "sandboxes", _, "logs"]) => {
            Ok(method_not_allowed("GET"))
        }
        (_, ["health"]) => Ok(method_not_allowed("GET")),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "Not found")),
    }
}

/// A 405 naming the methods the path serves.
fn method_not_allowed(allow: &'static str) -> Response {
    crate::reply::method_not_allowed("Method not allowed", allow)
}

/// Routes of E2B's published API (`spec/openapi.yml`) that e2b-local does not
/// implement, named as the spec names them; `None` for every other path.
fn unsupported_route(method: &Method, segments: &[&str]) -> Option<String> {
    match segments {
        // Served: the snapshot list and the template delete the SDK's delete_snapshot uses.
        ["snapshots"] => None,
        ["secrets"] | ["secrets", _] | ["volumes"] | ["volumes", _] => None,
        ["templates", _] if method == Method::DELETE => None,
        ["templates", "aliases", _] if method == Method::GET => None,
        // The build API and tags (crate::builder).
        ["templates", "tags"] => None,
        ["templates", _, "tags" | "files"] | ["templates", _, "files", _]
            if method == Method::GET =>
        {
            None
        }
        ["templates", _, "builds", _, "status"] if method == Method::GET => None,
        ["v3", "templates"] if method == Method::POST => None,
        ["v2", "templates", _, "builds", _] if method == Method::POST => None,
        [
            first @ ("snapshots" | "teams" | "templates" | "nodes" | "admin" | "access-tokens"
            | "api-keys" | "volumes" | "secrets"),
            ..,
        ] => Some(format!("/{first}")),
        [version @ ("v2" | "v3"), "templates", ..] => Some(format!("/{version}/templates")),
        _ => None,
    }
}

/// The sandbox a control-plane or admin path names (for the request log).
pub(crate) fn sandbox_in_path(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["sandboxes", id, ..]
        | ["v2", "sandboxes", id, ..]
        | ["_e2b_local", "sandboxes", id, ..] => Some((*id).to_owned()),
        _ => None,
    }
}

// ---- create ---------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct NewVolume {
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<network::NetworkBody>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    /// E2B's MCP gateway configuration: refused, see [`MCP_REFUSED`].
    mcp: Option<Value>,
    volume_mounts: Option<Vec<crate::volumes::MountRequest>>,
    iam: Option<crate::identity::IamBody>,
}

/// Why e2b-local refuses E2B's MCP gateway (the `mcp` of a create, the `mcp-gateway`
/// template) instead of answering that the template does not exist.
const MCP_REFUSED: &str = "e2b-local does not serve E2B's MCP gateway: its template runs the \
     MCP servers of E2B's catalog from container images, which e2b-local has no way to run; \
     start an MCP server in the sandbox yourself (any command) and reach it through the \
     sandbox's commands";

fn validate_timeout(timeout: i64) -> Result<i64, ApiError> {
    if timeout <= 0 {
        return Err(ApiError::bad_request("Timeout must be greater than 0"));
    }
    if timeout > MAX_TIMEOUT_SECS {
        return Err(ApiError::bad_request(format!(
            "Timeout cannot be greater than {} hours",
            MAX_TIMEOUT_SECS / 3600
        )));
    }
    Ok(timeout)
}

/// A create, at most once per `Idempotency-Key`: the key's first create makes the sandbox,
/// and a repeat of it (a client retrying after a lost answer) gets that sandbox again
/// instead of a second one; the same key with another body is refused (422). Keys are kept
/// in memory for the server's life.
fn create_once(
    app: &Arc<App>,
    version: ApiVersion,
    body: &Bytes,
    key: Option<&str>,
) -> Result<Response, ApiError> {
    let Some(key) = key else {
        return create(app, version, body).map(|record| created(&record));
    };
    let digest = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        body.hash(&mut hasher);
        hasher.finish()
    };
    // Held across the create, so that a concurrent repeat waits for the first one's sandbox.
    let mut keys = app
        .create_keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((first, sandbox_id)) = keys.get(key) {
        if *first != digest {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency-Key was already used with a different request",
            ));
        }
        let record = app.store.get(sandbox_id)?;
        return Ok(created(&record));
    }
    let record = create(app, version, body)?;
    keys.insert(key.to_owned(), (digest, record.id.clone()));
    Ok(created(&record))
}

fn created(record: &Record) -> Response {
    json_response(StatusCode::CREATED, &sandbox_json(record))
}

fn create(app: &Arc<App>, version: ApiVersion, body: &Bytes) -> Result<Record, ApiError> {
    let req: NewSandbox = parse_body(body)?;
    let template = req
        .template_id
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("templateID is required"))?;
    if req.mcp.as_ref().is_some_and(|mcp| !mcp.is_null()) || template == "mcp-gateway" {
        return Err(ApiError::bad_request(MCP_REFUSED));
    }
    // Anything but a built-in template may be a snapshot or a built template (by id, name,
    // name:tag or local/name:tag).
    let builtin = app.builtin_template(template);
    let snapshot = match builtin {
        Some(_) => None,
        None => app.snapshots.resolve(&Reference::parse(template)),
    };
    // Read only for a built-in template: a snapshot names its own base and id.
    let name = builtin.unwrap_or(template);
    if builtin.is_none() && snapshot.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("template '{template}' not found"),
        ));
    }
    let default_timeout = match version {
        ApiVersion::V1 => 15,
        ApiVersion::V2 => 300,
    };
    let timeout = validate_timeout(req.timeout.unwrap_or(default_timeout))?;
    let auto_pause = req.auto_pause.unwrap_or(false);
    let auto_pause_memory = req.auto_pause_memory.unwrap_or(true);
    let auto_resume = req.auto_resume.as_ref().is_some_and(|a| a.enabled);
    if !auto_pause_memory && !auto_pause {
        return Err(ApiError::bad_request(
            "autoPauseMemory can only be set together with autoPause",
        ));
    }
    if !auto_pause_memory && auto_resume {
        return Err(ApiError::bad_request(
            "autoResume requires memory to be kept on pause",
        ));
    }
    let secure = match version {
        ApiVersion::V1 => req.secure.unwrap_or(false),
        ApiVersion::V2 => true,
    };
    if req.network.as_ref().and_then(|n| n.allow_public_traffic) == Some(false) && !secure {
        return Err(ApiError::bad_request(
            "allowPublicTraffic=false requires a secure sandbox",
        ));
    }
    let network = network::for_create(app, req.network, req.allow_internet_access)?;
    let iam_tokens = crate::identity::check(req.iam)?;
    let base_template = snapshot
        .as_ref()
        .map_or(name, |found| found.origin.base_template.as_str());
    let isolation = if app.isolation_is_namespace() {
        crate::volumes::MountIsolation::Namespace
    } else {
        crate::volumes::MountIsolation::PathMapping
    };
    let volume_mounts = app.volumes.mounts_for(
        req.volume_mounts.as_deref().unwrap_or_default(),
        crate::paths::home_for_template(base_template),
        isolation,
    )?;
    let (template_id, origin, files_from, built) = match snapshot {
        Some(found) => (
            found.template_id,
            Some(found.origin),
            Some(found.files),
            found.config,
        ),
        None => (name.to_owned(), None, None, None),
    };
    let record = app.store.create(CreateParams {
        template: template_id,
        timeout_secs: timeout,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        auto_pause,
        auto_pause_memory,
        auto_resume,
        allow_internet_access: req.allow_internet_access,
        secure,
        with_token: secure,
        origin,
        files_from,
        network,
        volume_mounts,
        iam_tokens,
        build_of: None,
        defaults: built.as_ref().map(|config| config.defaults.clone()),
    })?;
    // A built template's start command runs in each of its sandboxes, which is answered
    // once the ready command passes (on this blocking worker: creates copy files).
    if let Some(config) = built.filter(|c| c.start_cmd.is_some() || c.ready_cmd.is_some()) {
        let started = tokio::runtime::Handle::current()
            .block_on(crate::builder::start_in_sandbox(app, &record.id, &config));
        if let Err(why) = started {
            let _ = app.store.kill(&record.id);
            return Err(ApiError::internal(format!(
                "sandbox {} of template {}: the start command did not get ready: {why}",
                record.id, record.template
            )));
        }
    }
    tracing::info!(sandbox_id = %record.id, template = %record.template, "sandbox created");
    Ok(record)
}

/// The `Sandbox` schema (create / connect / resume answers).
fn sandbox_json(record: &Record) -> Value {
    let mut value = json!({
        "templateID": record.template,
        "alias": record.alias(),
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "trafficAccessToken": record.traffic_token.as_ref().map(EnvdToken::expose),
        "domain": null,
    });
    if let Some(token) = &record.token {
        value["envdAccessToken"] = json!(token.expose());
    }
    value
}

/// The `ListedSandbox` schema.
fn listed_json(record: &Record) -> Value {
    json!({
        "templateID": record.template,
        "alias": record.alias(),
        "sandboxID": record.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(record.started_at),
        "endAt": rfc3339(record.end_at),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "metadata": record.metadata,
        "state": record.state.as_str(),
        "envdVersion": ENVD_VERSION,
        "volumeMounts": crate::volumes::mounts_json(&record.volume_mounts),
    })
}

/// The `SandboxDetail` schema (GET one).
fn detail_json(record: &Record) -> Value {
    let mut value = listed_json(record);
    if let Some(token) = &record.token {
        value["envdAccessToken"] = json!(token.expose());
    }
    value["allowInternetAccess"] = json!(record.allow_internet_access);
    value["domain"] = Value::Null;
    if let Some(network) = network::detail(record) {
        value["network"] = network;
    }
    value["lifecycle"] = json!({
        "autoResume": record.auto_resume,
        "onTimeout": if record.auto_pause { "pause" } else { "kill" },
    });
    if record.auto_pause {
        value["pauseMode"] = json!(if record.auto_pause_memory {
            "full"
        } else {
            "filesystem"
        });
    }
    value
}

// ---- connect / resume -----------------------------------------------------------

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: Option<i64>,
    /// Connect's and resume's `memory` (newer E2B APIs): `false` resumes a sandbox paused
    /// with its memory from its files only, a fresh boot.
    memory: Option<bool>,
}

/// `SandboxPauseRequest` (the body is optional): `memory: false` pauses keeping the
/// files only, so the resume boots the sandbox afresh.
#[derive(Debug, Deserialize)]
struct PauseBody {
    memory: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RefreshBody {
    duration: Option<i64>,
}

fn connect(app: &App, version: ApiVersion, id: &str, body: &Bytes) -> Result<Response, ApiError> {
    let id = parse_sandbox_id(id)?;
    let req: TimeoutBody = parse_body(body)?;
    let timeout = match (version, req.timeout) {
        (_, Some(t)) => t,
        (ApiVersion::V1, None) => return Err(ApiError::bad_request("timeout is required")),
        (ApiVersion::V2, None) => 300,
    };
    let timeout = validate_timeout(timeout)?;
    let (record, resumed) = app
        .store
        .connect(&id, timeout, req.memory.unwrap_or(true))?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(status, &sandbox_json(&record)))
}

fn resume(app: &App, id: &str, body: &Bytes) -> Result<Response, ApiError> {
    let id = parse_sandbox_id(id)?;
    let req: TimeoutBody = parse_body(body)?;
    let timeout = validate_timeout(req.timeout.unwrap_or(15))?;
    let record = app.store.get(&id)?;
    if record.state == SbState::Running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Sandbox {id} is already running"),
        ));
    }
    let (record, _) = app
        .store
        .connect(&id, timeout, req.memory.unwrap_or(true))?;
    Ok(json_response(StatusCode::CREATED, &sandbox_json(&record)))
}

// ---- list -----------------------------------------------------------------------

/// Parses the metadata filter: the (once-decoded) parameter value is unescaped again,
/// split into `k=v` pairs, and each side unescaped once more (E2B's double encoding).
pub(crate) fn parse_metadata_filter(value: &str) -> Result<Vec<(String, String)>, ApiError> {
    let invalid = || ApiError::bad_request("Error when parsing metadata");
    let decoded = query_unescape(value).ok_or_else(invalid)?;
    let mut filters = Vec::new();
    for pair in decoded.split('&').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = pair.split('=').collect();
        let [k, v] = parts.as_slice() else {
            return Err(invalid());
        };
        filters.push((
            query_unescape(k).ok_or_else(invalid)?,
            query_unescape(v).ok_or_else(invalid)?,
        ));
    }
    Ok(filters)
}

fn parse_list_query(version: ApiVersion, query: &str) -> Result<ListQuery, ApiError> {
    let mut out = ListQuery {
        metadata: Vec::new(),
        states: match version {
            ApiVersion::V1 => vec![SbState::Running],
            ApiVersion::V2 => vec![SbState::Running, SbState::Paused],
        },
        ascending: false,
        started_after: None,
        template: None,
        cursor: None,
        limit: 100,
    };
    for (key, value) in query_pairs(query) {
        match key.as_str() {
            "metadata" => out.metadata = parse_metadata_filter(&value)?,
            "state" if version == ApiVersion::V2 => {
                let mut states = Vec::new();
                for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    states.push(match part {
                        "running" => SbState::Running,
                        "paused" => SbState::Paused,
                        other => {
                            return Err(ApiError::bad_request(format!("invalid state '{other}'")));
                        }
                    });
                }
                if !states.is_empty() {
                    out.states = states;
                }
            }
            "order" => {
                out.ascending = match value.as_str() {
                    "asc" => true,
                    "desc" => false,
                    other => return Err(ApiError::bad_request(format!("invalid order '{other}'"))),
                }
            }
            "startedAfter" => {
                let t = time::OffsetDateTime::parse(
                    &value,
                    &time::format_description::well_known::Rfc3339,
                )
                .map_err(|_| ApiError::bad_request("invalid startedAfter"))?;
                out.started_after = Some(u64::try_from(t.unix_timestamp_nanos()).unwrap_or(0));
            }
            "template" => out.template = Some(value),
            "nextToken" if !value.is_empty() => {
                out.cursor = Some(
                    Cursor::decode(&value)
                        .ok_or_else(|| ApiError::bad_request("Invalid next token"))?,
                );
            }
            "limit" => {
                let limit: usize = value
                    .parse()
                    .map_err(|_| ApiError::bad_request("limit must be an integer"))?;
                if !(1..=100).contains(&limit) {
                    return Err(ApiError::bad_request("limit must be between 1 and 100"));
                }
                out.limit = limit;
            }
            _ => {}
        }
    }
    Ok(out)
}

fn list(app: &App, version: ApiVersion, query: &str) -> Result<Response, ApiError> {
    let query = parse_list_query(version, query)?;
    let page = app.store.list(&query);
    let items: Vec<Value> = page.items.iter().map(listed_json).collect();
    let mut response = json_response(StatusCode::OK, &Value::Array(items));
    if let Some(token) = page.next_token
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    if query.states.contains(&SbState::Running) {
        response
            .headers_mut()
            .insert("x-total-running", HeaderValue::from(page.total_running));
    }
    Ok(response)
}

#[cfg(test)]
mod tests;
