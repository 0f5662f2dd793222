//! The backends of one process that share an E2B account (L14): its limit of concurrently
//! running sandboxes, and one set of connection pools. Below `config` and `backend`: a
//! member is whatever implements [`Member`] (the backend's core does), so this module knows
//! nothing of a backend's insides.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use e2b_client::SandboxId;

/// What the fleet asks of a member. Each call decides under the member's own locks, taken
/// without waiting (a member busy with an operation is skipped or counted as running).
pub(crate) trait Member: Send + Sync {
    /// When the member was last used (milliseconds on its clock's boot time).
    fn last_use(&self) -> u64;
    /// Whether its sandbox runs as far as this process knows.
    fn believed_running(&self) -> bool;
    /// Its scope: a leftover search never takes the writer role of a scope of its own
    /// process (L15).
    fn scope(&self) -> sandbox_identity::ScopeDigest;
    /// Pauses its sandbox if it may be paused now; its id when it was.
    fn pause_if_idle(&self) -> Option<SandboxId>;
    /// Pauses its sandbox if it may be paused now and has been quiet for its
    /// `pause_after_idle` (L17); its id when it was.
    fn pause_if_quiet(&self) -> Option<SandboxId>;
    /// Whether its settings ask for the quiet pause (the watcher runs only then).
    fn pauses_when_quiet(&self) -> bool;
    /// Whether a watcher polled a background process in its sandbox lately: such a sandbox
    /// is paused for the limit only after every idle one without (L17).
    fn serves_background(&self) -> bool;
    /// Runs `start`, a resume of the member's sandbox made outside its own start path (a
    /// state transfer's reconnect at teardown), within the account's limit as its own
    /// starts are: a refusal for the limit pauses another member's idle sandbox, or waits.
    fn start_within_limit(
        &self,
        operation: &'static str,
        sandbox_id: &SandboxId,
        start: &mut dyn FnMut() -> Result<(), crate::error::Error>,
    ) -> Result<(), crate::error::Error>;
}

/// The backends of one process that share an E2B account, and so its limit of concurrently
/// running sandboxes (L14).
///
/// [`Services`](crate::Services) carries one: backends built from clones of the same
/// `Services` share it, and a create or resume refused for the limit may pause another
/// member's idle sandbox. A member is held weakly: dropping a backend leaves the fleet.
///
/// Its members also share one set of connection pools: every member's client is made on
/// the first one's pools, so a scope costs no pool, trust-root copy or idle connection of
/// its own however many a process holds.
#[derive(Clone, Default)]
pub struct Fleet {
    members: Arc<Mutex<Vec<Weak<dyn Member>>>>,
    /// The client whose pools every member's clients share; made on first use.
    pools: Arc<Mutex<Option<e2b_client::Client>>>,
    /// How many teardown pulls the account's limit deferred in this process (L16): the
    /// first is said at INFO, the rest at DEBUG.
    deferred_pulls: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether the quiet watcher's thread has been started (L17).
    watching: Arc<std::sync::atomic::AtomicBool>,
}

/// How often the quiet watcher looks at the members: the precision of the quiet pause.
const QUIET_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("members", &self.members().len())
            .finish()
    }
}

/// Pauses each of `members` that has been quiet long enough (L17); how many.
fn pause_quiet(members: &[Arc<dyn Member>]) -> usize {
    members
        .iter()
        .filter(|member| member.pauses_when_quiet())
        .filter_map(|member| member.pause_if_quiet())
        .count()
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// How many members' sandboxes run now as far as this process knows (attached, with a
    /// lease that has not run out). A member busy with an operation counts as running.
    pub fn running(&self) -> usize {
        self.members()
            .iter()
            .filter(|member| member.believed_running())
            .count()
    }

    /// A client for `wanted` on the fleet's shared pools (made on the first call's).
    pub(crate) fn client(
        &self,
        wanted: e2b_client::Config,
    ) -> Result<e2b_client::Client, e2b_client::Error> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        let made = match &*pools {
            Some(seed) => seed.sharing_pools(wanted),
            None => e2b_client::Client::new(wanted),
        }?;
        if pools.is_none() {
            *pools = Some(made.clone());
        }
        Ok(made)
    }

    /// One pass of the quiet watcher (L17): pauses every member's sandbox that has been
    /// quiet for its `pause_after_idle` and may be paused now; how many it paused. The
    /// watcher's thread makes one pass every second while the fleet has members that ask
    /// for it; callers with a clock of their own (tests) may make one at any time.
    pub fn pause_quiet(&self) -> usize {
        pause_quiet(&self.members())
    }

    /// Starts the quiet watcher's thread once, when a member asks for the quiet pause. It
    /// holds the member list weakly and ends once every clone of the fleet is gone. A
    /// plain thread: a pause blocks on the runtime, which no runtime worker may do.
    fn watch_quiet(&self) {
        if self
            .watching
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let members = Arc::downgrade(&self.members);
        let spawned = std::thread::Builder::new()
            .name("e2b-quiet-watch".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(QUIET_WATCH_PERIOD);
                    let Some(list) = members.upgrade() else {
                        return;
                    };
                    let live: Vec<Arc<dyn Member>> = list
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .iter()
                        .filter_map(Weak::upgrade)
                        .collect();
                    drop(list);
                    pause_quiet(&live);
                }
            });
        if let Err(error) = spawned {
            // Without the thread the lease still ends a quiet sandbox's running time.
            self.watching
                .store(false, std::sync::atomic::Ordering::SeqCst);
            tracing::warn!(
                "the E2B quiet watcher could not start: {error}; quiet sandboxes run on until their leases end"
            );
        }
    }

    pub(crate) fn join(&self, member: Weak<dyn Member>) {
        if member
            .upgrade()
            .is_some_and(|member| member.pauses_when_quiet())
        {
            self.watch_quiet();
        }
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        // Dropped backends are swept when the list would grow, so it stays proportional to
        // the live members however many come and go.
        if members.len() == members.capacity() {
            members.retain(|weak| weak.strong_count() > 0);
        }
        members.push(member);
    }

    fn members(&self) -> Vec<Arc<dyn Member>> {
        self.members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Pauses the sandbox of the member (other than `asking`) idle longest that may be
    /// paused, those serving a background process last; its id, or `None` when no
    /// member's may.
    pub(crate) fn pause_idlest(&self, asking: &dyn Member) -> Option<SandboxId> {
        let mut members = self.members_besides(asking);
        members.sort_by_cached_key(|member| (member.serves_background(), member.last_use()));
        members.iter().find_map(|member| member.pause_if_idle())
    }

    /// Counts one teardown pull deferred for the limit; how many were before it.
    pub(crate) fn defer_pull(&self) -> usize {
        self.deferred_pulls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The scopes of the live members.
    pub(crate) fn scopes(&self) -> Vec<sandbox_identity::ScopeDigest> {
        self.members().iter().map(|member| member.scope()).collect()
    }

    /// Members other than `asking` whose sandboxes run now.
    pub(crate) fn running_besides(&self, asking: &dyn Member) -> usize {
        self.members_besides(asking)
            .iter()
            .filter(|member| member.believed_running())
            .count()
    }

    /// The live members other than `asking`.
    fn members_besides(&self, asking: &dyn Member) -> Vec<Arc<dyn Member>> {
        let mut members = self.members();
        members.retain(|member| !std::ptr::addr_eq(Arc::as_ptr(member), asking));
        members
    }
}
