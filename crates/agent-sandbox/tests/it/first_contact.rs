//! What a person meets first, against e2b-local's fault injection: the error of each refusal
//! names its step once and carries the class a binding words its hint from (contract O5);
//! the access check tells the classes apart without creating anything (contract O6).

use std::time::Duration;

use agent_sandbox::{ACCESS_CHECK_DEADLINE, ErrorChain, Inventory, SandboxMode};
use e2b_local::{FailRule, FaultScope};

use crate::support::World;

fn rest_fault(world: &World, status: u16, message: &str) {
    let mut rule = FailRule::new(1, status);
    rule.scope = FaultScope::Rest;
    rule.should_retry = Some(false);
    rule.message = Some(message.to_owned());
    world.server().faults().fail_next(rule);
}

fn inventory(world: &World) -> Inventory {
    Inventory::new(
        world.config(SandboxMode::Persistent),
        world.home.path().to_path_buf(),
        world.services(),
    )
}

#[test]
fn a_refused_key_names_the_step_once_and_is_classified() {
    // contract: O5
    let world = World::new();
    rest_fault(&world, 401, "Invalid API key");
    let error = world.persistent().attach().expect_err("refused");
    assert!(error.is_key_refused(), "{error:?}");
    assert!(!error.is_concurrency_limit() && !error.is_template_missing());
    let text = ErrorChain(&error).to_string();
    // The step and the request share a name: it is said once.
    assert_eq!(text.matches("list sandboxes").count(), 1, "{text}");
    assert_eq!(text.matches("E2B ").count(), 1, "{text}");
    assert!(text.ends_with("HTTP 401: Invalid API key"), "{text}");
}

#[test]
fn the_concurrency_limit_says_how_many_run() {
    // contract: O5
    let world = World::new();
    // Two run already (other sessions', alive: a leftover no session holds would be paused
    // for the slot, L15).
    let one = world.persistent_task("one");
    one.attach().expect("one");
    let two = world.persistent_task("two");
    two.attach().expect("two");
    // An ephemeral backend creates at once: the fault meets the create. It stands for
    // another process (a fleet of its own: nothing of its own to pause) that waits for no
    // slot (L14 has its own tests).
    let mut config = world.config(SandboxMode::Ephemeral {
        lifetime: Duration::from_secs(300),
    });
    config.slot_wait = Duration::ZERO;
    let services = agent_sandbox::Services {
        fleet: agent_sandbox::Fleet::new(),
        ..world.services()
    };
    let backend = agent_sandbox::Backend::new(
        config,
        world.scope("third"),
        services,
        std::sync::Arc::new(agent_sandbox::NoStateHooks),
    )
    .expect("backend");
    rest_fault(
        &world,
        429,
        "You have reached the maximum number of concurrent E2B sandboxes",
    );
    let error = backend.attach().expect_err("limit");
    assert!(error.is_concurrency_limit(), "{error:?}");
    assert_eq!(error.running_sandboxes(), Some(2));
    let text = ErrorChain(&error).to_string();
    assert_eq!(
        text,
        "E2B create failed: the account's limit of concurrently running sandboxes is reached \
         (2 running now); 0 other sandbox(es) of this process run and none could be paused (each \
         has a command running or is busy); of this profile's sandboxes of other processes, 2 \
         are held by a live Hermes session on this host, 0 run a command and 0 belong to another \
         host; waited 0 s for a slot: HTTP 429: You have reached \
         the maximum number of concurrent E2B sandboxes"
    );
}

#[test]
fn a_missing_template_is_classified() {
    // contract: O5
    let world = World::new();
    let backend = world.backend(
        SandboxMode::Ephemeral {
            lifetime: Duration::from_secs(300),
        },
        "t",
        std::sync::Arc::new(agent_sandbox::NoStateHooks),
    );
    rest_fault(&world, 404, "template 'nope' not found");
    let error = backend.attach().expect_err("missing");
    assert!(error.is_template_missing(), "{error:?}");
    assert!(!error.is_sandbox_gone(), "{error:?}");
    let text = ErrorChain(&error).to_string();
    assert_eq!(text.matches("create").count(), 1, "{text}");
}

#[test]
fn the_access_check_creates_nothing_and_counts_the_running() {
    // contract: O6
    let world = World::new();
    world.persistent_task("one").attach().expect("one");
    let before = world.list().len();
    let access = inventory(&world).check_access().expect("accepted");
    assert_eq!(access.running, Some(1));
    assert!(access.elapsed < ACCESS_CHECK_DEADLINE);
    assert_eq!(world.list().len(), before, "nothing created");
}

#[test]
fn the_access_check_tells_a_refused_key_from_an_unreachable_endpoint() {
    // contract: O6
    let world = World::new();
    for status in [401, 403] {
        rest_fault(&world, status, "Invalid API key");
        let error = inventory(&world).check_access().expect_err("refused");
        assert!(error.is_key_refused(), "{status}: {error:?}");
        assert!(!error.is_unreachable() && !error.is_tls(), "{error:?}");
    }

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://127.0.0.1:{}",
        listener.local_addr().expect("addr").port()
    );
    drop(listener);
    let mut config = world.config(SandboxMode::Persistent);
    config.endpoints.api_url = Some(url.clone());
    let error = Inventory::new(config, world.home.path().to_path_buf(), world.services())
        .check_access()
        .expect_err("unreachable");
    assert!(error.is_unreachable(), "{error:?}");
    assert!(!error.is_key_refused(), "{error:?}");
    assert_eq!(error.endpoint(), Some(url.as_str()));
    let text = ErrorChain(&error).to_string();
    assert_eq!(text.matches(&url).count(), 1, "{text}");
    assert_eq!(text.matches("list sandboxes").count(), 1, "{text}");
}

#[test]
fn a_slow_endpoint_fails_the_access_check_at_its_deadline() {
    // contract: O6
    let world = World::new();
    world
        .server()
        .faults()
        .set_latency(ACCESS_CHECK_DEADLINE + Duration::from_secs(2));
    let error = inventory(&world).check_access().expect_err("too slow");
    world.server().faults().set_latency(Duration::ZERO);
    assert_eq!(error.deadline(), Some(ACCESS_CHECK_DEADLINE), "{error:?}");
}
