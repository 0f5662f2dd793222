//! The module's one tokio runtime.

use std::sync::OnceLock;

use crate::error::Error;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The shared multi-thread runtime, built on first use (never at import, so importing the
/// module starts no threads).
pub(crate) fn handle() -> Result<tokio::runtime::Handle, Error> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime.handle().clone());
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hermes-e2b")
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            operation: "start the async runtime",
            path: std::path::PathBuf::from("<runtime>"),
            source,
        })?;
    // A racing thread may have won; its runtime is used and ours is dropped.
    let runtime = RUNTIME.get_or_init(|| built);
    Ok(runtime.handle().clone())
}

static FLEET: OnceLock<agent_sandbox::Fleet> = OnceLock::new();

/// The process's one fleet: every backend of a Hermes process (a gateway's many sessions)
/// shares the E2B account's limit of concurrently running sandboxes, so a start refused for
/// it may pause another session's idle sandbox (L14).
pub(crate) fn fleet() -> agent_sandbox::Fleet {
    FLEET.get_or_init(agent_sandbox::Fleet::new).clone()
}
