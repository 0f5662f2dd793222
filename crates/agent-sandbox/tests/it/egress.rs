//! The profile's egress policy on its sandboxes (contracts X9, X10): in force before any
//! command, updated live with one request only when a sandbox's rules differ, none in steady
//! state, and a narrowed policy applied before the next command. Destinations are listeners
//! on 127.0.0.x (x ≥ 2) started here; 127.0.0.1 is the sandbox's own loopback.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, SystemTime};

use agent_sandbox::{Backend, EgressPolicy, Inventory, NoStateHooks, SandboxMode};
use e2b_local::FailRule;

use crate::support::{World, run};

/// The label e2b-local's request counter gives `PUT /sandboxes/{id}/network`.
const NETWORK: &str = "update network";

/// A TCP listener on a loopback address that counts the connections that delivered bytes
/// (a destination the sandbox reached for real).
struct Destination {
    addr: SocketAddr,
    reached: Arc<AtomicU64>,
}

impl Destination {
    fn on(ip: &str) -> Destination {
        let listener = TcpListener::bind((ip, 0)).expect("bind a loopback listener");
        let addr = listener.local_addr().expect("address");
        let reached = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&reached);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buffer = [0u8; 16];
                if matches!(stream.read(&mut buffer), Ok(n) if n > 0) {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Destination { addr, reached }
    }

    fn reached(&self) -> u64 {
        self.reached.load(Ordering::SeqCst)
    }

    /// A sandbox command that connects and sends a line; exit 0 when the connection opened.
    fn probe(&self) -> String {
        format!(
            "exec 3<>/dev/tcp/{}/{} && echo ping >&3 && exec 3>&- && echo opened",
            self.addr.ip(),
            self.addr.port()
        )
    }
}

/// Runs the probe of `destination` through `backend` and says whether it got through.
fn reaches(backend: &Backend, destination: &Destination) -> bool {
    let before = destination.reached();
    let _ = run(backend, &destination.probe()).expect("the command runs");
    // The listener counts on its own thread: wait for the count, bounded.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while destination.reached() == before && std::time::Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
    destination.reached() > before
}

fn policy(allow: &[String], deny: &[&str]) -> EgressPolicy {
    EgressPolicy::new(
        allow.to_vec(),
        deny.iter().map(|entry| (*entry).to_owned()).collect(),
    )
    .expect("a valid policy")
}

fn backend_with(world: &World, egress: EgressPolicy) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    config.egress = egress;
    Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

/// The rules E2B reports for the backend's sandbox: `(allow_out, deny_out)`.
fn rules_of(world: &World, backend: &Backend) -> (Vec<String>, Vec<String>) {
    let id = backend.info().expect("attached").sandbox_id;
    let detail = world.detail(&id).expect("detail");
    let network = detail.network.expect("rules reported");
    (network.egress.allow_out, network.egress.deny_out)
}

fn ip_of(destination: &Destination) -> String {
    destination.addr.ip().to_string()
}

#[test]
fn a_created_sandbox_has_the_policy_before_its_first_command_without_an_update() {
    // contract: X9 — the create carries the policy: no update request, and the very first
    // command already finds the denied destination closed and the allowed one open.
    let world = World::new();
    let denied = Destination::on("127.0.0.2");
    let allowed = Destination::on("127.0.0.3");
    let egress = policy(&[ip_of(&allowed)], &["127.0.0.0/8"]);
    let backend = backend_with(&world, egress.clone());
    assert!(
        !reaches(&backend, &denied),
        "the first command reached a denied destination"
    );
    assert!(
        reaches(&backend, &allowed),
        "an allowed destination was refused"
    );
    assert_eq!(world.server().requests().get(NETWORK), 0);
    assert_eq!(
        rules_of(&world, &backend),
        (vec![ip_of(&allowed)], vec!["127.0.0.0/8".to_owned()])
    );
    let listed = world.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].metadata.get(agent_sandbox::EGRESS_KEY),
        Some(&egress.digest()),
        "the digest rides in the metadata adoption lists"
    );
}

#[test]
fn an_adopted_sandbox_whose_rules_differ_is_updated_once_and_steady_state_sends_nothing() {
    // contract: X9 — one update at adoption, before the first command; then none.
    let world = World::new();
    let denied = Destination::on("127.0.0.2");
    let open = world.persistent();
    assert!(reaches(&open, &denied), "no rules yet: reachable");
    open.cleanup();

    let before = world.server().requests();
    let closed = backend_with(&world, policy(&[], &["127.0.0.2"]));
    assert!(
        !reaches(&closed, &denied),
        "the adopted sandbox's first command got out"
    );
    let adoption = world.server().requests().since(&before);
    assert_eq!(adoption.get("create"), 0, "adopted, not recreated");
    assert_eq!(adoption.get(NETWORK), 1);
    assert_eq!(closed.stats().network_updates, 1);
    assert_eq!(
        rules_of(&world, &closed),
        (vec![], vec!["127.0.0.2".to_owned()])
    );

    let steady = world.server().requests();
    for _ in 0..5 {
        let (exit, _) = run(&closed, "true").expect("runs");
        assert_eq!(exit.exit_code, 0);
    }
    assert_eq!(world.server().requests().since(&steady).get(NETWORK), 0);
    closed.cleanup();

    // Another session with the same policy: this host's note says the update is done (the
    // metadata still carries the creation's digest), so nothing is sent.
    let again = world.server().requests();
    let same = backend_with(&world, policy(&[], &["127.0.0.2"]));
    assert!(!reaches(&same, &denied));
    assert_eq!(world.server().requests().since(&again).get(NETWORK), 0);
    same.cleanup();
}

#[test]
fn a_narrowed_policy_is_applied_before_the_next_command_and_a_widened_one_too() {
    // contract: X10 — a running backend told of a new policy updates the sandbox before
    // the next command starts; with the policy unchanged, nothing is sent.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let backend = world.persistent();
    assert!(reaches(&backend, &target));
    assert!(backend.set_egress(policy(&[], &["127.0.0.2/32"])));
    let before = world.server().requests();
    assert!(
        !reaches(&backend, &target),
        "the narrowed policy was not in force"
    );
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 1);
    assert_eq!(
        rules_of(&world, &backend),
        (vec![], vec!["127.0.0.2".to_owned()])
    );
    assert!(
        !backend.set_egress(policy(&[], &["127.0.0.2"])),
        "same policy"
    );
    assert!(backend.set_egress(EgressPolicy::none()));
    assert!(
        reaches(&backend, &target),
        "the widened policy was not in force"
    );
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 2);
}

#[test]
fn a_failed_update_runs_no_command() {
    // contract: X10 — the update failing fails the command; it never runs under the old
    // rules, and the next command tries the update again.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let backend = world.persistent();
    assert!(reaches(&backend, &target));
    backend.set_egress(policy(&[], &["127.0.0.2"]));
    // In steady state the update is the only control-plane request before the command; a
    // 400 is not retried.
    let mut rule = FailRule::new(1, 400);
    rule.path_prefix = Some("/sandboxes/".to_owned());
    rule.scope = e2b_local::FaultScope::Rest;
    world.server().faults().fail_next(rule);
    let starts = world.server().requests().get("Process/Start");
    let error = run(&backend, &target.probe()).expect_err("refused");
    assert!(error.to_string().contains("apply egress policy"), "{error}");
    assert_eq!(world.server().requests().get("Process/Start"), starts);
    assert!(!reaches(&backend, &target));
}

#[test]
fn an_update_made_by_the_inventory_is_not_repeated_by_a_running_session() {
    // contract: X10 — `hermes e2b network` updates the running sandbox and records it; the
    // session that then reads the same policy sends nothing.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let backend = world.persistent();
    assert!(reaches(&backend, &target));
    let mut config = world.config(SandboxMode::Persistent);
    config.egress = policy(&[], &["127.0.0.2"]);
    let inventory = Inventory::new(config, world.home.path().to_path_buf(), world.services());
    let applied = inventory.apply_egress(SystemTime::now()).expect("applied");
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].outcome, agent_sandbox::EgressOutcome::Updated);
    assert_eq!(world.server().requests().get(NETWORK), 1);
    // Already in force: not sent again.
    let again = inventory.apply_egress(SystemTime::now()).expect("applied");
    assert_eq!(again[0].outcome, agent_sandbox::EgressOutcome::InForce);
    backend.set_egress(policy(&[], &["127.0.0.2"]));
    assert!(!reaches(&backend, &target));
    assert_eq!(world.server().requests().get(NETWORK), 1);
}

#[test]
fn an_attached_sandbox_gets_a_configured_policy_and_keeps_its_own_rules_otherwise() {
    // contract: X9 — attach mode: rules unknown, so a configured policy costs one update at
    // attach; with no policy the owner's sandbox is left as it is.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let owner = world.persistent();
    assert!(reaches(&owner, &target));
    let id = owner.info().expect("attached").sandbox_id;
    let attach = SandboxMode::Attach {
        sandbox_id: agent_sandbox::SandboxId::parse(id).expect("id"),
    };
    let before = world.server().requests();
    let plain = world.backend(attach.clone(), "default", Arc::new(NoStateHooks));
    assert!(reaches(&plain, &target));
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 0);
    let mut config = world.config(attach);
    config.egress = policy(&[], &["127.0.0.2"]);
    let strict = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    assert!(!reaches(&strict, &target));
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 1);
}

#[test]
fn a_policy_changed_while_the_sandbox_paused_is_applied_once_it_resumed() {
    // contract: X10 — E2B updates running sandboxes: one idle past its lease (paused) is
    // resumed by the lease top-up first, then updated, then the command runs.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let backend = world.persistent();
    assert!(reaches(&backend, &target));
    world.advance(Duration::from_secs(3600));
    let id = backend.info().expect("attached").sandbox_id;
    let paused = world.list();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].sandbox_id.as_str(), id);
    assert_eq!(paused[0].state, e2b_client::SandboxState::Paused);
    backend.set_egress(policy(&[], &["127.0.0.2"]));
    let before = world.server().requests();
    assert!(!reaches(&backend, &target));
    let step = world.server().requests().since(&before);
    assert_eq!(
        step.get("connect"),
        1,
        "{:?}",
        step.routes().collect::<Vec<_>>()
    );
    assert_eq!(step.get(NETWORK), 1);
}

#[test]
fn a_sandbox_restored_from_a_checkpoint_starts_under_the_policy_in_force() {
    // contract: X9 — a rollback's new sandbox is created with the policy in force now (here
    // narrowed after the checkpoint was taken), so its first command already finds it.
    let world = World::new();
    let target = Destination::on("127.0.0.2");
    let backend = world.persistent();
    assert!(reaches(&backend, &target));
    backend
        .checkpoint(agent_sandbox::CheckpointRequest {
            label: Some("open".to_owned()),
            reason: agent_sandbox::CheckpointReason::Manual,
            wait: Duration::ZERO,
        })
        .expect("checkpoint");
    backend.set_egress(policy(&[], &["127.0.0.2"]));
    // The old sandbox is updated before its next command (the rollback's own commands in
    // it would be too); the restored one must need no update of its own.
    assert!(!reaches(&backend, &target));
    let before = world.server().requests();
    let report = backend
        .rollback(agent_sandbox::CheckpointTarget::Latest, Duration::ZERO)
        .expect("rollback");
    assert_eq!(
        backend.info().expect("attached").sandbox_id,
        report.sandbox_id
    );
    assert!(!reaches(&backend, &target), "the restored sandbox got out");
    assert_eq!(
        rules_of(&world, &backend),
        (vec![], vec!["127.0.0.2".to_owned()])
    );
    assert_eq!(
        world.server().requests().since(&before).get(NETWORK),
        0,
        "created with the policy: no update"
    );
}

#[test]
fn the_egress_proxy_setting_reaches_the_sandbox_and_a_new_password_is_one_update() {
    // contract: X23 — `network.egressProxy` in the create, its password resolved like a
    // credential's value and in force before the next command once it changes.
    let world = World::new();
    let password = std::sync::Arc::new(std::sync::Mutex::new("firstpassword0".to_owned()));
    let seen = std::sync::Arc::clone(&password);
    let mut config = world.config(SandboxMode::Persistent);
    config.credentials = agent_sandbox::Credentials::new(
        Vec::new(),
        std::sync::Arc::new(move |name| {
            (name == "E2B_EGRESS_PROXY_PASSWORD").then(|| seen.lock().expect("lock").clone())
        }),
        "/profile/.env".to_owned(),
    )
    .expect("valid");
    config.egress_proxy = Some(
        agent_sandbox::EgressProxySetting::parse(
            "socks5://proxyuser@127.0.0.9:1080",
            Some("E2B_EGRESS_PROXY_PASSWORD".to_owned()),
        )
        .expect("valid"),
    );
    let backend = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        std::sync::Arc::new(agent_sandbox::NoStateHooks),
    )
    .expect("backend");
    run(&backend, "true").expect("runs");
    let id = backend.info().expect("attached").sandbox_id;
    let proxy = world
        .detail(&id)
        .expect("detail")
        .network
        .and_then(|network| network.egress_proxy)
        .expect("the sandbox has the proxy");
    assert_eq!(proxy.address, "127.0.0.9:1080");
    assert_eq!(proxy.username.as_deref(), Some("proxyuser"));
    assert!(!world.raw_detail(&id).contains("firstpassword0"));
    let before = world.server().requests();
    run(&backend, "true").expect("runs");
    assert_eq!(
        world
            .server()
            .requests()
            .since(&before)
            .get("update network"),
        0
    );
    *password.lock().expect("lock") = "secondpassword1".to_owned();
    run(&backend, "true").expect("runs");
    assert_eq!(
        world
            .server()
            .requests()
            .since(&before)
            .get("update network"),
        1
    );
    backend.cleanup();
}

#[test]
fn bad_egress_proxy_urls_are_refused_saying_why() {
    // contract: X23
    for (url, why) in [
        ("http://proxy:1080", "socks5://"),
        ("socks5://proxy", "port"),
        ("socks5://user:secret@proxy:1080", ".env"),
        ("socks5://proxy:0", "port"),
    ] {
        let error = agent_sandbox::EgressProxySetting::parse(url, None).expect_err(url);
        let text = error.to_string();
        assert!(
            text.contains("egress_proxy") && text.contains(why),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
}
