//! Checkpoints, rollback, fork and adoption (contract R1–R9).
//!
//! A checkpoint is one E2B snapshot named by sandbox-identity's `CheckpointName`, so any host
//! finds the scope's checkpoints by listing snapshots. A rollback and an adoption replace the
//! scope's sandbox in an order that every crash leaves resolvable by the next bring-up:
//!
//! ```text
//! rollback: recover state from A -> snapshot A (undo) -> create B from the checkpoint,
//!           stamped `supersedes: A` -> (kill A | clear B's skills/ and memories/) -> bring-up
//! adopt:    recover state from A -> snapshot A (undo) -> list and kill every other branch
//!           -> (kill A | clear the branch's skills/ and memories/) -> bring-up
//! ```
//!
//! `(x | y)` go out together. Until A is killed, adoption keeps choosing A (a branch waits
//! while its parent lives) or B (A is superseded); the writer's next bring-up kills a
//! superseded A (R5). Which of the kill and the clear lands first does not matter: the
//! push comes after both.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use e2b_client::{
    Client, CreateOptions, KillOutcome, ListQuery, ListedSandbox, OnTimeout, PauseMemory,
    SandboxId, SnapshotQuery, StateFilter,
};
use futures::TryStreamExt;
use sandbox_identity::{
    BRANCH_KEY, CheckpointName, CheckpointReason, RESTORED_FROM_KEY, SCOPE_KEY,
};

use super::replace::Replacement;
use super::{Attached, Backend, Inner, Phase, Role, TRANSFER_WINDOW, bump};
use crate::checkpoint::{
    Branch, Checkpoint, CheckpointRequest, CheckpointTarget, Discarded, Fork, RollbackReport,
    TEMPLATE_KEY, beyond_keep, newest_first,
};
use crate::config::{SandboxMode, Scope};
use crate::error::{CheckpointRefusal, Error, ErrorChain};
use crate::hooks::NoStateHooks;

/// The most branches one fork makes (E2B's limit for its own fork call).
pub const MAX_BRANCHES: u32 = 100;

impl Backend {
    /// Takes a checkpoint of the scope's sandbox (R1, R2, R3): one snapshot request in steady
    /// state, after the scope's running commands ended (waiting up to `request.wait`).
    /// Attaches first if needed; only the scope's writer (or an ephemeral owner) may.
    pub fn checkpoint(&self, request: CheckpointRequest) -> Result<Checkpoint, Error> {
        const OP: &str = "checkpoint";
        let inner = &*self.inner;
        let mut state = inner.lock_state("checkpoint");
        let attached = inner.attach_to_change(&mut state, OP, request.wait)?;
        inner.top_up_lease(attached, TRANSFER_WINDOW)?;
        let label = request
            .label
            .as_deref()
            .and_then(CheckpointName::label_from);
        inner.take_checkpoint(attached, OP, request.reason, label)
    }

    /// The scope's checkpoints, newest first, from any host (R3): one paged list of E2B's
    /// snapshots, keeping those named for this scope. Needs no sandbox and attaches none.
    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>, Error> {
        let client = self.inner.client()?;
        self.inner.list_checkpoints(&client, "list checkpoints")
    }

    /// Deletes the scope's automatic checkpoints beyond the newest `keep` (R7); labelled ones
    /// are never deleted. Returns what it deleted. One list, then one delete per checkpoint.
    pub fn prune_checkpoints(&self, keep: usize) -> Result<Vec<Checkpoint>, Error> {
        const OP: &str = "prune checkpoints";
        let inner = &*self.inner;
        let client = inner.client()?;
        let all = inner.list_checkpoints(&client, OP)?;
        let mut deleted = Vec::new();
        for checkpoint in beyond_keep(&all, keep) {
            bump(&inner.stats.snapshot_deletes);
            match inner.block_on(client.delete_snapshot(&checkpoint.snapshot_id)) {
                Ok(_) => deleted.push(checkpoint.clone()),
                Err(source) => return Err(Error::e2b(OP, None, source)),
            }
        }
        Ok(deleted)
    }

    /// Makes a sandbox created from a checkpoint the scope's one sandbox (R4, R5, R8). The
    /// sandbox it replaces is recovered from first (its `skills/` and `memories/` reach the
    /// host), then checkpointed (the undo point in the report), then killed; the new one gets
    /// the host's Hermes state pushed into emptied `skills/` and `memories/`, while its
    /// workspace and packages are the checkpoint's.
    pub fn rollback(
        &self,
        target: CheckpointTarget,
        wait: Duration,
    ) -> Result<RollbackReport, Error> {
        const OP: &str = "rollback";
        let inner = &*self.inner;
        let mut state = inner.lock_state("rollback");
        let attached = inner.attach_to_change(&mut state, OP, wait)?;
        // A snapshot id that is one of the scope's checkpoint names says all a rollback needs;
        // a label or "latest" needs the list.
        let direct = match &target {
            CheckpointTarget::Named(name) => {
                Checkpoint::from_snapshot(name, &[], &inner.identity.digest())
            }
            CheckpointTarget::Latest => None,
        };
        let all = match direct {
            Some(checkpoint) => vec![checkpoint],
            None => inner.list_checkpoints(&attached.client, OP)?,
        };
        let restored = target
            .pick(&all)
            .cloned()
            .ok_or_else(|| Error::CheckpointRefused {
                operation: OP,
                sandbox_id: Some(attached.id.as_str().to_owned()),
                reason: CheckpointRefusal::NoCheckpoint {
                    target: target.describe(),
                },
            })?;
        inner.replace_sandbox(&mut state, OP, Replacement::Restore(restored))
    }

    /// Forks the scope's current state into `count` branches (R6): one checkpoint (reason
    /// `fork`), then `count` sandboxes created from it at once, each stamped as a branch of
    /// the scope's sandbox, so no bring-up adopts one while that sandbox exists. Each branch
    /// starts or fails on its own.
    pub fn fork(&self, count: u32, wait: Duration) -> Result<Fork, Error> {
        const OP: &str = "fork";
        if !(1..=MAX_BRANCHES).contains(&count) {
            return Err(Error::InvalidConfig {
                reason: format!("a fork makes 1 to {MAX_BRANCHES} branches, not {count}"),
            });
        }
        let inner = &*self.inner;
        let mut state = inner.lock_state("fork");
        let attached = inner.attach_to_change(&mut state, OP, wait)?;
        inner.top_up_lease(attached, TRANSFER_WINDOW)?;
        let checkpoint = inner.take_checkpoint(attached, OP, CheckpointReason::Fork, None)?;
        let parent = attached.id.as_str().to_owned();
        // The branches are created under the policy and credentials in force (X9, X16).
        let options =
            inner.create_options(&checkpoint.snapshot_id, [(BRANCH_KEY, parent.as_str())])?;
        let creates = (0..count as usize).map(|index| {
            let options = options.clone();
            let client = attached.client.clone();
            bump(&inner.stats.creates);
            async move {
                let created = client.create(options).await;
                (index, created)
            }
        });
        let answers = inner.block_on(futures::future::join_all(creates));
        let branches = answers
            .into_iter()
            .map(|(index, created)| {
                created
                    .map(|info| Branch {
                        index,
                        sandbox_id: info.sandbox_id,
                    })
                    .map_err(|source| Error::e2b(OP, Some(&parent), source))
            })
            .collect();
        Ok(Fork {
            checkpoint,
            parent,
            branches,
        })
    }

    /// A backend for one branch, to run commands in it (attach mode: it touches no scope file
    /// and never kills the branch; L12).
    pub fn branch(&self, branch: &Branch) -> Result<Backend, Error> {
        let mut config = self.inner.config.clone();
        config.mode = SandboxMode::Attach {
            sandbox_id: branch.sandbox_id.clone(),
        };
        Backend::new(
            config,
            Scope {
                task_id: format!("{}-branch-{}", self.inner.scope.task_id, branch.index),
                ..self.inner.scope.clone()
            },
            self.inner.services.clone(),
            std::sync::Arc::new(NoStateHooks),
        )
    }

    /// Makes `chosen`, a started branch of `fork`, the scope's sandbox (R6, R8): like a
    /// rollback, the scope's sandbox is recovered from and checkpointed first; then the other
    /// branches and the scope's sandbox are killed, in that order, so the chosen branch is
    /// what any bring-up adopts from then on.
    pub fn adopt(
        &self,
        fork: &Fork,
        chosen: &Branch,
        wait: Duration,
    ) -> Result<RollbackReport, Error> {
        const OP: &str = "adopt";
        let inner = &*self.inner;
        let mut state = inner.lock_state("adopt");
        let attached = inner.ensure_attached(&mut state, OP)?;
        inner.may_change_scope(attached, OP)?;
        if !fork.started().any(|branch| branch == chosen) || fork.parent != attached.id.as_str() {
            return Err(Error::CheckpointRefused {
                operation: OP,
                sandbox_id: Some(attached.id.as_str().to_owned()),
                reason: CheckpointRefusal::NotABranch {
                    sandbox_id: chosen.sandbox_id.as_str().to_owned(),
                },
            });
        }
        inner.quiesce(attached, OP, wait)?;
        let others = fork
            .started()
            .filter(|branch| *branch != chosen)
            .map(|branch| branch.sandbox_id.clone())
            .collect();
        inner.replace_sandbox(
            &mut state,
            OP,
            Replacement::Adopt {
                checkpoint: fork.checkpoint.clone(),
                chosen: chosen.sandbox_id.clone(),
                others,
            },
        )
    }

    /// Kills every started branch of `fork` (those already gone count as killed). Needs no
    /// role: branches are never the scope's while its sandbox lives.
    pub fn discard(&self, fork: &Fork) -> Result<Discarded, Error> {
        let inner = &*self.inner;
        let client = inner.client()?;
        let ids: Vec<SandboxId> = fork.started().map(|b| b.sandbox_id.clone()).collect();
        let (killed, failed) = inner.kill_all(&client, &ids);
        Ok(Discarded { killed, failed })
    }
}

impl Inner {
    /// What every change of the scope does first: attach, check the role (R1), then wait for
    /// the scope's running commands (R2). The state lock the caller holds stays held, so no
    /// command starts until the change is done.
    pub(super) fn attach_to_change<'a>(
        &self,
        state: &'a mut Phase,
        operation: &'static str,
        wait: Duration,
    ) -> Result<&'a mut Attached, Error> {
        let attached = self.ensure_attached(state, operation)?;
        self.may_change_scope(attached, operation)?;
        self.quiesce(attached, operation, wait)?;
        Ok(attached)
    }

    /// Only the scope's writer (or an ephemeral sandbox's owner) changes the scope (R1).
    pub(super) fn may_change_scope(
        &self,
        attached: &Attached,
        operation: &'static str,
    ) -> Result<(), Error> {
        let refusal = match attached.role {
            Role::Writer(_) | Role::Owner { .. } => return Ok(()),
            // A delegated child's fork this process made is its own to fork again (a
            // grandchild's, R15).
            Role::External if self.subagents.fork_of.get().is_some() => return Ok(()),
            Role::External => CheckpointRefusal::NoScope("a backend attached to a given sandbox"),
            Role::Probe => CheckpointRefusal::NoScope("the probe scope"),
            Role::Reader | Role::PendingWriter(_) => CheckpointRefusal::NotWriter,
        };
        Err(Error::CheckpointRefused {
            operation,
            sandbox_id: Some(attached.id.as_str().to_owned()),
            reason: refusal,
        })
    }

    /// Waits up to `wait` for the scope's commands to end (R2). The state lock is held, so
    /// none starts meanwhile; commands end on their pump without it.
    pub(super) fn quiesce(
        &self,
        attached: &Attached,
        operation: &'static str,
        wait: Duration,
    ) -> Result<(), Error> {
        self.inflight
            .wait_idle_for(wait)
            .map_err(|commands| Error::CheckpointRefused {
                operation,
                sandbox_id: Some(attached.id.as_str().to_owned()),
                reason: CheckpointRefusal::CommandsRunning {
                    commands,
                    waited: wait,
                },
            })
    }

    /// The next checkpoint name of the attached sandbox. Times only move forward within this
    /// process, so two checkpoints never share a name (a second snapshot under one name would
    /// replace the first at E2B).
    fn checkpoint_name(
        &self,
        source: &SandboxId,
        reason: CheckpointReason,
        label: Option<String>,
    ) -> CheckpointName {
        let now = self
            .services
            .clock
            .wall()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let last = &self.last_checkpoint_ms;
        let mut millis = now;
        let _ = last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |previous| {
            millis = now.max(previous + 1);
            Some(millis)
        });
        CheckpointName {
            scope: CheckpointName::scope_tag(&self.identity.digest()),
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(millis),
            reason,
            source: source.as_str().to_ascii_lowercase(),
            label,
        }
    }

    /// One snapshot request.
    pub(super) fn take_checkpoint(
        &self,
        attached: &Attached,
        operation: &'static str,
        reason: CheckpointReason,
        label: Option<String>,
    ) -> Result<Checkpoint, Error> {
        let name = self.checkpoint_name(&attached.id, reason, label);
        bump(&self.stats.snapshots);
        let info = self
            .block_on(
                attached
                    .client
                    .create_snapshot(&attached.id, Some(&name.encode())),
            )
            .map_err(|source| Error::e2b(operation, Some(attached.id.as_str()), source))?;
        Ok(Checkpoint::named(info.snapshot_id, name))
    }

    fn list_checkpoints(
        &self,
        client: &Client,
        operation: &'static str,
    ) -> Result<Vec<Checkpoint>, Error> {
        bump(&self.stats.snapshot_lists);
        let digest = self.identity.digest();
        let listed = self
            .block_on(
                client
                    .list_snapshots(SnapshotQuery::all())
                    .try_collect::<Vec<_>>(),
            )
            .map_err(|source| Error::e2b(operation, None, source))?;
        let mut own: Vec<Checkpoint> = listed
            .iter()
            .filter_map(|info| Checkpoint::from_snapshot(&info.snapshot_id, &info.names, &digest))
            .collect();
        newest_first(&mut own);
        Ok(own)
    }

    /// Create options for a sandbox of this scope made from a snapshot, with extra keys.
    pub(super) fn create_options<'a>(
        &self,
        snapshot_id: &str,
        extra: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<CreateOptions, Error> {
        let mut options = CreateOptions::new(snapshot_id.to_owned());
        let mut metadata =
            sandbox_identity::stamp_scope(&self.config.metadata, &self.identity).metadata;
        metadata.insert(RESTORED_FROM_KEY.to_owned(), snapshot_id.to_owned());
        metadata.insert(TEMPLATE_KEY.to_owned(), self.config.template.clone());
        for (key, value) in extra {
            metadata.insert(key.to_owned(), value.to_owned());
        }
        options.metadata = metadata;
        options.timeout = Some(self.with_headroom(self.policy.baseline()));
        options.on_timeout = match self.config.mode {
            SandboxMode::Ephemeral { .. } => OnTimeout::Kill,
            _ => OnTimeout::Pause(PauseMemory::Discard),
        };
        options.allow_internet_access = Some(matches!(
            self.config.internet,
            sandbox_identity::InternetAccess::Allowed
        ));
        options.secure = Some(matches!(
            self.config.security,
            sandbox_identity::Security::Secure
        ));
        self.stamp_egress(&mut options)?;
        Ok(options)
    }

    /// The scope's sandboxes that are fork branches (of any parent), from one list.
    pub(super) fn live_branches(
        &self,
        client: &Client,
        operation: &'static str,
    ) -> Result<Vec<SandboxId>, Error> {
        let mut query = ListQuery::all();
        query.metadata = BTreeMap::from([(SCOPE_KEY.to_owned(), self.identity.digest().to_hex())]);
        query.state = StateFilter::Any;
        bump(&self.stats.lists);
        let listed = self
            .block_on(client.list(query).try_collect::<Vec<ListedSandbox>>())
            .map_err(|source| Error::e2b(operation, None, source))?;
        Ok(listed
            .into_iter()
            .filter(|listed| listed.metadata.contains_key(BRANCH_KEY))
            .map(|listed| listed.sandbox_id)
            .collect())
    }

    /// Kills each sandbox; a sandbox already gone counts as killed.
    pub(super) fn kill_all(
        &self,
        client: &Client,
        ids: &[SandboxId],
    ) -> (Vec<String>, Vec<(String, String)>) {
        self.block_on(self.kill_all_async(client, ids))
    }

    /// [`Self::kill_all`], to be joined with other requests.
    pub(super) async fn kill_all_async(
        &self,
        client: &Client,
        ids: &[SandboxId],
    ) -> (Vec<String>, Vec<(String, String)>) {
        let kills = ids.iter().map(|id| {
            bump(&self.stats.sandbox_kills);
            let client = client.clone();
            async move { (id.as_str().to_owned(), client.kill(id).await) }
        });
        let mut killed = Vec::new();
        let mut failed = Vec::new();
        for (id, outcome) in futures::future::join_all(kills).await {
            match outcome {
                Ok(KillOutcome::Killed | KillOutcome::NotFound) => killed.push(id),
                Err(error) => {
                    let error = Error::e2b("kill", Some(&id), error);
                    failed.push((id, ErrorChain(&error).to_string()));
                }
            }
        }
        (killed, failed)
    }
}
