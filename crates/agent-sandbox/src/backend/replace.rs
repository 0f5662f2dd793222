//! Replacing the scope's sandbox, the shared end of a rollback and an adoption: recover the
//! old sandbox's Hermes state, checkpoint it, bring in the new one, retire the old one (the
//! order and why are in `checkpoint.rs`).

use e2b_client::{Client, SandboxId, StartOptions};
use sandbox_identity::{CheckpointReason, LeaseTracker, SUPERSEDES_KEY};

use super::egress::EgressKnown;
use super::{Attached, Inner, Phase, Role, TRANSFER_WINDOW, bump};
use crate::checkpoint::{Checkpoint, RollbackReport};
use crate::error::{CheckpointRefusal, Error};
use crate::report::{Origin, RecoverySummary};

/// The output a state-root clearing may print before it is refused.
const CLEAR_OUTPUT_LIMIT: u64 = 64 * 1024;

/// What replaces the scope's sandbox.
pub(super) enum Replacement {
    /// A new sandbox from this checkpoint (rollback).
    Restore(Checkpoint),
    /// A fork's branch (adoption); the other branches are killed.
    Adopt {
        checkpoint: Checkpoint,
        chosen: SandboxId,
        others: Vec<SandboxId>,
    },
}

impl Inner {
    /// Recovers the scope's `skills/` and `memories/` from the attached sandbox into the host
    /// (the three-way recovery of a bring-up, S5/S6): one start request streaming them. The
    /// caller's pull hook is not needed: everything a rollback keeps of the old sandbox's
    /// Hermes state is under those two roots (R8).
    fn recover_before_retiring(&self, attached: &mut Attached) -> Result<RecoverySummary, Error> {
        self.top_up_lease(attached, TRANSFER_WINDOW)?;
        self.recover_into_home(attached.id.as_str())
    }

    /// Replaces the attached sandbox (see the module docs for the order and why).
    pub(super) fn replace_sandbox(
        &self,
        state: &mut Phase,
        operation: &'static str,
        replacement: Replacement,
    ) -> Result<RollbackReport, Error> {
        let Phase::Attached(mut old) = std::mem::replace(state, Phase::Detached) else {
            unreachable!("the caller attached")
        };
        let undo_reason = match replacement {
            Replacement::Restore(_) => CheckpointReason::BeforeRollback,
            Replacement::Adopt { .. } => CheckpointReason::BeforeAdopt,
        };
        // Until the new sandbox exists, a failure leaves everything as it was.
        let prepared = (|| {
            let recovery = self.recover_before_retiring(&mut old)?;
            let undo = self.take_checkpoint(&old, operation, undo_reason, None)?;
            Ok::<_, Error>((recovery, undo))
        })();
        let (recovery, undo) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                *state = Phase::Attached(old);
                return Err(error);
            }
        };
        let old_id = old.id.clone();
        let client = old.client.clone();
        let mut warnings = Vec::new();
        // The digest of the policy a restored sandbox is created with.
        let mut created_egress = String::new();
        let (restored, new_id, created) = match replacement {
            Replacement::Restore(checkpoint) => {
                let options = match self
                    .create_options(&checkpoint.snapshot_id, [(SUPERSEDES_KEY, old_id.as_str())])
                {
                    Ok(options) => options,
                    Err(error) => {
                        *state = Phase::Attached(old);
                        return Err(error);
                    }
                };
                created_egress = options
                    .metadata
                    .get(crate::egress::EGRESS_KEY)
                    .cloned()
                    .unwrap_or_default();
                bump(&self.stats.creates);
                let (mut lease, request) = self.opening_lease();
                let mut options = options;
                options.timeout = Some(request.timeout());
                // The restored sandbox runs beside the old one until the old is killed: a
                // start under the account's limit like any create (L14).
                let created = self.within_limit(operation, Some(&old_id), || {
                    self.block_on(client.create(options.clone()))
                        .map_err(|source| Error::e2b(operation, Some(old_id.as_str()), source))
                });
                match created {
                    Ok(info) => {
                        lease.confirm(&request);
                        // The create's answer carries envd's address: no connect needed.
                        let sandbox = client.sandbox(info.envd_access()).map_err(|source| {
                            Error::e2b(operation, Some(info.sandbox_id.as_str()), source)
                        });
                        (checkpoint, info.sandbox_id, Some((sandbox, lease)))
                    }
                    Err(error) => {
                        *state = Phase::Attached(old);
                        return Err(error);
                    }
                }
            }
            Replacement::Adopt {
                checkpoint,
                chosen,
                others,
            } => {
                // Every other branch of the scope first, this fork's and any an earlier,
                // interrupted fork left: with the parent gone, a branch left would be as
                // adoptable as the chosen one (R6). One list finds the leftovers.
                let mut others = others;
                match self.live_branches(&client, operation) {
                    Ok(found) => {
                        for id in found {
                            if id != chosen && !others.contains(&id) {
                                others.push(id);
                            }
                        }
                    }
                    Err(error) => {
                        *state = Phase::Attached(old);
                        return Err(error);
                    }
                }
                let (_, failed) = self.kill_all(&client, &others);
                if let Some((id, why)) = failed.into_iter().next() {
                    *state = Phase::Attached(old);
                    return Err(Error::CheckpointRefused {
                        operation,
                        sandbox_id: Some(old_id.as_str().to_owned()),
                        reason: CheckpointRefusal::NotABranch {
                            sandbox_id: format!("{id} (its kill failed: {why})"),
                        },
                    });
                }
                (checkpoint, chosen, None)
            }
        };
        // The old sandbox goes: its grant first, then the sandbox. A kill E2B refuses leaves
        // it superseded (rollback) and it is retired by the next bring-up.
        self.fence_release(&old);
        self.clear_transport();
        let role = match std::mem::replace(&mut old.role, Role::Reader) {
            Role::Writer(lease) | Role::PendingWriter(lease) => Role::PendingWriter(lease),
            _ => Role::Owner { pushed: false },
        };
        // Made from a checkpoint of this scope (same template, same user): its home is the
        // replaced sandbox's, so no probe asks for it again (L13).
        if let Some(files) = &self.files {
            crate::home::HomeCache::new(files.dir()).put(new_id.as_str(), &old.info.home);
        }
        drop(old);
        // The old sandbox's kill goes out beside the new one's first requests: once A is
        // superseded (or every other branch is gone) no order of the two is unsafe, and a
        // crash between them leaves what the next bring-up resolves (R5).
        let kill_old = || self.kill_all(&client, std::slice::from_ref(&old_id));
        // A sandbox created just now has the policy in force; a fork branch made earlier may
        // not (the policy may have changed since), so it is updated once (X9).
        let new_sandbox = match created {
            Some((sandbox, lease)) => {
                sandbox.map(|sandbox| (sandbox, lease, EgressKnown::Created(created_egress)))
            }
            None => self
                .connect_new(&client, &new_id, operation)
                .map(|(sandbox, lease)| (sandbox, lease, EgressKnown::Stamped(None))),
        };
        let (sandbox, lease, egress) = match new_sandbox {
            Ok(new_sandbox) => new_sandbox,
            Err(error) => {
                kill_old();
                return Err(error);
            }
        };
        let attached = self.attached(
            client.clone(),
            sandbox,
            lease,
            role,
            Origin::Restored,
            false,
            None,
            egress,
        );
        let mut attached = match attached {
            Ok(attached) => attached,
            Err(error) => {
                kill_old();
                return Err(error);
            }
        };
        attached.fresh = true;
        // The state roots are under the home: known before anything is removed.
        if let Err(error) = self.settle_home(&mut attached) {
            kill_old();
            return Err(error);
        }
        let (cleared, (_, failed)) = self.block_on(futures::future::join(
            self.clear_state_roots(&attached, operation),
            self.kill_all_async(&client, std::slice::from_ref(&old_id)),
        ));
        warn_unkilled(&mut warnings, failed);
        cleared?;
        *state = Phase::Attached(Box::new(attached));
        let Phase::Attached(attached) = state else {
            unreachable!("set just above")
        };
        self.establish(attached)?;
        Ok(RollbackReport {
            restored,
            undo,
            retired_sandbox: old_id.as_str().to_owned(),
            sandbox_id: new_id.as_str().to_owned(),
            recovery,
            warnings,
        })
    }

    /// Connects to the sandbox that replaces the old one (its envd access, and a lease).
    fn connect_new(
        &self,
        client: &Client,
        id: &SandboxId,
        operation: &'static str,
    ) -> Result<(e2b_client::Sandbox, LeaseTracker), Error> {
        let (sandbox, lease, _) = self.within_limit(operation, Some(id), || {
            self.block_on(self.connect_async(client, id, operation))
        })?;
        Ok((sandbox, lease))
    }

    /// Empties `skills/` and `memories/` of the new sandbox: they are the checkpoint's (or
    /// the branch's) and older than the host's, which the bring-up pushes next; left in
    /// place, a later recovery would take them for the agent's new work (R8).
    async fn clear_state_roots(
        &self,
        attached: &Attached,
        operation: &'static str,
    ) -> Result<(), Error> {
        let home = attached.info.remote_hermes_home.trim_end_matches('/');
        if home.is_empty() || !crate::home::is_normalised_absolute(home) {
            return Err(Error::UntrustedAnswer {
                operation,
                sandbox_id: attached.id.as_str().to_owned(),
                reason: "the state root to empty is not an absolute, normalised path".to_owned(),
            });
        }
        let mut args = vec!["-rf".to_owned(), "--".to_owned()];
        args.extend(
            recovery::RECOVERABLE_ROOTS
                .iter()
                .map(|root| format!("{home}/{root}")),
        );
        let options = StartOptions::exec("/bin/rm".to_owned(), args);
        run_checked(
            attached,
            options,
            CLEAR_OUTPUT_LIMIT,
            operation,
            "clear state roots",
        )
        .await
        .map(drop)
    }
}

/// Runs a command of the backend's own in `attached` to its end: a request that fails names
/// `operation`, a non-zero exit `step` (with the start of its stderr).
pub(super) async fn run_checked(
    attached: &Attached,
    options: StartOptions,
    output_limit: u64,
    operation: &'static str,
    step: &'static str,
) -> Result<e2b_client::CommandOutput, Error> {
    let id = attached.id.as_str();
    let output = attached
        .sandbox
        .run(options, output_limit)
        .await
        .map_err(|source| Error::e2b(operation, Some(id), source))?;
    if output.end.exit_code != 0 {
        return Err(Error::SandboxCommand {
            operation: step,
            sandbox_id: id.to_owned(),
            exit_code: output.end.exit_code,
            stderr: String::from_utf8_lossy(&output.stderr)
                .chars()
                .take(300)
                .collect(),
        });
    }
    Ok(output)
}

/// Warns about each replaced sandbox whose kill failed.
fn warn_unkilled(warnings: &mut Vec<String>, failed: Vec<(String, String)>) {
    for (id, why) in failed {
        warnings.push(format!(
            "the replaced sandbox {id} could not be killed ({why}); it is never adopted again and the next bring-up retires it"
        ));
    }
}
