//! Which operation needed a credential's value, and for which sandbox
//! ([`Error::MissingCredential`]'s words).

use super::Error;

/// ` for sandbox <id>`, or nothing before there is a sandbox.
pub(super) fn for_sandbox(sandbox_id: Option<&str>) -> String {
    sandbox_id
        .map(|id| format!(" for sandbox {id}"))
        .unwrap_or_default()
}

impl Error {
    /// A credential without a value, said of `operation` on `sandbox_id` (what needed the
    /// value); any other error unchanged.
    pub(crate) fn needed_by(self, operation: &'static str, sandbox_id: Option<&str>) -> Error {
        match self {
            Error::MissingCredential {
                name, source_file, ..
            } => Error::MissingCredential {
                name,
                source_file,
                operation,
                sandbox_id: sandbox_id.map(str::to_owned),
            },
            other => other,
        }
    }
}
