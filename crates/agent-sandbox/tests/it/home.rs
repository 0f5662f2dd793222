//! The sandbox's real home (contract L13): commands start in it and Hermes' state lives under
//! it, on a template whose user's home is not E2B's usual `/home/user` (e2b-local's
//! `agent-home`, home `/home/agent`).

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_sandbox::{Backend, NoStateHooks, RoleKind, SandboxMode, StateHooks};
use e2b_client::CreateOptions;

use crate::support::{RecordingHooks, World, ok, tar_names};

/// e2b-local's built-in template whose user's home is [`OTHER_HOME`].
const OTHER_HOME_TEMPLATE: &str = "agent-home";
const OTHER_HOME: &str = "/home/agent";

fn other_home_backend(world: &World, mode: SandboxMode, hooks: Arc<dyn StateHooks>) -> Backend {
    let mut config = world.config(mode);
    config.template = OTHER_HOME_TEMPLATE.to_owned();
    Backend::new(config, world.scope("default"), world.services(), hooks).expect("backend")
}

#[test]
fn commands_state_and_resume_recovery_follow_the_sandbox_users_real_home() {
    // contract: L13, S5
    let world = World::new();
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/host")).unwrap();
    std::fs::write(home.join("skills/host/SKILL.md"), "host skill").unwrap();

    let first_hooks = RecordingHooks::new(home);
    let first = other_home_backend(&world, SandboxMode::Persistent, first_hooks.clone());
    let info = first.attach().expect("attach");
    assert_eq!(info.role, RoleKind::Writer);
    assert_eq!(info.home.home, OTHER_HOME);
    assert_eq!(info.home.user, "user");
    assert_eq!(info.remote_hermes_home, "/home/agent/.hermes");
    assert_eq!(info.default_cwd, OTHER_HOME);
    assert_eq!(first.stats().home_probes, 1, "learned once, at attach");

    // Commands start in the real home; the initial push landed under it, not /home/user.
    assert_eq!(
        ok(&first, "pwd; printf '%s\\n' \"$HOME\""),
        "/home/agent\n/home/agent\n"
    );
    assert_eq!(
        ok(&first, "cat /home/agent/.hermes/skills/host/SKILL.md"),
        "host skill"
    );
    assert_eq!(
        ok(
            &first,
            "test -e /home/user/.hermes && echo there || echo absent"
        ),
        "absent\n"
    );

    // The agent writes state under its home; the teardown pull names it by that path.
    ok(
        &first,
        "mkdir -p ~/.hermes/skills/agent && printf agent > ~/.hermes/skills/agent/SKILL.md",
    );
    first.cleanup();
    let names = tar_names(&first_hooks.pulled.lock().unwrap());
    assert!(
        names.contains(&"home/agent/.hermes/skills/agent/SKILL.md".to_owned()),
        "{names:?}"
    );

    // A later session resumes the same sandbox: recovery reads the real home's state back
    // to the host (the pull above was not extracted: only recovery restores it here), and
    // the home comes from this host's cache, not from another request.
    let second = other_home_backend(&world, SandboxMode::Persistent, RecordingHooks::new(home));
    let again = second.attach().expect("attach");
    assert_eq!(again.sandbox_id, info.sandbox_id);
    assert_eq!(again.home.home, OTHER_HOME);
    assert_eq!(second.stats().home_probes, 0, "a resume reuses the home");
    assert_eq!(
        std::fs::read_to_string(home.join("skills/agent/SKILL.md")).unwrap(),
        "agent"
    );
    assert_eq!(ok(&second, "pwd"), "/home/agent\n");
    second.cleanup();
}

#[test]
fn an_explicit_cwd_and_state_root_still_win_over_the_home() {
    // contract: L13
    let world = World::new();
    let mut config = world.config(SandboxMode::Ephemeral {
        lifetime: std::time::Duration::from_secs(300),
    });
    config.template = OTHER_HOME_TEMPLATE.to_owned();
    config.cwd = Some("/tmp".to_owned());
    config.remote_hermes_home = Some("/home/agent/state".to_owned());
    let backend = Backend::new(
        config,
        world.scope("explicit"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    let info = backend.attach().expect("attach");
    assert_eq!(info.home.home, OTHER_HOME, "the home is still learned");
    assert_eq!(info.default_cwd, "/tmp");
    assert_eq!(info.remote_hermes_home, "/home/agent/state");
    assert_eq!(
        backend
            .transport()
            .expect("transport")
            .remote_hermes_home()
            .expect("known"),
        "/home/agent/state"
    );
    assert_eq!(ok(&backend, "pwd"), "/tmp\n");
    backend.cleanup();
}

#[test]
fn a_home_the_sandbox_reports_wrongly_is_refused_naming_the_operation_and_sandbox() {
    // contract: L13
    let world = World::new();
    // A sandbox whose environment overrides HOME with a relative path (e2b-local applies
    // sandbox-wide variables after its own, as envd does).
    let mut options = CreateOptions::new("base".to_owned());
    options.env_vars = BTreeMap::from([("HOME".to_owned(), "../etc".to_owned())]);
    let client = world.client();
    let created = world
        .runtime
        .block_on(client.create(options))
        .expect("create");
    let id = created.sandbox_id.clone();
    let backend = world.backend(
        SandboxMode::Attach {
            sandbox_id: id.clone(),
        },
        "attached",
        Arc::new(NoStateHooks),
    );
    let error = backend.attach().expect_err("a relative home is refused");
    assert!(error.is_untrusted_answer(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("learn the sandbox home") && text.contains(id.as_str()),
        "{text}"
    );
    assert_eq!(error.sandbox_id(), Some(id.as_str()));
}

#[test]
fn a_first_command_sent_with_the_probe_starts_in_the_home_and_only_in_an_accepted_one() {
    // contract: L13 — the first command of a new sandbox goes out with the home probe and
    // starts in the home all the same; where the sandbox's home is one the host refuses,
    // that command does not run and the run fails naming the operation and the sandbox.
    let world = World::new();
    let backend = other_home_backend(&world, SandboxMode::Persistent, Arc::new(NoStateHooks));
    assert_eq!(ok(&backend, "pwd"), "/home/agent\n");
    assert_eq!(backend.stats().home_probes, 1);
    let info = backend.info().expect("attached");
    assert_eq!(info.home.home, OTHER_HOME);
    assert_eq!(info.remote_hermes_home, "/home/agent/.hermes");
    assert_eq!(info.default_cwd, OTHER_HOME);
    backend.cleanup();

    let mut options = CreateOptions::new("base".to_owned());
    options.env_vars = BTreeMap::from([("HOME".to_owned(), "/tmp/../etc".to_owned())]);
    let client = world.client();
    let created = world
        .runtime
        .block_on(client.create(options))
        .expect("create");
    let id = created.sandbox_id.clone();
    let backend = world.backend(
        SandboxMode::Attach {
            sandbox_id: id.clone(),
        },
        "attached",
        Arc::new(NoStateHooks),
    );
    let error = backend
        .run(
            "touch /tmp/ran-in-a-refused-home",
            agent_sandbox::RunOptions::new(std::time::Duration::from_secs(60)),
            Box::new(agent_sandbox::DiscardSink),
        )
        .expect_err("a home that is not normalised is refused");
    assert!(error.is_untrusted_answer(), "{error}");
    assert!(
        error.to_string().contains("learn the sandbox home")
            && error.to_string().contains(id.as_str()),
        "{error}"
    );
    assert!(backend.info().is_none(), "nothing stays attached");
    let sandbox = client.sandbox(created.envd_access()).expect("sandbox");
    let output = world
        .runtime
        .block_on(sandbox.run(
            e2b_client::StartOptions::shell(
                "test -e /tmp/ran-in-a-refused-home && echo ran || echo absent".to_owned(),
            ),
            1024,
        ))
        .expect("check");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "absent\n");
}
