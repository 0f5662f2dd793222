//! State edges: the window between snapshot and push (S13), a pull that succeeds on a
//! retry (S12), and bring-ups that fail closed before any push (S8, S11).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::{PullOutcome, SandboxMode};

use crate::support::{self, RecordingHooks, World, ok};

/// Hooks that, during the initial push, write into the sandbox behind the backend's back:
/// after the recovery snapshot and before the push lands (the window S13 pins).
struct WindowHooks {
    world_url: String,
    runtime: tokio::runtime::Handle,
    host: PathBuf,
}

impl agent_sandbox::StateHooks for WindowHooks {
    fn push(
        &self,
        transport: &agent_sandbox::StateTransport,
        kind: agent_sandbox::PushKind,
    ) -> Result<(), agent_sandbox::HookError> {
        if kind == agent_sandbox::PushKind::Initial {
            let mut config =
                e2b_client::Config::new(e2b_client::ApiKey::new("test-local-key".to_owned()));
            config.api_url = Some(self.world_url.clone());
            config.sandbox_url = Some(self.world_url.clone());
            let client = e2b_client::Client::new(config)?;
            let id = e2b_client::SandboxId::parse(transport.sandbox_id().to_owned()).unwrap();
            let writes = async {
                let connected = client.connect(&id, Duration::from_secs(300)).await?;
                let sandbox = client.sandbox(connected.sandbox.envd_access())?;
                sandbox
                    .run(
                        e2b_client::StartOptions::shell(
                            "mkdir -p /home/user/.hermes/skills/known /home/user/.hermes/skills/late && \
                             printf late-overwrite > /home/user/.hermes/skills/known/SKILL.md && \
                             printf late-new > /home/user/.hermes/skills/late/NEW.md"
                                .to_owned(),
                        ),
                        4096,
                    )
                    .await
            };
            // Hooks run on the caller's thread, outside the runtime: blocking is allowed.
            let output = self.runtime.block_on(writes)?;
            assert_eq!(output.end.exit_code, 0);
            transport.upload_many(vec![(
                self.host.join("skills/known/SKILL.md"),
                "/home/user/.hermes/skills/known/SKILL.md".to_owned(),
            )])?;
        }
        Ok(())
    }

    fn pull(
        &self,
        _transport: &agent_sandbox::StateTransport,
    ) -> Result<(), agent_sandbox::HookError> {
        Ok(())
    }
}

#[test]
fn the_window_between_snapshot_and_push_is_pinned() {
    // contract: S13
    let world = World::new();
    let home = world.home.path().to_path_buf();
    std::fs::create_dir_all(home.join("skills/known")).unwrap();
    std::fs::write(home.join("skills/known/SKILL.md"), "host copy").unwrap();
    let hooks = Arc::new(WindowHooks {
        world_url: world.url.clone(),
        runtime: world.runtime.handle().clone(),
        host: home.clone(),
    });
    let backend = world.backend(SandboxMode::Persistent, "default", hooks);
    backend.attach().expect("attach");
    // A write to a host-known path in the window is overwritten by the push ...
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/known/SKILL.md"),
        "host copy"
    );
    // ... and a file created in the window survives (a force-push deletes nothing).
    assert_eq!(
        ok(&backend, "cat /home/user/.hermes/skills/late/NEW.md"),
        "late-new"
    );
    // It was not recovered to the host: the snapshot was taken before it existed.
    assert!(!home.join("skills/late/NEW.md").exists());
}

/// Pulls like Hermes' sync_back: up to three attempts, errors swallowed.
struct RetryingPull;

impl agent_sandbox::StateHooks for RetryingPull {
    fn push(
        &self,
        _transport: &agent_sandbox::StateTransport,
        _kind: agent_sandbox::PushKind,
    ) -> Result<(), agent_sandbox::HookError> {
        Ok(())
    }

    fn pull(
        &self,
        transport: &agent_sandbox::StateTransport,
    ) -> Result<(), agent_sandbox::HookError> {
        for _ in 0..3 {
            if transport.download_state(&mut Vec::new()).is_ok() {
                break;
            }
        }
        Ok(())
    }
}

#[test]
fn a_pull_that_succeeds_on_a_retry_is_not_reported_as_failed() {
    // contract: S12
    let world = World::new();
    let backend = world.backend(SandboxMode::Persistent, "default", Arc::new(RetryingPull));
    ok(&backend, "mkdir -p /home/user/.hermes/skills");
    let mut rule = e2b_local::FailRule::new(1, 503);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    world.server().faults().fail_next(rule);
    assert_eq!(backend.cleanup().pull, PullOutcome::Pulled);

    // Three failed attempts are a failed pull.
    let again = world.backend(SandboxMode::Persistent, "default", Arc::new(RetryingPull));
    ok(&again, "true");
    let mut rule = e2b_local::FailRule::new(3, 503);
    rule.scope = e2b_local::FaultScope::Envd;
    rule.path_prefix = Some("/process.Process/Start".to_owned());
    world.server().faults().fail_next(rule);
    assert!(matches!(again.cleanup().pull, PullOutcome::Failed(_)));
}

/// Leaves a persistent sandbox whose `skills/demo/SKILL.md` conflicts with the host's copy
/// ("host" on the host, "sandbox" in the sandbox), with the writer role released. Returns
/// the sandbox id.
fn a_sandbox_with_a_conflicting_skill(world: &World) -> String {
    let home = world.home.path();
    std::fs::create_dir_all(home.join("skills/demo")).unwrap();
    std::fs::write(home.join("skills/demo/SKILL.md"), "host").unwrap();
    let first = world.backend(
        SandboxMode::Persistent,
        "default",
        RecordingHooks::new(home),
    );
    ok(
        &first,
        "printf sandbox > /home/user/.hermes/skills/demo/SKILL.md",
    );
    let id = first.info().expect("attached").sandbox_id;
    // A hard crash: no teardown pull, so the host keeps its older copy.
    first.finalize();
    id
}

/// What a bring-up that failed closed must leave: the error surfaced, the push never ran, no
/// upload reached the sandbox, and the sandbox's copy (the only one) is untouched.
fn assert_failed_closed_without_pushing(
    world: &World,
    id: &str,
    hooks: &RecordingHooks,
    attached: Result<agent_sandbox::AttachInfo, agent_sandbox::Error>,
    before: &e2b_local::RequestCounts,
) -> agent_sandbox::Error {
    let error = attached.expect_err("the bring-up fails closed");
    assert_eq!(error.sandbox_id(), Some(id), "{error}");
    assert!(
        !hooks.calls().iter().any(|call| call.starts_with("push")),
        "{:?}",
        hooks.calls()
    );
    let since = world.server().requests().since(before);
    assert_eq!(
        since.get("files POST"),
        0,
        "{:?}",
        since.routes().collect::<Vec<_>>()
    );
    let sandbox_copy = world
        .server()
        .sandbox_home(id)
        .join(".hermes/skills/demo/SKILL.md");
    assert_eq!(std::fs::read_to_string(sandbox_copy).unwrap(), "sandbox");
    error
}

#[test]
fn a_backend_whose_quarantine_is_redirected_does_not_push() {
    // contract: S8 — quarantine refused fails recovery closed, which blocks the push.
    let world = World::new();
    let id = a_sandbox_with_a_conflicting_skill(&world);
    // The quarantine tree is redirected outside the home.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path(),
        world.home.path().join("cache/e2b-recovered"),
    )
    .unwrap();

    let hooks = RecordingHooks::new(world.home.path());
    let second = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let before = world.server().requests();
    let attached = second.attach();
    let error = assert_failed_closed_without_pushing(&world, &id, &hooks, attached, &before);
    assert!(
        matches!(error, agent_sandbox::Error::Recovery { .. }),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("skills/demo/SKILL.md")).unwrap(),
        "host"
    );
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // Nothing runs on the unrecovered sandbox either.
    assert!(support::run(&second, "true").is_err());
    assert_eq!(
        world.server().requests().since(&before).get("files POST"),
        0
    );
}

#[test]
fn a_backend_whose_snapshot_cannot_be_read_does_not_push() {
    // contract: S11 — an unreadable snapshot fails the bring-up closed, before any push.
    let world = World::new();
    let id = a_sandbox_with_a_conflicting_skill(&world);
    // Every envd stream is cut after a few bytes: the snapshot never arrives whole.
    world
        .server()
        .faults()
        .drop_streams(e2b_local::DropRule::new(100, 16));

    let hooks = RecordingHooks::new(world.home.path());
    let second = world.backend(SandboxMode::Persistent, "default", hooks.clone());
    let before = world.server().requests();
    let attached = second.attach();
    world.server().faults().clear();
    let error = assert_failed_closed_without_pushing(&world, &id, &hooks, attached, &before);
    assert!(error.to_string().contains("state snapshot"), "{error}");
    assert_eq!(
        std::fs::read_to_string(world.home.path().join("skills/demo/SKILL.md")).unwrap(),
        "host"
    );
}
