//! The plugin's settings (`plugins.entries.e2b.settings`): parsed and validated here, so the
//! Python layer only hands the raw mapping over. Keys, kinds and defaults are the settings
//! table ([`table::SETTINGS`]); parsing writes into an agent-sandbox [`Config`], so a key that
//! is absent keeps the default [`Config::new`] applies and no default is written here.

mod credentials;
mod egress;
mod read;
mod subagents;
pub mod table;

pub use credentials::credentials;
pub use egress::egress;
pub use subagents::{SubagentForks, Subagents};

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use agent_sandbox::{
    ApiKeySource, Config, Endpoints, InternetAccess, SandboxId, SandboxMode, Security,
    WriterArbitration,
};

use crate::error::Error;
use read::{boolean, count, invalid, metadata_text, metadata_value, seconds, string, url};
use table::{SETTINGS, Setting};

/// A setting's raw value as it came out of `config.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null` / absent value.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// A mapping with string keys.
    Map(BTreeMap<String, Value>),
    /// A list.
    List(Vec<Value>),
    /// Anything else (a list, ...), by type name, for the error message.
    Other(String),
}

impl Value {
    fn kind(&self) -> &str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Map(_) => "a mapping",
            Value::List(_) => "a list",
            Value::Other(kind) => kind,
        }
    }
}

/// Validated plugin settings. Build with [`Settings::parse`].
#[derive(Clone)]
pub struct Settings {
    /// The backend configuration the settings give: [`Config::new`]'s defaults with every
    /// given key applied. Its key source and mode are placeholders until
    /// [`Settings::to_config`] (the key is resolved per environment, the mode is Hermes').
    pub config: Config,
    /// Who named the endpoints of [`Settings::config`].
    pub endpoints_from: EndpointSource,
    /// Attach mode: an externally owned sandbox.
    pub sandbox_id: Option<SandboxId>,
    /// Keys present in the mapping that the plugin does not know (reported, not fatal).
    pub unknown_keys: Vec<String>,
    /// What the Hermes adapter does about checkpoints.
    pub checkpoints: CheckpointSettings,
    /// The `credentials` setting's entries, then those taken from Hermes' own egress
    /// firewall ([`Settings::add_hermes_mappings`]); values come from the profile (X16).
    pub credentials: Vec<agent_sandbox::Credential>,
    /// The names in `credentials` that came from Hermes' egress firewall mappings.
    pub credentials_from_hermes: Vec<String>,
    /// Whether a gateway chat's sandbox gets the profile's skills
    /// (`skills_in_chat_sandboxes`, X19).
    pub skills_in_chat_sandboxes: bool,
    /// Where delegated children work (`subagents`, R15).
    pub subagents: Subagents,
    /// What becomes of a child's fork once its work is back (`subagent_forks`, R15).
    pub subagent_forks: SubagentForks,
    /// Whether `execute_code` and background processes run live (`live_tools`, O8, O9).
    pub live_tools: bool,
}

/// The variable of the profile's `.env` holding the egress proxy's password (X23).
pub const EGRESS_PROXY_PASSWORD: &str = "E2B_EGRESS_PROXY_PASSWORD";

/// The settings of the Hermes adapter, not of the backend, as the settings table reads
/// them ([`table::SettingDefault::Plugin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterSettings {
    /// The checkpoint settings.
    pub checkpoints: CheckpointSettings,
    /// Whether a gateway chat's sandbox gets the profile's skills
    /// (`skills_in_chat_sandboxes`, X19).
    pub skills_in_chat_sandboxes: bool,
    /// Where delegated children work (`subagents`, R15).
    pub subagents: Subagents,
    /// What becomes of a child's fork once its work is back (`subagent_forks`, R15).
    pub subagent_forks: SubagentForks,
    /// Whether `execute_code` cells run in a live kernel and background processes stream
    /// (`live_tools`, O8, O9); false leaves Hermes' own polling paths.
    pub live_tools: bool,
}

impl AdapterSettings {
    /// The defaults the settings table states: Hermes shares skills profile-wide, and so do
    /// its chats' sandboxes unless the operator says otherwise.
    pub fn defaults() -> AdapterSettings {
        AdapterSettings {
            checkpoints: CheckpointSettings::defaults(),
            skills_in_chat_sandboxes: true,
            subagents: Subagents::Shared,
            subagent_forks: SubagentForks::Kill,
            live_tools: true,
        }
    }
}

/// The checkpoint settings: what the Hermes adapter does on its own (all off by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// A checkpoint when a session first uses its sandbox (`checkpoint_at_start`).
    pub at_session_start: bool,
    /// Automatic checkpoints kept per scope (`checkpoint_keep`).
    pub keep: usize,
    /// The agent's `sandbox_checkpoint` tool (`checkpoint_tool`).
    pub agent_tool: bool,
    /// Turn checkpoints kept in the sandbox; 0 is off (`turn_checkpoints`).
    pub turns: usize,
}

impl CheckpointSettings {
    /// The defaults the settings table states.
    pub fn defaults() -> CheckpointSettings {
        CheckpointSettings {
            at_session_start: false,
            keep: 5,
            agent_tool: false,
            turns: 0,
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        // Metadata values are the user's and may be sensitive: keys only.
        f.debug_struct("Settings")
            .field("template", &config.template)
            .field("cwd", &config.cwd)
            .field("lease", &config.lease)
            .field("command_grace", &config.command_grace)
            .field("internet", &config.internet)
            .field("security", &config.security)
            .field("egress", &config.egress)
            .field("metadata_keys", &config.metadata.keys().collect::<Vec<_>>())
            .field("endpoints", &config.endpoints)
            .field("endpoints_from", &self.endpoints_from)
            .field("sandbox_id", &self.sandbox_id)
            .field("writer_arbitration", &config.writer_arbitration)
            .field("checkpoints", &self.checkpoints)
            .field("credentials", &self.credentials)
            .field("credential_store", &config.credential_store)
            .field("egress_proxy", &config.egress_proxy)
            .field("skills_in_chat_sandboxes", &self.skills_in_chat_sandboxes)
            .field("subagents", &self.subagents)
            .field("live_tools", &self.live_tools)
            .finish()
    }
}

/// Who named the endpoints: the plugin settings win over E2B's environment variables, which
/// win over E2B's public cloud (the E2B SDKs' order: explicit options, then the environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointSource {
    /// `domain` / `api_url` / `sandbox_url` under `plugins.entries.e2b.settings`.
    Settings,
    /// `E2B_DOMAIN` / `E2B_API_URL` / `E2B_SANDBOX_URL` in the process environment.
    Environment,
    /// Neither: E2B's public cloud.
    Default,
}

/// The settings naming where E2B is; their environment variables are the table's.
const ENDPOINT_KEYS: [&str; 3] = ["domain", "api_url", "sandbox_url"];

/// E2B's environment variables for where it is, in the order of [`ENDPOINT_KEYS`].
fn endpoint_env_vars() -> [&'static str; 3] {
    // A key without a variable would read the setting's own name from the environment; a
    // test keeps every endpoint key's variable in the table.
    ENDPOINT_KEYS.map(|key| {
        Setting::find(key)
            .and_then(|setting| setting.env)
            .unwrap_or(key)
    })
}

/// Which sandbox lifecycle Hermes asked for (`container_persistent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// One sandbox per scope, kept across sessions.
    Persistent,
    /// A fresh sandbox per session, killed at cleanup.
    Ephemeral,
}

impl Persistence {
    /// Parses the Python layer's `"persistent"` / `"ephemeral"`.
    pub fn parse(value: &str) -> Result<Persistence, Error> {
        match value {
            "persistent" => Ok(Persistence::Persistent),
            "ephemeral" => Ok(Persistence::Ephemeral),
            other => Err(Error::InvalidArgument {
                operation: "create environment",
                reason: format!("mode must be \"persistent\" or \"ephemeral\", not {other:?}"),
            }),
        }
    }
}

/// Hermes' command deadline (`terminal.timeout`, handed to every environment) as the backend
/// can use it: a positive, finite number of seconds. Anything else is refused once, at the
/// environment's creation and in the doctor rows, naming the setting (contract O5); a
/// deadline that could never be met would otherwise fail every command.
pub fn command_timeout(value: &Value) -> Result<Duration, Error> {
    let refused = |shown: String| Error::InvalidHermesSetting {
        key: "terminal.timeout",
        value: shown,
        reason: "the E2B backend needs a positive number of seconds (Hermes' default is 180)",
        file: None,
    };
    let seconds = match value {
        Value::Int(seconds) => *seconds as f64,
        Value::Float(seconds) => *seconds,
        Value::Str(text) => text
            .trim()
            .parse::<f64>()
            .map_err(|_| refused(format!("{text:?}")))?,
        other => return Err(refused(other.kind().to_owned())),
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(deadline) if !deadline.is_zero() => Ok(deadline),
        // A number written as text (Hermes' environment bridge) is shown as the number.
        _ => Err(refused(seconds.to_string())),
    }
}

/// Hermes' idle lifetime (`terminal.lifetime_seconds`), else the default lease: the lease's
/// fallback and an ephemeral sandbox's lifetime.
pub fn idle_lifetime(lifetime_seconds: Option<u64>) -> Duration {
    lifetime_seconds
        .filter(|seconds| *seconds > 0)
        .map_or_else(|| table::core_defaults().lease, Duration::from_secs)
}

/// Reads the three endpoint keys (`names`: the settings' or the environment's) of `raw`.
fn endpoints(raw: &BTreeMap<String, Value>, names: [&str; 3]) -> Result<Endpoints, Error> {
    let [domain_key, api_key, sandbox_key] = names;
    let domain = string(raw, domain_key)?.filter(|d| !d.is_empty());
    if let Some(domain) = &domain {
        let ok = domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == ':');
        if !ok {
            return Err(invalid(domain_key, "must be a host name such as e2b.app"));
        }
    }
    Ok(Endpoints {
        domain,
        api_url: url(raw, api_key)?,
        sandbox_url: url(raw, sandbox_key)?,
    })
}

/// The known setting nearest to an unknown `key` by edit distance, if it is near enough to be
/// a typo (a third of the key's length, at least 2) rather than a different idea.
pub fn nearest_setting(key: &str) -> Option<&'static str> {
    let limit = (key.chars().count() / 3).max(2);
    SETTINGS
        .iter()
        .map(|setting| (edit_distance(key, setting.key), setting.key))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance over chars, case-insensitive (`Template` is a typo of `template`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

impl Settings {
    /// The adapter's settings among these.
    pub fn adapter(&self) -> AdapterSettings {
        AdapterSettings {
            checkpoints: self.checkpoints,
            skills_in_chat_sandboxes: self.skills_in_chat_sandboxes,
            subagents: self.subagents,
            subagent_forks: self.subagent_forks,
            live_tools: self.live_tools,
        }
    }

    /// Validates the raw settings mapping. `lifetime_seconds` is Hermes'
    /// `terminal.lifetime_seconds`, the lease's fallback.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use _native::settings::{Settings, Value};
    ///
    /// let mut raw = BTreeMap::new();
    /// raw.insert("template".to_owned(), Value::Str("my-template".to_owned()));
    /// raw.insert("lease_seconds".to_owned(), Value::Int(600));
    /// let settings = Settings::parse(&raw, None).unwrap();
    /// assert_eq!(settings.config.template, "my-template");
    /// assert_eq!(settings.config.lease.as_secs(), 600);
    ///
    /// raw.insert("lease_seconds".to_owned(), Value::Str("soon".to_owned()));
    /// assert!(Settings::parse(&raw, None).is_err());
    /// ```
    pub fn parse(
        raw: &BTreeMap<String, Value>,
        lifetime_seconds: Option<u64>,
    ) -> Result<Settings, Error> {
        // An absent key leaves the core's default in place.
        let mut config = table::core_defaults();
        if let Some(template) = string(raw, "template")? {
            if template.is_empty() {
                return Err(invalid("template", "must not be empty"));
            }
            config.template = template;
        }
        if let Some(cwd) = string(raw, "cwd")? {
            if !cwd.starts_with('/') {
                return Err(invalid("cwd", "must be an absolute path"));
            }
            config.cwd = Some(cwd);
        }
        config.lease = match seconds(raw, "lease_seconds")? {
            Some(lease) => lease,
            None => idle_lifetime(lifetime_seconds),
        };
        if let Some(grace) = seconds(raw, "command_grace_seconds")? {
            config.command_grace = grace;
        }
        if let Some(grace) = seconds(raw, "watchdog_grace_seconds")? {
            config.watchdog_grace = grace;
        }
        if let Some(cap) = count(raw, "max_running")? {
            config.max_running = Some(u32::try_from(cap).unwrap_or(u32::MAX));
        }
        if let Some(wait) = seconds(raw, "slot_wait_seconds")? {
            config.slot_wait = wait;
        }
        // The quiet running time is the lease unless set: what the README's cost says (L17).
        config.pause_after_idle =
            Some(seconds(raw, "pause_after_idle_seconds")?.unwrap_or(config.lease));
        if let Some(allowed) = boolean(raw, "allow_internet_access")? {
            config.internet = if allowed {
                InternetAccess::Allowed
            } else {
                InternetAccess::Denied
            };
        }
        if let Some(secure) = boolean(raw, "secure")? {
            config.security = if secure {
                Security::Secure
            } else {
                Security::Insecure
            };
        }
        config.egress = egress(raw)?;
        let credentials = credentials(raw)?;
        match raw.get("metadata") {
            None | Some(Value::Null) => {}
            Some(Value::Map(entries)) => {
                config.metadata = entries
                    .iter()
                    .map(|(key, value)| Ok((key.clone(), metadata_value(key, value)?)))
                    .collect::<Result<_, Error>>()?;
            }
            // Hermes' config screens have no mapping field: they hand the value over as text.
            Some(Value::Str(text)) => config.metadata = metadata_text(text)?,
            Some(other) => {
                return Err(invalid(
                    "metadata",
                    format!("must be a mapping or text, not {}", other.kind()),
                ));
            }
        }
        config.endpoints = endpoints(raw, ENDPOINT_KEYS)?;
        let endpoints_from = if config.endpoints == Endpoints::e2b_cloud() {
            EndpointSource::Default
        } else {
            EndpointSource::Settings
        };
        let sandbox_id = match string(raw, "sandbox_id")?.filter(|id| !id.is_empty()) {
            None => None,
            Some(id) => Some(SandboxId::parse(id).ok_or_else(|| {
                invalid(
                    "sandbox_id",
                    "must be an E2B sandbox id (letters, digits, '-')",
                )
            })?),
        };
        if let Some(url) = string(raw, "egress_proxy")? {
            let refused = |error: agent_sandbox::Error| invalid("egress_proxy", error.to_string());
            let setting = agent_sandbox::EgressProxySetting::parse(&url, None).map_err(refused)?;
            // A user name means RFC 1929: its password is the profile's, from its `.env`.
            config.egress_proxy = Some(if setting.username().is_some() {
                agent_sandbox::EgressProxySetting::parse(
                    &url,
                    Some(EGRESS_PROXY_PASSWORD.to_owned()),
                )
                .map_err(refused)?
            } else {
                setting
            });
        }
        if let Some(value) = string(raw, "credential_store")? {
            config.credential_store = agent_sandbox::CredentialStore::parse(&value)
                .ok_or_else(|| invalid("credential_store", "must be auto, secrets or rules"))?;
        }
        for path in egress::destinations(raw, "subagent_paths")? {
            if !agent_sandbox::may_be_root(&path) {
                return Err(invalid(
                    "subagent_paths",
                    format!(
                        "entry {path:?} is not a plain absolute directory outside what the system owns (/usr, /etc, /var, /proc, ...; not /tmp itself)"
                    ),
                ));
            }
            config.subagent_paths.push(path);
        }
        if let Some(value) = string(raw, "writer_arbitration")? {
            config.writer_arbitration = WriterArbitration::parse(&value)
                .ok_or_else(|| invalid("writer_arbitration", "must be host or sandbox"))?;
        }
        let unknown_keys = raw
            .keys()
            .filter(|key| Setting::find(key).is_none())
            .cloned()
            .collect();
        let mut checkpoints = CheckpointSettings::defaults();
        if let Some(at_start) = boolean(raw, "checkpoint_at_start")? {
            checkpoints.at_session_start = at_start;
        }
        if let Some(keep) = count(raw, "checkpoint_keep")? {
            checkpoints.keep = keep;
        }
        if let Some(tool) = boolean(raw, "checkpoint_tool")? {
            checkpoints.agent_tool = tool;
        }
        if let Some(turns) = count(raw, "turn_checkpoints")? {
            checkpoints.turns = turns;
        }
        let skills_in_chat_sandboxes = boolean(raw, "skills_in_chat_sandboxes")?
            .unwrap_or(AdapterSettings::defaults().skills_in_chat_sandboxes);
        let subagents = match string(raw, "subagents")? {
            Some(value) => Subagents::parse(&value)
                .ok_or_else(|| invalid("subagents", "must be shared or fork"))?,
            None => AdapterSettings::defaults().subagents,
        };
        let subagent_forks = match string(raw, "subagent_forks")? {
            Some(value) => SubagentForks::parse(&value)
                .ok_or_else(|| invalid("subagent_forks", "must be kill or keep"))?,
            None => AdapterSettings::defaults().subagent_forks,
        };
        let live_tools =
            boolean(raw, "live_tools")?.unwrap_or(AdapterSettings::defaults().live_tools);
        Ok(Settings {
            config,
            endpoints_from,
            sandbox_id,
            unknown_keys,
            checkpoints,
            credentials,
            credentials_from_hermes: Vec::new(),
            skills_in_chat_sandboxes,
            subagents,
            subagent_forks,
            live_tools,
        })
    }

    /// Adds the credentials of Hermes' own egress firewall (its `mappings.json` entries, read
    /// by the Python layer only when `proxy.enabled` is set), for names the `credentials`
    /// setting does not configure: the same mappings apply on E2B without a second setup.
    pub fn add_hermes_mappings(&mut self, mappings: &[Value]) -> Result<(), Error> {
        let added = credentials::from_hermes_mappings(mappings, &self.credentials)?;
        let mut all = self.credentials.clone();
        all.extend(added.iter().cloned());
        agent_sandbox::Credentials::new(all.clone(), std::sync::Arc::new(|_| None), String::new())
            .map_err(|error| invalid("credentials", error.to_string()))?;
        self.credentials_from_hermes = added.iter().map(|c| c.name().to_owned()).collect();
        self.credentials = all;
        Ok(())
    }

    /// The credentials for one environment: values through `values`, a missing one named
    /// with `source` (the profile's `.env`).
    pub fn credentials_with(
        &self,
        values: agent_sandbox::CredentialValues,
        source: String,
    ) -> Result<agent_sandbox::Credentials, Error> {
        agent_sandbox::Credentials::new(self.credentials.clone(), values, source)
            .map_err(|error| invalid("credentials", error.to_string()))
    }

    /// [`Settings::parse`], then E2B's environment variables (`E2B_DOMAIN`, `E2B_API_URL`,
    /// `E2B_SANDBOX_URL`, read through `env`) when the settings name no endpoint at all: the
    /// settings win as a whole, so a configured self-hosted domain is never half-overridden
    /// by a stray `E2B_API_URL`. The API key is not read here (it is the profile's, X2).
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use _native::settings::{EndpointSource, Settings};
    ///
    /// let env = |name: &str| (name == "E2B_API_URL").then(|| "http://127.0.0.1:3000".to_owned());
    /// let settings = Settings::parse_with_env(&BTreeMap::new(), None, &env).unwrap();
    /// assert_eq!(settings.config.endpoints.api_url.as_deref(), Some("http://127.0.0.1:3000"));
    /// assert_eq!(settings.endpoints_from, EndpointSource::Environment);
    /// ```
    pub fn parse_with_env(
        raw: &BTreeMap<String, Value>,
        lifetime_seconds: Option<u64>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, Error> {
        let mut settings = Settings::parse(raw, lifetime_seconds)?;
        if settings.endpoints_from == EndpointSource::Default {
            let names = endpoint_env_vars();
            let vars = names
                .iter()
                .filter_map(|name| Some(((*name).to_owned(), Value::Str(env(name)?))))
                .collect();
            let endpoints = endpoints(&vars, names)?;
            if endpoints != Endpoints::e2b_cloud() {
                settings.config.endpoints = endpoints;
                settings.endpoints_from = EndpointSource::Environment;
            }
        }
        Ok(settings)
    }

    /// One line per unknown key: that it is ignored, and the known key it is nearest to.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use _native::settings::{Settings, Value};
    ///
    /// let raw = BTreeMap::from([("lease_secs".to_owned(), Value::Int(60))]);
    /// let notes = Settings::parse(&raw, None).unwrap().unknown_key_notes();
    /// assert_eq!(notes, ["unknown setting lease_secs is ignored; did you mean lease_seconds?"]);
    /// ```
    pub fn unknown_key_notes(&self) -> Vec<String> {
        self.unknown_keys
            .iter()
            .map(|key| match nearest_setting(key) {
                Some(known) => format!("unknown setting {key} is ignored; did you mean {known}?"),
                None => format!("unknown setting {key} is ignored"),
            })
            .collect()
    }

    /// Logs [`Settings::unknown_key_notes`] as warnings, each key once per process: settings
    /// are re-read for every probe, doctor row and environment, and one line is enough.
    pub fn warn_unknown_keys_once(&self) {
        for (key, note) in self.unknown_keys.iter().zip(self.unknown_key_notes()) {
            if agent_sandbox::warn_once::first_time(&format!("unknown setting: {key}")) {
                tracing::warn!("plugins.entries.e2b.settings: {note}");
            }
        }
    }

    /// The directory a cwd handed over by Hermes means. Hermes hands container backends
    /// `/root` (or `""`, `~`) when it does not know the cwd, or after discarding a
    /// host-looking `/home/...` one; that means "where the session is": `current` (the
    /// session's tracked cwd) unless it is such a placeholder too, else the configured cwd;
    /// `None` when none is configured either: then it is the sandbox's default (its user's
    /// real home), which only attaching learns.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use _native::settings::Settings;
    ///
    /// let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
    /// assert_eq!(settings.session_cwd("/root", None), None);
    /// assert_eq!(settings.session_cwd("/root", Some("/home/user/x")).as_deref(), Some("/home/user/x"));
    /// assert_eq!(settings.session_cwd("/opt", Some("/home/user/x")).as_deref(), Some("/opt"));
    /// ```
    pub fn session_cwd(&self, requested: &str, current: Option<&str>) -> Option<String> {
        const PLACEHOLDERS: [&str; 3] = ["", "/root", "~"];
        let known = |cwd: &&str| !PLACEHOLDERS.contains(cwd);
        Some(requested)
            .filter(known)
            .or(current.filter(known))
            .or(self.config.cwd.as_deref())
            .map(str::to_owned)
    }

    /// One line for doctor rows: who picks the one writer of a persistent scope.
    pub fn arbitration_summary(&self) -> String {
        match self.config.writer_arbitration {
            WriterArbitration::Host => {
                "host (a file lock: one writer per profile on this machine)".to_owned()
            }
            WriterArbitration::Sandbox { term } => format!(
                "sandbox (a fenced record in the sandbox: one writer across hosts; a silent \
                 writer is taken over after {} s)",
                term.as_secs()
            ),
        }
    }

    /// One line for doctor rows: the profile's egress policy, with what
    /// `allow_internet_access = false` adds (E2B's deny of every destination).
    pub fn egress_summary(&self) -> String {
        let config = &self.config;
        let rules = config.egress.summary();
        match config.internet {
            InternetAccess::Allowed if config.egress.is_empty() => {
                "no rules: every destination is reachable".to_owned()
            }
            InternetAccess::Allowed => rules,
            InternetAccess::Denied => {
                let effective = config.egress.effective(InternetAccess::Denied);
                format!(
                    "{} ({} from allow_internet_access: false)",
                    effective.summary(),
                    agent_sandbox::ALL_TRAFFIC
                )
            }
        }
    }

    /// One line for doctor rows: where the backend sends requests. Never contains the key.
    pub fn endpoint_summary(&self) -> String {
        let Endpoints {
            domain,
            api_url,
            sandbox_url,
        } = &self.config.endpoints;
        let place = match (api_url, sandbox_url) {
            (Some(api), Some(sandbox)) if api == sandbox => format!("{api} (api and sandbox)"),
            (Some(api), Some(sandbox)) => format!("api {api}, sandbox {sandbox}"),
            (Some(api), None) => format!("api {api}"),
            (None, Some(sandbox)) => format!("sandbox {sandbox}"),
            (None, None) => match domain {
                Some(domain) => format!("E2B at {domain}"),
                None => "E2B cloud (e2b.app)".to_owned(),
            },
        };
        match self.endpoints_from {
            EndpointSource::Environment => format!("{place} (from E2B_* environment variables)"),
            EndpointSource::Settings | EndpointSource::Default => place,
        }
    }

    /// The backend configuration for one environment.
    pub fn to_config(
        &self,
        api_key: ApiKeySource,
        persistence: Persistence,
        lifetime: Duration,
    ) -> Config {
        let mut config = self.config.clone();
        config.api_key = api_key;
        config.mode = match (&self.sandbox_id, persistence) {
            (Some(sandbox_id), _) => SandboxMode::Attach {
                sandbox_id: sandbox_id.clone(),
            },
            (None, Persistence::Persistent) => SandboxMode::Persistent,
            (None, Persistence::Ephemeral) => SandboxMode::Ephemeral { lifetime },
        };
        config
    }
}

#[cfg(test)]
mod tests;
