//! The caller's state synchronisation, which the backend drives.

use crate::transport::StateTransport;

/// A failure reported by a [`StateHooks`] callback.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Which push the backend asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PushKind {
    /// The full push of a bring-up (after recovery); a failure is fatal (contract S2).
    Initial,
    /// The per-command incremental sync; a failure aborts the command and marks the scope
    /// dirty (contract S3).
    Incremental,
}

/// The caller's state synchronisation, driven by the backend at the right moments and only
/// in the writer role (C1). Hermes' binding implements it with its FileSyncManager, whose
/// callbacks use the [`StateTransport`] handed in here.
///
/// A callback fails by returning an error, and also when any transport call made during it
/// failed (the transport records failures), so a sync engine that swallows exceptions still
/// fails closed.
///
/// Callbacks run on the thread that called into the backend, while the backend holds its
/// attach state: they must use the transport they are given and must not call back into the
/// same [`Backend`](crate::Backend) (that would wait on itself).
pub trait StateHooks: Send + Sync {
    /// Push host state into the sandbox.
    fn push(&self, transport: &StateTransport, kind: PushKind) -> Result<(), HookError>;
    /// Pull sandbox state back to the host at teardown.
    fn pull(&self, transport: &StateTransport) -> Result<(), HookError>;
}

/// Hooks that move no state: for callers that only run commands.
#[derive(Debug, Clone, Copy)]
pub struct NoStateHooks;

impl StateHooks for NoStateHooks {
    fn push(&self, _transport: &StateTransport, _kind: PushKind) -> Result<(), HookError> {
        Ok(())
    }

    fn pull(&self, _transport: &StateTransport) -> Result<(), HookError> {
        Ok(())
    }
}
