//! Who holds the scope's state lock (lock 1) now, for what and at which step: what a caller
//! that waited too long names in its error (contract O7). A leaf lock, held only to read or
//! write the record.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::Phase;
use crate::report::ScopeHolder;

/// The record of lock 1's current holder.
#[derive(Debug, Default)]
pub(super) struct StateHolder {
    now: Mutex<Option<Holding>>,
}

#[derive(Debug, Clone, Copy)]
struct Holding {
    operation: &'static str,
    step: Option<&'static str>,
    since: Instant,
}

impl StateHolder {
    fn record(&self) -> MutexGuard<'_, Option<Holding>> {
        self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the step the holder is in (`None`: back in the operation itself).
    pub(super) fn step(&self, step: Option<&'static str>) {
        if let Some(holding) = self.record().as_mut() {
            holding.step = step;
        }
    }

    /// The holder now, if any.
    pub(super) fn current(&self) -> Option<ScopeHolder> {
        self.record().map(|holding| ScopeHolder {
            operation: holding.operation,
            step: holding.step,
            held_for: holding.since.elapsed(),
        })
    }
}

/// Lock 1's guard, which keeps [`StateHolder`] true: set when taken, cleared when dropped.
pub(super) struct StateGuard<'a> {
    guard: MutexGuard<'a, Phase>,
    holder: &'a StateHolder,
}

impl<'a> StateGuard<'a> {
    pub(super) fn new(
        guard: MutexGuard<'a, Phase>,
        holder: &'a StateHolder,
        operation: &'static str,
    ) -> StateGuard<'a> {
        *holder.record() = Some(Holding {
            operation,
            step: None,
            since: Instant::now(),
        });
        StateGuard { guard, holder }
    }
}

impl Deref for StateGuard<'_> {
    type Target = Phase;

    fn deref(&self) -> &Phase {
        &self.guard
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Phase {
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        // Cleared before the state lock itself is released (fields drop after this body),
        // so a record is never left naming a holder that is gone.
        *self.holder.record() = None;
    }
}
