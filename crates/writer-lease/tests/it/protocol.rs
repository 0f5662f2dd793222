//! The writer protocol, reader admission, the creation lock and degraded
//! hosts, within one process (flock locks are per open file, so two
//! `ScopeFiles` in one process contend like two processes).

use crate::support;

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use support::{FaultyHost, Op, denied, disk_full, no_locks, read_only, unsupported};
use writer_lease::{
    Admission, CreationAccess, DegradationCause, DirtyReason, Generation, Refusal, Role, ScopeFile,
    ScopeFiles, ScopeKey, WriterLease, WriterPhase, WriterStatus,
};

fn key() -> ScopeKey {
    ScopeKey::from_bytes([0x5c; 32])
}

fn files(dir: &tempfile::TempDir) -> ScopeFiles {
    ScopeFiles::new(dir.path().join("cache").join("e2b"), key())
}

fn faulty(dir: &tempfile::TempDir) -> (ScopeFiles, Arc<FaultyHost>) {
    let host = Arc::new(FaultyHost::new());
    let files = ScopeFiles::with_host(dir.path().join("e2b"), key(), host.clone());
    (files, host)
}

fn writer(files: &ScopeFiles) -> WriterLease {
    match files.try_acquire_writer() {
        Ok(Role::Writer(lease)) => lease,
        other => panic!("expected the writer role, got {other:?}"),
    }
}

fn refusal(admission: Admission) -> Refusal {
    match admission {
        Admission::Refused(refusal) => refusal,
        Admission::Admitted { generation } => panic!("admitted at generation {generation}"),
    }
}

// contract: C1
#[test]
fn one_writer_per_scope_and_the_role_frees_on_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = files(&dir);
    let b = files(&dir);
    assert_eq!(a.writer_status().ok(), Some(WriterStatus::Free));

    let lease = writer(&a);
    assert!(lease.degradation().is_none());
    assert!(matches!(b.try_acquire_writer(), Ok(Role::Reader)));
    assert_eq!(b.writer_status().ok(), Some(WriterStatus::Held));
    // The status probe did not disturb the holder.
    assert!(matches!(b.try_acquire_writer(), Ok(Role::Reader)));

    lease.release();
    assert_eq!(b.writer_status().ok(), Some(WriterStatus::Free));
    let other = ScopeFiles::new(a.dir().to_path_buf(), ScopeKey::from_bytes([1; 32]));
    let _unrelated = writer(&other);
    assert!(matches!(b.try_acquire_writer(), Ok(Role::Writer(_))));
}

// contract: C1
#[test]
fn one_writer_per_scope_however_its_directory_is_spelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("e2b");
    std::fs::create_dir(&real).expect("dir");
    let link = dir.path().join("linked");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let key = ScopeKey::from_bytes([7; 32]);
    let (a, b) = (
        ScopeFiles::new(real, key),
        ScopeFiles::new(link.clone(), key),
    );
    let lease = writer(&a);
    // Asked again and again (a reader's every command), through the other spelling.
    for _ in 0..3 {
        assert_eq!(b.writer_status().ok(), Some(WriterStatus::Held));
        assert!(matches!(b.try_acquire_writer(), Ok(Role::Reader)));
    }
    lease.release();
    assert_eq!(b.writer_status().ok(), Some(WriterStatus::Free));
    assert!(matches!(b.try_acquire_writer(), Ok(Role::Writer(_))));
}

// contract: C2, C3
// Found by the crash/fault campaign: a reader that read the markers after a new writer
// took the role but before it marked the scope dirty was admitted on the previous
// session's stamp, and ran a command on state the host had changed since.
#[test]
fn a_new_writer_holds_the_gate_from_taking_the_role_until_its_transition_began() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    let mut first = writer(&files(&dir));
    let generation = first.begin_transition().expect("begin");
    first.complete_push("sbx1").expect("push");
    first.release();
    assert!(matches!(
        reader.admission("sbx1"),
        Admission::Admitted { generation: g } if g == generation
    ));

    let mut second = writer(&files(&dir));
    assert_eq!(second.phase(), WriterPhase::Idle);
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Changed
    ));
    second.begin_transition().expect("begin");
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Dirty(_)
    ));
    second.complete_push("sbx1").expect("push");
    assert!(reader.admission("sbx1").is_admitted());

    // A session that finds the role taken leaves the gate open behind it.
    assert!(matches!(
        files(&dir).try_acquire_writer().expect("try"),
        Role::Reader
    ));
    assert!(reader.admission("sbx1").is_admitted());
}

// contract: C2
#[test]
fn a_reader_waits_a_bounded_time_for_the_gate_then_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = writer(&files(&dir));
    first.begin_transition().expect("begin");
    first.complete_push("sbx1").expect("push");
    first.release();
    let _second = writer(&files(&dir));
    let host = Arc::new(FaultyHost::new());
    let reader = ScopeFiles::with_host(dir.path().join("cache").join("e2b"), key(), host.clone());
    let before = host.sleeps();
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Changed
    ));
    // The whole GATE_WAIT (2 s, on the fake clock) at one poll per millisecond.
    assert_eq!(host.sleeps() - before, 2000);
}

// contract: C2, C3
#[test]
fn a_stamp_of_an_older_generation_admits_nobody() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    let mut lease = writer(&files(&dir));
    lease.begin_transition().expect("begin");
    lease.complete_push("sbx1").expect("push");
    drop(lease);
    assert!(reader.admission("sbx1").is_admitted());
    // A newer generation without a dirty marker (never written so by a writer, but the
    // gate must not trust the order of other hosts' writes): the old stamp is stale.
    fs::write(
        reader.path(ScopeFile::Generation),
        b"hermes-e2b generation v1\ngeneration: 2\n",
    )
    .expect("newer generation");
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Unprepared
    ));
}

// contract: C2, C3, S3
#[test]
fn readers_are_refused_until_stamped_and_while_dirty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Unprepared
    ));

    let mut lease = writer(&files(&dir));
    assert_eq!(lease.phase(), WriterPhase::Idle);
    let generation = lease.begin_transition().expect("begin");
    assert_eq!(generation, Generation::new(1));
    match refusal(reader.admission("sbx1")) {
        Refusal::Dirty(marker) => {
            assert_eq!(marker.reason, DirtyReason::Transition);
            assert_eq!(marker.generation, Some(generation));
            assert_eq!(marker.pid, Some(std::process::id()));
        }
        other => panic!("expected dirty, got {other:?}"),
    }

    let stamp = lease.complete_push("sbx1").expect("push");
    assert_eq!(stamp.generation, generation);
    assert_eq!(lease.phase(), WriterPhase::Prepared);
    assert!(matches!(
        reader.admission("sbx1"),
        Admission::Admitted { generation: g } if g == generation
    ));
    assert!(matches!(
        refusal(reader.admission("sbx2")),
        Refusal::OtherSandbox
    ));

    lease.record_sync_failure().expect("mark");
    assert_eq!(lease.phase(), WriterPhase::Stale);
    match refusal(reader.admission("sbx1")) {
        Refusal::Dirty(marker) => assert_eq!(marker.reason, DirtyReason::FailedSync),
        other => panic!("expected dirty, got {other:?}"),
    }
    lease.record_sync_success().expect("clear");
    assert!(reader.admission("sbx1").is_admitted());
}

// contract: C3, C4
#[test]
fn a_new_writer_generation_invalidates_the_previous_stamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    let mut first = writer(&files(&dir));
    first.begin_transition().expect("begin");
    first.complete_push("sbx1").expect("push");
    first.release();

    // The next writer holds the role but has not begun: the markers are as the previous
    // writer left them, and the gate it holds refuses readers meanwhile.
    let mut second = writer(&reader);
    assert!(reader.prepared().expect("read").is_some());
    assert!(!reader.admission("sbx1").is_admitted());

    let generation = second.begin_transition().expect("begin");
    assert_eq!(generation, Generation::new(2));
    assert_eq!(reader.prepared().expect("read"), None);
    assert!(!reader.admission("sbx1").is_admitted());
    second.complete_push("sbx1").expect("push");
    assert!(matches!(
        reader.admission("sbx1"),
        Admission::Admitted { generation: g } if g == Generation::new(2)
    ));
}

// contract: C5
#[test]
fn a_writer_that_stops_mid_transition_leaves_the_scope_dirty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    let mut lease = writer(&files(&dir));
    lease.begin_transition().expect("begin");
    lease.complete_push("sbx1").expect("push");
    lease.begin_transition().expect("second transition");
    drop(lease);

    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Dirty(_)
    ));
    let mut next = writer(&reader);
    assert!(
        next.record_sync_success()
            .is_err_and(|e| e.is_caller_error())
    );
    next.begin_transition().expect("begin");
    next.complete_push("sbx1").expect("push");
    assert!(reader.admission("sbx1").is_admitted());
}

#[test]
fn protocol_steps_out_of_order_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut lease = writer(&files(&dir));
    let err = lease.complete_push("sbx1").err();
    assert!(err.is_some_and(|e| e.is_caller_error() && e.operation() == "stamp prepared"));
    assert!(
        lease
            .record_sync_success()
            .is_err_and(|e| e.is_caller_error())
    );
    lease.begin_transition().expect("begin");
    assert!(
        lease
            .record_sync_success()
            .is_err_and(|e| e.is_caller_error())
    );
    for bad in ["", "a/b", "x\ny", "sandbox id"] {
        assert!(
            lease.complete_push(bad).is_err_and(|e| e.is_caller_error()),
            "{bad:?}"
        );
    }
    assert_eq!(lease.phase(), WriterPhase::InTransition);
}

#[test]
fn corrupt_or_lost_files_refuse_admission_and_never_revive_an_old_stamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = files(&dir);
    let mut lease = writer(&files(&dir));
    lease.begin_transition().expect("begin");
    lease.complete_push("sbx1").expect("push");

    // A lost generation file makes the stamp look foreign, not current.
    fs::remove_file(reader.path(ScopeFile::Generation)).expect("remove");
    assert!(matches!(
        refusal(reader.admission("sbx1")),
        Refusal::Unprepared
    ));

    // Garbage in the stamp is unreadable, so admission refuses.
    fs::write(reader.path(ScopeFile::Prepared), b"garbage").expect("corrupt");
    match refusal(reader.admission("sbx1")) {
        Refusal::Unreadable(error) => {
            assert!(error.is_corrupt());
            assert_eq!(
                error.path(),
                Some(reader.path(ScopeFile::Prepared).as_path())
            );
        }
        other => panic!("expected unreadable, got {other:?}"),
    }

    // The next transition numbers above everything it can still see.
    drop(lease);
    let mut next = writer(&reader);
    fs::write(reader.path(ScopeFile::Generation), b"junk").expect("corrupt");
    fs::write(
        reader.path(ScopeFile::Prepared),
        b"hermes-e2b prepared v1\ngeneration: 9\nsandbox: sbx1\n",
    )
    .expect("old stamp");
    assert_eq!(next.begin_transition().expect("begin"), Generation::new(10));
    next.complete_push("sbx1").expect("push");
    assert!(reader.admission("sbx1").is_admitted());
}

/// The descriptors this process has open on files under `dir`.
#[cfg(target_os = "linux")]
fn open_under(dir: &std::path::Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .expect("list descriptors")
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

// contract: C1
#[cfg(target_os = "linux")]
#[test]
fn a_process_holds_one_descriptor_for_every_writer_role_of_a_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let coordination = dir.path().join("e2b");
    let scope = |n: u8| ScopeFiles::new(coordination.clone(), ScopeKey::from_bytes([n; 32]));
    // As a backend's writers are once brought up: their transitions began (which gives
    // the gate back).
    let leases: Vec<WriterLease> = (0..200)
        .map(|n| {
            let mut lease = writer(&scope(n));
            lease.begin_transition().expect("begin");
            lease
        })
        .collect();
    assert_eq!(
        open_under(dir.path()),
        1,
        "one writers' lock file, open once"
    );
    // Each role is exclusive in the process all the same, and ends alone.
    assert!(matches!(scope(7).try_acquire_writer(), Ok(Role::Reader)));
    assert_eq!(scope(7).writer_status().ok(), Some(WriterStatus::Held));
    let mut leases = leases;
    drop(leases.remove(7));
    assert_eq!(scope(7).writer_status().ok(), Some(WriterStatus::Free));
    assert_eq!(scope(8).writer_status().ok(), Some(WriterStatus::Held));
    let mut again = writer(&scope(7));
    again.begin_transition().expect("begin");
    drop(leases);
    assert_eq!(open_under(dir.path()), 1, "held while any role is");
    drop(again);
    assert_eq!(open_under(dir.path()), 0, "closed with the last role");
}

// contract: C1
#[test]
fn a_writer_of_an_older_version_holding_the_scopes_own_lock_file_is_respected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = files(&dir);
    // What an older version's writer holds for its whole session.
    fs::create_dir_all(scope.dir()).expect("dir");
    let legacy = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(scope.path(ScopeFile::WriterLock))
        .expect("open");
    // Another open file of the lock: excluded as another process would be.
    legacy.try_lock().expect("lock");
    assert!(matches!(scope.try_acquire_writer(), Ok(Role::Reader)));
    assert_eq!(scope.writer_status().ok(), Some(WriterStatus::Held));
    drop(legacy);
    let _lease = writer(&scope);
}

// contract: C1
#[test]
fn files_are_private_and_named_from_the_key_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = files(&dir);
    let mut lease = writer(&scope);
    lease.begin_transition().expect("begin");
    lease.complete_push("sbx1").expect("push");
    lease.record_sync_failure().expect("mark");

    let mut names: Vec<String> = fs::read_dir(scope.dir())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let hex = key().to_hex();
    let mut expected = vec![
        format!("{hex}.dirty"),
        format!("{hex}.gate.lock"),
        format!("{hex}.generation"),
        format!("{hex}.prepared"),
        format!("{hex}.writer.lock"),
    ];
    // The directory's one writers' lock, shared by its scopes (a byte each).
    if cfg!(target_os = "linux") {
        expected.push("writers.lock".to_owned());
    }
    assert_eq!(names, expected);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: PathBuf| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(scope.dir().to_path_buf()), 0o700);
        for file in [
            ScopeFile::WriterLock,
            ScopeFile::Dirty,
            ScopeFile::Prepared,
            ScopeFile::Generation,
        ] {
            assert_eq!(mode(scope.path(file)), 0o600, "{file:?}");
        }
        #[cfg(target_os = "linux")]
        assert_eq!(mode(scope.dir().join("writers.lock")), 0o600);
    }
}

// contract: I6
#[test]
fn the_creation_lock_excludes_and_its_wait_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, host) = faulty(&dir);
    let (b, _) = faulty(&dir);
    let Ok(CreationAccess::Locked(guard)) = a.try_creation_lock() else {
        panic!("a free creation lock is taken");
    };
    assert_eq!(guard.path(), a.path(ScopeFile::CreationLock));
    assert!(matches!(b.try_creation_lock(), Ok(CreationAccess::Busy)));

    // b's own host is a different virtual clock; use a's to count polls.
    let before = host.sleeps();
    assert!(matches!(
        a.creation_lock_within(Duration::from_millis(200)),
        Ok(CreationAccess::Busy)
    ));
    assert_eq!(host.sleeps() - before, 4, "200 ms at 50 ms per poll");
    // An absurd timeout is still bounded (capped at MAX_CREATION_WAIT).
    let before = host.sleeps();
    assert!(matches!(
        a.creation_lock_within(Duration::MAX),
        Ok(CreationAccess::Busy)
    ));
    let polls = host.sleeps() - before;
    let cap = writer_lease::MAX_CREATION_WAIT.as_millis() / 50;
    assert_eq!(u128::from(polls), cap);

    guard.release();
    assert!(matches!(
        b.creation_lock_within(Duration::from_secs(1)),
        Ok(CreationAccess::Locked(_))
    ));
}

fn degraded(files: &ScopeFiles) -> (WriterLease, DegradationCause) {
    let lease = writer(files);
    let cause = lease
        .degradation()
        .map(|d| d.cause)
        .expect("the writer reports the degradation");
    (lease, cause)
}

// contract: C6
#[test]
fn unsupported_locking_degrades_to_an_unprotected_writer() {
    for error in [unsupported as fn() -> std::io::Error, no_locks] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (scope, host) = faulty(&dir);
        host.fail_always(Op::Lock, "", error);
        let (mut lease, cause) = degraded(&scope);
        assert_eq!(cause, DegradationCause::LockingUnsupported);
        let warning = lease.degradation().expect("degraded").to_string();
        assert!(
            warning.contains("concurrent same-scope persistent sessions are not supported here"),
            "{warning}"
        );
        assert!(warning.contains(".writer.lock"), "{warning}");

        // A second session is not told "reader" forever: it degrades too.
        let (_second, second_cause) = degraded(&scope);
        assert_eq!(second_cause, DegradationCause::LockingUnsupported);
        assert!(matches!(
            scope.writer_status(),
            Ok(WriterStatus::Unknown(_))
        ));
        assert!(matches!(
            scope.try_creation_lock(),
            Ok(CreationAccess::Unprotected(_))
        ));

        // A single session still works.
        lease.begin_transition().expect("begin");
        lease.complete_push("sbx1").expect("push");
        assert!(scope.admission("sbx1").is_admitted());
    }
}

// contract: C6
#[test]
fn an_unwritable_directory_degrades_and_the_session_still_works() {
    type MakeError = fn() -> std::io::Error;
    let cases: [(Op, &'static str, MakeError); 3] = [
        (Op::EnsureDir, "e2b", denied),
        (Op::OpenLock, ".writer.lock", read_only),
        (Op::Probe, "e2b", denied),
    ];
    for (op, suffix, error) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let (scope, host) = faulty(&dir);
        host.fail_always(op, suffix, error);
        // Every marker write fails too, as it would in such a directory.
        host.fail_always(Op::Write, "", error);
        host.fail_always(Op::Remove, "", error);
        let (mut lease, cause) = degraded(&scope);
        assert_eq!(cause, DegradationCause::MarkerDirUnusable, "{op:?}");
        // The probe failure gave the lock back, so others degrade alike
        // instead of waiting as readers behind a writer that cannot gate them.
        let (_other, other_cause) = degraded(&scope);
        assert_eq!(other_cause, DegradationCause::MarkerDirUnusable);

        // Best effort: the protocol runs and reports no marker failures.
        lease.begin_transition().expect("begin");
        lease.complete_push("sbx1").expect("push");
        lease.record_sync_failure().expect("mark");
        lease.record_sync_success().expect("clear");
        assert_eq!(lease.phase(), WriterPhase::Prepared);
    }
}

// contract: C6
#[test]
fn a_directory_path_that_is_a_regular_file_degrades_without_any_seam() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blocker = dir.path().join("e2b");
    fs::write(&blocker, b"not a directory").expect("file");
    let scope = ScopeFiles::new(blocker, key());
    let (_lease, cause) = degraded(&scope);
    assert_eq!(cause, DegradationCause::MarkerDirUnusable);
}

#[test]
fn on_a_healthy_host_marker_failures_are_errors_naming_path_and_operation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (scope, host) = faulty(&dir);
    let mut lease = writer(&scope);
    assert!(lease.degradation().is_none());

    host.fail_once(Op::Write, ".dirty", disk_full);
    let Err(err) = lease.begin_transition() else {
        panic!("a failed mark is reported");
    };
    assert!(err.is_io());
    assert_eq!(err.operation(), "mark scope dirty");
    assert_eq!(err.path(), Some(scope.path(ScopeFile::Dirty).as_path()));
    assert!(err.to_string().contains(".dirty"));
    assert_eq!(lease.phase(), WriterPhase::Idle);

    // A reader that cannot read the markers is refused, not admitted.
    lease.begin_transition().expect("begin");
    lease.complete_push("sbx1").expect("push");
    host.fail_once(Op::Read, ".dirty", denied);
    assert!(matches!(refusal(scope.admission("sbx1")), Refusal::Unreadable(e) if e.is_io()));
    assert!(scope.admission("sbx1").is_admitted());
}

#[test]
fn a_failure_that_may_pass_is_an_error_not_a_second_writer() {
    // EMFILE: out of file descriptors says nothing about the directory, and
    // degrading on it would run this session as a writer beside the real one.
    fn emfile() -> std::io::Error {
        std::io::Error::from_raw_os_error(24)
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (scope, host) = faulty(&dir);
    host.fail_once(Op::OpenLock, ".writer.lock", emfile);
    let Err(error) = scope.try_acquire_writer() else {
        panic!("a transient failure is reported");
    };
    assert!(error.is_io());
    assert_eq!(error.operation(), "open lock file");
    assert_eq!(
        error.path(),
        Some(scope.path(ScopeFile::WriterLock).as_path())
    );

    host.fail_once(Op::Probe, "e2b", emfile);
    assert!(
        scope
            .try_acquire_writer()
            .is_err_and(|e| e.operation() == "probe coordination directory")
    );
    host.fail_once(Op::OpenLock, ".create.lock", emfile);
    assert!(scope.try_creation_lock().is_err());
    // Once the failure passes, the role is available (the failed attempts
    // held nothing).
    let _lease = writer(&scope);
}
