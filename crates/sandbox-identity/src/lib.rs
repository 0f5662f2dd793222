//! Pure scope identity for E2B sandboxes: the scope digest, identity metadata, adoption choice and lease arithmetic.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::{Duration, SystemTime};
//!
//! use sandbox_identity::{
//!     Adoption, Candidate, IdentityMetadata, InternetAccess, LeaseKind, LeasePlan, LeasePolicy,
//!     LeaseTracker, ManualClock, Mode, SandboxState, ScopeIdentity, Security, stamp,
//! };
//!
//! // 1. The scope: what Hermes resolved, plus the settings that make a
//! //    sandbox a valid substitute.
//! let scope = ScopeIdentity {
//!     profile_home: "/home/alice/.hermes".to_owned(),
//!     task_id: "default".to_owned(),
//!     template: "base".to_owned(),
//!     mode: Mode::Persistent,
//!     internet: InternetAccess::Allowed,
//!     security: Security::Secure,
//! };
//!
//! // 2. The metadata to create a sandbox with: no task id, no host path.
//! let identity = IdentityMetadata::for_scope(&scope);
//! let user = BTreeMap::from([("team".to_owned(), "infra".to_owned())]);
//! let create_with = stamp(&user, &identity).metadata;
//! assert_eq!(create_with["hermes.scope"], scope.digest().to_hex());
//! assert!(create_with.values().all(|v| !v.contains("alice")));
//!
//! // 3. Adoption among what a list call returned.
//! let listed = Candidate {
//!     sandbox_id: "isb1".to_owned(),
//!     template_id: "rki5dems9wqfm4r03t7g".to_owned(),
//!     template_alias: Some("base".to_owned()),
//!     metadata: create_with.clone(),
//!     started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
//!     state: SandboxState::Paused,
//! };
//! let candidates = [listed];
//! let Adoption::Adopt { candidate, duplicates, .. } = sandbox_identity::choose(&scope, &candidates)
//! else {
//!     panic!("a matching sandbox is adopted");
//! };
//! assert_eq!((candidate.sandbox_id.as_str(), duplicates), ("isb1", 0));
//!
//! // 4. The lease before a command, over an injected clock.
//! let policy = LeasePolicy {
//!     lease: Duration::from_secs(300),
//!     command_grace: Duration::from_secs(30),
//!     kind: LeaseKind::Persistent,
//! };
//! let clock = ManualClock::new();
//! let mut tracker = LeaseTracker::new();
//! let needed = policy.command_lease(Duration::from_secs(600));
//! assert_eq!(needed, Duration::from_secs(630));
//! if let LeasePlan::Extend(request) = tracker.plan(&clock, needed) {
//!     // Send an extend-only connect with request.timeout_secs(), then:
//!     tracker.confirm(&request);
//! }
//! clock.advance(Duration::from_secs(10));
//! let short = policy.command_lease(Duration::from_secs(5));
//! assert_eq!(tracker.plan(&clock, short), LeasePlan::Covered);
//! ```
//!
//! # What it guarantees
//!
//! - **Digest.** [`ScopeIdentity::digest`] is SHA-256 over a versioned,
//!   length-prefixed encoding of (profile home, task id, template, mode,
//!   internet access, security). Same inputs, same digest on every
//!   platform; any one input changed, a different digest (contract I1).
//! - **Metadata.** [`stamp`] merges user metadata under the identity keys
//!   ([`SCOPE_KEY`], [`IDENTITY_VERSION_KEY`], [`MODE_KEY`]); the identity
//!   always wins and the whole `hermes.` prefix is reserved. Only the digest,
//!   the version and the mode reach E2B as identity; [`stamp_scope`] adds two
//!   descriptive [`Labels`] ([`PROFILE_KEY`]: a digest of the profile home
//!   alone, [`POSTURE_KEY`]) that never decide adoption, so sandboxes made
//!   before them are still adopted.
//! - **Adoption.** [`choose`] adopts the newest exact match, reports how many
//!   duplicates exist (I5), never adopts another template or posture (I3),
//!   and never adopts in ephemeral mode (L4).
//! - **Leases.** [`LeasePolicy::command_lease`] is
//!   `max(lease, timeout + grace)` (L5); ephemeral sandboxes never go below
//!   [`ephemeral_floor`] (L4); [`LeaseTracker`] says when the known expiry
//!   already covers a command, and its expiry only grows.
//! - **Pure.** No I/O, no HTTP types; time comes from a [`Clock`].

#![deny(missing_docs)]

mod adoption;
mod error;
mod labels;
mod lease;
mod metadata;
mod scope;

pub use adoption::{Adoption, Candidate, Mismatch, SandboxState, check, choose};
pub use error::Error;
pub use labels::{Labels, POSTURE_KEY, PROFILE_KEY, Posture, ProfileDigest, stamp_scope};
pub use lease::{
    CONTROL_PLANE_MARGIN, Clock, ExtensionRequest, LeaseKind, LeasePlan, LeasePolicy, LeaseTracker,
    ManualClock, PROBE_LEASE_CAP, REAPER_INTERVAL, SystemClock, ephemeral_floor,
};
pub use metadata::{
    IDENTITY_VERSION_KEY, IdentityMetadata, MODE_KEY, RESERVED_PREFIX, SCOPE_KEY, StampedMetadata,
    stamp,
};
pub use scope::{IDENTITY_VERSION, InternetAccess, Mode, ScopeDigest, ScopeIdentity, Security};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
