//! The push base (S15): a sandbox copy that is only this host's last push gives way to the
//! host's newer edit, across sessions and under sandbox arbitration.

use std::path::Path;
use std::time::Duration;

use agent_sandbox::{Backend, SandboxMode, WriterArbitration};

use crate::support::{RecordingHooks, World, ok};

#[test]
fn a_host_edit_after_a_push_supersedes_the_sandbox_copy_across_sessions() {
    // contract: S15, S6
    host_edits_supersede_the_last_push(WriterArbitration::Host);
}

#[test]
fn a_host_edit_after_a_staged_push_supersedes_the_sandbox_copy_under_sandbox_arbitration() {
    // contract: S15, C10 — staged uploads are recorded by the path their commit lands at.
    host_edits_supersede_the_last_push(WriterArbitration::Sandbox {
        term: Duration::from_secs(180),
    });
}

fn host_edits_supersede_the_last_push(arbitration: WriterArbitration) {
    let world = World::new();
    let open = |world: &World, home: &Path| {
        let mut config = world.config(SandboxMode::Persistent);
        config.writer_arbitration = arbitration;
        Backend::new(
            config,
            world.scope("default"),
            world.services(),
            RecordingHooks::new(home),
        )
        .expect("backend")
    };
    let home = world.home.path();
    let skill = home.join("skills/s/SKILL.md");
    std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
    std::fs::write(&skill, "host v0").unwrap();
    let mut id = String::new();
    for session in 1..=3 {
        let backend = open(&world, home);
        id = backend.attach().expect("attach").sandbox_id;
        // The bring-up pushed the host's version over the previous push.
        assert_eq!(
            ok(&backend, "cat /home/user/.hermes/skills/s/SKILL.md"),
            format!("host v{}", session - 1)
        );
        backend.cleanup();
        // Between sessions the host edits the file: the sandbox still holds the last push.
        std::fs::write(&skill, format!("host v{session}")).unwrap();
    }
    let quarantine = home.join(format!("cache/e2b-recovered/{id}"));
    assert!(
        !quarantine.exists(),
        "a copy that is only the last push is never a conflict"
    );
    let records: Vec<_> = std::fs::read_dir(home.join("cache/e2b"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".push-base"))
        .collect();
    assert_eq!(records.len(), 1, "one push base for the scope");

    // A sandbox-side edit is still a conflict, quarantined next to the host's edit (S6).
    let backend = open(&world, home);
    backend.attach().expect("attach");
    ok(
        &backend,
        "printf 'sandbox edit' > /home/user/.hermes/skills/s/SKILL.md",
    );
    backend.cleanup();
    std::fs::write(&skill, "host v4").unwrap();
    let last = open(&world, home);
    assert_eq!(last.attach().expect("attach").sandbox_id, id);
    assert_eq!(std::fs::read_to_string(&skill).unwrap(), "host v4");
    assert_eq!(
        std::fs::read_to_string(quarantine.join("skills/s/SKILL.md")).unwrap(),
        "sandbox edit"
    );
    last.cleanup();
}

#[test]
fn the_push_base_follows_uploads_and_deletes_and_is_rewritten_only_when_they_change_it() {
    // contract: S15
    use std::os::unix::fs::MetadataExt;
    let world = World::new();
    let home = world.home.path();
    let skill = home.join("skills/s/SKILL.md");
    std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
    std::fs::write(&skill, "host").unwrap();
    let backend = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    let id = backend.attach().expect("attach").sandbox_id;
    let record = std::fs::read_dir(home.join("cache/e2b"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".push-base"))
        .expect("the initial push stored a push base");
    let (base, source) = recovery::PushBase::load(&record, &id);
    assert_eq!(source, recovery::BaseSource::Record);
    assert_eq!(base.len(), 1);
    // A sync that moves nothing leaves the record alone (no write per command).
    let inode = std::fs::metadata(&record).unwrap().ino();
    ok(&backend, "true");
    assert_eq!(std::fs::metadata(&record).unwrap().ino(), inode);
    // A delete forgets what it removed; the next successful sync stores that.
    let transport = backend.transport().expect("transport");
    transport
        .delete_many(vec!["/home/user/.hermes/skills/s/SKILL.md".to_owned()])
        .expect("delete");
    ok(&backend, "true");
    assert!(recovery::PushBase::load(&record, &id).0.is_empty());
    // An upload is recorded; a delete of the Hermes home itself forgets everything, even
    // when the sandbox refuses it (the sandbox may have removed part of it).
    transport
        .upload_many(vec![(
            skill.clone(),
            "/home/user/.hermes/skills/s/SKILL.md".to_owned(),
        )])
        .expect("upload");
    ok(&backend, "true");
    assert_eq!(recovery::PushBase::load(&record, &id).0.len(), 1);
    transport
        .delete_many(vec!["/home/user/.hermes".to_owned()])
        .expect_err("rm refuses a directory");
    ok(&backend, "true");
    assert!(recovery::PushBase::load(&record, &id).0.is_empty());
    backend.cleanup();
}
