//! Credentials the sandbox never holds (contract X16): commands see a stand-in under the
//! variable's name, while the sandbox's network rules carry the real header for the listed
//! hosts only; in force before the first command of a created, adopted, restored or forked
//! sandbox, and re-applied before the next command when the value changes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agent_sandbox::{
    Backend, Credential, CredentialStore, Credentials, Inventory, NoStateHooks, RunOptions,
    STAND_IN_PREFIX, SandboxMode,
};

use crate::support::{World, run};

/// The label e2b-local's request counter gives `PUT /sandboxes/{id}/network`.
const NETWORK: &str = "update network";

/// Shaped like no known secret, so only the mechanism under test can keep it out.
const VALUE: &str = "realcredentialvalue0123";
const SOURCE: &str = "/profile/.env";

/// A value the test can change while the backend runs.
#[derive(Clone)]
pub(crate) struct Value(Arc<Mutex<Option<String>>>);

impl Value {
    pub(crate) fn new(value: Option<&str>) -> Value {
        Value(Arc::new(Mutex::new(value.map(str::to_owned))))
    }

    pub(crate) fn set(&self, value: &str) {
        *self.0.lock().expect("lock") = Some(value.to_owned());
    }

    pub(crate) fn credentials(&self) -> Credentials {
        let github = Credential::new(
            "GITHUB_TOKEN".to_owned(),
            vec!["api.github.com".to_owned()],
            None,
            None,
        )
        .expect("valid");
        let value = self.clone();
        Credentials::new(
            vec![github],
            Arc::new(move |name| {
                (name == "GITHUB_TOKEN")
                    .then(|| value.0.lock().expect("lock").clone())
                    .flatten()
            }),
            SOURCE.to_owned(),
        )
        .expect("valid")
    }
}

fn backend_with(world: &World, mode: SandboxMode, credentials: Credentials) -> Backend {
    let mut config = world.config(mode);
    config.credentials = credentials;
    // These tests are about the `rules` store (the value in the rules); X22's tests
    // (secret_store.rs) cover E2B Secrets.
    config.credential_store = CredentialStore::Rules;
    Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

/// The header values E2B holds for `host` on the backend's sandbox.
fn header_of(world: &World, sandbox_id: &str, host: &str) -> Option<String> {
    let detail = world.detail(sandbox_id).expect("detail");
    let rules = detail.network?.rules;
    let rule = rules.get(host)?.first()?.clone();
    rule.headers
        .get("Authorization")
        .map(|value| value.expose().to_owned())
}

/// What a command sees of the variable, its own environ and every process's.
fn what_commands_see(backend: &Backend) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut options = RunOptions::new(Duration::from_secs(60));
    // A caller passing the real value under the name must not get it through.
    options
        .env
        .insert("GITHUB_TOKEN".to_owned(), VALUE.to_owned());
    let handle = backend
        .run(
            "printenv GITHUB_TOKEN; cat /proc/self/environ | tr '\\0' '\\n'; \
             cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep GITHUB_TOKEN; \
             cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
            options,
            Box::new(agent_sandbox::ChannelSink::unbounded(tx)),
        )
        .expect("runs");
    handle.wait().expect("exits");
    let output: Vec<u8> = rx.try_iter().flat_map(|chunk| chunk.bytes).collect();
    String::from_utf8_lossy(&output).into_owned()
}

#[test]
fn a_created_sandbox_has_the_header_rule_before_its_first_command_and_commands_see_a_stand_in() {
    // contract: X16 — the create carries the rule (no update); the command's environment,
    // every process's environ and command line hold the stand-in, never the value.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let backend = backend_with(&world, SandboxMode::Persistent, value.credentials());
    let seen = what_commands_see(&backend);
    assert!(!seen.contains(VALUE), "{seen}");
    let stand_in = backend.stand_ins()["GITHUB_TOKEN"].clone();
    assert!(stand_in.starts_with(STAND_IN_PREFIX), "{stand_in}");
    assert!(seen.contains(&format!("GITHUB_TOKEN={stand_in}")), "{seen}");
    assert!(seen.lines().next() == Some(stand_in.as_str()), "{seen}");
    assert_eq!(world.server().requests().get(NETWORK), 0);
    let id = backend.info().expect("attached").sandbox_id;
    assert_eq!(
        header_of(&world, &id, "api.github.com").as_deref(),
        Some(format!("Bearer {VALUE}").as_str())
    );
    // Only the listed host has a rule.
    let detail = world.detail(&id).expect("detail");
    let rules = detail.network.expect("network").rules;
    assert_eq!(rules.keys().collect::<Vec<_>>(), ["api.github.com"]);
    // Debug of the backend's state and the detail show no value.
    let shown = format!("{:?} {:?}", backend.credentials(), world.detail(&id));
    assert!(!shown.contains(VALUE), "{shown}");
    backend.cleanup();
}

#[test]
fn a_changed_value_is_in_force_before_the_next_command_and_the_stand_in_stays() {
    // contract: X16 — values are resolved at every command: a changed one costs one update
    // before the next command; an unchanged one nothing. The stand-in stays the sandbox's,
    // in this session and the next one on this host.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let backend = backend_with(&world, SandboxMode::Persistent, value.credentials());
    let (exit, _) = run(&backend, "true").expect("runs");
    assert_eq!(exit.exit_code, 0);
    let stand_in = backend.stand_ins()["GITHUB_TOKEN"].clone();
    let id = backend.info().expect("attached").sandbox_id;
    value.set("changedcredentialvalue456");
    let before = world.server().requests();
    let seen = what_commands_see(&backend);
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 1);
    assert_eq!(
        header_of(&world, &id, "api.github.com").as_deref(),
        Some("Bearer changedcredentialvalue456")
    );
    assert!(seen.contains(&stand_in), "{seen}");
    let steady = world.server().requests();
    for _ in 0..3 {
        run(&backend, "true").expect("runs");
    }
    assert_eq!(world.server().requests().since(&steady).get(NETWORK), 0);
    backend.cleanup();

    let again = backend_with(&world, SandboxMode::Persistent, value.credentials());
    let seen = what_commands_see(&again);
    assert_eq!(again.info().expect("attached").sandbox_id, id, "adopted");
    assert!(
        seen.contains(&stand_in),
        "the stand-in is the sandbox's: {seen}"
    );
    again.cleanup();
}

#[test]
fn a_missing_value_runs_nothing_and_names_the_variable_and_the_file() {
    // contract: X16 — no silent skip: no sandbox is created, nothing runs.
    let world = World::new();
    let value = Value::new(None);
    let backend = backend_with(&world, SandboxMode::Persistent, value.credentials());
    let error = run(&backend, "true").expect_err("refused");
    let text = error.to_string();
    assert!(error.is_credential(), "{text}");
    assert!(
        text.contains("GITHUB_TOKEN") && text.contains(SOURCE),
        "{text}"
    );
    assert_eq!(world.server().requests().get("create"), 0);
    // Once the value is there, the next command runs under it.
    value.set(VALUE);
    let (exit, _) = run(&backend, "true").expect("runs");
    assert_eq!(exit.exit_code, 0);
    backend.cleanup();
}

#[test]
fn an_adopted_attached_restored_or_forked_sandbox_has_the_rule_before_its_first_command() {
    // contract: X16 — a sandbox made before the setting gets one update before its first
    // command (adopted, attached); a restored one and fork branches are created with it.
    let world = World::new();
    let plain = world.persistent();
    run(&plain, "true").expect("runs");
    let id = plain.info().expect("attached").sandbox_id;
    plain.cleanup();
    assert_eq!(header_of(&world, &id, "api.github.com"), None);

    let value = Value::new(Some(VALUE));
    let before = world.server().requests();
    let adopted = backend_with(&world, SandboxMode::Persistent, value.credentials());
    let seen = what_commands_see(&adopted);
    assert!(!seen.contains(VALUE), "{seen}");
    assert_eq!(adopted.info().expect("attached").sandbox_id, id);
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 1);
    assert!(header_of(&world, &id, "api.github.com").is_some());

    let attach = SandboxMode::Attach {
        sandbox_id: agent_sandbox::SandboxId::parse(id.clone()).expect("id"),
    };
    let attached = backend_with(&world, attach, value.credentials());
    let seen = what_commands_see(&attached);
    assert!(
        seen.contains(STAND_IN_PREFIX) && !seen.contains(VALUE),
        "{seen}"
    );

    adopted
        .checkpoint(agent_sandbox::CheckpointRequest {
            label: Some("c".to_owned()),
            reason: agent_sandbox::CheckpointReason::Manual,
            wait: Duration::ZERO,
        })
        .expect("checkpoint");
    value.set("rotatedcredentialvalue789");
    // The old sandbox gets the new value before its next command (the rollback's own would
    // do it too); the restored one must need no update of its own.
    run(&adopted, "true").expect("runs");
    let before = world.server().requests();
    let report = adopted
        .rollback(agent_sandbox::CheckpointTarget::Latest, Duration::ZERO)
        .expect("rollback");
    assert_eq!(
        header_of(&world, &report.sandbox_id, "api.github.com").as_deref(),
        Some("Bearer rotatedcredentialvalue789"),
        "the restored sandbox is created with the value in force now"
    );
    let seen = what_commands_see(&adopted);
    assert!(
        seen.contains(STAND_IN_PREFIX) && !seen.contains("rotatedcredential"),
        "{seen}"
    );
    assert_eq!(world.server().requests().since(&before).get(NETWORK), 0);

    let fork = adopted.fork(1, Duration::ZERO).expect("fork");
    let branch = fork.branches[0].as_ref().expect("branch created");
    assert_eq!(
        header_of(&world, branch.sandbox_id.as_str(), "api.github.com").as_deref(),
        Some("Bearer rotatedcredentialvalue789")
    );
    adopted.cleanup();
}

#[test]
fn the_inventory_keeps_the_header_rule_when_it_applies_a_policy() {
    // contract: X16 — `hermes e2b network` replaces the whole network (E2B clears what an
    // update omits): the credentials' rule travels with the policy, and shows by header
    // name only.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let backend = backend_with(&world, SandboxMode::Persistent, value.credentials());
    run(&backend, "true").expect("runs");
    let id = backend.info().expect("attached").sandbox_id;
    let mut config = world.config(SandboxMode::Persistent);
    config.credentials = value.credentials();
    config.credential_store = CredentialStore::Rules;
    config.egress =
        agent_sandbox::EgressPolicy::new(vec![], vec!["127.0.0.2".to_owned()]).expect("policy");
    let inventory = Inventory::new(config, world.home.path().to_path_buf(), world.services());
    let applied = inventory.apply_egress(SystemTime::now()).expect("applied");
    assert_eq!(applied[0].outcome, agent_sandbox::EgressOutcome::Updated);
    assert_eq!(
        header_of(&world, &id, "api.github.com").as_deref(),
        Some(format!("Bearer {VALUE}").as_str())
    );
    let names = inventory.sandbox_credential_headers(&id).expect("read");
    assert_eq!(names.headers["api.github.com"], ["Authorization"]);
    // The `rules` store: the value is in the rules, and the listing says so by host.
    assert_eq!(names.values_in_rules, ["api.github.com"]);
    assert!(!format!("{names:?}").contains(VALUE));
    backend.cleanup();
}

#[test]
fn every_header_of_a_credential_is_set_and_its_aliases_see_its_stand_in_and_lend_their_value() {
    // contract: X17 — Hermes' egress mappings: several matched headers, alias names; the
    // value comes from an alias when the name has none (as Hermes reads GOOGLE_API_KEY).
    let world = World::new();
    let gemini = Credential::new(
        "GEMINI_API_KEY".to_owned(),
        vec!["api.gemini.test".to_owned()],
        Some("x-goog-api-key".to_owned()),
        Some("{value}".to_owned()),
    )
    .expect("valid")
    .with_header("Authorization".to_owned(), "Bearer {value}".to_owned())
    .expect("valid")
    .with_aliases(vec!["GOOGLE_API_KEY".to_owned()])
    .expect("valid");
    let credentials = Credentials::new(
        vec![gemini],
        Arc::new(|name| (name == "GOOGLE_API_KEY").then(|| VALUE.to_owned())),
        SOURCE.to_owned(),
    )
    .expect("valid");
    let backend = backend_with(&world, SandboxMode::Persistent, credentials);
    let (_, seen) =
        run(&backend, "printenv GEMINI_API_KEY; printenv GOOGLE_API_KEY").expect("runs");
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.len(), 2, "{seen}");
    assert!(
        lines[0].starts_with(STAND_IN_PREFIX) && lines[0] == lines[1],
        "{seen}"
    );
    let id = backend.info().expect("attached").sandbox_id;
    let detail = world.detail(&id).expect("detail");
    let headers = &detail.network.expect("network").rules["api.gemini.test"][0].headers;
    assert_eq!(headers["x-goog-api-key"].expose(), VALUE);
    assert_eq!(headers["Authorization"].expose(), format!("Bearer {VALUE}"));
    backend.cleanup();
}
