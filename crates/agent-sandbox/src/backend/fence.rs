//! Fencing with the sandbox-held writer record (`writer_arbitration: sandbox`, contracts
//! C8–C11): the writer's acquire at bring-up, the commit of its staged pushes, renewal when
//! due, demotion when another host took over, and the release at teardown.
//!
//! Costs: the acquire is one Process/Start per bring-up, shared with the snapshot when the
//! bring-up recovers (a sandbox this process did not just create); a push with something
//! staged costs one Process/Start (its commit, which also renews); a command whose sync
//! staged nothing costs nothing extra unless the grant is older than [`renewal_period`], then
//! one renewal.
//! An idle writer sends nothing: its grant lapses, and its next command renews it if no other
//! host took over meanwhile, or is fenced.
//! A host refused by another's grant asks again at most once per renewal period (sooner when
//! the sandbox said the grant has fewer seconds left); its refused commands cost nothing.

use std::sync::PoisonError;
use std::time::Duration;

use e2b_client::Sandbox;
use writer_lease::{Generation, Holder, Verdict, WriterRecord};

use super::{Attached, Inner, RETRY_HINT, Role};
use crate::arbitration::{
    ANSWER_LIMIT, Ask, SandboxArbitration, acquire_then, parse_answer, renewal_period, staging_dir,
};
use crate::config::WriterArbitration;
use crate::error::{Error, ErrorChain};
use crate::report::RoleKind;
use crate::warn_once;

/// The writer's grant in the sandbox's record.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    generation: Generation,
    /// [`Clock::since_boot`](crate::Clock::since_boot) reading at the last grant or renewal:
    /// only paces renewals (expiry is the sandbox's to decide). It counts time suspended, so
    /// a writer resumed past its term renews (and learns of a takeover) before its next
    /// command runs.
    renewed: Duration,
}

/// When a commit is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CommitWhen {
    /// Always (the bring-up's push: its commit is what makes the state current).
    Always,
    /// Only when something was staged or the grant is due for renewal (per-command sync).
    StagedOrDue,
}

impl Inner {
    /// The grant's term when the sandbox arbitrates this scope's writer.
    pub(super) fn sandbox_term(&self) -> Option<Duration> {
        match self.config.writer_arbitration {
            WriterArbitration::Sandbox { term } if self.files.is_some() => Some(term),
            _ => None,
        }
    }

    fn holder(&self) -> Result<Holder, Error> {
        let mut holder = self
            .arbitration
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(holder) = &*holder {
            return Ok(holder.clone());
        }
        let dir = self
            .files
            .as_ref()
            .map(|files| files.dir().to_path_buf())
            .ok_or_else(|| Error::InvalidConfig {
                reason: "sandbox arbitration without coordination files".to_owned(),
            })?;
        let loaded = crate::arbitration::load_holder(&dir)?;
        *holder = Some(loaded.clone());
        Ok(loaded)
    }

    /// `remote_home` is the Hermes home this sandbox reported at attach (the record sits
    /// beside it).
    fn ask(
        &self,
        sandbox: &Sandbox,
        remote_home: &str,
        term: Duration,
        ask: &Ask,
    ) -> Result<(Verdict, u64), Error> {
        let holder = self.holder()?;
        SandboxArbitration {
            runtime: &self.services.runtime,
            sandbox,
            remote_home,
            holder: &holder,
            term,
        }
        .ask(ask)
    }

    /// Why this host should not ask the sandbox's record again yet: another host held it at
    /// the last acquire, and the pause after that refusal has not passed.
    pub(super) fn held_elsewhere(&self) -> Option<String> {
        let held = self
            .arbitration
            .held_elsewhere
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &*held {
            Some((until, reason)) if self.services.clock.since_boot() < *until => {
                Some(reason.clone())
            }
            _ => None,
        }
    }

    /// The bring-up's acquire on its own Start (after the host lock), for a sandbox this
    /// process just created: there is no snapshot for it to ride on.
    pub(super) fn fence_acquire(&self, attached: &mut Attached) -> Result<(), Error> {
        let Some(term) = self.sandbox_term() else {
            return Ok(());
        };
        // The record sits beside the Hermes home: this waits for the home probe if it is out.
        let remote_home = self.bring_up_home(attached)?;
        let (verdict, sandbox_now) =
            self.ask(&attached.sandbox, &remote_home, term, &Ask::Acquire)?;
        self.take_acquired(attached, &remote_home, term, verdict, sandbox_now)
    }

    /// The bring-up's acquire and recovery of a sandbox it did not just create: under
    /// sandbox arbitration one Process/Start answers the acquire and, only when granted, goes
    /// on to the snapshot recovery reads; refused, this host stays a reader and reads no
    /// state. Without it, recovery alone.
    pub(super) fn acquire_and_recover(&self, attached: &mut Attached) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        let Some(term) = self.sandbox_term() else {
            return self.recover_into_home(&id).map(drop);
        };
        let holder = self.holder()?;
        let operation = Ask::Acquire.operation();
        let remote_home = self.bring_up_home(attached)?;
        let (line, snapshot) =
            self.current_transport(&id)?
                .gated_snapshot(operation, ANSWER_LIMIT, |snapshot| {
                    acquire_then(&remote_home, &holder, term, snapshot)
                })?;
        let (verdict, sandbox_now) = parse_answer(operation, &id, &line)?;
        self.take_acquired(attached, &remote_home, term, verdict, sandbox_now)?;
        let config = self.recovery_config(&id);
        let report = snapshot.recover(&config);
        self.settle_recovery(&id, config, report).map(drop)
    }

    /// The Hermes home during a bring-up, from the transport (waiting for the attach's home
    /// probe if it is still out; its cause is left for the attach to report).
    fn bring_up_home(&self, attached: &Attached) -> Result<String, Error> {
        self.current_transport(attached.id.as_str())?
            .remote_hermes_home()
            .map(str::to_owned)
    }

    /// Granted, this writer stages its pushes from now on; held by another host, it stays a
    /// reader (and pauses its asking).
    fn take_acquired(
        &self,
        attached: &mut Attached,
        remote_home: &str,
        term: Duration,
        verdict: Verdict,
        sandbox_now: u64,
    ) -> Result<(), Error> {
        let id = attached.id.as_str().to_owned();
        match verdict {
            Verdict::Granted(record) => {
                *self
                    .arbitration
                    .held_elsewhere
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                attached.grant = Some(Grant {
                    generation: record.generation,
                    renewed: self.services.clock.since_boot(),
                });
                self.current_transport(&id)?
                    .stage_into(Some(staging_dir(remote_home, record.generation)));
                Ok(())
            }
            Verdict::Held(record) => {
                let reason = format!(
                    "another host holds the writer role in the sandbox ({}, generation {})",
                    record.holder,
                    record.generation.get()
                );
                // Asking again before the grant can lapse (by the sandbox's own count of
                // its remaining seconds), or more often than once per renewal period, would
                // cost a request per refused command.
                let remaining = Duration::from_secs(record.expires_at.saturating_sub(sandbox_now));
                let pause = remaining
                    .min(renewal_period(term))
                    .max(Duration::from_secs(1));
                *self
                    .arbitration
                    .held_elsewhere
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) =
                    Some((self.services.clock.since_boot() + pause, reason.clone()));
                Err(Error::NotReady {
                    sandbox_id: Some(id),
                    reason,
                    retry_hint: RETRY_HINT.to_owned(),
                })
            }
            other => Err(Error::Arbitration {
                operation: Ask::Acquire.operation(),
                sandbox_id: id,
                detail: format!("an acquire cannot be answered {other:?}"),
            }),
        }
    }

    /// Commits what the writer staged (and renews), or only renews when due, or does
    /// nothing. A fenced commit returns [`Error::Fenced`]; the staged files stay where they
    /// are for the current writer's next commit to discard.
    pub(super) fn fence_commit(
        &self,
        sandbox: &Sandbox,
        grant: &mut Option<Grant>,
        id: &str,
        when: CommitWhen,
    ) -> Result<(), Error> {
        let (Some(term), Some(current)) = (self.sandbox_term(), *grant) else {
            return Ok(());
        };
        let transport = self.current_transport(id)?;
        let (uploads, deletes) = transport.take_staged();
        let now = self.services.clock.since_boot();
        let due = now.saturating_sub(current.renewed) >= renewal_period(term);
        let ask = if uploads > 0 || !deletes.is_empty() || when == CommitWhen::Always {
            Ask::Commit {
                generation: current.generation,
                deletes,
            }
        } else if due {
            Ask::Renew(current.generation)
        } else {
            return Ok(());
        };
        let answer = transport
            .remote_hermes_home()
            .and_then(|home| self.ask(sandbox, home, term, &ask));
        if answer.is_err()
            && let Ask::Commit { deletes, .. } = ask.clone()
        {
            // Not committed (or not known to be): the next sync commits the same staging
            // again, so a later success never clears dirty over files that did not land.
            transport.restage(uploads.max(1), deletes);
        }
        match answer?.0 {
            Verdict::Granted(_) => {
                *grant = Some(Grant {
                    renewed: now,
                    ..current
                });
                Ok(())
            }
            Verdict::Fenced(record) => Err(fenced(ask.operation(), id, record)),
            other => Err(Error::Arbitration {
                operation: ask.operation(),
                sandbox_id: id.to_owned(),
                detail: format!("a commit cannot be answered {other:?}"),
            }),
        }
    }

    /// A fenced writer becomes a reader: the scope is marked dirty on this host, the host
    /// lock and the grant are let go, nothing staged is committed, and the takeover is warned
    /// about once.
    pub(super) fn demote(&self, attached: &mut Attached, error: &Error) {
        if let Role::Writer(writer) = &mut attached.role
            && let Err(marker) = writer.record_sync_failure()
        {
            tracing::warn!(sandbox_id = %attached.id, "E2B mark scope dirty failed: {}", ErrorChain(&marker));
        }
        attached.role = Role::Reader;
        attached.info.role = RoleKind::Reader;
        attached.grant = None;
        if let Ok(transport) = self.current_transport(attached.id.as_str()) {
            transport.stage_into(None);
        }
        if warn_once::first_time(&format!("fenced {}", attached.id)) {
            tracing::warn!(sandbox_id = %attached.id, "{}", ErrorChain(error));
        }
    }

    /// Teardown, before the pull: a writer that was fenced meanwhile pulls nothing and
    /// releases nothing (contract C10).
    pub(super) fn fence_before_pull(&self, attached: &mut Attached) {
        let id = attached.id.as_str().to_owned();
        if !matches!(attached.role, Role::Writer(_)) {
            return;
        }
        let Some(current) = attached.grant else {
            return;
        };
        let Some(term) = self.sandbox_term() else {
            return;
        };
        match self.ask(
            &attached.sandbox,
            &attached.info.remote_hermes_home,
            term,
            &Ask::Renew(current.generation),
        ) {
            Ok((Verdict::Granted(_), _)) => {}
            Ok((Verdict::Fenced(record), _)) => {
                let error = fenced("teardown pull", &id, record);
                self.demote(attached, &error);
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(sandbox_id = %id, "{}", ErrorChain(&error));
            }
        }
    }

    /// Teardown, after the pull: gives the grant up so another host can take over at once.
    pub(super) fn fence_release(&self, attached: &Attached) {
        let (Some(term), Some(current)) = (self.sandbox_term(), attached.grant) else {
            return;
        };
        if !matches!(attached.role, Role::Writer(_)) {
            return;
        }
        if let Err(error) = self.ask(
            &attached.sandbox,
            &attached.info.remote_hermes_home,
            term,
            &Ask::Release(current.generation),
        ) {
            tracing::warn!(sandbox_id = %attached.id, "{}", ErrorChain(&error));
        }
    }
}

fn fenced(operation: &'static str, id: &str, record: Option<WriterRecord>) -> Error {
    let (holder, generation) = match record {
        Some(record) => (record.holder.to_string(), record.generation.get()),
        None => ("no holder (the record is gone)".to_owned(), 0),
    };
    Error::Fenced {
        operation,
        sandbox_id: id.to_owned(),
        holder,
        generation,
    }
}
