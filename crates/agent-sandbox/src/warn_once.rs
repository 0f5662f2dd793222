//! Warnings given once per cause per process (I5, C6). A host that cannot lock, or a scope
//! with duplicate sandboxes, stays so for every backend of the process (a gateway builds one
//! per session): repeating the warning for each would bury it. A binding uses the same record
//! for its own causes (e.g. an unknown setting key), so "once" means once across both.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// True the first time this process sees `cause`, false ever after.
pub fn first_time(cause: &str) -> bool {
    WARNED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(cause.to_owned())
}
