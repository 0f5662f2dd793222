//! Letting go: cleanup (wait, pull, release or kill), the finalizer path, and detaching
//! from a sandbox that is gone.

use std::sync::PoisonError;

use e2b_client::KillOutcome;

use super::{Attached, Backend, Inner, Phase, Role, bump};
use crate::config::WriterArbitration;
use crate::error::{Error, ErrorChain};
use crate::note::{NOTE_PULL, stamped};
use crate::report::{CleanupReport, KillOutcomeReport, PullOutcome, TeardownRecovery};

impl Backend {
    /// Cleanup for session close, idle reaping and exit (L7, L8): waits for in-flight
    /// commands; persistent writer: pull, release the role, never pause or kill (L3);
    /// ephemeral: pull, kill (L4); probe: kill without a pull (L11); reader and attach mode:
    /// detach only (L12). Never creates or replaces a sandbox; repeated or after the sandbox
    /// vanished it does nothing harmful. Failures are logged and reported, never raised:
    /// release and destruction always run.
    pub fn cleanup(&self) -> CleanupReport {
        let inner = &self.inner;
        let attached = {
            let mut state = inner.lock_state("cleanup");
            match std::mem::replace(&mut *state, Phase::Closing(None)) {
                Phase::Detached => {
                    *state = Phase::Closed { sandbox_id: None };
                    return CleanupReport {
                        sandbox_id: None,
                        repeated: false,
                        pull: PullOutcome::NotAttempted,
                        recovery: TeardownRecovery::NotAttempted,
                        sandbox: KillOutcomeReport::LeftRunning,
                    };
                }
                Phase::Attached(attached) => {
                    let id = attached.id.as_str().to_owned();
                    *state = Phase::Closing(Some(attached));
                    id
                }
                previous @ (Phase::Closing(_) | Phase::Closed { .. }) => {
                    let sandbox_id = match &previous {
                        Phase::Closing(Some(attached)) => Some(attached.id.as_str().to_owned()),
                        Phase::Closed { sandbox_id } => sandbox_id.clone(),
                        _ => None,
                    };
                    *state = previous;
                    return CleanupReport {
                        sandbox_id,
                        repeated: true,
                        pull: PullOutcome::NotAttempted,
                        recovery: TeardownRecovery::NotAttempted,
                        sandbox: KillOutcomeReport::LeftRunning,
                    };
                }
            }
        };
        // Live processes' followers waiting for a use see the scope closing and stop.
        inner.live.used();
        // Outside the state lock: commands finishing need nothing from it.
        inner.inflight.wait_idle();
        // The last command's end on record now, not after the writer's gathering: a process
        // that exits right after its cleanup must not leave the scope reading "running".
        if let Some(recorder) = &inner.activity {
            super::record_activity(recorder.flush());
        }
        let taken = {
            let mut state = inner.lock_state("cleanup");
            let previous = std::mem::replace(
                &mut *state,
                Phase::Closed {
                    sandbox_id: Some(attached.clone()),
                },
            );
            match previous {
                Phase::Closing(Some(attached)) => Some(attached),
                _ => None,
            }
        };
        let Some(attached) = taken else {
            return CleanupReport {
                sandbox_id: Some(attached),
                repeated: true,
                pull: PullOutcome::NotAttempted,
                recovery: TeardownRecovery::NotAttempted,
                sandbox: KillOutcomeReport::LeftRunning,
            };
        };
        inner.teardown(*attached)
    }

    /// The finalizer path, for a dropped last reference (L9): releases the writer role
    /// locally and never pulls state; an ephemeral or probe sandbox is still killed. Does not
    /// wait for commands. Safe to call from any thread, including async ones (the kill is
    /// then sent in the background).
    pub fn finalize(&self) {
        let inner = &self.inner;
        let previous = {
            let mut state = inner.lock_state("finalize");
            let sandbox_id = match &*state {
                Phase::Attached(attached) | Phase::Closing(Some(attached)) => {
                    Some(attached.id.as_str().to_owned())
                }
                Phase::Closed { sandbox_id } => sandbox_id.clone(),
                Phase::Detached | Phase::Closing(None) => None,
            };
            std::mem::replace(&mut *state, Phase::Closed { sandbox_id })
        };
        inner.clear_transport();
        inner.live.used();
        let attached = match previous {
            Phase::Attached(attached) | Phase::Closing(Some(attached)) => attached,
            _ => return,
        };
        let Attached {
            client, id, role, ..
        } = *attached;
        match role {
            Role::Writer(lease) | Role::PendingWriter(lease) => lease.release(),
            Role::Owner { .. } | Role::Probe => {
                bump(&inner.stats.sandbox_kills);
                let kill = async move {
                    if let Err(error) = client.kill(&id).await {
                        tracing::warn!(sandbox_id = %id, "E2B kill failed in finalizer: {}", ErrorChain(&error));
                    }
                };
                if tokio::runtime::Handle::try_current().is_ok() {
                    inner.services.runtime.spawn(kill);
                } else {
                    inner.services.runtime.block_on(kill);
                }
            }
            Role::Reader | Role::External => {}
        }
    }
}

impl Inner {
    /// Lets the attached sandbox go without touching it: the writer role is released, the
    /// transport cleared; the next use attaches afresh and reports what it replaced.
    pub(super) fn detach(&self, state: &mut Phase) {
        let Phase::Attached(attached) = std::mem::replace(state, Phase::Detached) else {
            return;
        };
        self.clear_transport();
        let id = attached.id.as_str().to_owned();
        tracing::warn!(sandbox_id = %id, "E2B sandbox {id} is gone or no longer prepared; the next use attaches afresh");
        *self
            .handoff
            .replaced
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(id);
        // Dropping the attachment drops its writer lease, if any.
        drop(attached);
    }

    fn teardown(&self, mut attached: Attached) -> CleanupReport {
        let id = attached.id.as_str().to_owned();
        self.fence_before_pull(&mut attached);
        let (pull, recovery) = match &attached.role {
            Role::Writer(_) | Role::Owner { .. } if self.unchanged_since_attach(&attached) => {
                // Nothing ran since the bring-up made the sandbox's state the host's: a pull
                // would resume a paused sandbox to bring back nothing (L16).
                self.note(|note| {
                    note.set(
                        NOTE_PULL,
                        &stamped(&format!("unchanged in {id} since attach")),
                    )
                });
                (PullOutcome::Unchanged, TeardownRecovery::NotAttempted)
            }
            Role::Writer(_) | Role::Owner { .. } if !self.lease_live(&attached) => {
                match self.resume_for_pull(&id) {
                    Ok(()) => self.pull_at_teardown(&id),
                    Err(deferred) => (deferred, TeardownRecovery::NotAttempted),
                }
            }
            Role::Writer(_) | Role::Owner { .. } => self.pull_at_teardown(&id),
            Role::PendingWriter(_) | Role::Reader | Role::Probe | Role::External => {
                (PullOutcome::NotAttempted, TeardownRecovery::NotAttempted)
            }
        };
        self.fence_release(&attached);
        self.clear_transport();
        let paused = self.pause_at_close(&attached, &pull);
        let Attached { client, role, .. } = attached;
        let sandbox = match role {
            Role::Writer(lease) | Role::PendingWriter(lease) => {
                // Released after the pause: no session takes the scope up in between.
                lease.release();
                if paused {
                    KillOutcomeReport::Paused
                } else {
                    KillOutcomeReport::LeftRunning
                }
            }
            Role::Reader | Role::External => KillOutcomeReport::LeftRunning,
            Role::Owner { .. } | Role::Probe => {
                bump(&self.stats.sandbox_kills);
                match self.block_on(client.kill(&attached.id)) {
                    Ok(KillOutcome::Killed) => KillOutcomeReport::Killed,
                    Ok(KillOutcome::NotFound) => KillOutcomeReport::AlreadyGone,
                    Err(error) => {
                        let error = Error::e2b("kill", Some(&id), error);
                        let text = ErrorChain(&error).to_string();
                        tracing::error!(sandbox_id = %id, "{text}");
                        KillOutcomeReport::Failed(text)
                    }
                }
            }
        };
        CleanupReport {
            sandbox_id: Some(id),
            repeated: false,
            pull,
            recovery,
            sandbox,
        }
    }

    /// The caller's pull hook, then the backend's own recovery (L4).
    fn pull_at_teardown(&self, id: &str) -> (PullOutcome, TeardownRecovery) {
        if let Ok(transport) = self.current_transport(id) {
            transport.forget_transfer_connection();
        }
        let outcome = match self.run_hook("pull", id, |t| self.hooks.pull(t)) {
            Ok(()) => PullOutcome::Pulled,
            Err(error) => {
                let text = ErrorChain(&error).to_string();
                tracing::error!(sandbox_id = %id, "{text}");
                PullOutcome::Failed(text)
            }
        };
        let line = match &outcome {
            PullOutcome::Failed(text) => format!("failed from {id}: {text}"),
            _ => format!("pulled from {id}"),
        };
        self.note(|note| note.set(NOTE_PULL, &stamped(&line)));
        (outcome, self.recover_at_teardown(id))
    }

    /// Whether the sandbox's Hermes state is the host's as the bring-up left it: this
    /// process used it for nothing since it attached, and this host's activity record shows
    /// no command of another process since then either (L16).
    fn unchanged_since_attach(&self, attached: &Attached) -> bool {
        if attached.used {
            return false;
        }
        let Some(files) = &self.files else {
            return true;
        };
        match files.activity() {
            Ok(Some(record)) => {
                record.sandbox_id != attached.id.as_str()
                    || record.last_used() <= attached.attached_at
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Resumes a sandbox paused behind the backend (for the limit, or by E2B at lease end)
    /// for the teardown pull, within the account's limit. When the limit leaves no slot, the
    /// pull is deferred: nothing is lost, the state stays in the paused sandbox until its
    /// next use (resume recovery) or `hermes e2b pull`; the process says so once, at INFO
    /// (L16). Any other failure is left to the pull, which reports it as before.
    fn resume_for_pull(&self, id: &str) -> Result<(), PullOutcome> {
        let Ok(transport) = self.current_transport(id) else {
            return Ok(());
        };
        match transport.prepare_teardown_transfer() {
            Err(error) if error.is_concurrency_limit() => {
                let text = ErrorChain(&error).to_string();
                let earlier = self.services.fleet.defer_pull();
                if earlier == 0 {
                    tracing::info!(
                        sandbox_id = %id,
                        "E2B: the account's limit of concurrently running sandboxes leaves no slot to resume sandbox {id} and pull its Hermes state back at cleanup; it stays paused with its state (this process says this once; every sandbox deferred so is brought back by its session's next use, or now by `hermes e2b pull --task <task>`)"
                    );
                } else {
                    tracing::debug!(sandbox_id = %id, "E2B: pulling Hermes state back at cleanup deferred for the account's limit ({} deferred in this process)", earlier + 1);
                }
                self.note(|note| {
                    note.set(
                        NOTE_PULL,
                        &stamped(&format!(
                            "deferred from {id}: no slot under the account's limit"
                        )),
                    )
                });
                Err(PullOutcome::Deferred(text))
            }
            _ => Ok(()),
        }
    }

    /// Pauses a persistent writer's sandbox at close once its state is back on the host (or
    /// was never changed), so it frees its slot and its running cost at once rather than at
    /// lease end (L16). Only where no other session can be using it: host arbitration (the
    /// writer role, still held, keeps sessions of this host out), this process's commands
    /// all ended, and this host's activity record showing no command of another process.
    /// Whether it paused.
    fn pause_at_close(&self, attached: &Attached, pull: &PullOutcome) -> bool {
        let writer = matches!(attached.role, Role::Writer(_));
        let host_arbitration = matches!(self.config.writer_arbitration, WriterArbitration::Host);
        let state_home = matches!(pull, PullOutcome::Pulled | PullOutcome::Unchanged);
        if !writer || !host_arbitration || !state_home || !self.inflight.is_idle() {
            return false;
        }
        let busy_elsewhere = self.files.as_ref().is_some_and(|files| {
            files
                .activity()
                .ok()
                .flatten()
                .is_some_and(|record| record.command_running())
        });
        if busy_elsewhere {
            return false;
        }
        let id = &attached.id;
        match self.block_on(attached.client.pause(id)) {
            Ok(_) => {
                tracing::debug!(sandbox_id = %id, "E2B sandbox {id} paused at cleanup: its Hermes state is on the host and no session uses it");
                true
            }
            Err(error) => {
                tracing::debug!(sandbox_id = %id, "pausing sandbox {id} at cleanup failed (it runs on to its lease end): {}", ErrorChain(&error));
                false
            }
        }
    }

    /// After the caller's pull: the backend's own recovery of `skills/` and `memories/` from
    /// the sandbox (L4, S5, S6). The pull hook is the caller's engine and may map back only
    /// what it pushed (Hermes' never pushes `memories/`, and skips its pull entirely when it
    /// pushed nothing), so what the agent created in the sandbox would otherwise die with
    /// an ephemeral sandbox. Running after the pull, files the pull brought back compare as
    /// unchanged; what it left out is restored, or quarantined where the host differs.
    fn recover_at_teardown(&self, id: &str) -> TeardownRecovery {
        let result = self
            .current_transport(id)
            .and_then(|transport| transport.prepare_teardown_transfer())
            .and_then(|()| self.recover_into_home(id));
        match result {
            Ok(summary) => TeardownRecovery::Recovered(summary),
            Err(error) => {
                let text = ErrorChain(&error).to_string();
                tracing::error!(sandbox_id = %id, "E2B teardown recovery: {text}");
                TeardownRecovery::Failed(text)
            }
        }
    }
}
