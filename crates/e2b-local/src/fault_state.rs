//! The fault rules (public) and the state they are queued in, consulted by the
//! listener and the request pipeline in `faults`.
//!
//! Below `app` (which holds the state) and `faults` (which applies it), so neither
//! has to import the other to share it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::plane::Plane;

/// Which requests a fault rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultScope {
    /// Every request except the admin routes.
    Any,
    /// Control-plane (REST) requests only: requests without an `E2b-Sandbox-Id` header.
    Rest,
    /// envd requests only: requests with an `E2b-Sandbox-Id` header.
    Envd,
}

impl FaultScope {
    /// Parses `any`, `rest` or `envd`.
    pub fn parse(text: &str) -> Option<FaultScope> {
        match text {
            "any" => Some(FaultScope::Any),
            "rest" => Some(FaultScope::Rest),
            "envd" => Some(FaultScope::Envd),
            _ => None,
        }
    }

    fn matches(&self, plane: Plane) -> bool {
        match self {
            FaultScope::Any => true,
            FaultScope::Rest => plane == Plane::Rest,
            FaultScope::Envd => plane == Plane::Envd,
        }
    }
}

/// "Fail the next `count` matching requests with `status`" (see
/// [`Faults::fail_next`](crate::Faults::fail_next)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailRule {
    /// How many matching requests fail before the rule is used up.
    pub count: u32,
    /// The HTTP status to answer with (normally 5xx or 429).
    pub status: u16,
    /// Which requests the rule applies to.
    pub scope: FaultScope,
    /// Only requests whose path starts with this prefix, when set.
    pub path_prefix: Option<String>,
    /// A `Retry-After: <seconds>` header to add, when set.
    pub retry_after_secs: Option<u64>,
    /// A `Should-Retry: true|false` header to add, when set.
    pub should_retry: Option<bool>,
    /// The error body's `message`, when set (E2B's own wording, so a client shows what a user
    /// would see: `Invalid API key`, a template `not found`, the concurrency limit); else
    /// `injected fault`.
    pub message: Option<String>,
}

impl FailRule {
    /// A rule failing the next `count` requests of any kind with `status`, no extra headers.
    pub fn new(count: u32, status: u16) -> FailRule {
        FailRule {
            count,
            status,
            scope: FaultScope::Any,
            path_prefix: None,
            retry_after_secs: None,
            should_retry: None,
            message: None,
        }
    }

    fn matches(&self, plane: Plane, path: &str) -> bool {
        self.scope.matches(plane)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| path.starts_with(prefix))
    }
}

/// "Cut the next `count` matching responses after `after_bytes` body bytes" (see
/// [`Faults::drop_streams`](crate::Faults::drop_streams)). The connection is aborted
/// mid-body, as a crashed proxy would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropRule {
    /// How many matching responses are cut before the rule is used up.
    pub count: u32,
    /// Body bytes delivered before the cut.
    pub after_bytes: u64,
    /// Which requests the rule applies to.
    pub scope: FaultScope,
    /// Only requests whose path starts with this prefix, when set.
    pub path_prefix: Option<String>,
}

impl DropRule {
    /// A rule cutting the next `count` envd responses after `after_bytes` bytes.
    pub fn new(count: u32, after_bytes: u64) -> DropRule {
        DropRule {
            count,
            after_bytes,
            scope: FaultScope::Envd,
            path_prefix: None,
        }
    }

    fn matches(&self, plane: Plane, path: &str) -> bool {
        self.scope.matches(plane)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| path.starts_with(prefix))
    }
}

/// "Hold the request that comes after the next `skip` matching ones" (see
/// [`Faults::hold_request`](crate::Faults::hold_request)): it waits, unanswered and not yet
/// handled, until it is released. A crash test stops its client at a chosen request this
/// way: once the request is held, the client has sent every request before it and no other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRule {
    /// Matching requests let through before the one held.
    pub skip: u32,
    /// Which requests count.
    pub scope: FaultScope,
    /// Only requests whose path starts with this prefix count, when set.
    pub path_prefix: Option<String>,
}

impl HoldRule {
    fn matches(&self, plane: Plane, path: &str) -> bool {
        self.scope.matches(plane)
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| path.starts_with(prefix))
    }
}

/// What a held request does once released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// It is handled as if it had never been held.
    Continue,
    /// It is answered 503 without being handled (its client is usually gone by then).
    Fail,
}

/// The hold rule and the request it holds.
#[derive(Debug, Default)]
struct HoldSlot {
    rule: Option<HoldRule>,
    /// `METHOD path` of the request being held.
    held: Option<String>,
    /// Set by a release; taken by the held request.
    release: Option<Release>,
}

/// The shared fault state consulted by the listener and the request pipeline.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    latency_ms: AtomicU64,
    drop_connections: AtomicU32,
    fail: Mutex<VecDeque<FailRule>>,
    drop_streams: Mutex<VecDeque<DropRule>>,
    /// Forks (single entries of a fork request) still to fail, and with what status.
    fork_start_failures: Mutex<Option<(u32, u16)>>,
    /// Fork requests whose source is still to vanish after its capture.
    fork_source_vanishes: AtomicU32,
    hold: Mutex<HoldSlot>,
    released: tokio::sync::Notify,
}

impl FaultState {
    pub(crate) fn new(latency: Duration) -> FaultState {
        let state = FaultState::default();
        state
            .latency_ms
            .store(duration_ms(latency), Ordering::Relaxed);
        state
    }

    pub(crate) fn latency(&self) -> Duration {
        Duration::from_millis(self.latency_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        self.latency_ms
            .store(duration_ms(latency), Ordering::Relaxed);
    }

    pub(crate) fn push_fail(&self, rule: FailRule) {
        self.fail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(rule);
    }

    pub(crate) fn add_connection_drops(&self, count: u32) {
        self.drop_connections.fetch_add(count, Ordering::SeqCst);
    }

    pub(crate) fn push_drop(&self, rule: DropRule) {
        self.drop_streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(rule);
    }

    pub(crate) fn set_fork_start_failures(&self, count: u32, status: u16) {
        *self
            .fork_start_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (count > 0).then_some((count, status));
    }

    /// Takes one queued fork-start failure: the status that fork answers.
    pub(crate) fn take_fork_start_failure(&self) -> Option<u16> {
        let mut slot = self
            .fork_start_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (left, status) = (*slot)?;
        *slot = (left > 1).then(|| (left - 1, status));
        Some(status)
    }

    pub(crate) fn add_fork_source_vanishes(&self, count: u32) {
        self.fork_source_vanishes.fetch_add(count, Ordering::SeqCst);
    }

    /// True when this fork's source must vanish after its capture.
    pub(crate) fn take_fork_source_vanish(&self) -> bool {
        self.fork_source_vanishes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Arms the hold rule (replacing one not yet used).
    pub(crate) fn set_hold(&self, rule: HoldRule) {
        let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        slot.rule = Some(rule);
    }

    /// The request being held (`METHOD path`), if one is; and whether a rule is armed.
    pub(crate) fn hold_status(&self) -> (bool, Option<String>) {
        let slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        (slot.rule.is_some(), slot.held.clone())
    }

    /// Disarms the rule and lets the held request, if any, go on as `release` says.
    pub(crate) fn release_hold(&self, release: Release) {
        let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        slot.rule = None;
        if slot.held.is_some() {
            slot.release = Some(release);
        }
        drop(slot);
        self.released.notify_waiters();
    }

    /// Whether this request is the one to hold (then it is marked held and the rule used up).
    pub(crate) fn take_hold(&self, plane: Plane, method: &str, path: &str) -> bool {
        let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(rule) = slot.rule.as_mut() else {
            return false;
        };
        if !rule.matches(plane, path) {
            return false;
        }
        if rule.skip > 0 {
            rule.skip -= 1;
            return false;
        }
        slot.rule = None;
        slot.held = Some(format!("{method} {path}"));
        slot.release = None;
        true
    }

    /// Waits until the held request is released; how it goes on.
    pub(crate) async fn wait_release(&self) -> Release {
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(release) = slot.release.take() {
                    slot.held = None;
                    return release;
                }
            }
            notified.await;
        }
    }

    /// Forgets every rule and the latency.
    pub(crate) fn clear(&self) {
        self.release_hold(Release::Fail);
        self.latency_ms.store(0, Ordering::Relaxed);
        self.drop_connections.store(0, Ordering::SeqCst);
        self.fork_source_vanishes.store(0, Ordering::SeqCst);
        self.set_fork_start_failures(0, 0);
        self.fail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.drop_streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Takes one use of the first fail rule matching this request.
    pub(crate) fn take_fail(&self, plane: Plane, path: &str) -> Option<FailRule> {
        take_rule(
            &self.fail,
            |rule| rule.matches(plane, path),
            |rule| &mut rule.count,
        )
    }

    pub(crate) fn take_drop(&self, plane: Plane, path: &str) -> Option<DropRule> {
        take_rule(
            &self.drop_streams,
            |rule| rule.matches(plane, path),
            |rule| &mut rule.count,
        )
    }

    /// True when the connection just accepted must be closed without an answer.
    pub(crate) fn take_connection_drop(&self) -> bool {
        self.drop_connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

fn take_rule<R: Clone>(
    rules: &Mutex<VecDeque<R>>,
    matches: impl Fn(&R) -> bool,
    count: impl Fn(&mut R) -> &mut u32,
) -> Option<R> {
    let mut rules = rules.lock().unwrap_or_else(PoisonError::into_inner);
    let index = rules.iter().position(&matches)?;
    let rule = rules[index].clone();
    let left = count(&mut rules[index]);
    *left = left.saturating_sub(1);
    if *left == 0 {
        rules.remove(index);
    }
    Some(rule)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
