//! Leftovers under the account's limit (L15): a running sandbox of this profile that no live
//! process holds (an earlier Hermes that crashed or was killed, or one whose cleanup left it
//! running on its lease) takes a slot until its lease ends. When a start is refused for the
//! limit and no sandbox of this process can be paused, the backend pauses such a leftover,
//! as it pauses its own idle ones (L14).
//!
//! What makes a sandbox a leftover is decided from E2B's list and this host's arbitration
//! records, never from a guess: a persistent sandbox labelled with this profile, of a scope
//! this host has coordinated, whose writer role nobody on this host holds, whose activity
//! record shows no command running, and that is no scope of this process's fleet. The pause
//! is made while this backend holds that scope's writer role itself, so no process can bring
//! the scope up between the check and the pause; the role is given back right after,
//! leaving the scope's markers as they were. The scope's next use resumes the sandbox with
//! its files (and, on E2B, its memory) as it left them.
//!
//! Sandboxes of other hosts are never touched: a host's records say nothing of another
//! host's sessions. With `writer_arbitration: sandbox` (several hosts serving a profile),
//! the writer may live on another host, so nothing is paused as a leftover at all.

use std::collections::BTreeMap;
use std::time::SystemTime;

use e2b_client::{ListQuery, ListedSandbox, SandboxId, StateFilter};
use futures::TryStreamExt;
use sandbox_identity::{IdentityMetadata, Mode, PROFILE_KEY, ProfileDigest, ScopeDigest};
use writer_lease::{Role as LeaseRole, ScopeFiles, ScopeKey, WriterStatus};

use super::Inner;
use crate::config::WriterArbitration;
use crate::error::ErrorChain;

/// What a search for a leftover found besides the one it paused: why the rest of this
/// profile's running sandboxes stayed running. Goes into the limit error (O5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeftoverCensus {
    /// Held by a live session on this host (its writer role is taken).
    pub(crate) held: usize,
    /// Running a command, as this host's activity record says.
    pub(crate) busy: usize,
    /// Of a scope this host never coordinated (another host's), or whose records cannot be
    /// read.
    pub(crate) unknown: usize,
}

impl std::fmt::Display for LeftoverCensus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::error::write_census(f, self.held, self.busy, self.unknown)
    }
}

/// Why a listed sandbox is not paused as a leftover, or that it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Pausable,
    Held,
    Busy,
    Unknown,
    /// Not a candidate at all: this process's own scope, or not persistent.
    Ignored,
}

impl Inner {
    /// Pauses one leftover of this profile (see the module docs), the one used longest ago
    /// first; its id, or `None` with the census of what stayed running. One list request;
    /// nothing at all with sandbox arbitration.
    pub(super) fn pause_leftover(&self) -> (Option<SandboxId>, LeftoverCensus) {
        let mut census = LeftoverCensus::default();
        if !matches!(self.config.writer_arbitration, WriterArbitration::Host) {
            return (None, census);
        }
        let Ok(client) = self.client() else {
            return (None, census);
        };
        let profile = ProfileDigest::of(&self.scope.profile_home.to_string_lossy());
        let mut query = ListQuery::all();
        query.metadata = BTreeMap::from([(PROFILE_KEY.to_owned(), profile.to_hex())]);
        query.state = StateFilter::Running;
        let listed: Vec<ListedSandbox> = match self.block_on(client.list(query).try_collect()) {
            Ok(listed) => listed,
            Err(error) => {
                tracing::debug!(
                    "listing this profile's sandboxes for a leftover to pause failed: {}",
                    ErrorChain(&error)
                );
                return (None, census);
            }
        };
        let ours = self.services.fleet.scopes();
        let mut candidates: Vec<(SystemTime, ListedSandbox, ScopeFiles)> = Vec::new();
        for sandbox in listed {
            let Ok(identity) = IdentityMetadata::from_map(&sandbox.metadata) else {
                continue;
            };
            let files = self.files_of(&identity.digest);
            let (standing, last_used) = standing(&identity, &files, &ours);
            match standing {
                Standing::Pausable => {
                    candidates.push((last_used.unwrap_or(SystemTime::UNIX_EPOCH), sandbox, files))
                }
                Standing::Held => census.held += 1,
                Standing::Busy => census.busy += 1,
                Standing::Unknown => census.unknown += 1,
                Standing::Ignored => {}
            }
        }
        candidates.sort_by_key(|(last_used, ..)| *last_used);
        for (_, sandbox, files) in candidates {
            if let Some(id) = self.pause_one_leftover(&client, &sandbox.sandbox_id, &files) {
                return (Some(id), census);
            }
            census.held += 1;
        }
        (None, census)
    }

    /// The coordination files of another scope of this profile (the same directory as this
    /// backend's own).
    fn files_of(&self, digest: &ScopeDigest) -> ScopeFiles {
        let dir = self
            .config
            .coordination_dir
            .clone()
            .unwrap_or_else(|| self.scope.profile_home.join("cache").join("e2b"));
        ScopeFiles::new(dir, ScopeKey::from_bytes(*digest.as_bytes()))
    }

    /// Takes the scope's writer role, checks its activity again, pauses the sandbox and
    /// gives the role back. `None` when the role is taken meanwhile or the pause fails.
    fn pause_one_leftover(
        &self,
        client: &e2b_client::Client,
        id: &SandboxId,
        files: &ScopeFiles,
    ) -> Option<SandboxId> {
        let lease = match files.try_acquire_writer() {
            Ok(LeaseRole::Writer(lease)) if lease.degradation().is_none() => lease,
            // A session took it meanwhile, or this host cannot lock: not a leftover to pause.
            _ => return None,
        };
        if files
            .activity()
            .ok()
            .flatten()
            .is_some_and(|record| record.command_running())
        {
            return None;
        }
        let paused = self.block_on(client.pause(id));
        // Given back unchanged: no transition was begun, the markers stay as they were.
        lease.release();
        match paused {
            Ok(_) => {}
            Err(error) if error.is_not_found() => {}
            Err(error) => {
                tracing::debug!(sandbox_id = %id, "pausing a leftover sandbox for the account's limit failed: {}", ErrorChain(&error));
                return None;
            }
        }
        tracing::info!(
            sandbox_id = %id,
            "E2B sandbox {id} paused to free a slot under the account's limit of concurrently running sandboxes: no live session holds it (an earlier Hermes process left it running); its session's next command resumes it"
        );
        Some(id.clone())
    }
}

/// Where a listed sandbox of this profile stands, and when its scope was last used as far
/// as this host's activity record says.
fn standing(
    identity: &IdentityMetadata,
    files: &ScopeFiles,
    ours: &[ScopeDigest],
) -> (Standing, Option<SystemTime>) {
    if identity.mode != Mode::Persistent || ours.contains(&identity.digest) {
        return (Standing::Ignored, None);
    }
    if !files.known_on_host() {
        return (Standing::Unknown, None);
    }
    match files.writer_status() {
        Ok(WriterStatus::Free) => {}
        Ok(WriterStatus::Held) => return (Standing::Held, None),
        Ok(WriterStatus::Unknown(_)) | Err(_) => return (Standing::Unknown, None),
    }
    let activity = files.activity().ok().flatten();
    if activity
        .as_ref()
        .is_some_and(|record| record.command_running())
    {
        return (Standing::Busy, None);
    }
    (
        Standing::Pausable,
        activity.map(|record| record.last_used()),
    )
}
