//! The profile's secret lookups as the core's sources: the E2B API key and the credential
//! values, each asked through a Python callable in the calling Hermes thread's context.

use std::sync::Arc;

use agent_sandbox::ApiKey;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::context::call_in_context;

/// The API key source for a Python `key_resolver()` (the profile's secret lookup), asked on
/// first use.
pub(crate) fn python_key_resolver(key_resolver: Py<PyAny>) -> agent_sandbox::KeyResolver {
    Arc::new(move || -> Option<ApiKey> {
        // In the calling Hermes thread's context: Hermes scopes the profile's secrets there.
        Python::try_attach(|py| {
            match call_in_context(py, key_resolver.bind(py), PyTuple::empty(py)) {
                Ok(value) => value
                    .extract::<Option<String>>()
                    .ok()
                    .flatten()
                    .filter(|key| !key.is_empty())
                    .map(ApiKey::new),
                Err(error) => {
                    // The error text is Python's; it names no key (resolvers never put it there).
                    tracing::warn!(
                        "E2B API key lookup failed: {}",
                        error
                            .get_type(py)
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    );
                    None
                }
            }
        })
        .flatten()
    })
}

/// The credential value source for a Python `credential_resolver(name)` (the profile's
/// secret lookup), asked before every command; `None` resolves nothing.
pub(crate) fn python_credential_values(
    resolver: Option<Py<PyAny>>,
) -> agent_sandbox::CredentialValues {
    let Some(resolver) = resolver else {
        return Arc::new(|_| None);
    };
    Arc::new(move |name: &str| -> Option<String> {
        Python::try_attach(|py| {
            let args = PyTuple::new(py, [name]).ok()?;
            match call_in_context(py, resolver.bind(py), args) {
                Ok(value) => value
                    .extract::<Option<String>>()
                    .ok()
                    .flatten()
                    .filter(|value| !value.is_empty()),
                Err(error) => {
                    // Python's error type only: its text could hold anything.
                    tracing::warn!(
                        "E2B credential lookup for {name} failed: {}",
                        error
                            .get_type(py)
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    );
                    None
                }
            }
        })
        .flatten()
    })
}

/// Where a profile's credential values belong, for the error about a missing one.
pub(crate) fn credential_source(profile_home: &std::path::Path) -> String {
    profile_home.join(".env").display().to_string()
}
