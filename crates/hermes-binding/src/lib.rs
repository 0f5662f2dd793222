//! The Hermes Agent plugin's native core: the PyO3 module `hermes_e2b._native`, a thin adapter
//! over agent-sandbox, shipped in the `hermes-e2b` wheel beside the Python package
//! `hermes_e2b` (the Hermes provider and environment classes).
//!
//! The Python layer hands raw values over; validation and every decision happen here or in
//! agent-sandbox. The settings parser is plain Rust:
//!
//! ```
//! use std::collections::BTreeMap;
//! use _native::settings::{Settings, Value};
//!
//! let mut raw = BTreeMap::new();
//! raw.insert("api_url".to_owned(), Value::Str("http://127.0.0.1:49999".to_owned()));
//! raw.insert("sandbox_url".to_owned(), Value::Str("http://127.0.0.1:49999".to_owned()));
//! raw.insert("allow_internet_access".to_owned(), Value::Bool(false));
//! let settings = Settings::parse(&raw, Some(600)).unwrap();
//! assert_eq!(settings.lease.as_secs(), 600, "terminal.lifetime_seconds is the lease fallback");
//! assert_eq!(settings.endpoint_summary(), "http://127.0.0.1:49999 (api and sandbox)");
//!
//! raw.insert("secure".to_owned(), Value::Str("yes".to_owned()));
//! let error = Settings::parse(&raw, None).unwrap_err();
//! assert!(error.is_configuration());
//! assert_eq!(error.to_string(), "E2B setting secure is invalid: must be true or false, not a string");
//! ```
//!
//! # What it guarantees
//!
//! - **Only this crate knows Python.** agent-sandbox and everything below it are
//!   framework-neutral; the Python package adapts Hermes' calls and holds no logic Rust can
//!   hold.
//! - **The GIL is released** around every call that can block or emit a log record
//!   (attach, run, wait, cleanup, transport calls); waits wake every 100 ms so Ctrl-C reaches
//!   Python.
//! - **Logging:** `tracing` events of the core reach Python `logging` under the logger
//!   `hermes_e2b`, through a layer that takes the GIL only to hand one record over. Each
//!   warning is logged once, by the core; the Python package does not repeat it.
//! - **One settings table:** keys, kinds, defaults and descriptions are agent-sandbox's
//!   [`agent_sandbox::SETTINGS`]; [`settings`] validates against it and the module exposes
//!   it as `SETTINGS` and `SETTING_KEYS`, so Python writes no default. The sandbox's home is
//!   not a default but what the sandbox reports at attach (`attach()`'s `home`,
//!   `remote_hermes_home`, `default_cwd`); `E2B_DEFAULT_HOME` is only a placeholder for
//!   static hints before any sandbox exists.
//! - **One tokio runtime** per process, built on first use (importing starts no threads).
//! - **Errors** are a small hierarchy rooted at `E2BError` (`ConfigurationError`,
//!   `NotReadyError`, `SandboxGoneError`, `StateSyncError`, `BackendClosedError`). A message is
//!   the backend's error chain, each cause once (`Error::message`): it names the operation and
//!   the sandbox, never the API key, and never contains the word "timeout" (rewritten here, the
//!   one place Rust errors become Hermes-facing text).
//! - **Redaction** (X4): every error message (`Error::message`), every record the logging
//!   bridge hands to Python, and (through the exported `redact`) the Python layer's own log
//!   records and doctor rows pass agent-sandbox's one redaction pass.
//! - **No host pid:** a running command exposes `sandbox_pid`, never `pid`.
//! - **`hermes e2b`:** the `Inventory` class hands agent-sandbox's inventory (list, planned
//!   removal, on-demand pull, live check, host locking) to the Python CLI as plain dicts;
//!   progress reports reach a Python callable only when the CLI passes one (on a terminal).

#![deny(missing_docs)]

pub mod error;
mod inventory;
pub mod logging;
mod native;
mod runtime;
pub mod settings;

#[cfg(test)]
mod redaction_tests;

pub use error::Error;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use agent_sandbox::{SettingDefault, SettingKind};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The module initialiser: classes, exceptions, `__version__`, and the logging bridge.
#[pymodule]
#[pyo3(name = "_native")]
fn native_module(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // agent-sandbox's settings table is the one source: the keys the Python layer reads
    // from Hermes' config, the provider's config schema, and the sandbox home.
    let keys = agent_sandbox::SETTINGS.iter().map(|setting| setting.key);
    module.add("SETTING_KEYS", PyTuple::new(py, keys)?)?;
    module.add("SETTINGS", settings_schema(py)?)?;
    // Only a placeholder until a sandbox reports its real home (the provider's static
    // hints need a path before any environment exists).
    module.add("E2B_DEFAULT_HOME", agent_sandbox::E2B_DEFAULT_HOME)?;
    module.add("E2BError", py.get_type::<error::E2BError>())?;
    module.add(
        "ConfigurationError",
        py.get_type::<error::ConfigurationError>(),
    )?;
    module.add("NotReadyError", py.get_type::<error::NotReadyError>())?;
    module.add("SandboxGoneError", py.get_type::<error::SandboxGoneError>())?;
    module.add("StateSyncError", py.get_type::<error::StateSyncError>())?;
    module.add(
        "BackendClosedError",
        py.get_type::<error::BackendClosedError>(),
    )?;
    module.add_class::<native::PySettings>()?;
    module.add_class::<native::PyBackend>()?;
    module.add_class::<native::PyCommand>()?;
    module.add_class::<native::PyTransport>()?;
    module.add_class::<inventory::PyInventory>()?;
    module.add_function(wrap_pyfunction!(emit_log, module)?)?;
    module.add_function(wrap_pyfunction!(redact, module)?)?;
    logging::install();
    Ok(())
}

/// The settings table as Hermes' config-schema entries: one dict per setting with `key`,
/// `type`, `description`, and `default` when the setting has a fixed one.
fn settings_schema(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let entries = agent_sandbox::SETTINGS.iter().map(|setting| {
        let entry = PyDict::new(py);
        entry.set_item("key", setting.key)?;
        let kind = match setting.kind {
            SettingKind::Seconds { .. } => "number",
            SettingKind::Flag => "boolean",
            // Hermes' schema has no mapping type; its config screens take such values as text.
            SettingKind::Mapping => "text",
            _ => "string",
        };
        entry.set_item("type", kind)?;
        match setting.default {
            SettingDefault::Text(text) => entry.set_item("default", text)?,
            SettingDefault::Seconds(seconds) => entry.set_item("default", seconds)?,
            SettingDefault::Flag(flag) => entry.set_item("default", flag)?,
            _ => {}
        }
        if setting.kind == SettingKind::Mapping {
            // What settings.rs accepts when such a screen hands the mapping over as text.
            let description = format!(
                "{} As text: key=value pairs separated by commas or new lines, or a JSON object.",
                setting.description
            );
            entry.set_item("description", description)?;
        } else {
            entry.set_item("description", setting.description)?;
        }
        Ok(entry)
    });
    PyTuple::new(py, entries.collect::<PyResult<Vec<_>>>()?)
}

/// The redaction pass (contract X4) for the Python layer's own text: its logging filter and
/// doctor rows use it, so the rules live once, in Rust.
#[pyfunction]
fn redact(text: &str) -> String {
    agent_sandbox::redact(text)
}

/// Emits one `tracing` event at `level` ("error", "warn", "info", "debug"); lets the Python
/// tests check the logging bridge end to end.
#[pyfunction]
fn emit_log(py: Python<'_>, level: &str, message: String) -> PyResult<()> {
    let level = match level {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "info" => tracing::Level::INFO,
        "debug" => tracing::Level::DEBUG,
        other => {
            return Err(Error::InvalidArgument {
                operation: "emit log",
                reason: format!("unknown level {other:?}"),
            }
            .into());
        }
    };
    // Emitted with the GIL released, as the backend's own threads do.
    py.detach(move || match level {
        tracing::Level::ERROR => tracing::error!("{message}"),
        tracing::Level::WARN => tracing::warn!("{message}"),
        tracing::Level::INFO => tracing::info!("{message}"),
        _ => tracing::debug!("{message}"),
    });
    Ok(())
}
