//! Warnings given once per cause per process (I5, C6). A host that cannot lock, or a scope
//! with duplicate sandboxes, stays so for every backend of the process (a gateway builds one
//! per session): repeating the warning for each would bury it.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// True the first time this process sees `cause`, false ever after.
pub(crate) fn first_time(cause: &str) -> bool {
    WARNED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(cause.to_owned())
}
