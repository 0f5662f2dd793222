//! Lease arithmetic over an injected clock.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hermes' idle reaper checks once per interval of this length.
pub const REAPER_INTERVAL: Duration = Duration::from_secs(60);

/// One control-plane request timeout: the time a reconnect after the last
/// reaper tick may need to reach E2B and renew the lease.
pub const CONTROL_PLANE_MARGIN: Duration = Duration::from_secs(60);

/// The longest baseline lease the prompt probe's sandbox gets.
pub const PROBE_LEASE_CAP: Duration = Duration::from_secs(120);

/// A source of monotonic time, injected so lease decisions are testable
/// without sleeping.
pub trait Clock: fmt::Debug + Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Time since an arbitrary fixed origin that keeps counting while the machine is
    /// suspended. [`Instant`] stops during a suspend on Linux, so anything that must notice
    /// time spent asleep (a writer grant on another machine's clock lapsing) paces by this.
    fn since_boot(&self) -> Duration;

    /// The wall clock, for what people read (a checkpoint's time). Never used for lease
    /// arithmetic, which follows [`Clock::now`].
    fn wall(&self) -> std::time::SystemTime {
        std::time::SystemTime::now()
    }
}

/// The process's monotonic clock; [`Clock::since_boot`] reads `CLOCK_BOOTTIME` on Linux
/// and falls back to the monotonic clock elsewhere (where a suspend then goes unnoticed).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[cfg(target_os = "linux")]
    fn since_boot(&self) -> Duration {
        let time = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // The kernel never returns negative boot time; clamp rather than trust it.
        Duration::new(
            u64::try_from(time.tv_sec).unwrap_or(0),
            u32::try_from(time.tv_nsec).unwrap_or(0),
        )
    }

    #[cfg(not(target_os = "linux"))]
    fn since_boot(&self) -> Duration {
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    elapsed_nanos: AtomicU64,
    /// Time spent in simulated suspends: counted by [`Clock::since_boot`] only.
    asleep_nanos: AtomicU64,
}

impl ManualClock {
    /// A clock standing at an arbitrary origin.
    pub fn new() -> Self {
        ManualClock {
            origin: Instant::now(),
            elapsed_nanos: AtomicU64::new(0),
            asleep_nanos: AtomicU64::new(0),
        }
    }

    /// Moves the clock forward (saturating after about 584 years).
    pub fn advance(&self, by: Duration) {
        add_saturating(&self.elapsed_nanos, by);
    }

    /// Simulates a suspend of `by` (a laptop lid closed): [`Clock::since_boot`] moves on,
    /// [`Clock::now`] does not, as with Linux's boot and monotonic clocks.
    pub fn suspend(&self, by: Duration) {
        add_saturating(&self.asleep_nanos, by);
    }
}

fn add_saturating(counter: &AtomicU64, by: Duration) {
    let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
    // fetch_update with saturating_add cannot fail: the closure always returns Some.
    let _ = counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |old| {
        Some(old.saturating_add(nanos))
    });
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.origin + Duration::from_nanos(self.elapsed_nanos.load(Ordering::SeqCst))
    }

    fn since_boot(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos.load(Ordering::SeqCst)).saturating_add(
            Duration::from_nanos(self.asleep_nanos.load(Ordering::SeqCst)),
        )
    }
}

/// Which lifecycle floor applies to a sandbox's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// A persistent sandbox: the configured lease, extended per command.
    Persistent,
    /// An ephemeral sandbox: never below [`ephemeral_floor`] of Hermes'
    /// `terminal.lifetime_seconds`, so the idle reaper can pull state and
    /// kill it before E2B's on-timeout kill fires.
    Ephemeral {
        /// Hermes' idle lifetime (`terminal.lifetime_seconds`).
        lifetime: Duration,
    },
    /// The prompt probe's throwaway sandbox: a baseline no longer than
    /// [`PROBE_LEASE_CAP`], because Hermes never reaps it.
    Probe,
}

/// The lease settings of one environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeasePolicy {
    /// The configured baseline lease (`lease_seconds`).
    pub lease: Duration,
    /// Headroom beyond a command's timeout (`command_grace_seconds`).
    pub command_grace: Duration,
    /// Which lifecycle floor applies.
    pub kind: LeaseKind,
}

/// `lifetime` plus one reaper interval plus one control-plane request
/// timeout: the shortest lease an ephemeral sandbox may have (contract L4).
pub fn ephemeral_floor(lifetime: Duration) -> Duration {
    lifetime
        .saturating_add(REAPER_INTERVAL)
        .saturating_add(CONTROL_PLANE_MARGIN)
}

impl LeasePolicy {
    /// The lease a sandbox is created or attached with.
    pub fn baseline(&self) -> Duration {
        match self.kind {
            LeaseKind::Persistent => self.lease,
            LeaseKind::Ephemeral { lifetime } => self.lease.max(ephemeral_floor(lifetime)),
            LeaseKind::Probe => self.lease.min(PROBE_LEASE_CAP),
        }
    }

    /// The lease a command needs: `max(baseline, timeout + grace)`
    /// (contract L5), so E2B's timeout action cannot fire mid-command.
    pub fn command_lease(&self, command_timeout: Duration) -> Duration {
        self.baseline()
            .max(command_timeout.saturating_add(self.command_grace))
    }

    /// The lease a teardown transfer needs: the command lease for the
    /// transfer's timeout, and at least that timeout plus one control-plane
    /// request timeout whatever the configured grace.
    pub fn transfer_lease(&self, transfer_timeout: Duration) -> Duration {
        self.command_lease(transfer_timeout)
            .max(transfer_timeout.saturating_add(CONTROL_PLANE_MARGIN))
    }
}

/// A lease extension to send: an extend-only connect with this timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct ExtensionRequest {
    requested_at: Instant,
    timeout: Duration,
}

impl ExtensionRequest {
    /// When the extension was planned; the lease it yields runs from no
    /// earlier than this.
    pub fn requested_at(&self) -> Instant {
        self.requested_at
    }

    /// The lease to ask for.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The lease to ask for in whole seconds, rounded up, as E2B takes it.
    pub fn timeout_secs(&self) -> u64 {
        let secs = self.timeout.as_secs();
        if self.timeout.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        }
    }
}

/// Whether a command needs a lease request first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum LeasePlan {
    /// The known expiry already covers the command: send nothing.
    Covered,
    /// Extend first, then [`LeaseTracker::confirm`] the request.
    Extend(ExtensionRequest),
}

/// What this process knows about one sandbox's lease expiry.
///
/// The known expiry is a lower bound: an extension planned at `t` for `d`
/// yields a lease ending no earlier than `t + d`, because connect only ever
/// extends. It never moves backwards (contract L5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeaseTracker {
    covered_until: Option<Instant>,
}

impl LeaseTracker {
    /// A tracker that knows nothing yet, so the first command extends.
    pub fn new() -> Self {
        LeaseTracker::default()
    }

    /// The earliest the lease can end, if known.
    pub fn covered_until(&self) -> Option<Instant> {
        self.covered_until
    }

    /// Whether the known expiry covers `needed` from `now`.
    pub fn covers(&self, now: Instant, needed: Duration) -> bool {
        match (now.checked_add(needed), self.covered_until) {
            (Some(end), Some(until)) => end <= until,
            _ => false,
        }
    }

    /// Decides whether a command needing `needed` of lease must extend first.
    pub fn plan(&self, clock: &dyn Clock, needed: Duration) -> LeasePlan {
        let now = clock.now();
        if self.covers(now, needed) {
            LeasePlan::Covered
        } else {
            LeasePlan::Extend(ExtensionRequest {
                requested_at: now,
                timeout: needed,
            })
        }
    }

    /// Records a successful extension. The known expiry only grows.
    pub fn confirm(&mut self, request: &ExtensionRequest) {
        if let Some(end) = request.requested_at.checked_add(request.timeout) {
            self.covered_until = Some(self.covered_until.map_or(end, |until| until.max(end)));
        }
    }

    /// Forgets the known expiry, for when the sandbox was replaced or found
    /// paused: the next command extends again.
    pub fn forget(&mut self) {
        self.covered_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn policy(kind: LeaseKind) -> LeasePolicy {
        LeasePolicy {
            lease: secs(300),
            command_grace: secs(30),
            kind,
        }
    }

    #[test]
    fn the_system_boot_clock_counts_at_least_what_the_monotonic_clock_counts() {
        // contract: C9 — read boot, monotonic, monotonic, boot: boot time is monotonic time
        // plus time suspended, so its span covers the monotonic one.
        let boot = SystemClock.since_boot();
        let start = SystemClock.now();
        std::thread::sleep(Duration::from_millis(20));
        let spent = SystemClock.now() - start;
        let boot_spent = SystemClock.since_boot() - boot;
        assert!(spent >= Duration::from_millis(20));
        assert!(boot_spent >= spent, "{boot_spent:?} < {spent:?}");
        assert!(
            boot_spent < spent + Duration::from_secs(60),
            "{boot_spent:?}"
        );
    }

    #[test]
    fn a_manual_suspend_moves_only_the_boot_clock() {
        let clock = ManualClock::new();
        let (now, boot) = (clock.now(), clock.since_boot());
        clock.suspend(secs(600));
        assert_eq!(clock.now(), now);
        assert_eq!(clock.since_boot(), boot + secs(600));
        clock.advance(secs(5));
        assert_eq!(clock.now(), now + secs(5));
        assert_eq!(clock.since_boot(), boot + secs(605));
    }

    // contract: L5
    #[test]
    fn command_lease_is_the_larger_of_baseline_and_timeout_plus_grace() {
        let persistent = policy(LeaseKind::Persistent);
        assert_eq!(persistent.command_lease(secs(180)), secs(300));
        assert_eq!(persistent.command_lease(secs(600)), secs(630));
        assert_eq!(persistent.command_lease(secs(270)), secs(300));
        assert_eq!(persistent.command_lease(secs(271)), secs(301));
    }

    // contract: L4
    #[test]
    fn ephemeral_lease_covers_lifetime_reaper_and_request_timeout() {
        assert_eq!(ephemeral_floor(secs(300)), secs(420));
        let ephemeral = LeasePolicy {
            lease: secs(100),
            command_grace: Duration::ZERO,
            kind: LeaseKind::Ephemeral {
                lifetime: secs(300),
            },
        };
        // Zero command grace does not shrink the lifecycle margin.
        assert_eq!(ephemeral.baseline(), secs(420));
        assert_eq!(ephemeral.command_lease(secs(4)), secs(420));
        assert_eq!(ephemeral.command_lease(secs(1000)), secs(1000));
    }

    // contract: L11
    #[test]
    fn probe_baseline_is_capped_but_still_covers_its_command() {
        let probe = policy(LeaseKind::Probe);
        assert_eq!(probe.baseline(), PROBE_LEASE_CAP);
        assert_eq!(probe.command_lease(secs(4)), PROBE_LEASE_CAP);
        assert_eq!(probe.command_lease(secs(200)), secs(230));
        let short = LeasePolicy {
            lease: secs(60),
            ..probe
        };
        assert_eq!(short.baseline(), secs(60));
    }

    #[test]
    fn transfer_lease_keeps_a_request_margin_with_zero_grace() {
        let no_grace = LeasePolicy {
            lease: secs(60),
            command_grace: Duration::ZERO,
            kind: LeaseKind::Persistent,
        };
        assert_eq!(no_grace.transfer_lease(secs(300)), secs(360));
        assert_eq!(
            policy(LeaseKind::Persistent).transfer_lease(secs(10)),
            secs(300)
        );
    }

    // contract: L5
    #[test]
    fn a_covered_command_sends_no_request_and_extensions_never_shorten() {
        let clock = ManualClock::new();
        let mut tracker = LeaseTracker::new();
        let LeasePlan::Extend(first) = tracker.plan(&clock, secs(300)) else {
            panic!("an unknown lease must be extended");
        };
        assert_eq!(first.timeout_secs(), 300);
        tracker.confirm(&first);

        clock.advance(secs(100));
        assert_eq!(tracker.plan(&clock, secs(200)), LeasePlan::Covered);
        let LeasePlan::Extend(longer) = tracker.plan(&clock, secs(201)) else {
            panic!("a lease ending too early must be extended");
        };
        tracker.confirm(&longer);
        let after_long = tracker.covered_until();

        // A short extension confirmed later never moves the expiry back.
        let short = ExtensionRequest {
            requested_at: clock.now(),
            timeout: secs(1),
        };
        tracker.confirm(&short);
        assert_eq!(tracker.covered_until(), after_long);

        tracker.forget();
        assert!(matches!(
            tracker.plan(&clock, secs(1)),
            LeasePlan::Extend(_)
        ));
    }

    #[test]
    fn whole_seconds_round_up() {
        let request = ExtensionRequest {
            requested_at: Instant::now(),
            timeout: Duration::from_millis(1500),
        };
        assert_eq!(request.timeout_secs(), 2);
    }
}
