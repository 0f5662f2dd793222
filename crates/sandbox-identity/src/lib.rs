#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod adoption;
mod checkpoint;
mod error;
mod labels;
mod lease;
mod metadata;
mod scope;

pub use adoption::{
    Adoption, Candidate, Mismatch, SandboxState, check, choose, retirable, superseded,
};
pub use checkpoint::{
    BRANCH_KEY, CheckpointName, CheckpointReason, MAX_LABEL_LEN, RESTORED_FROM_KEY, SUBAGENT_KEY,
    SUPERSEDES_KEY, alias_of,
};
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
