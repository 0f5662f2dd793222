use super::*;

fn entry(id: &str, owner: Owner, state: EntryState, secs: u64) -> SandboxEntry {
    SandboxEntry {
        sandbox_id: id.to_owned(),
        state,
        template: "base".to_owned(),
        mode: Mode::Persistent,
        scope: "ab".repeat(32),
        owner,
        posture: None,
        started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        lease_left: None,
        duplicate_of: None,
        host: None,
    }
}

fn held(mut entry: SandboxEntry) -> SandboxEntry {
    entry.host = Some(HostScope {
        task_id: Some("default".to_owned()),
        writer: WriterHolder::Held { pid: Some(4242) },
        dirty: None,
        prepared_for: Some(entry.sandbox_id.clone()),
        last_pull: None,
        last_recovery: None,
    });
    entry
}

fn verdicts(plan: &[PlannedRemoval]) -> Vec<(&str, &Verdict)> {
    plan.iter()
        .map(|p| (p.sandbox_id.as_str(), &p.verdict))
        .collect()
}

// contract: I8
#[test]
fn removal_refuses_other_profiles_unknown_owners_and_live_writers() {
    let all = [
        entry("other", Owner::OtherProfile, EntryState::Paused, 1),
        entry("legacy", Owner::Unknown, EntryState::Paused, 2),
        held(entry("live", Owner::ThisProfile, EntryState::Running, 3)),
        entry("mine", Owner::ThisProfile, EntryState::Paused, 4),
    ];
    let ids = RemovalTarget::Ids(
        ["other", "legacy", "live", "mine", "gone"]
            .map(str::to_owned)
            .to_vec(),
    );
    let plan_no = plan(&all, &ids, Force::No);
    let got = verdicts(&plan_no);
    assert_eq!(got[0].1, &Verdict::Refused(Refusal::OtherProfile));
    assert_eq!(got[1].1, &Verdict::Refused(Refusal::UnknownOwner));
    assert_eq!(
        got[2].1,
        &Verdict::Refused(Refusal::LiveWriter { pid: Some(4242) })
    );
    assert!(got[2].1 != &Verdict::Refused(Refusal::LiveWriter { pid: None }));
    assert!(
        matches!(
            got[3].1,
            Verdict::Kill {
                loses: Loss::UnpulledState { .. }
            }
        ),
        "{:?}",
        got[3].1
    );
    assert_eq!(got[4], ("gone", &Verdict::AlreadyGone));

    let forced = plan(&all, &ids, Force::Yes);
    let got = verdicts(&forced);
    assert!(
        matches!(got[0].1, Verdict::Refused(_)),
        "--force never takes another profile's"
    );
    assert!(
        got[1..4]
            .iter()
            .all(|(_, v)| matches!(v, Verdict::Kill { .. }))
    );
}

// contract: I8
#[test]
fn paused_and_duplicates_select_only_this_profiles() {
    let mut dup = entry("dup", Owner::ThisProfile, EntryState::Running, 1);
    dup.duplicate_of = Some("new".to_owned());
    let all = [
        entry("new", Owner::ThisProfile, EntryState::Running, 5),
        dup,
        entry("paused", Owner::ThisProfile, EntryState::Paused, 2),
        entry("theirs", Owner::OtherProfile, EntryState::Paused, 3),
    ];
    let ids = |target| {
        plan(&all, &target, Force::No)
            .into_iter()
            .map(|p| p.sandbox_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(RemovalTarget::Duplicates), ["dup"]);
    assert_eq!(ids(RemovalTarget::Paused), ["paused"]);
}
