//! The state protocol around commands: the writer's bring-up, the ephemeral owner's push,
//! and the per-command gates (reader admission) and sync (writer, owner).

use std::sync::PoisonError;
use std::time::Duration;

use writer_lease::{Admission, Role as LeaseRole, WriterLease, WriterPhase, WriterStatus};

use super::fence::CommitWhen;
use super::{Attached, Inner, RETRY_HINT, Role};
use crate::error::{Error, ErrorChain};
use crate::hooks::{HookError, PushKind};
use crate::report::RoleKind;
use crate::transport::StateTransport;

impl Inner {
    pub(super) fn current_transport(&self, id: &str) -> Result<StateTransport, Error> {
        self.handoff
            .transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed {
                operation: "state transfer",
                sandbox_id: Some(id.to_owned()),
            })
    }

    /// Runs a hook and folds in transport failures recorded while it ran.
    pub(super) fn run_hook(
        &self,
        operation: &'static str,
        id: &str,
        hook: impl FnOnce(&StateTransport) -> Result<(), HookError>,
    ) -> Result<(), Error> {
        let transport = self.current_transport(id)?;
        self.handoff
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.holder.step(Some(operation));
        let returned = hook(&transport);
        self.holder.step(None);
        let recorded = std::mem::take(
            &mut *self
                .handoff
                .failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut problems: Vec<String> = recorded.into_iter().map(|(_, text)| text).collect();
        if let Err(error) = returned {
            problems.push(error.to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::StateHook {
                operation,
                sandbox_id: id.to_owned(),
                detail: problems.join("; "),
            })
        }
    }

    /// The writer's bring-up (C3, C4, S5, S11, S2): mark dirty and invalidate the stamp,
    /// recover skills/ and memories/ from the sandbox (unless this process just created it),
    /// push, stamp prepared. On failure the
    /// role is released (C5) and the backend stays attached as a reader.
    pub(super) fn bring_up(
        &self,
        attached: &mut Attached,
        mut writer: WriterLease,
    ) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        let fresh = std::mem::take(&mut attached.fresh);
        // The scope note (for people, and the next attach's hint) is written on a thread of
        // its own beside the bring-up's requests and joined before the bring-up returns.
        let result = std::thread::scope(|scope| {
            let recovery = fresh.then(|| super::pull::nothing_to_recover(&id));
            let noted = scope.spawn(|| self.note_writer(&id, recovery));
            let result = (|| {
                // A writer from attach began its transition when it took the role.
                if writer.phase() != WriterPhase::InTransition {
                    writer
                        .begin_transition()
                        .map_err(|source| Error::Coordination {
                            operation: "begin writer transition",
                            sandbox_id: Some(id.clone()),
                            source,
                        })?;
                }
                // Sandbox arbitration: the record's grant before anything is read or written
                // (riding on the snapshot's Start when there is one to recover).
                if fresh {
                    self.fence_acquire(attached)?;
                    self.track_empty_push_base(&id);
                } else {
                    match self.acquire_and_recover(attached) {
                        Err(error) if error.is_sandbox_gone() => {
                            // Paused behind this session while its known lease still covered
                            // it (another session's close, L16, or a leftover's pause, L15):
                            // the connect resumes it; a sandbox really gone fails it.
                            attached.lease.forget();
                            self.top_up_lease(attached, std::time::Duration::ZERO)?;
                            self.acquire_and_recover(attached)?;
                        }
                        other => other?,
                    }
                }
                self.run_hook("initial push", &id, |t| {
                    self.hooks.push(t, PushKind::Initial)
                })?;
                self.fence_commit(
                    &attached.sandbox,
                    &mut attached.grant,
                    &id,
                    CommitWhen::Always,
                )?;
                self.store_push_base(&id);
                writer
                    .complete_push(&id)
                    .map_err(|source| Error::Coordination {
                        operation: "stamp prepared",
                        sandbox_id: Some(id.clone()),
                        source,
                    })?;
                Ok(())
            })();
            if let Err(panicked) = noted.join() {
                std::panic::resume_unwind(panicked);
            }
            result
        });
        match result {
            Ok(()) => {
                attached.role = Role::Writer(writer);
                attached.info.role = RoleKind::Writer;
                Ok(())
            }
            Err(error) => {
                writer.release();
                attached.grant = None;
                attached.role = Role::Reader;
                attached.info.role = RoleKind::Reader;
                Err(error)
            }
        }
    }

    pub(super) fn owner_push(&self, attached: &mut Attached) -> Result<(), Error> {
        let Role::Owner { pushed } = &mut attached.role else {
            return Ok(());
        };
        let (operation, kind) = if *pushed {
            ("sync", PushKind::Incremental)
        } else {
            ("initial push", PushKind::Initial)
        };
        let id = attached.id.as_str().to_owned();
        self.run_hook(operation, &id, |t| self.hooks.push(t, kind))?;
        *pushed = true;
        Ok(())
    }

    /// The per-command gates and sync; a writer fenced by another host becomes a reader.
    fn admit(&self, attached: &mut Attached) -> Result<(), Error> {
        let result = self.admit_role(attached);
        if let Err(error) = &result
            && error.is_fenced()
        {
            self.demote(attached, error);
        }
        result
    }

    fn admit_role(&self, attached: &mut Attached) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        match &mut attached.role {
            Role::Probe | Role::External | Role::PendingWriter(_) => Ok(()),
            Role::Owner { .. } => self.owner_push(attached),
            Role::Reader => {
                let files = self.files.as_ref().ok_or_else(|| Error::InvalidConfig {
                    reason: "a reader without coordination files".to_owned(),
                })?;
                if let Some(reason) = self.held_elsewhere() {
                    // Another host's grant, not lapsed yet: refused without a request.
                    return Err(Error::NotReady {
                        sandbox_id: Some(id),
                        reason,
                        retry_hint: RETRY_HINT.to_owned(),
                    });
                }
                // While the writer role is held (a reader's steady state), trying to take it
                // cannot succeed: a shared look at the lock costs half the full attempt (which
                // closes the gate first). A role freed just after the look is taken over at the
                // next command, as when the attempt itself loses that race.
                let held = matches!(files.writer_status(), Ok(WriterStatus::Held));
                let role = if held {
                    LeaseRole::Reader
                } else {
                    files
                        .try_acquire_writer()
                        .map_err(|source| Error::Coordination {
                            operation: "acquire writer role",
                            sandbox_id: Some(id.clone()),
                            source,
                        })?
                };
                if let LeaseRole::Writer(writer) = role {
                    // Hand-off: a full recover-then-push (C4).
                    return self.bring_up(attached, writer);
                }
                match files.admission(&id) {
                    Admission::Admitted { .. } => Ok(()),
                    Admission::Refused(refusal) => {
                        if matches!(refusal, writer_lease::Refusal::OtherSandbox) {
                            attached.stale = true;
                        }
                        Err(Error::NotReady {
                            sandbox_id: Some(id),
                            reason: refusal.to_string(),
                            retry_hint: RETRY_HINT.to_owned(),
                        })
                    }
                }
            }
            Role::Writer(writer) => {
                let synced = self
                    .run_hook("sync", &id, |t| self.hooks.push(t, PushKind::Incremental))
                    .and_then(|()| {
                        let when = CommitWhen::StagedOrDue;
                        self.fence_commit(&attached.sandbox, &mut attached.grant, &id, when)
                    });
                match synced {
                    Ok(()) => {
                        self.store_push_base(&id);
                        if writer.phase() == WriterPhase::Stale {
                            writer
                                .record_sync_success()
                                .map_err(|source| Error::Coordination {
                                    operation: "clear dirty marker",
                                    sandbox_id: Some(id.clone()),
                                    source,
                                })?;
                        }
                        Ok(())
                    }
                    Err(error) => {
                        if let Err(marker) = writer.record_sync_failure() {
                            tracing::warn!(sandbox_id = %id, "E2B mark scope dirty failed: {}", ErrorChain(&marker));
                        }
                        Err(error)
                    }
                }
            }
        }
    }

    /// Lease, then gates and sync, then the lease again, for an operation that may take
    /// `deadline`. The first top-up resumes a paused sandbox and keeps it alive through the
    /// sync; the second is computed from the clock after the sync (L5), so an upload longer
    /// than the command grace cannot push the command's end past the known expiry. In steady
    /// state both find the expiry covered and send nothing.
    pub(super) fn prepare(&self, attached: &mut Attached, deadline: Duration) -> Result<(), Error> {
        self.top_up_lease(attached, deadline)?;
        if let Err(error) = self.admit(attached) {
            if error.is_state_failure() {
                // The sandbox may have paused or vanished under a lease we believed covered:
                // the next use reconnects first, which tells.
                attached.lease.forget();
            }
            return Err(error);
        }
        self.top_up_lease(attached, deadline)
    }
}
