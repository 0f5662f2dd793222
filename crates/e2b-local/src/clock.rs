//! The injectable clock that drives every lease (endAt) decision, and the two ways
//! its times go on the wire (Unix nanoseconds, RFC 3339).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The server's notion of "now", shared by the control plane and the expiry sweep.
///
/// Cloning gives another handle onto the same clock. A [`Clock::system`] clock follows
/// the wall clock plus every [`Clock::advance`]; a [`Clock::manual`] clock stands still
/// except when advanced, so lease expiry is testable without sleeping. Process deadlines
/// (`Connect-Timeout-Ms`) and keepalives use real time: they are about the transport,
/// not about leases.
#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<ClockInner>,
}

#[derive(Debug)]
struct ClockInner {
    base: Base,
    offset: Mutex<Duration>,
}

#[derive(Debug)]
enum Base {
    System,
    Manual(SystemTime),
}

impl Clock {
    /// A clock that follows the system wall clock (plus any advance).
    pub fn system() -> Clock {
        Clock::with_base(Base::System)
    }

    /// A clock frozen at `start` that only moves when [`Clock::advance`] is called.
    pub fn manual(start: SystemTime) -> Clock {
        Clock::with_base(Base::Manual(start))
    }

    fn with_base(base: Base) -> Clock {
        Clock {
            inner: Arc::new(ClockInner {
                base,
                offset: Mutex::new(Duration::ZERO),
            }),
        }
    }

    /// The current time as the server sees it.
    pub fn now(&self) -> SystemTime {
        let offset = *self
            .inner
            .offset
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let base = match self.inner.base {
            Base::System => SystemTime::now(),
            Base::Manual(start) => start,
        };
        base + offset
    }

    /// Moves the clock forward by `by`. Leases that end at or before the new "now" expire
    /// on the server's next request or sweep.
    pub fn advance(&self, by: Duration) {
        let mut offset = self
            .inner
            .offset
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *offset = offset.saturating_add(by);
    }
}

/// Unix nanoseconds (0 before the epoch, saturating far after it).
pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// RFC 3339 text for Unix nanoseconds, as E2B writes `startedAt`/`endAt`.
pub(crate) fn rfc3339(unix_nanos: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_nanos))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = Clock::manual(start);
        assert_eq!(clock.now(), start);
        let other = clock.clone();
        other.advance(Duration::from_secs(30));
        assert_eq!(clock.now(), start + Duration::from_secs(30));
    }

    #[test]
    fn system_clock_includes_advance() {
        let clock = Clock::system();
        clock.advance(Duration::from_secs(3600));
        let ahead = clock.now().duration_since(SystemTime::now()).unwrap();
        assert!(ahead > Duration::from_secs(3500), "{ahead:?}");
    }
}
