//! From E2B's listing to the profile's entries: what each sandbox is (owner, duplicates,
//! a delegated child's fork, the host's view, its last use) and their order.

use super::*;

/// Orders entries by last use, the most recently used first; a sandbox running a command
/// counts as used now. Entries with no known use come last; ties go newest started first,
/// then by id.
pub(crate) fn by_last_use(entries: &mut [SandboxEntry]) {
    let rank = |entry: &SandboxEntry| {
        let running = matches!(entry.usage.activity, Activity::RunningCommand { .. });
        (running, entry.usage.last_used, entry.started_at)
    };
    entries.sort_by(|a, b| {
        rank(b)
            .cmp(&rank(a))
            .then_with(|| a.sandbox_id.cmp(&b.sandbox_id))
    });
}

/// The listed sandboxes this plugin made (a readable identity), with owner, duplicates,
/// host view and last use; newest first. Pure but for `host`, which the caller backs with
/// the scope files, and `now`, the wall clock idle times and lease time left count to.
pub(crate) fn classify(
    listed: &[ListedSandbox],
    profile: ProfileDigest,
    now: SystemTime,
    spans: LeaseSpans,
    host: &dyn Fn(&ScopeDigest) -> Option<HostScope>,
) -> Vec<SandboxEntry> {
    let mut entries: Vec<SandboxEntry> = Vec::new();
    for sandbox in listed {
        let Ok(identity) = IdentityMetadata::from_map(&sandbox.metadata) else {
            continue;
        };
        let labels = Labels::from_map(&sandbox.metadata);
        let host_view = host(&identity.digest);
        let owner = match labels.profile {
            Some(found) if found == profile => Owner::ThisProfile,
            Some(_) => Owner::OtherProfile,
            None if host_view.is_some() => Owner::ThisProfile,
            None => Owner::Unknown,
        };
        let state = match sandbox.state {
            e2b_client::SandboxState::Running => EntryState::Running,
            e2b_client::SandboxState::Paused => EntryState::Paused,
            _ => EntryState::Other,
        };
        let end_at = SystemTime::from(sandbox.end_at);
        let restored_from = sandbox
            .metadata
            .get(sandbox_identity::RESTORED_FROM_KEY)
            .map(|snapshot| crate::checkpoint::Checkpoint::restored_from_name(snapshot));
        let template = restored_from
            .as_ref()
            .and_then(|_| {
                sandbox
                    .metadata
                    .get(crate::checkpoint::TEMPLATE_KEY)
                    .cloned()
            })
            .or_else(|| sandbox.alias.clone())
            .unwrap_or_else(|| sandbox.template_id.clone());
        let started_at = SystemTime::from(sandbox.started_at);
        let usage = usage::usage(
            usage::Observed {
                sandbox_id: sandbox.sandbox_id.as_str(),
                state,
                started_at,
                end_at,
                lease_span: match identity.mode {
                    Mode::Ephemeral => spans.ephemeral,
                    Mode::Persistent => spans.persistent,
                },
                record: host_view.as_ref().and_then(|h| h.activity.as_ref()),
                session_live: host_view
                    .as_ref()
                    .is_some_and(|h| matches!(h.writer, WriterHolder::Held { .. })),
            },
            now,
        );
        entries.push(SandboxEntry {
            sandbox_id: sandbox.sandbox_id.as_str().to_owned(),
            state,
            template,
            restored_from,
            mode: identity.mode,
            scope: identity.digest.to_hex(),
            owner,
            posture: labels.posture.map(|p| p.as_str().to_owned()),
            started_at,
            lease_left: (state == EntryState::Running)
                .then(|| end_at.duration_since(now).unwrap_or(Duration::ZERO)),
            duplicate_of: None,
            subagent: sandbox
                .metadata
                .get(sandbox_identity::SUBAGENT_KEY)
                .map(|child| {
                    let parent = sandbox
                        .metadata
                        .get(sandbox_identity::BRANCH_KEY)
                        .cloned()
                        .unwrap_or_default();
                    (child.clone(), parent)
                }),
            // Known once the listing checks this host's records.
            subagent_recoverable: false,
            subagent_held: None,
            host: if owner == Owner::ThisProfile {
                host_view
            } else {
                None
            },
            egress_stamp: sandbox.metadata.get(crate::egress::EGRESS_KEY).cloned(),
            usage,
        });
    }
    // Newest first, ties by id: the order adoption uses, so the first of a scope is the one
    // sessions adopt.
    entries.sort_by(|a, b| (b.started_at, &b.sandbox_id).cmp(&(a.started_at, &a.sandbox_id)));
    let mut keeper: BTreeMap<(String, Owner), String> = BTreeMap::new();
    for entry in &mut entries {
        let adoptable = entry.mode == Mode::Persistent
            && entry.state != EntryState::Other
            && entry.subagent.is_none();
        if !adoptable {
            continue;
        }
        let key = (entry.scope.clone(), entry.owner);
        match keeper.get(&key) {
            Some(newest) => entry.duplicate_of = Some(newest.clone()),
            None => {
                keeper.insert(key, entry.sandbox_id.clone());
            }
        }
    }
    entries
}
