#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod chats;
pub mod error;
mod inventory;
pub mod logging;
mod native;
pub mod privacy;
mod runtime;
pub mod settings;
mod watch;

#[cfg(test)]
mod redaction_tests;

pub use error::Error;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use settings::table::Fixed;

/// The module initialiser: classes, exceptions, `__version__`, and the logging bridge.
#[pymodule]
#[pyo3(name = "_native")]
fn native_module(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The settings table is the one source: the keys the Python layer reads from Hermes'
    // config and the provider's config schema.
    let keys = settings::table::SETTINGS.iter().map(|setting| setting.key);
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
    module.add("CredentialError", py.get_type::<error::CredentialError>())?;
    module.add("NotReadyError", py.get_type::<error::NotReadyError>())?;
    module.add("SandboxGoneError", py.get_type::<error::SandboxGoneError>())?;
    module.add("StateSyncError", py.get_type::<error::StateSyncError>())?;
    module.add("StalledError", py.get_type::<error::StalledError>())?;
    module.add(
        "LiveProcessLostError",
        py.get_type::<error::LiveProcessLostError>(),
    )?;
    module.add(
        "BackendClosedError",
        py.get_type::<error::BackendClosedError>(),
    )?;
    module.add_class::<native::PySettings>()?;
    module.add_class::<native::PyBackend>()?;
    module.add_class::<native::PyChild>()?;
    module.add_class::<native::PyCommand>()?;
    module.add_class::<native::PyLiveProcess>()?;
    module.add_class::<native::PyKernel>()?;
    module.add_class::<native::PySharedPort>()?;
    module.add_class::<native::PyDeadline>()?;
    module.add_class::<native::PyTransport>()?;
    module.add_class::<inventory::PyInventory>()?;
    module.add_function(wrap_pyfunction!(emit_log, module)?)?;
    module.add_function(wrap_pyfunction!(redact, module)?)?;
    module.add_function(wrap_pyfunction!(native::command_timeout, module)?)?;
    module.add_function(wrap_pyfunction!(inventory::pull_subagent, module)?)?;
    module.add_function(wrap_pyfunction!(native::missing_key_message, module)?)?;
    module.add_function(wrap_pyfunction!(native::note_chat_texts, module)?)?;
    logging::install();
    Ok(())
}

/// The settings table as Hermes' config-schema entries: one dict per setting with `key`,
/// `type`, `description`, and `default` when the setting has a fixed one.
fn settings_schema(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let entries = settings::table::SETTINGS.iter().map(|setting| {
        let entry = PyDict::new(py);
        entry.set_item("key", setting.key)?;
        entry.set_item("type", setting.kind.dashboard_type())?;
        match setting.fixed_default() {
            Some(Fixed::Text(text)) => entry.set_item("default", text)?,
            Some(Fixed::Seconds(seconds) | Fixed::Count(seconds)) => {
                entry.set_item("default", seconds)?
            }
            Some(Fixed::Flag(flag)) => entry.set_item("default", flag)?,
            None => {}
        }
        entry.set_item("description", setting.schema_description())?;
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
