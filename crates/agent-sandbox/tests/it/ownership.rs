//! Who owns what: the host owns ~/.hermes, the sandbox owns its workspace.

use std::fs;

use crate::support::{RecordingHooks, World, ok, tar_names};

#[test]
fn the_host_owns_its_hermes_home_and_the_sandbox_its_workspace() {
    // contract: S1
    let world = World::new();
    let host_skill = world.home.path().join("skills/notes/SKILL.md");
    fs::create_dir_all(host_skill.parent().unwrap()).unwrap();
    fs::write(&host_skill, "host version\n").unwrap();
    let hooks = RecordingHooks::new(world.home.path());
    let backend = world.backend(
        agent_sandbox::SandboxMode::Persistent,
        "default",
        hooks.clone(),
    );

    // Bring-up pushes the host's copy; the sandbox then works in its own workspace and
    // also writes inside its Hermes home.
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/notes/SKILL.md"),
        "host version\n"
    );
    ok(
        &backend,
        "mkdir -p /home/user/project && echo built > /home/user/project/out.txt && \
         mkdir -p /home/user/.hermes/memories && echo sandbox note > /home/user/.hermes/memories/MEMORY.md",
    );
    let report = backend.cleanup();
    assert_eq!(hooks.pulls.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The teardown pull carries the sandbox's Hermes home only, never its workspace.
    let names = tar_names(&hooks.pulled.lock().unwrap());
    assert!(
        names
            .iter()
            .any(|name| name.ends_with("home/user/.hermes/memories/MEMORY.md")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("home/user/.hermes")),
        "the workspace leaked into the pull: {names:?}"
    );

    // Nothing of the workspace appeared on the host, and the host's own file is unchanged.
    let mut stray = Vec::new();
    let mut stack = vec![world.home.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|name| name == "out.txt") {
                stray.push(path);
            }
        }
    }
    assert!(stray.is_empty(), "workspace files on the host: {stray:?}");
    assert_eq!(fs::read_to_string(&host_skill).unwrap(), "host version\n");

    // The workspace stays with the sandbox: the next session finds it there.
    let again = world.backend(
        agent_sandbox::SandboxMode::Persistent,
        "default",
        RecordingHooks::new(world.home.path()),
    );
    assert_eq!(ok(&again, "cat /home/user/project/out.txt"), "built\n");
    assert_eq!(again.info().unwrap().sandbox_id, report.sandbox_id.unwrap());
    again.cleanup();
}
