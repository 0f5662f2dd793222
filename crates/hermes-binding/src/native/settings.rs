//! `_native.Settings`: the plugin settings, validated by the one settings table, as Python
//! sees them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::error::{Error, config_file, env_file};
use crate::settings::{Settings, Value};

pub(crate) fn to_value(object: &Bound<'_, PyAny>) -> PyResult<Value> {
    // bool before int: Python's bool is an int subclass.
    if object.is_none() {
        Ok(Value::Null)
    } else if object.is_instance_of::<PyBool>() {
        Ok(Value::Bool(object.extract()?))
    } else if object.is_instance_of::<PyInt>() {
        Ok(object
            .extract::<i64>()
            .map(Value::Int)
            .unwrap_or_else(|_| Value::Other("an integer out of range".to_owned())))
    } else if object.is_instance_of::<PyFloat>() {
        Ok(Value::Float(object.extract()?))
    } else if object.is_instance_of::<PyString>() {
        Ok(Value::Str(object.extract()?))
    } else if let Ok(mapping) = object.cast::<PyDict>() {
        let mut entries = BTreeMap::new();
        for (key, value) in mapping.iter() {
            entries.insert(key.str()?.to_string(), to_value(&value)?);
        }
        Ok(Value::Map(entries))
    } else if object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>() {
        let items = object
            .try_iter()?
            .map(|item| to_value(&item?))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Value::List(items))
    } else {
        Ok(Value::Other(format!("a {}", object.get_type().name()?)))
    }
}

/// Validated plugin settings (`plugins.entries.e2b.settings`).
#[pyclass(name = "Settings", module = "hermes_e2b._native", frozen)]
#[derive(Debug)]
pub struct PySettings {
    pub(crate) settings: Settings,
}

#[pymethods]
impl PySettings {
    /// Validates the raw mapping; raises ConfigurationError naming the bad key, what is
    /// valid, and the profile's `config.yaml` when `profile_home` (the Hermes home) is given.
    #[new]
    ///
    /// `hermes_proxy_mappings`: the entries of Hermes' own egress firewall (`mappings.json`),
    /// given only when its `proxy.enabled` is set; names the `credentials` setting does not
    /// configure are taken from them (X16).
    #[pyo3(signature = (raw, *, lifetime_seconds = None, profile_home = None, hermes_proxy_mappings = None))]
    fn new(
        raw: &Bound<'_, PyAny>,
        lifetime_seconds: Option<u64>,
        profile_home: Option<PathBuf>,
        hermes_proxy_mappings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PySettings> {
        let named = |error: Error| match &profile_home {
            Some(home) => error.in_config_file(config_file(home)),
            None => error,
        };
        let raw = match to_value(raw)? {
            Value::Map(entries) => entries,
            Value::Null => BTreeMap::new(),
            other => {
                return Err(named(Error::InvalidSetting {
                    key: "settings".to_owned(),
                    reason: format!("must be a mapping, not {other:?}"),
                    file: None,
                })
                .into());
            }
        };
        let env = |name: &str| std::env::var(name).ok();
        let mut settings = Settings::parse_with_env(&raw, lifetime_seconds, &env).map_err(named)?;
        if let Some(mappings) = hermes_proxy_mappings {
            let mappings = match to_value(mappings)? {
                Value::List(items) => items,
                _ => Vec::new(),
            };
            settings.add_hermes_mappings(&mappings).map_err(named)?;
        }
        settings.warn_unknown_keys_once();
        Ok(PySettings { settings })
    }

    #[getter]
    fn template(&self) -> &str {
        &self.settings.config.template
    }

    #[getter]
    fn cwd(&self) -> Option<&str> {
        self.settings.config.cwd.as_deref()
    }

    #[getter]
    fn lease_seconds(&self) -> u64 {
        self.settings.config.lease.as_secs()
    }

    #[getter]
    fn command_grace_seconds(&self) -> u64 {
        self.settings.config.command_grace.as_secs()
    }

    #[getter]
    fn allow_internet_access(&self) -> bool {
        self.settings.config.internet == agent_sandbox::InternetAccess::Allowed
    }

    #[getter]
    fn secure(&self) -> bool {
        self.settings.config.security == agent_sandbox::Security::Secure
    }

    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.settings.config.metadata.clone()
    }

    /// The configured credentials (the setting's and Hermes' egress firewall's): a list of
    /// dicts (name, hosts, header, format, source: "settings" or "hermes-proxy"). No value.
    #[getter]
    fn credentials<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.settings
            .credentials
            .iter()
            .map(|credential| {
                let dict = PyDict::new(py);
                dict.set_item("name", credential.name())?;
                dict.set_item("hosts", credential.hosts().to_vec())?;
                dict.set_item("header", credential.header())?;
                dict.set_item("format", credential.format())?;
                let source = if self
                    .settings
                    .credentials_from_hermes
                    .iter()
                    .any(|name| name == credential.name())
                {
                    "hermes-proxy"
                } else {
                    "settings"
                };
                dict.set_item("source", source)?;
                Ok(dict)
            })
            .collect()
    }

    /// `allow_out`, canonical.
    #[getter]
    fn allow_out(&self) -> Vec<String> {
        self.settings.config.egress.allow_out().to_vec()
    }

    /// `deny_out`, canonical.
    #[getter]
    fn deny_out(&self) -> Vec<String> {
        self.settings.config.egress.deny_out().to_vec()
    }

    /// One line for doctor rows: the egress policy and what `allow_internet_access` adds.
    fn egress_summary(&self) -> String {
        self.settings.egress_summary()
    }

    #[getter]
    fn sandbox_id(&self) -> Option<&str> {
        self.settings.sandbox_id.as_ref().map(|id| id.as_str())
    }

    /// `checkpoint_at_start`.
    #[getter]
    fn checkpoint_at_start(&self) -> bool {
        self.settings.checkpoints.at_session_start
    }

    /// `checkpoint_keep`.
    #[getter]
    fn checkpoint_keep(&self) -> usize {
        self.settings.checkpoints.keep
    }

    /// `checkpoint_tool`.
    #[getter]
    fn checkpoint_tool(&self) -> bool {
        self.settings.checkpoints.agent_tool
    }

    /// `subagents`: `shared` or `fork` (R15).
    #[getter]
    fn subagents(&self) -> &'static str {
        self.settings.subagents.as_str()
    }

    /// `subagent_forks`: `kill` or `keep` (R15).
    #[getter]
    fn subagent_forks(&self) -> &'static str {
        self.settings.subagent_forks.as_str()
    }

    /// `live_tools`: execute_code in a live kernel, background processes streamed (O8, O9).
    #[getter]
    fn live_tools(&self) -> bool {
        self.settings.live_tools
    }

    /// `turn_checkpoints` (0: off).
    #[getter]
    fn turn_checkpoints(&self) -> usize {
        self.settings.checkpoints.turns
    }

    #[getter]
    fn unknown_keys(&self) -> Vec<String> {
        self.settings.unknown_keys.clone()
    }

    /// One line per unknown setting key, with the nearest known key (for doctor rows).
    fn unknown_key_notes(&self) -> Vec<String> {
        self.settings.unknown_key_notes()
    }

    /// One line naming where requests go (for doctor rows); never contains the key.
    fn endpoint_summary(&self) -> String {
        self.settings.endpoint_summary()
    }

    /// One line naming who picks the one writer (for doctor rows).
    fn arbitration_summary(&self) -> String {
        self.settings.arbitration_summary()
    }

    /// The directory a cwd Hermes hands over means (see `Settings::session_cwd`).
    #[pyo3(signature = (requested, current = None))]
    fn session_cwd(&self, requested: &str, current: Option<&str>) -> Option<String> {
        self.settings.session_cwd(requested, current)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.settings)
    }
}

/// Hermes' `terminal.timeout` as the backend uses it, in seconds; raises ConfigurationError
/// naming the setting, what is valid, and the profile's `config.yaml` when `profile_home`
/// is given (contract O5).
#[pyfunction]
#[pyo3(signature = (value, *, profile_home = None))]
pub(crate) fn command_timeout(
    value: &Bound<'_, PyAny>,
    profile_home: Option<PathBuf>,
) -> PyResult<f64> {
    crate::settings::command_timeout(&to_value(value)?)
        .map(|deadline| deadline.as_secs_f64())
        .map_err(|error| match profile_home {
            Some(home) => error.in_config_file(config_file(&home)).into(),
            None => error.into(),
        })
}

/// What the doctor and the terminal tool say when the profile at `profile_home` has no API
/// key: the reason and what to do, naming the profile's env file (contract O5).
#[pyfunction]
pub(crate) fn missing_key_message(profile_home: PathBuf) -> String {
    Error::MissingApiKey {
        env_file: env_file(&profile_home),
    }
    .message()
}

/// Records the texts of a turn in gateway chat `chat` (its messages, as Hermes'
/// `pre_llm_call` hands them): the per-conversation files they name may reach that chat's
/// sandbox (X19). Whether they named anything new. Never fails: a text that names nothing
/// adds nothing.
#[pyfunction]
pub(crate) fn note_chat_texts(chat: &str, texts: Vec<String>) -> bool {
    !chat.is_empty() && crate::chats::note_texts(chat, texts.iter().map(String::as_str))
}
