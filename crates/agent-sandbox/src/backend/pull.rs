//! The on-demand pull (a person asked for it, e.g. `hermes e2b pull`): resume recovery from
//! the scope's existing sandbox into the profile home, as the writer, without a push; and the
//! scope note the backend keeps for people (task id, last writer, last pull and recovery;
//! its keys are [`crate::note`]'s).

use std::path::PathBuf;

use writer_lease::{Role as LeaseRole, ScopeNote};

use super::{Backend, Inner, Role};
use crate::error::{Error, ErrorChain};
use crate::note::{
    NOTE_RECOVERY, NOTE_SANDBOX, NOTE_TASK, NOTE_TEMPLATE, NOTE_WRITER_PID, stamped,
};
use crate::report::RecoverySummary;

impl Backend {
    /// Recovers `skills/` and `memories/` from the scope's existing sandbox into the profile
    /// home now (conflicts quarantined as always, S6), resuming it if paused. Never creates a
    /// sandbox and never pushes: the sandbox keeps the state the last writer prepared, so its
    /// stamp stays true. Refused while another session on this host holds the writer role
    /// (that session's own teardown pulls), and for non-persistent scopes.
    pub fn pull_now(&self) -> Result<RecoverySummary, Error> {
        let inner = &*self.inner;
        let files = inner.files.as_ref().ok_or_else(|| Error::InvalidConfig {
            reason: "an on-demand pull needs a persistent scope".to_owned(),
        })?;
        let state = inner.lock_state("pull state");
        if !matches!(&*state, super::Phase::Detached) {
            return Err(Error::InvalidConfig {
                reason: "an on-demand pull needs a backend that has not attached yet".to_owned(),
            });
        }
        let writer = match files
            .try_acquire_writer()
            .map_err(|source| Error::Coordination {
                operation: "acquire writer role",
                sandbox_id: None,
                source,
            })? {
            LeaseRole::Writer(writer) => writer,
            LeaseRole::Reader => {
                let pid = files
                    .note()
                    .ok()
                    .flatten()
                    .and_then(|n| n.get(NOTE_WRITER_PID).map(str::to_owned));
                return Err(Error::NotReady {
                    sandbox_id: None,
                    reason: format!(
                        "another session on this host holds the writer role{}",
                        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
                    ),
                    retry_hint: "Its own teardown pulls state back; end that session first."
                        .to_owned(),
                });
            }
        };
        let client = inner.client()?;
        let Some((sandbox, lease, origin, resumed, egress)) =
            inner.find_existing(&client, super::attach::Retire::Nothing, || Ok(()))?
        else {
            writer.release();
            return Err(Error::NoSandbox { operation: "pull" });
        };
        let attached = inner.attached(
            client,
            sandbox,
            lease,
            Role::PendingWriter(writer),
            origin,
            resumed,
            None,
            egress,
        )?;
        let id = attached.id.as_str().to_owned();
        let result = inner.recover_into_home(&id);
        inner.clear_transport();
        if let Role::PendingWriter(writer) = attached.role {
            writer.release();
        }
        drop(state);
        result
    }
}

impl Inner {
    /// Recovery from the attached sandbox into the profile home, recorded in the scope note.
    /// The push base this host recorded for the sandbox lets a sandbox copy that is only the
    /// last push give way to the host's newer edit (S15); the transport then tracks the
    /// pushes that follow on top of it.
    pub(super) fn recover_into_home(&self, id: &str) -> Result<RecoverySummary, Error> {
        let config = self.recovery_config(id);
        let report = self
            .current_transport(id)
            .and_then(|transport| transport.recover(&config));
        self.settle_recovery(id, config, report)
    }

    /// What recovery of sandbox `id` into the profile home is given, the push base this host
    /// recorded for the sandbox included.
    pub(super) fn recovery_config(&self, id: &str) -> recovery::RecoveryConfig {
        recovery::RecoveryConfig {
            hermes_home: self.scope.profile_home.clone(),
            sandbox_id: id.to_owned(),
            host_only: self.config.host_only.clone(),
            max_snapshot_bytes: self.config.state_cap,
            push_base: self.load_push_base(id),
        }
    }

    /// After a recovery with `config`: when it succeeded, the transport tracks the pushes
    /// that follow on top of the push base that recovery used; noted either way.
    pub(super) fn settle_recovery(
        &self,
        id: &str,
        config: recovery::RecoveryConfig,
        report: Result<recovery::RecoveryReport, Error>,
    ) -> Result<RecoverySummary, Error> {
        if report.is_ok()
            && let (Some(base), Ok(transport)) = (config.push_base, self.current_transport(id))
        {
            transport.track_push_base(base);
        }
        self.note_recovery(id, report)
    }

    /// Warns about and notes a recovery's outcome.
    fn note_recovery(
        &self,
        id: &str,
        result: Result<recovery::RecoveryReport, Error>,
    ) -> Result<RecoverySummary, Error> {
        let report = match result {
            Ok(report) => report,
            Err(error) => {
                let text = format!("failed from {id}: {}", ErrorChain(&error));
                self.note(|note| note.set(NOTE_RECOVERY, &stamped(&text)));
                return Err(error);
            }
        };
        for warning in report.warnings() {
            // Recovery warnings name files the sandbox chose (X4).
            tracing::warn!(sandbox_id = %id, "{}", e2b_client::redact(&warning.to_string()));
        }
        let summary = RecoverySummary::of(&report);
        self.note(|note| note.set(NOTE_RECOVERY, &stamped(&format!("{summary} from {id}"))));
        Ok(summary)
    }

    /// A bring-up that skipped recovery (the sandbox is this session's own, just created):
    /// the push base starts empty and follows the initial push (S15).
    pub(super) fn track_empty_push_base(&self, id: &str) {
        if self.push_base_path().is_some()
            && let Ok(transport) = self.current_transport(id)
        {
            transport.track_push_base(recovery::PushBase::new(id));
        }
    }

    /// Where this scope's push base lives: next to its coordination files (persistent
    /// scopes only; nothing else recovers). A host whose coordination directory is unusable
    /// has already been warned about (C6) and keeps no base.
    fn push_base_path(&self) -> Option<PathBuf> {
        let files = self.files.as_ref()?;
        let dir = files.dir();
        dir.is_dir()
            .then(|| dir.join(format!("{}.push-base", files.key().to_hex())))
    }

    /// The push base recorded for sandbox `id`, read defensively: a missing, corrupt or other
    /// sandbox's record is an empty base (every difference is a conflict, S6).
    fn load_push_base(&self, id: &str) -> Option<recovery::PushBase> {
        let path = self.push_base_path()?;
        let (base, source) = recovery::PushBase::load(&path, id);
        if let recovery::BaseSource::Unusable(reason) = source {
            tracing::warn!(sandbox_id = %id, "E2B push base {} unusable ({reason}); recovery treats every difference as a conflict", path.display());
        }
        Some(base)
    }

    /// Stores what the pushes so far put in the sandbox, after a push succeeded. Best effort:
    /// a record that cannot be written leaves an older one, which only makes the next
    /// recovery quarantine more.
    pub(super) fn store_push_base(&self, id: &str) {
        // Asked after every sync: the look at the directory only when there is news.
        let Ok(transport) = self.current_transport(id) else {
            return;
        };
        if !transport.push_base_changed() {
            return;
        }
        let Some(path) = self.push_base_path() else {
            return;
        };
        let Some(base) = transport.take_changed_push_base() else {
            return;
        };
        if let Err(error) = base.store(&path) {
            tracing::warn!(sandbox_id = %id, "E2B {}", ErrorChain(&error));
        }
    }

    /// Updates the scope note, best effort: it is for people, so a host that cannot write it
    /// loses a status line, never a command.
    pub(super) fn note(&self, change: impl FnOnce(&mut ScopeNote)) {
        let Some(files) = &self.files else { return };
        // One read-modify-write at a time: the bring-up writes its note beside its requests.
        let _serial = self
            .note_serial
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(error) = files.update_note(change) {
            tracing::debug!("E2B scope note not updated: {}", ErrorChain(&error));
        }
    }

    /// The note a writer leaves when it takes the role: which task this scope is, who
    /// holds it now, and in which sandbox (the next attach's hint); plus `recovery`, the
    /// recovery line when it is known up front (see [`nothing_to_recover`]).
    pub(super) fn note_writer(&self, id: &str, recovery: Option<String>) {
        let task = self.scope.task_id.clone();
        let template = self.config.template.clone();
        self.note(|note| {
            note.set(NOTE_TASK, &task);
            note.set(NOTE_TEMPLATE, &template);
            note.set(NOTE_WRITER_PID, &std::process::id().to_string());
            note.set(NOTE_SANDBOX, id);
            if let Some(line) = recovery {
                note.set(NOTE_RECOVERY, &line);
            }
        });
    }
}

/// The recovery note line of a bring-up that skipped recovery: the sandbox is this
/// session's own, just created, so there was nothing in it to recover.
pub(super) fn nothing_to_recover(id: &str) -> String {
    let nothing = RecoverySummary {
        restored: 0,
        unchanged: 0,
        quarantined: 0,
        skipped: 0,
        superseded: 0,
    };
    stamped(&format!(
        "{nothing} from {id} (created by this session: nothing to recover)"
    ))
}
