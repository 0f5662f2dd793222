//! The plugin's settings (`plugins.entries.e2b.settings`): parsed and validated here, so the
//! Python layer only hands the raw mapping over. Keys, kinds and defaults are agent-sandbox's
//! settings table ([`agent_sandbox::SETTINGS`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use agent_sandbox::{
    ApiKeySource, Config, DEFAULT_COMMAND_GRACE, DEFAULT_INTERNET, DEFAULT_LEASE, DEFAULT_SECURITY,
    DEFAULT_TEMPLATE, Endpoints, InternetAccess, MAX_SETTING_SECONDS, REMOTE_HOME, SandboxId,
    SandboxMode, Security, Setting, SettingKind,
};

use crate::error::Error;

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
            Value::Other(kind) => kind,
        }
    }
}

/// Validated plugin settings. Build with [`Settings::parse`].
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// E2B template name or id (default `base`).
    pub template: String,
    /// Starting directory in the sandbox (default `/home/user`).
    pub cwd: String,
    /// Baseline lease (`lease_seconds`, else [`idle_lifetime`]).
    pub lease: Duration,
    /// Lease headroom beyond a command's deadline (default 30 s).
    pub command_grace: Duration,
    /// Egress policy (default allowed).
    pub internet: InternetAccess,
    /// envd access-token protection (default on).
    pub security: Security,
    /// Extra sandbox metadata.
    pub metadata: BTreeMap<String, String>,
    /// Where E2B is.
    pub endpoints: Endpoints,
    /// Attach mode: an externally owned sandbox.
    pub sandbox_id: Option<SandboxId>,
    /// Keys present in the mapping that the plugin does not know (reported, not fatal).
    pub unknown_keys: Vec<String>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("template", &self.template)
            .field("cwd", &self.cwd)
            .field("lease", &self.lease)
            .field("command_grace", &self.command_grace)
            .field("internet", &self.internet)
            .field("security", &self.security)
            .field("metadata_keys", &self.metadata.keys().collect::<Vec<_>>())
            .field("endpoints", &self.endpoints)
            .field("sandbox_id", &self.sandbox_id)
            .finish()
    }
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

fn invalid(key: &str, reason: impl Into<String>) -> Error {
    Error::InvalidSetting {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

fn string(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<String>, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Str(value)) => Ok(Some(value.trim().to_owned())),
        Some(other) => Err(invalid(
            key,
            format!("must be a string, not {}", other.kind()),
        )),
    }
}

fn boolean(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<bool>, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(invalid(
            key,
            format!("must be true or false, not {}", other.kind()),
        )),
    }
}

/// Hermes' idle lifetime (`terminal.lifetime_seconds`), else the default lease: the lease's
/// fallback and an ephemeral sandbox's lifetime.
pub fn idle_lifetime(lifetime_seconds: Option<u64>) -> Duration {
    lifetime_seconds
        .filter(|seconds| *seconds > 0)
        .map_or(DEFAULT_LEASE, Duration::from_secs)
}

fn seconds(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<Duration>, Error> {
    let min = match Setting::find(key).map(|setting| setting.kind) {
        Some(SettingKind::Seconds { min }) => min,
        _ => 0,
    };
    let value = match raw.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Int(value)) => *value,
        Some(Value::Float(value)) if value.fract() == 0.0 && value.is_finite() => *value as i64,
        Some(other) => {
            return Err(invalid(
                key,
                format!("must be a whole number of seconds, not {}", other.kind()),
            ));
        }
    };
    match u64::try_from(value) {
        Ok(seconds) if (min..=MAX_SETTING_SECONDS).contains(&seconds) => {
            Ok(Some(Duration::from_secs(seconds)))
        }
        _ => Err(invalid(
            key,
            format!("must be between {min} and {MAX_SETTING_SECONDS} seconds, not {value}"),
        )),
    }
}

fn url(raw: &BTreeMap<String, Value>, key: &str) -> Result<Option<String>, Error> {
    let Some(value) = string(raw, key)? else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    let scheme_ok = value.starts_with("http://") || value.starts_with("https://");
    if !scheme_ok || value.contains(char::is_whitespace) || value.contains('@') {
        // '@' would smuggle credentials into a URL that ends up in diagnostics.
        return Err(invalid(
            key,
            "must be an http:// or https:// URL without credentials",
        ));
    }
    Ok(Some(value.trim_end_matches('/').to_owned()))
}

impl Settings {
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
    /// assert_eq!(settings.template, "my-template");
    /// assert_eq!(settings.lease.as_secs(), 600);
    ///
    /// raw.insert("lease_seconds".to_owned(), Value::Str("soon".to_owned()));
    /// assert!(Settings::parse(&raw, None).is_err());
    /// ```
    pub fn parse(
        raw: &BTreeMap<String, Value>,
        lifetime_seconds: Option<u64>,
    ) -> Result<Settings, Error> {
        let template = string(raw, "template")?.unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
        if template.is_empty() {
            return Err(invalid("template", "must not be empty"));
        }
        let cwd = string(raw, "cwd")?.unwrap_or_else(|| REMOTE_HOME.to_owned());
        if !cwd.starts_with('/') {
            return Err(invalid("cwd", "must be an absolute path"));
        }
        let lease = seconds(raw, "lease_seconds")?.unwrap_or(idle_lifetime(lifetime_seconds));
        let command_grace = seconds(raw, "command_grace_seconds")?.unwrap_or(DEFAULT_COMMAND_GRACE);
        let internet = match boolean(raw, "allow_internet_access")? {
            None => DEFAULT_INTERNET,
            Some(true) => InternetAccess::Allowed,
            Some(false) => InternetAccess::Denied,
        };
        let security = match boolean(raw, "secure")? {
            None => DEFAULT_SECURITY,
            Some(true) => Security::Secure,
            Some(false) => Security::Insecure,
        };
        let metadata = match raw.get("metadata") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Map(entries)) => entries
                .iter()
                .map(|(key, value)| match value {
                    Value::Str(text) => Ok((key.clone(), text.clone())),
                    Value::Int(number) => Ok((key.clone(), number.to_string())),
                    Value::Bool(flag) => Ok((key.clone(), flag.to_string())),
                    other => Err(invalid(
                        "metadata",
                        format!("value of {key:?} must be a string, not {}", other.kind()),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(invalid(
                    "metadata",
                    format!("must be a mapping, not {}", other.kind()),
                ));
            }
        };
        let domain = string(raw, "domain")?.filter(|d| !d.is_empty());
        if let Some(domain) = &domain {
            let ok = domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == ':');
            if !ok {
                return Err(invalid("domain", "must be a host name such as e2b.app"));
            }
        }
        let endpoints = Endpoints {
            domain,
            api_url: url(raw, "api_url")?,
            sandbox_url: url(raw, "sandbox_url")?,
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
        let unknown_keys = raw
            .keys()
            .filter(|key| Setting::find(key).is_none())
            .cloned()
            .collect();
        Ok(Settings {
            template,
            cwd,
            lease,
            command_grace,
            internet,
            security,
            metadata,
            endpoints,
            sandbox_id,
            unknown_keys,
        })
    }

    /// The directory a cwd handed over by Hermes means. Hermes hands container backends
    /// `/root` (or `""`, `~`) when it does not know the cwd, or after discarding a
    /// host-looking `/home/...` one; that means "where the session is": `current` (the
    /// session's tracked cwd) unless it is such a placeholder too, else the configured cwd.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use _native::settings::Settings;
    ///
    /// let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
    /// assert_eq!(settings.session_cwd("/root", None), "/home/user");
    /// assert_eq!(settings.session_cwd("/root", Some("/home/user/x")), "/home/user/x");
    /// assert_eq!(settings.session_cwd("/opt", Some("/home/user/x")), "/opt");
    /// ```
    pub fn session_cwd(&self, requested: &str, current: Option<&str>) -> String {
        const PLACEHOLDERS: [&str; 3] = ["", "/root", "~"];
        let known = |cwd: &&str| !PLACEHOLDERS.contains(cwd);
        Some(requested)
            .filter(known)
            .or(current.filter(known))
            .unwrap_or(&self.cwd)
            .to_owned()
    }

    /// One line for doctor rows: where the backend sends requests. Never contains the key.
    pub fn endpoint_summary(&self) -> String {
        let Endpoints {
            domain,
            api_url,
            sandbox_url,
        } = &self.endpoints;
        match (api_url, sandbox_url) {
            (Some(api), Some(sandbox)) if api == sandbox => format!("{api} (api and sandbox)"),
            (Some(api), Some(sandbox)) => format!("api {api}, sandbox {sandbox}"),
            (Some(api), None) => format!("api {api}"),
            (None, Some(sandbox)) => format!("sandbox {sandbox}"),
            (None, None) => match domain {
                Some(domain) => format!("E2B at {domain}"),
                None => "E2B cloud (e2b.app)".to_owned(),
            },
        }
    }

    /// The backend configuration for one environment.
    pub fn to_config(
        &self,
        api_key: ApiKeySource,
        persistence: Persistence,
        lifetime: Duration,
    ) -> Config {
        let mut config = Config::new(api_key);
        config.template = self.template.clone();
        config.cwd = self.cwd.clone();
        config.lease = self.lease;
        config.command_grace = self.command_grace;
        config.internet = self.internet;
        config.security = self.security;
        config.metadata = self.metadata.clone();
        config.endpoints = self.endpoints.clone();
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
mod tests {
    use agent_sandbox::{SETTINGS, SettingDefault};

    use super::*;

    fn raw(entries: &[(&str, Value)]) -> BTreeMap<String, Value> {
        entries
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect()
    }

    #[test]
    fn defaults_match_the_configuration_table() {
        let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
        assert_eq!(settings.template, "base");
        assert_eq!(settings.cwd, "/home/user");
        assert_eq!(settings.lease, Duration::from_secs(300));
        assert_eq!(settings.command_grace, Duration::from_secs(30));
        assert_eq!(settings.internet, InternetAccess::Allowed);
        assert_eq!(settings.security, Security::Secure);
        assert!(settings.metadata.is_empty());
        assert_eq!(settings.sandbox_id, None);
        assert_eq!(settings.endpoint_summary(), "E2B cloud (e2b.app)");
    }

    #[test]
    fn every_key_of_the_settings_table_is_read_with_its_default() {
        let nulls = SETTINGS
            .iter()
            .map(|setting| (setting.key.to_owned(), Value::Null))
            .collect();
        let settings = Settings::parse(&nulls, None).unwrap();
        assert!(
            settings.unknown_keys.is_empty(),
            "{:?}",
            settings.unknown_keys
        );
        let default = |key| Setting::find(key).unwrap().default;
        assert!(
            matches!(default("template"), SettingDefault::Text(text) if text == settings.template)
        );
        assert!(matches!(default("cwd"), SettingDefault::Text(text) if text == settings.cwd));
        assert_eq!(
            default("command_grace_seconds"),
            SettingDefault::Seconds(settings.command_grace.as_secs())
        );
        assert_eq!(
            default("secure"),
            SettingDefault::Flag(settings.security == Security::Secure)
        );
    }

    #[test]
    fn lease_falls_back_to_hermes_lifetime_but_the_setting_wins() {
        let settings = Settings::parse(&BTreeMap::new(), Some(900)).unwrap();
        assert_eq!(settings.lease, Duration::from_secs(900));
        let settings =
            Settings::parse(&raw(&[("lease_seconds", Value::Int(60))]), Some(900)).unwrap();
        assert_eq!(settings.lease, Duration::from_secs(60));
    }

    #[test]
    fn wrong_types_and_ranges_name_the_key() {
        let cases = [
            ("lease_seconds", Value::Int(0)),
            ("lease_seconds", Value::Bool(true)),
            ("command_grace_seconds", Value::Int(-1)),
            ("allow_internet_access", Value::Str("yes".to_owned())),
            ("secure", Value::Int(1)),
            ("cwd", Value::Str("relative/dir".to_owned())),
            ("template", Value::Str(String::new())),
            ("api_url", Value::Str("ftp://x".to_owned())),
            ("api_url", Value::Str("https://user:key@host".to_owned())),
            ("sandbox_id", Value::Str("../etc".to_owned())),
            ("metadata", Value::Str("team=infra".to_owned())),
            ("domain", Value::Str("e2b.app/evil".to_owned())),
        ];
        for (key, value) in cases {
            let error = Settings::parse(&raw(&[(key, value.clone())]), None)
                .expect_err(&format!("{key} = {value:?} must be refused"));
            assert!(error.is_configuration());
            assert!(error.to_string().contains(key), "{error}");
        }
    }

    #[test]
    fn flags_metadata_endpoints_and_attach_mode() {
        let mut metadata = BTreeMap::new();
        metadata.insert("team".to_owned(), Value::Str("infra".to_owned()));
        metadata.insert("tier".to_owned(), Value::Int(2));
        let settings = Settings::parse(
            &raw(&[
                ("allow_internet_access", Value::Bool(false)),
                ("secure", Value::Bool(false)),
                ("metadata", Value::Map(metadata)),
                ("api_url", Value::Str("http://127.0.0.1:3000/".to_owned())),
                (
                    "sandbox_url",
                    Value::Str("http://127.0.0.1:3000".to_owned()),
                ),
                ("sandbox_id", Value::Str("sbx-123".to_owned())),
                ("surprise", Value::Bool(true)),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(settings.internet, InternetAccess::Denied);
        assert_eq!(settings.security, Security::Insecure);
        assert_eq!(settings.metadata.get("tier").map(String::as_str), Some("2"));
        assert_eq!(
            settings.endpoint_summary(),
            "http://127.0.0.1:3000 (api and sandbox)"
        );
        assert_eq!(settings.unknown_keys, vec!["surprise".to_owned()]);
        let config = settings.to_config(
            ApiKeySource::Resolver(std::sync::Arc::new(|| None)),
            Persistence::Persistent,
            Duration::from_secs(300),
        );
        assert!(matches!(config.mode, SandboxMode::Attach { .. }));
    }

    #[test]
    fn placeholder_cwds_mean_where_the_session_is() {
        let settings =
            Settings::parse(&raw(&[("cwd", Value::Str("/srv".to_owned()))]), None).unwrap();
        for placeholder in ["", "/root", "~"] {
            assert_eq!(settings.session_cwd(placeholder, None), "/srv");
            assert_eq!(settings.session_cwd(placeholder, Some("~")), "/srv");
            assert_eq!(settings.session_cwd(placeholder, Some("/tmp")), "/tmp");
        }
        assert_eq!(settings.session_cwd("/opt", None), "/opt");
        assert_eq!(settings.session_cwd("/opt", Some("/tmp")), "/opt");
    }

    #[test]
    fn persistence_chooses_the_mode() {
        let settings = Settings::parse(&BTreeMap::new(), None).unwrap();
        let key = || ApiKeySource::Resolver(std::sync::Arc::new(|| None));
        let lifetime = Duration::from_secs(120);
        let persistent = settings.to_config(key(), Persistence::Persistent, lifetime);
        assert_eq!(persistent.mode, SandboxMode::Persistent);
        let ephemeral = settings.to_config(key(), Persistence::Ephemeral, lifetime);
        assert_eq!(ephemeral.mode, SandboxMode::Ephemeral { lifetime });
        assert!(Persistence::parse("sometimes").is_err());
    }
}
