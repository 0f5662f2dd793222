//! The account's limit of concurrently running sandboxes (L14), the backend's side: the
//! backends of one process form a [`Fleet`](crate::Fleet), and a create or resume that E2B refuses for the limit (or that
//! `max_running` would take past this process's own cap) pauses the fleet's sandbox that
//! has been idle longest and tries again; when none can be paused it waits a bounded time
//! for a slot.
//!
//! What may be paused is decided under that scope's own state lock, taken with `try_lock`
//! only: a scope whose lock is held is mid-operation (an attach, a sync, a checkpoint) and
//! is skipped, and a caller holding its own lock never waits for another scope's, so two
//! scopes competing for slots cannot deadlock. Only a sandbox this process owns and whose
//! writer state is settled is paused: the writer after its bring-up, or an ephemeral owner
//! after its first push; never a reader's, an attached (external) one or the prompt
//! probe's, and never one with a command or fetch in flight (its `Inflight` count is read
//! under the same lock that every start enters it under). A paused sandbox keeps its
//! files and the scope keeps its attachment with a forgotten lease, so its next use
//! reconnects first, which resumes it: the cost is one resume.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use e2b_client::SandboxId;

use super::holder::StateGuard;
use super::leftover::LeftoverCensus;
use super::{Attached, Inner, Phase, Role};
use crate::error::PausedFor;
use crate::error::{Error, ErrorChain};
use crate::fleet::Member;
use crate::progress::{Meter, ProgressUnit};

/// For how long after a watcher's poll a scope counts as serving a background process:
/// Hermes polls each one every 2 s, so a few missed polls still count (L17).
const BACKGROUND_WINDOW_MS: u64 = 10_000;

/// How often a create or resume that found no sandbox to pause tries again while it waits
/// for a slot.
const SLOT_POLL: Duration = Duration::from_secs(1);

/// At most this many sandboxes are paused for one create or resume: a bound on the loop, in
/// case slots freed by this process are taken by others as fast as they are freed.
const MAX_PAUSES_PER_START: usize = 8;

impl Member for Inner {
    fn last_use(&self) -> u64 {
        self.last_use.load(Ordering::Relaxed)
    }

    fn believed_running(&self) -> bool {
        Inner::believed_running(self)
    }

    fn scope(&self) -> sandbox_identity::ScopeDigest {
        self.identity.digest()
    }

    fn pause_if_idle(&self) -> Option<SandboxId> {
        Inner::pause_if_idle(self, PausedFor::Limit)
    }

    fn pause_if_quiet(&self) -> Option<SandboxId> {
        let quiet = self.config.pause_after_idle?;
        let now = since_boot_ms(&*self.services.clock);
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.last_use.load(Ordering::Relaxed)) < quiet_ms {
            return None;
        }
        Inner::pause_if_idle(self, PausedFor::Quiet(quiet))
    }

    fn pauses_when_quiet(&self) -> bool {
        self.config.pause_after_idle.is_some()
    }

    fn serves_background(&self) -> bool {
        // A live background process being followed serves as a polled one does (O9).
        if self.live.serving() {
            return true;
        }
        let watched = self.last_watch.load(Ordering::Relaxed);
        let now = since_boot_ms(&*self.services.clock);
        watched != 0 && now.saturating_sub(watched) < BACKGROUND_WINDOW_MS
    }

    fn start_within_limit(
        &self,
        operation: &'static str,
        sandbox_id: &SandboxId,
        start: &mut dyn FnMut() -> Result<(), Error>,
    ) -> Result<(), Error> {
        // No wait here: the sandboxes of scopes already closed hold their slots until
        // their leases end, and a teardown waiting for them would hold up the process's
        // cleanup of every other scope.
        self.within_limit_waiting(operation, Some(sandbox_id), Duration::ZERO, start)
    }
}

impl Inner {
    /// A client for these settings (the key resolved now) on the process's shared pools.
    pub(super) fn shared_client(&self) -> Result<e2b_client::Client, Error> {
        let wanted = self.config.client_config()?;
        self.services
            .fleet
            .client(wanted)
            .map_err(|source| Error::e2b("configure client", None, source))
    }

    /// Records a watcher's poll now: the scope serves a background process (L17).
    pub(super) fn watched(&self) {
        touch(&self.last_watch, &*self.services.clock);
    }

    /// Records a use of the scope now: what "idle longest" is measured from.
    pub(super) fn touch(&self) {
        touch(&self.last_use, &*self.services.clock);
        // A live process whose stream was cut while the sandbox was paused looks again.
        self.live.used();
    }

    /// Whether this scope's sandbox runs as far as this process knows. A scope busy with an
    /// operation counts as running: it may be creating or resuming one this moment.
    fn believed_running(&self) -> bool {
        let Ok(guard) = self.state.try_lock() else {
            return true;
        };
        match &*guard {
            Phase::Attached(attached) | Phase::Closing(Some(attached)) => self.lease_live(attached),
            _ => false,
        }
    }

    /// Why this process paused the attached sandbox, while it still is: what a watcher's
    /// poll and a sync must not resume (L17).
    pub(super) fn paused_by_backend(&self, attached: &Attached) -> Option<PausedFor> {
        attached.paused_for.filter(|_| !self.lease_live(attached))
    }

    /// Whether the sandbox's known lease has not run out (a forgotten one, after a pause
    /// for the limit, has).
    pub(super) fn lease_live(&self, attached: &Attached) -> bool {
        attached
            .lease
            .covers(self.services.clock.now(), Duration::ZERO)
    }

    /// Pauses this scope's sandbox if it may be paused now (see the module docs); its id
    /// when it was paused (or E2B had paused it already).
    fn pause_if_idle(&self, why: PausedFor) -> Option<SandboxId> {
        let guard = self.state.try_lock().ok()?;
        let operation = match why {
            PausedFor::Limit => "pause for the account's limit",
            PausedFor::Quiet(_) => "pause a quiet sandbox",
        };
        let mut state = StateGuard::new(guard, &self.holder, operation);
        let Phase::Attached(attached) = &mut *state else {
            return None;
        };
        let owned_and_settled = matches!(
            attached.role,
            Role::Writer(_) | Role::Owner { pushed: true }
        ) || (matches!(attached.role, Role::External)
            && self.subagents.fork_of.get().is_some());
        if !owned_and_settled || !self.inflight.is_idle() || !self.lease_live(attached) {
            return None;
        }
        let id = attached.id.clone();
        match self.block_on(attached.client.pause(&id)) {
            Ok(_) => {}
            Err(error) => {
                // Gone or not running frees the slot as well; anything else leaves it as
                // it was, and the next member is tried.
                if !error.is_not_found() {
                    tracing::debug!(sandbox_id = %id, "pausing an idle sandbox for the account's limit failed: {}", ErrorChain(&error));
                    return None;
                }
            }
        }
        // The next use reconnects first, which resumes it (or tells it is gone).
        attached.lease.forget();
        attached.paused_for = Some(why);
        match why {
            PausedFor::Quiet(quiet) => {
                tracing::debug!(
                    sandbox_id = %id,
                    "E2B sandbox {id} paused after {} s without a command (pause_after_idle_seconds); its next command resumes it",
                    quiet.as_secs()
                );
            }
            // The limit, and anything `PausedFor` may grow to, is said at INFO.
            _ => tracing::info!(
                sandbox_id = %id,
                "E2B sandbox {id} paused to free a slot under the account's limit of concurrently running sandboxes; its next command resumes it"
            ),
        }
        Some(id)
    }

    /// Starts a sandbox (`start`: a create or a resume, `operation` names it) within the
    /// account's limit (L14). Before it, when this scope's `max_running` is reached by the
    /// fleet's other running sandboxes, the idlest is paused. When E2B refuses for the
    /// limit, the idlest member's sandbox is paused and `start` runs again; when none can
    /// be paused, it runs again every [`SLOT_POLL`] for up to the `slot_wait` setting, with
    /// a progress report, then fails with [`Error::ConcurrencyLimit`].
    pub(super) fn within_limit<T>(
        &self,
        operation: &'static str,
        sandbox_id: Option<&SandboxId>,
        start: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.within_limit_waiting(operation, sandbox_id, self.config.slot_wait, start)
    }

    /// [`within_limit`](Self::within_limit) waiting at most `slot_wait` for a slot.
    fn within_limit_waiting<T>(
        &self,
        operation: &'static str,
        sandbox_id: Option<&SandboxId>,
        slot_wait: Duration,
        mut start: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let fleet = &self.services.fleet;
        self.keep_under_cap();
        let mut paused = 0;
        let mut waiting: Option<(Instant, Meter)> = None;
        loop {
            let error = match start() {
                Ok(started) => {
                    if let Some((_, meter)) = waiting {
                        meter.finish();
                    }
                    return Ok(started);
                }
                Err(error) if error.is_limit_refusal() => error,
                Err(error) => return Err(error),
            };
            if paused < MAX_PAUSES_PER_START && fleet.pause_idlest(self as &dyn Member).is_some() {
                paused += 1;
                continue;
            }
            // None of this process's: a sandbox an earlier process left running (L15).
            let (leftover, census) = self.pause_leftover();
            if paused < MAX_PAUSES_PER_START && leftover.is_some() {
                paused += 1;
                continue;
            }
            if slot_wait.is_zero() {
                return Err(self.limit_error(operation, sandbox_id, Duration::ZERO, census, error));
            }
            let (since, meter) = waiting.get_or_insert_with(|| {
                tracing::info!(
                    sandbox_id = sandbox_id.map(SandboxId::as_str).unwrap_or(""),
                    "E2B {operation}: the account's limit of concurrently running sandboxes is reached and no sandbox of this profile can be paused now ({}); waiting up to {} s for a slot",
                    census,
                    slot_wait.as_secs()
                );
                let meter = Meter::start(
                    self.services.progress.clone(),
                    "wait for a sandbox slot",
                    sandbox_id.map(SandboxId::as_str),
                    ProgressUnit::Seconds,
                    Some(slot_wait.as_secs()),
                );
                (Instant::now(), meter)
            });
            let waited = since.elapsed();
            if waited >= slot_wait {
                let (_, meter) = waiting.take().expect("set just above");
                meter.finish();
                return Err(self.limit_error(operation, sandbox_id, waited, census, error));
            }
            let pause = SLOT_POLL.min(slot_wait - waited);
            // The timer is made inside the runtime (a sleep made outside it has no reactor).
            self.block_on(async move { tokio::time::sleep(pause).await });
            meter.advance(pause.as_secs().max(1));
        }
    }

    /// With `max_running` set: pauses the fleet's idlest sandboxes while that many others
    /// run, so the start about to be made stays under the cap. A soft cap: when none may be
    /// paused, the start goes ahead and only E2B's own limit refuses it.
    pub(super) fn keep_under_cap(&self) {
        let Some(cap) = self.config.max_running else {
            return;
        };
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let fleet = &self.services.fleet;
        let mut paused = 0;
        while paused < MAX_PAUSES_PER_START
            && fleet.running_besides(self as &dyn Member) >= cap
            && fleet.pause_idlest(self as &dyn Member).is_some()
        {
            paused += 1;
        }
    }

    /// The error a start refused for the limit ends with: how many run on the account (one
    /// bounded count) and in this process, and how long it waited.
    fn limit_error(
        &self,
        operation: &'static str,
        sandbox_id: Option<&SandboxId>,
        waited: Duration,
        census: LeftoverCensus,
        refused: Error,
    ) -> Error {
        let Error::E2b { source, .. } = refused else {
            return refused;
        };
        let running = self.count_running();
        Error::ConcurrencyLimit {
            operation,
            detail: Box::new(crate::error::LimitDetail {
                sandbox_id: sandbox_id.map(|id| id.as_str().to_owned()),
                running,
                this_process: self.services.fleet.running_besides(self as &dyn Member),
                held_elsewhere: census.held,
                busy_elsewhere: census.busy,
                unknown: census.unknown,
                waited,
            }),
            source,
        }
    }

    /// One bounded count of the account's running sandboxes, so the person knows how many
    /// hold the limit; its own failure only leaves the count out (O5).
    fn count_running(&self) -> Option<u64> {
        let client = self.client().ok()?;
        self.block_on(async {
            tokio::time::timeout(COUNT_RUNNING_DEADLINE, client.count_running()).await
        })
        .ok()
        .and_then(Result::ok)
        .flatten()
    }
}

/// How long the count of running sandboxes may take when a start hit the limit: the count
/// only adds to a message, so it must never delay the error much.
const COUNT_RUNNING_DEADLINE: Duration = Duration::from_secs(5);

/// Stores "now" (the clock's boot time, in milliseconds) in `last_use`.
pub(super) fn touch(last_use: &std::sync::atomic::AtomicU64, clock: &dyn crate::Clock) {
    last_use.store(since_boot_ms(clock), Ordering::Relaxed);
}

/// The clock's boot time in milliseconds: what `last_use` and `last_watch` hold.
fn since_boot_ms(clock: &dyn crate::Clock) -> u64 {
    u64::try_from(clock.since_boot().as_millis()).unwrap_or(u64::MAX)
}
