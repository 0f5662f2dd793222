//! Credentials kept in E2B Secrets (contract X22): the sandbox's rules hold only the
//! placeholder of the profile's secret, a rotation is one update of the secret whatever the
//! number of sandboxes, a sandbox made with the value in its rules gets the placeholder at
//! its next command, a removed credential's secret is deleted, and a server without Secrets
//! leaves the value in the rules, saying why.

use std::sync::Arc;
use std::time::SystemTime;

use agent_sandbox::{
    Backend, Credential, CredentialStore, Credentials, Inventory, NoStateHooks, SandboxMode,
    StoreInForce,
};
use e2b_local::FailRule;
use futures::TryStreamExt;

use crate::credentials::Value;
use crate::support::{World, run};

const VALUE: &str = "realcredentialvalue0123";
const ROTATED: &str = "rotatedcredentialvalue789";

fn backend(world: &World, task: &str, credentials: Credentials, store: CredentialStore) -> Backend {
    let mut config = world.config(SandboxMode::Persistent);
    config.credentials = credentials;
    config.credential_store = store;
    Backend::new(
        config,
        world.scope(task),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend")
}

fn secret_names(world: &World) -> Vec<String> {
    let client = world.client();
    let listed: Vec<e2b_client::SecretInfo> = world
        .runtime
        .block_on(
            client
                .list_secrets(e2b_client::SecretQuery::all())
                .try_collect(),
        )
        .expect("list secrets");
    listed.into_iter().map(|info| info.name).collect()
}

fn header(world: &World, sandbox_id: &str) -> Option<String> {
    let detail = world.detail(sandbox_id).expect("detail");
    let rules = detail.network?.rules;
    let rule = rules.get("api.github.com")?.first()?.clone();
    rule.headers
        .get("Authorization")
        .map(|value| value.expose().to_owned())
}

fn placeholder(world: &World) -> String {
    let name = agent_sandbox::secret_name(
        &sandbox_identity::ProfileDigest::of(&world.home.path().to_string_lossy()),
        "GITHUB_TOKEN",
    );
    format!("Bearer ${{e2b.secrets.{name}}}")
}

#[test]
fn credentials_go_into_e2b_secrets_and_the_rules_hold_only_the_placeholder() {
    // contract: X22 — the create carries the placeholder; no answer of the sandbox detail
    // or the secrets list carries the value.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let backend = backend(&world, "a", value.credentials(), CredentialStore::Auto);
    run(&backend, "true").expect("runs");
    let id = backend.info().expect("attached").sandbox_id;
    assert_eq!(
        header(&world, &id).as_deref(),
        Some(placeholder(&world).as_str())
    );
    let raw = world.raw_detail(&id);
    assert!(!raw.contains(VALUE), "{raw}");
    let names = secret_names(&world);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(placeholder(&world).contains(&names[0]));
    assert_eq!(world.server().requests().get("update network"), 0);
    backend.cleanup();
}

#[test]
fn a_rotation_is_one_request_and_reaches_every_sandbox_untouched() {
    // contract: X22 — two sessions of the profile, each with its sandbox; a changed value
    // is one update of the secret, and neither sandbox's rules are updated.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let one = backend(&world, "one", value.credentials(), CredentialStore::Auto);
    let two = backend(&world, "two", value.credentials(), CredentialStore::Auto);
    run(&one, "true").expect("runs");
    run(&two, "true").expect("runs");
    let before = world.server().requests();
    run(&one, "true").expect("runs");
    run(&two, "true").expect("runs");
    let steady = world.server().requests().since(&before);
    assert_eq!(steady.rest(), 0, "steady state sends nothing: {steady:?}");

    // The second sandbox is paused meanwhile (E2B's own pause): it picks the value up when
    // its next command resumes it, with nothing sent about its rules.
    let paused = two.info().expect("attached").sandbox_id;
    world
        .server()
        .faults()
        .pause_sandbox(&paused)
        .expect("paused");
    value.set(ROTATED);
    let before = world.server().requests();
    run(&one, "true").expect("runs");
    let live = world.server().requests().since(&before);
    assert_eq!(live.get("update secret"), 1, "{live:?}");
    assert_eq!(live.rest(), 1, "one request for the rotation: {live:?}");
    run(&two, "true").expect("runs");
    let rotation = world.server().requests().since(&before);
    assert_eq!(rotation.get("update secret"), 1, "{rotation:?}");
    assert_eq!(rotation.get("update network"), 0, "{rotation:?}");
    assert_eq!(rotation.get("create secret"), 0, "{rotation:?}");
    for backend in [&one, &two] {
        let id = backend.info().expect("attached").sandbox_id;
        assert_eq!(
            header(&world, &id).as_deref(),
            Some(placeholder(&world).as_str())
        );
    }
    one.cleanup();
    two.cleanup();
}

#[test]
fn a_sandbox_with_the_value_in_its_rules_gets_the_placeholder_at_its_next_command() {
    // contract: X22 — the migration: one update, after which the detail holds no value.
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let old = backend(&world, "m", value.credentials(), CredentialStore::Rules);
    run(&old, "true").expect("runs");
    let id = old.info().expect("attached").sandbox_id;
    old.cleanup();
    assert_eq!(header(&world, &id), Some(format!("Bearer {VALUE}")));

    let new = backend(&world, "m", value.credentials(), CredentialStore::Auto);
    let before = world.server().requests();
    run(&new, "true").expect("runs");
    assert_eq!(new.info().expect("attached").sandbox_id, id);
    assert_eq!(
        world
            .server()
            .requests()
            .since(&before)
            .get("update network"),
        1
    );
    assert_eq!(
        header(&world, &id).as_deref(),
        Some(placeholder(&world).as_str())
    );
    assert!(!world.raw_detail(&id).contains(VALUE));
    new.cleanup();
}

#[test]
fn a_removed_credential_deletes_its_secret() {
    // contract: X22
    let world = World::new();
    let value = Value::new(Some(VALUE));
    let extra = Credential::new(
        "EXAMPLE_KEY".to_owned(),
        vec!["api.example.test".to_owned()],
        Some("x-api-key".to_owned()),
        Some("{value}".to_owned()),
    )
    .expect("valid");
    let github = value.credentials();
    let both = Credentials::new(
        vec![github.list()[0].clone(), extra],
        Arc::new(|_| Some(VALUE.to_owned())),
        "/profile/.env".to_owned(),
    )
    .expect("valid");
    let backend = backend(&world, "r", both, CredentialStore::Auto);
    run(&backend, "true").expect("runs");
    assert_eq!(secret_names(&world).len(), 2);
    assert!(backend.set_credentials(github));
    run(&backend, "true").expect("runs");
    let names = secret_names(&world);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with("-github_token"), "{names:?}");
    backend.cleanup();
}

#[test]
fn without_secrets_the_rules_carry_the_value_and_the_store_says_why() {
    // contract: X22 — a 404 to `GET /secrets` is the fallback (auto), or a refusal naming
    // the setting (secrets); the inventory says which store is in force and why.
    let world = World::new();
    let mut rule = FailRule::new(100, 404);
    rule.path_prefix = Some("/secrets".to_owned());
    rule.scope = e2b_local::FaultScope::Rest;
    world.server().faults().fail_next(rule);
    let value = Value::new(Some(VALUE));

    let strict = backend(&world, "s", value.credentials(), CredentialStore::Secrets);
    let error = run(&strict, "true").expect_err("refused");
    let text = error.to_string();
    assert!(
        error.is_credential() && text.contains("credential_store") && text.contains("404"),
        "{text}"
    );
    assert!(strict.info().is_none() || world.list().is_empty());

    let fallback = backend(&world, "f", value.credentials(), CredentialStore::Auto);
    run(&fallback, "true").expect("runs");
    let id = fallback.info().expect("attached").sandbox_id;
    assert_eq!(header(&world, &id), Some(format!("Bearer {VALUE}")));

    let mut config = world.config(SandboxMode::Persistent);
    config.credentials = value.credentials();
    let inventory = Inventory::new(config, world.home.path().to_path_buf(), world.services());
    let report = inventory.credential_store().expect("report");
    match report.in_force {
        StoreInForce::Rules { why } => assert!(why.contains("404"), "{why}"),
        other => panic!("expected the rules store, got {other:?}"),
    }
    // The inventory's `network` applies the same: the value stays where it is.
    let applied = inventory.apply_egress(SystemTime::now()).expect("applied");
    assert!(
        applied
            .iter()
            .all(|a| a.outcome == agent_sandbox::EgressOutcome::InForce)
    );
    fallback.cleanup();
}
