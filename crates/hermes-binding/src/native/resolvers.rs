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
        lookup(&key_resolver, &[], || "API key lookup".to_owned()).map(ApiKey::new)
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
        lookup(&resolver, &[name], || {
            format!("credential lookup for {name}")
        })
    })
}

/// `resolver(*args)`, called in the calling Hermes thread's context (Hermes scopes the
/// profile's secrets there): a non-empty string, else nothing. A failure is logged as
/// `what` with Python's error type only, never its text, which could hold anything (a
/// resolver never puts a secret there, but nothing makes it so).
fn lookup(resolver: &Py<PyAny>, args: &[&str], what: impl FnOnce() -> String) -> Option<String> {
    Python::try_attach(|py| {
        let args = PyTuple::new(py, args).ok()?;
        match call_in_context(py, resolver.bind(py), args) {
            Ok(value) => value
                .extract::<Option<String>>()
                .ok()
                .flatten()
                .filter(|value| !value.is_empty()),
            Err(error) => {
                tracing::warn!(
                    "E2B {} failed: {}",
                    what(),
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
}

/// Where a profile's credential values belong, for the error about a missing one.
pub(crate) fn credential_source(profile_home: &std::path::Path) -> String {
    profile_home.join(".env").display().to_string()
}
