use super::*;

fn entry(id: &str, owner: Owner, state: EntryState, secs: u64) -> SandboxEntry {
    SandboxEntry {
        sandbox_id: id.to_owned(),
        state,
        template: "base".to_owned(),
        restored_from: None,
        mode: Mode::Persistent,
        scope: "ab".repeat(32),
        owner,
        posture: None,
        started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        lease_left: None,
        duplicate_of: None,
        subagent: None,
        subagent_recoverable: false,
        subagent_held: None,
        host: None,
        egress_stamp: None,
        usage: Usage {
            last_used: None,
            source: None,
            activity: Activity::Unknown,
            paused_at: None,
        },
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
        egress_applied: None,
        activity: None,
    });
    entry
}

#[test]
fn the_rules_known_are_this_hosts_last_update_else_the_creation_stamp() {
    // contract: X9 — E2B metadata cannot change after an update, so the note decides.
    let mut sandbox = held(entry("sbx1", Owner::ThisProfile, EntryState::Running, 1));
    sandbox.egress_stamp = Some("created".to_owned());
    assert_eq!(sandbox.egress_known().as_deref(), Some("created"));
    if let Some(host) = sandbox.host.as_mut() {
        host.egress_applied = Some("sbx0 updated-elsewhere".to_owned());
    }
    assert_eq!(sandbox.egress_known().as_deref(), Some("created"));
    if let Some(host) = sandbox.host.as_mut() {
        host.egress_applied = Some("sbx1 updated".to_owned());
    }
    assert_eq!(sandbox.egress_known().as_deref(), Some("updated"));
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
    let plan_no = plan(&all, &ids, Force::No, SystemTime::UNIX_EPOCH);
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

    let forced = plan(&all, &ids, Force::Yes, SystemTime::UNIX_EPOCH);
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
        plan(&all, &target, Force::No, SystemTime::UNIX_EPOCH)
            .into_iter()
            .map(|p| p.sandbox_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(RemovalTarget::Duplicates), ["dup"]);
    assert_eq!(
        ids(RemovalTarget::Paused(PausedSelection::default())),
        ["paused"]
    );
}

// contract: I8
#[test]
fn paused_selection_takes_those_unused_long_enough_and_of_the_named_tasks() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
    let ago = |secs: u64| Some(now - Duration::from_secs(secs));
    let paused =
        |id: &str, task: &str, last_used: Option<SystemTime>, paused_at: Option<SystemTime>| {
            let mut entry = held(entry(id, Owner::ThisProfile, EntryState::Paused, 1));
            if let Some(host) = entry.host.as_mut() {
                host.task_id = Some(task.to_owned());
                host.writer = WriterHolder::Free;
            }
            entry.usage.last_used = last_used;
            entry.usage.paused_at = paused_at;
            entry
        };
    let all = [
        // Used three hours ago, paused two hours ago: unused for two hours.
        paused("old", "session:a", ago(3 * 3600), ago(2 * 3600)),
        // Paused ten minutes ago.
        paused("recent", "session:b", ago(3 * 3600), ago(600)),
        // Nothing known of its use: never taken by age.
        paused("unknown", "session:a", None, None),
        entry("running", Owner::ThisProfile, EntryState::Running, 2),
        entry("theirs", Owner::OtherProfile, EntryState::Paused, 3),
    ];
    let ids = |unused_for: Option<u64>, tasks: &[&str]| {
        let selection = PausedSelection::new(
            unused_for.map(Duration::from_secs),
            tasks.iter().map(|t| (*t).to_owned()).collect(),
        );
        plan(&all, &RemovalTarget::Paused(selection), Force::No, now)
            .into_iter()
            .map(|p| p.sandbox_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(None, &[]), ["old", "recent", "unknown"]);
    assert_eq!(ids(Some(3600), &[]), ["old"]);
    assert_eq!(ids(Some(2 * 3600), &[]), ["old"], "exactly as long counts");
    assert_eq!(ids(Some(300), &[]), ["old", "recent"]);
    assert_eq!(ids(Some(3 * 3600), &[]), Vec::<String>::new());
    assert_eq!(ids(None, &["session:a"]), ["old", "unknown"]);
    assert_eq!(ids(Some(300), &["session:b"]), ["recent"]);
    assert_eq!(ids(None, &["session:none"]), Vec::<String>::new());
}

#[test]
fn refusals_and_losses_say_why_in_plain_words() {
    // contract: I8 — the framework adds its command names; these are the reasons themselves.
    let cases = [
        (Refusal::OtherProfile.to_string(), "another profile owns it"),
        (
            Refusal::UnknownOwner.to_string(),
            "made before sandboxes carried their profile, and not by this host's profile",
        ),
        (
            Refusal::LiveWriter { pid: Some(42) }.to_string(),
            "a live session on this host (pid 42) holds its writer role",
        ),
        (
            Refusal::LiveWriter { pid: None }.to_string(),
            "a live session on this host holds its writer role",
        ),
        (Loss::Ephemeral.to_string(), "its files and processes"),
        (
            Loss::Duplicate {
                newest: "i2".to_owned(),
            }
            .to_string(),
            "its files and processes (a duplicate: sessions use i2; agent state written only here is lost)",
        ),
        (
            Loss::UnpulledState {
                last_pull: Some("2026-12-01T00:00:00Z pulled from i1".to_owned()),
            }
            .to_string(),
            "its files and processes, including agent state not yet pulled (last pull 2026-12-01T00:00:00Z pulled from i1)",
        ),
        (
            Loss::UnpulledState { last_pull: None }.to_string(),
            "its files and processes, including agent state not yet pulled (no pull recorded on this host)",
        ),
    ];
    for (text, wanted) in cases {
        assert_eq!(text, wanted);
    }
}

#[test]
fn a_kill_names_what_each_kind_of_sandbox_loses() {
    // contract: I8 — an ephemeral sandbox holds no state a pull would keep; a persistent one
    // names its last pull; a duplicate names the sandbox sessions use.
    let mut ephemeral = entry("eph", Owner::ThisProfile, EntryState::Running, 1);
    ephemeral.mode = Mode::Ephemeral;
    let mut dup = entry("dup", Owner::ThisProfile, EntryState::Running, 2);
    dup.duplicate_of = Some("new".to_owned());
    let all = [
        ephemeral,
        entry("kept", Owner::ThisProfile, EntryState::Paused, 3),
        dup,
    ];
    let ids = RemovalTarget::Ids(["eph", "kept", "dup"].map(str::to_owned).to_vec());
    let losses: Vec<Verdict> = plan(&all, &ids, Force::No, SystemTime::UNIX_EPOCH)
        .into_iter()
        .map(|p| p.verdict)
        .collect();
    assert_eq!(
        losses,
        [
            Verdict::Kill {
                loses: Loss::Ephemeral
            },
            Verdict::Kill {
                loses: Loss::UnpulledState { last_pull: None }
            },
            Verdict::Kill {
                loses: Loss::Duplicate {
                    newest: "new".to_owned()
                }
            },
        ]
    );
}

#[test]
fn the_template_check_names_each_missing_thing() {
    // contract: O6
    assert_eq!(template_gaps(""), Ok(()));
    assert_eq!(template_gaps("unrelated output\n"), Ok(()));
    let gaps = template_gaps("missing:flock\nmissing:setsid\nmissing:writable home /home/user\n")
        .expect_err("gaps");
    assert!(
        gaps.starts_with("the template lacks flock, setsid, writable home /home/user"),
        "{gaps}"
    );
    // The script asks for every tool the backend needs, and the home.
    let script = template_check_script();
    for tool in TEMPLATE_TOOLS {
        assert!(script.contains(tool), "{script}");
    }
    assert!(script.contains("$HOME"), "{script}");
}

#[test]
fn the_template_check_script_reports_what_this_machine_lacks() {
    // contract: O6 — the script itself, run by the same sh the sandbox uses, with a PATH
    // that has no tools and a home that cannot be written.
    let empty = tempfile::tempdir().expect("dir");
    let output = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(template_check_script())
        .env("PATH", empty.path())
        .env("HOME", "/nonexistent/home")
        .output()
        .expect("sh runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let gaps = template_gaps(&text).expect_err("nothing is there");
    for tool in TEMPLATE_TOOLS {
        assert!(gaps.contains(tool), "{gaps}");
    }
    assert!(gaps.contains("writable home /nonexistent/home"), "{gaps}");
}

/// The fixed wall clock the usage tests count from (no sleeping: `now` is a parameter).
fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

fn seen<'a>(
    state: EntryState,
    end_at: u64,
    record: Option<&'a ScopeActivity>,
    live: bool,
) -> usage::Observed<'a> {
    usage::Observed {
        sandbox_id: "sbx1",
        state,
        started_at: at(0),
        end_at: at(end_at),
        lease_span: Duration::from_secs(360),
        record,
        session_live: live,
    }
}

fn record(sandbox: &str, started: u64, ended: Option<u64>) -> ScopeActivity {
    ScopeActivity {
        sandbox_id: sandbox.to_owned(),
        started: at(started),
        ended: ended.map(at),
    }
}

#[test]
fn last_use_is_estimated_from_the_lease_end_and_idle_counts_to_now() {
    // contract: I9 — a running sandbox's endAt is its last extension plus lease and headroom.
    let now = at(1000);
    let running = usage::usage(seen(EntryState::Running, 1060, None, false), now);
    assert_eq!(running.last_used, Some(at(700)));
    assert_eq!(running.source, Some(UseSource::Lease));
    assert_eq!(running.activity, Activity::Idle(Duration::from_secs(300)));
    assert_eq!(running.paused_at, None);

    // Paused by its lease at 900: last used one lease span before, paused then.
    let paused = usage::usage(seen(EntryState::Paused, 900, None, false), now);
    assert_eq!(paused.last_used, Some(at(540)));
    assert_eq!(paused.paused_at, Some(at(900)));
    assert_eq!(paused.activity, Activity::Idle(Duration::from_secs(460)));

    // Never before its start, never after now (a long command's lease reaches further).
    let young = usage::usage(seen(EntryState::Running, 100, None, false), now);
    assert_eq!(young.last_used, Some(at(0)));
    let long = usage::usage(seen(EntryState::Running, 2000, None, false), now);
    assert_eq!(long.last_used, Some(now));
    assert_eq!(long.activity, Activity::Idle(Duration::ZERO));

    // Another state tells nothing.
    let other = usage::usage(seen(EntryState::Other, 900, None, false), now);
    assert_eq!((other.last_used, other.activity), (None, Activity::Unknown));
}

#[test]
fn this_hosts_record_of_the_sandbox_wins_and_tells_a_running_command() {
    // contract: I9
    let now = at(1000);
    let ended = record("sbx1", 800, Some(830));
    let idle = usage::usage(seen(EntryState::Running, 1060, Some(&ended), true), now);
    assert_eq!(idle.last_used, Some(at(830)));
    assert_eq!(idle.source, Some(UseSource::Host));
    assert_eq!(idle.activity, Activity::Idle(Duration::from_secs(170)));

    let started = record("sbx1", 950, Some(830));
    let busy = usage::usage(seen(EntryState::Running, 1060, Some(&started), true), now);
    assert_eq!(busy.activity, Activity::RunningCommand { since: at(950) });
    assert_eq!(busy.last_used, Some(at(950)));

    // No live session on this host: the command's process is gone; it was last used then.
    let crashed = usage::usage(seen(EntryState::Running, 1060, Some(&started), false), now);
    assert_eq!(crashed.activity, Activity::Idle(Duration::from_secs(50)));
    // A paused sandbox runs nothing, whatever the record says.
    let paused = usage::usage(seen(EntryState::Paused, 990, Some(&started), true), now);
    assert_eq!(paused.activity, Activity::Idle(Duration::from_secs(50)));
    assert_eq!(paused.paused_at, Some(at(990)));

    // A record of another sandbox of the scope (a replaced one) is not this one's use.
    let elsewhere = record("sbx0", 990, Some(995));
    let estimated = usage::usage(seen(EntryState::Running, 1060, Some(&elsewhere), true), now);
    assert_eq!(estimated.source, Some(UseSource::Lease));
    assert_eq!(estimated.last_used, Some(at(700)));
}

#[test]
fn the_listing_by_last_use_puts_the_most_recently_used_first() {
    // contract: I9
    let used = |id: &str, started: u64, last: Option<u64>, activity: Activity| {
        let mut e = entry(id, Owner::ThisProfile, EntryState::Running, started);
        e.usage = Usage {
            last_used: last.map(at),
            source: last.map(|_| UseSource::Lease),
            activity,
            paused_at: None,
        };
        e
    };
    let idle = |secs| Activity::Idle(Duration::from_secs(secs));
    let mut entries = vec![
        used("never", 50, None, Activity::Unknown),
        used("old", 40, Some(100), idle(900)),
        used(
            "busy",
            1,
            Some(50),
            Activity::RunningCommand { since: at(50) },
        ),
        used("recent", 2, Some(900), idle(100)),
        used("tie-b", 3, Some(500), idle(500)),
        used("tie-a", 3, Some(500), idle(500)),
    ];
    by_last_use(&mut entries);
    let order: Vec<&str> = entries.iter().map(|e| e.sandbox_id.as_str()).collect();
    assert_eq!(order, ["busy", "recent", "tie-a", "tie-b", "old", "never"]);
}
